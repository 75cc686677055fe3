"""Spec text shown where a UI renders Markdown (the Airflow UI's DAG docs, MLflow's model descriptions)."""

from __future__ import annotations

import re

# Every ASCII punctuation character CommonMark lets a backslash escape.
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def markdown_text(text: str) -> str:
    """``text`` escaped so that a Markdown renderer shows it as written: no heading, link or remote image
    (a tracking pixel, a phishing link "approved by the platform team") made of a spec's words."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)
