"""Storage URIs as a spec writes them, judged by their text alone (no Airflow, no filesystem).

A spec's ``data.uri`` is either absolute (``file://``, ``s3://`` or a ``/path``) or relative to the
storage root. Only the schemes trainpipe's storage reads (``STORAGE_SCHEMES``) are accepted: another
scheme would make the worker open something else (``http://`` a request, ``memory://`` or
``simplecache::`` another filesystem), so ``scheme_problem`` refuses it. It refuses as well a URI with
userinfo (``s3://conn@bucket/...``, ``user:password@``), which Airflow reads as the connection to use,
over the spec's ``conn_id`` (``userinfo_problem``). A relative URI must stay inside the root. The spec
stage refuses all of these (``trainpipe.spec.sections``), before any I/O, and
``trainpipe.storage.resolve_uri`` refuses them again before building a path.
"""

from __future__ import annotations

import re

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Anything that reads as "scheme:" at the start, with or without "//" (fsspec and urllib read both).
_ANY_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# The schemes trainpipe's storage reads a spec URI with (Airflow's ObjectStoragePath). Add one here,
# and only here, to accept it in specs.
STORAGE_SCHEMES = ("file", "s3")
# "scheme://" and what follows up to the first "/", where a URL parser finds "user:password@".
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/]*)")
_AT = re.compile(r"@|%40", re.IGNORECASE)
_COLON = re.compile(r":|%3a", re.IGNORECASE)

OUTSIDE_ROOT_FIX = (
    "relative URIs are relative to the storage root and must stay inside it; for data outside it, use an "
    "s3:// URI, or a local path the platform's policy allows (data.uris)"
)
# Without a policy, local data lies under the storage root (the spec stage and the snapshot both say so).
LOCAL_DATA_RULE = "without a platform policy trainpipe reads local data only under the storage root"
LOCAL_DATA_FIX = ("move the data there and write its path relative to the storage root, or the platform allows "
                  "the path in its policy's data.uris")


def scheme_problem(uri: str) -> str | None:
    """Why ``uri`` names something other than trainpipe's storage, or names it through a connection of its
    own (None when it does not)."""
    control = next((char for char in uri if ord(char) < 0x20 or ord(char) == 0x7F), None)
    if control is not None:
        # A YAML escape ("\n") puts one there: a key with it is another object than the one the author saw.
        return f"{uri!r} contains the control character U+{ord(control):04X}; remove it"
    if "::" in uri:
        return (f"{uri!r} chains filesystems ('::'), which trainpipe does not read; use a {_ALLOWED} URI or a path "
                "relative to the storage root")
    match = _ANY_SCHEME.match(uri)
    if match and match.group(1).lower() not in STORAGE_SCHEMES:
        return (f"scheme {match.group(1)!r} is not one trainpipe reads; use a {_ALLOWED} URI or a path relative "
                "to the storage root")
    return userinfo_problem(uri)


def userinfo(uri: str) -> str | None:
    """The userinfo of a ``scheme://`` URI, through its ``@`` (``risk-x@`` of ``s3://risk-x@search-data/x``), or
    None. Looked for in everything before the first ``/`` (wider than a URL parser's authority, which also
    ends at ``?`` and ``#``), with ``%40`` counted as ``@``: no spelling that some parser reads slips by."""
    split = _split_userinfo(uri)
    return split[1] if split else None


def userinfo_problem(uri: str) -> str | None:
    """Why ``uri`` may not carry userinfo: Airflow's ObjectStoragePath takes it as the connection id over its
    ``conn_id`` argument (an unknown one falls back to the worker's own credentials), so it would hide the
    connection, or a password, from the spec's ``conn_id`` and from the policy's rules on it."""
    split = _split_userinfo(uri)
    if split is None:
        return None
    scheme, found, rest = split
    # A password is not repeated: the message is printed and logged.
    name, *password = _COLON.split(found, maxsplit=1)
    shown = f"{name}:***{_AT.findall(found)[-1]}" if password else found
    return (f"{scheme + shown + rest!r} names a connection or credentials in its host part ({shown!r}); give the "
            f"bucket alone ({scheme + rest}) and the connection in conn_id")


def _split_userinfo(uri: str) -> tuple[str, str, str] | None:
    """``(scheme://, userinfo through its last @, the rest)``, or None without userinfo."""
    match = _AUTHORITY.match(uri)
    if match is None:
        return None
    ats = list(_AT.finditer(match.group(2)))
    if not ats:
        return None
    end = len(match.group(1)) + ats[-1].end()
    return match.group(1), uri[len(match.group(1)):end], uri[end:]


_ALLOWED = " or ".join(f"{scheme}://" for scheme in STORAGE_SCHEMES)


def spec_uri_problem(uri: str) -> str | None:
    """Why a storage URI a spec writes (``data.uri``, ``training.model.pretrained``) is refused by its text alone:
    another scheme, userinfo, a relative path that climbs out of the storage root. One rule for every such field;
    where it may lead (the storage root, a policy's ``data.uris``) is judged by ``trainpipe.policy.check``."""
    problem = scheme_problem(uri)
    if problem is not None:
        return problem
    if climbs_out_of_root(uri):
        return f"{uri!r} leads outside the storage root; {OUTSIDE_ROOT_FIX}"
    return None


# A Hugging Face Hub model, as ``training.model.pretrained`` names it: ``hf://owner/name`` (the Hub's own rules
# for a repository id: letters, digits, '-', '_', '.', never '..' nor a leading or trailing '.'/'-'). Only the
# pretrained weights may come from the Hub, and only where the platform's policy sets ``models.hub: true``.
HUB_SCHEME = "hf"
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9])?"
_HUB_ID = re.compile(rf"^hf://(?P<id>{_HUB_PART}/{_HUB_PART})\Z")


def is_hub(uri: str) -> bool:
    """Whether ``uri`` is written as a Hub reference (``hf:...``, any case): judged as one, never as storage."""
    match = _ANY_SCHEME.match(uri)
    return match is not None and match.group(1).lower() == HUB_SCHEME


def hub_problem(uri: str) -> str | None:
    """Why an ``hf:`` reference is not a plain ``hf://owner/name`` (None when it is)."""
    match = _HUB_ID.match(uri)
    if match is None or ".." in match.group("id"):
        return (f"{uri!r} is not a Hugging Face Hub model id: write hf://owner/name (letters, digits, '-', '_' and "
                "'.'; no revision, path or query)")
    return None


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
