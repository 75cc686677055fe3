"""Storage URIs as a spec writes them, judged by their text alone (no Airflow, no filesystem).

A spec's ``data.uri`` is either absolute (``file://``, ``s3://``, any ``scheme://``, or a ``/path``)
or relative to the storage root. A relative one must stay inside the root: the spec stage refuses
one that climbs out (``trainpipe.spec.models``), and ``trainpipe.storage.resolve_uri`` refuses it
again before touching storage.
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

OUTSIDE_ROOT_FIX = (
    "relative URIs are relative to the storage root and must stay inside it; use an absolute file:// or "
    "s3:// URI if you mean a location outside it"
)


def is_absolute(uri: str) -> bool:
    """``scheme://...`` or ``/path``; anything else is relative to the storage root."""
    return bool(_SCHEME.match(uri)) or uri.startswith("/")


def climbs_out_of_root(uri: str) -> bool:
    """Whether a relative ``uri`` leads outside the folder it is relative to, counting each ``..``
    against the parts before it: ``a/../../x`` does, ``a/../x`` does not. Absolute URIs never do."""
    if is_absolute(uri):
        return False
    depth = 0
    for part in uri.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False
