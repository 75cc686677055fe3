"""The policy's patterns: globs over names, spec paths and storage URIs (standard library only).

``*`` and ``?`` stay within one ``/``-separated part, ``**`` crosses parts, and a pattern ending in
``/**`` also matches the folder itself. Everything else is literal (no character classes), so a
pattern means what it reads. URIs are compared in one canonical form (``canonical_uri``), after
resolving a relative URI against the storage root, by the spec stage and again at run time.

A URI with userinfo (``s3://conn@bucket/...``) matches no pattern: Airflow reads it as the connection to
use, so ``s3://risk-*/**`` must not admit ``s3://risk-x@search-data/...``. ``canonical_uri`` refuses it, and
a ``scheme://`` pattern never matches an ``@`` or ``%`` (``%40``) before the first ``/``, whatever its
``*``, ``?`` or ``**`` would otherwise take.
"""

from __future__ import annotations

import functools
import posixpath
import re

from trainpipe import uris

# Before a URI pattern: the value has no "@" or "%" between "://" and the first "/". A lookahead over the
# whole authority rather than a narrower "*": a "**" there, or a "*" after it, would otherwise cross it.
_NO_USERINFO = r"(?![^/]*://[^/]*[@%])"


@functools.lru_cache(maxsize=4096)
def compiled(pattern: str) -> re.Pattern[str]:
    out = [_NO_USERINFO] if "://" in pattern else []
    index = 0
    if pattern.endswith("/**"):
        pattern, tail = pattern[:-3], "(?:/.*)?"
    else:
        tail = ""
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        out.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
        index += 1
    return re.compile("".join(out) + tail + r"\Z", re.DOTALL)


def matches(value: str, pattern: str) -> bool:
    return compiled(pattern).match(value) is not None


def matches_any(value: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(compiled(pattern).match(value) is not None for pattern in patterns)


@functools.lru_cache(maxsize=4096)
def canonical_uri(uri: str, storage_root: str) -> str | None:
    """``scheme://path`` with the scheme lower-cased, ``.`` parts and trailing ``/`` removed; a relative
    URI joined to ``storage_root`` first. None for a URI no pattern may match: an absolute one with a
    ``..`` part (object stores keep ``..`` literally, local paths climb: the same text means two things), or
    with userinfo (a connection or credentials of its own: ``uris.userinfo``)."""
    if not uris.is_absolute(uri):
        if uris.climbs_out_of_root(uri):
            return None
        relative = posixpath.normpath(uri)
        uri = storage_root.rstrip("/") + ("" if relative == "." else "/" + relative)
    if uri.startswith("/"):
        uri = "file://" + uri
    if uris.userinfo(uri) is not None:
        return None
    scheme, _, rest = uri.partition("://")
    parts = rest.split("/")
    if ".." in parts:
        return None
    leading = "/" if rest.startswith("/") else ""
    kept = "/".join(part for part in parts if part not in ("", "."))
    return f"{scheme.lower()}://{leading}{kept}"


def uri_allowed(uri: str, patterns: tuple[str, ...] | list[str], storage_root: str) -> bool:
    """Whether ``uri`` (as a spec writes it) is inside one of ``patterns`` (as the policy writes them),
    both resolved against ``storage_root``."""
    canonical = canonical_uri(uri, storage_root)
    if canonical is None:
        return False
    return any(
        (resolved := canonical_uri(pattern, storage_root)) is not None and matches(canonical, resolved)
        for pattern in patterns
    )
