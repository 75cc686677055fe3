"""Operators whose fields come from a spec render none of them with Jinja.

A spec author is less trusted than the platform: a label, an image, an e-mail subject written as
``{{ conn.aws_default.password }}`` must reach Kubernetes or the mail server as that text, never as
the secret Airflow would render. trainpipe computes every value these operators need (at parse time
from the plan, or in ``execute``), so none of their fields is a template: rendering is switched off
for the whole operator rather than field by field, so a field a provider upgrade adds to
``template_fields`` is covered too. The fields stay in ``template_fields``, so ``airflow tasks
render`` and the UI's rendered view still show them, as written.
"""

from __future__ import annotations

from typing import Any


class LiteralFields:
    """Mixin, before the Airflow operator in the bases: ``render_template_fields`` leaves every field as it is."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        return None
