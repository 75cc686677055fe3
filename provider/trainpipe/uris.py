"""Storage URIs as a spec writes them, judged by their text alone (no Airflow, no filesystem).

A spec's ``data.uri`` is either absolute (``file://``, ``s3://`` or a ``/path``) or relative to the
storage root. Only the schemes trainpipe's storage reads (``STORAGE_SCHEMES``) are accepted: another
scheme would make the worker open something else (``http://`` a request, ``memory://`` or
``simplecache::`` another filesystem), so ``scheme_problem`` refuses it. A relative URI must stay
inside the root. The spec stage refuses both (``trainpipe.spec.sections``), before any I/O, and
``trainpipe.storage.resolve_uri`` refuses them again before touching storage.
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Anything that reads as "scheme:" at the start, with or without "//" (fsspec and urllib read both).
_ANY_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# The schemes trainpipe's storage reads a spec URI with (Airflow's ObjectStoragePath). Add one here,
# and only here, to accept it in specs.
STORAGE_SCHEMES = ("file", "s3")

OUTSIDE_ROOT_FIX = (
    "relative URIs are relative to the storage root and must stay inside it; use an absolute file:// or "
    "s3:// URI if you mean a location outside it"
)


def scheme_problem(uri: str) -> str | None:
    """Why ``uri`` names something other than trainpipe's storage (None when it does not)."""
    if "::" in uri:
        return (f"{uri!r} chains filesystems ('::'), which trainpipe does not read; use a {_ALLOWED} URI or a path "
                "relative to the storage root")
    match = _ANY_SCHEME.match(uri)
    if match and match.group(1).lower() not in STORAGE_SCHEMES:
        return (f"scheme {match.group(1)!r} is not one trainpipe reads; use a {_ALLOWED} URI or a path relative "
                "to the storage root")
    return None


_ALLOWED = " or ".join(f"{scheme}://" for scheme in STORAGE_SCHEMES)


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
