"""Paths in trainpipe's storage, all through Airflow's ``ObjectStoragePath`` (file:// or s3://).

Layout under the storage root::

    snapshots/<pipeline_id>/<digest16>/{train,holdout}.parquet, manifest.json   (immutable dataset version)
    snapshots/<pipeline_id>/<digest16>/accepted.json                             (last passed validation)
    snapshots/<pipeline_id>/LATEST.json                                          (baseline: last accepted)
    runs/<pipeline_id>/<run_key>/trainer_config.json, checkpoints/, output/      (per DAG run)
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import posixpath
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from trainpipe import uris
from trainpipe.errors import (
    DataReadError,
    OutsideStorageRootError,
    PolicyViolationError,
    StorageAccessError,
    StorageConflictError,
    UnsupportedUriError,
)
from trainpipe.settings import Settings
from trainpipe_trainer.config import DataFormat

if TYPE_CHECKING:
    import pandas as pd
    from airflow.sdk import ObjectStoragePath


def storage_root(settings: Settings) -> ObjectStoragePath:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(settings.storage_root, conn_id=settings.storage_conn_id)


def resolve_uri(uri: str, settings: Settings, conn_id: str | None = None) -> ObjectStoragePath:
    """A spec URI: absolute (``file://``, ``s3://``, ``/abs``) or relative to the storage root, inside
    it. The spec stage already refuses another scheme, userinfo (a connection that would win over
    ``conn_id``) and a relative URI that climbs out; this refuses them again, before any path is built,
    for callers that did not come through a spec."""
    from airflow.sdk import ObjectStoragePath

    problem = uris.scheme_problem(uri)
    if problem is not None:
        raise UnsupportedUriError(problem)
    if uris.is_absolute(uri):
        return ObjectStoragePath(uri if "://" in uri else f"file://{uri}", conn_id=conn_id)
    if uris.climbs_out_of_root(uri):
        raise OutsideStorageRootError(f"{uri!r} leads outside the storage root; {uris.OUTSIDE_ROOT_FIX}")
    # Normalised, the path is the one the spec stage judged: joined as written, "a/../x" would need
    # "a" to exist and would follow it if it were a symlink out of the root.
    relative = posixpath.normpath(uri)
    return storage_root(settings) if relative == "." else storage_root(settings) / relative


def require_allowed(uri: str, path: ObjectStoragePath, patterns: tuple[str, ...], settings: Settings, *,
                    field: str = "data.uri") -> None:
    """Refuse, before any read, a data path outside the team's allowed URIs (the policy's data.uris):
    the spec's URI as resolved against this worker's storage root and, for a local path, where its
    symlinks really lead; for a local folder, also where each file a read of it opens really leads. A
    URI with userinfo is refused first: the connection it names is not the one the policy judged. ``field``: the
    spec field that wrote ``uri`` (pretrained weights are read as data is)."""
    from trainpipe.policy import globs

    problem = uris.userinfo_problem(uri)
    if problem is not None:
        raise UnsupportedUriError(f"{field} {problem}; nothing was read")
    if not globs.uri_allowed(uri, patterns, settings.storage_root):
        raise PolicyViolationError(f"{field} {uri!r} resolves outside {_allowed_text(patterns)}")
    if path.protocol != "file":
        return
    refused = _first_real_path_refused(path, lambda real: _real_path_allowed(real, patterns, settings))
    if refused == "":
        raise PolicyViolationError(f"{field} {uri!r} resolves outside {_allowed_text(patterns)}")
    if refused is not None:
        # Only the member's own name is shown: its target is none of the team's business.
        raise PolicyViolationError(f"{field} {uri!r} holds {refused!r}, which resolves outside "
                                   f"{_allowed_text(patterns)}")


def require_inside_root(uri: str, path: ObjectStoragePath, settings: Settings, *, field: str = "data.uri") -> None:
    """Without a policy, refuse before any read a local data path whose real path (links followed, each
    file of a folder too) is outside the storage root: the worker's own files (/etc/passwd,
    /proc/self/environ, the Airflow home) would be copied into a snapshot. Object stores are read by their
    connection; a policy's data.uris judges instead (``require_allowed``)."""
    import os

    if path.protocol != "file":
        return
    root = settings.storage_root
    real_root = os.path.realpath(root.removeprefix("file://")) if root.startswith("file://") else None

    def inside(real: str) -> bool:
        return real_root is not None and (real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep))

    refused = _first_real_path_refused(path, inside)
    if refused is not None:
        refusal = (f"{field} {uri!r} is a local path outside the storage root; nothing was read: "
                   f"{uris.LOCAL_DATA_RULE}; {uris.LOCAL_DATA_FIX}")
        raise OutsideStorageRootError(refusal + (f" ({refused!r} of the folder leads there)" if refused else ""))


def _first_real_path_refused(path: ObjectStoragePath, accepts: Callable[[str], bool]) -> str | None:
    """What a read of the local ``path`` would open that ``accepts`` refuses, judged by real path (links
    followed): None for nothing, "" for the path itself, else the name of the folder's member. ``read_table``
    opens each member, following its links, so each is judged for every format a read takes; a plain file
    of the folder goes with the folder (a pattern may name the folder itself). One walk for the policy's
    check and the no-policy one: both judge exactly what the read will open."""
    import os

    real_folder = os.path.realpath(path.path)
    if not accepts(real_folder):
        return ""
    if path.is_dir():
        for member in _members(path, TABLE_FORMATS):
            real = os.path.realpath(member.path)
            if real != os.path.join(real_folder, member.name) and not accepts(real):
                return member.name
    return None


def _real_path_allowed(real: str, patterns: tuple[str, ...], settings: Settings) -> bool:
    """Whether a local real path is inside the patterns, resolved against the storage root as configured
    and as its own real path (a root reached through a symlink)."""
    import os

    from trainpipe.policy import globs

    root = settings.storage_root
    real_root = ("file://" + os.path.realpath(root.removeprefix("file://"))) if root.startswith("file://") else root
    return any(globs.uri_allowed(real, patterns, base) for base in {root, real_root})


def _allowed_text(patterns: tuple[str, ...]) -> str:
    return (f"the URIs the platform policy allows this pipeline's team ({', '.join(map(repr, patterns)) or 'none'}); "
            "nothing was read. Use data the team may read, or ask the platform team to allow it")


def fsspec_uri(path: ObjectStoragePath) -> str:
    """The URI a process without Airflow (the trainer) opens with fsspec: no connection id in it
    (``str()`` of a path with a ``conn_id`` reads ``s3://conn_id@bucket/key``)."""
    return path.as_uri() if path.protocol == "file" else f"{path.protocol}://{path.path}"


def shown_uri(path: ObjectStoragePath) -> str:
    """A path as people read it: the plain URI, the connection named apart
    (``s3://trainpipe/storage/x (connection trainpipe_s3)``, never ``s3://trainpipe_s3@trainpipe/...``)."""
    conn_id = getattr(path, "conn_id", None)
    return fsspec_uri(path) + (f" (connection {conn_id})" if conn_id else "")


def _env_name(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


STACK_HINT = "on the stack: source .trainpipe/stack/cli.env"


def check_storage_settings(settings: Settings) -> None:
    """Before a command touches an object-store root: its connection must be defined. (Airflow would fall
    back to no connection and anonymous access against AWS itself, and fail later and less clearly.)"""
    if settings.storage_root.startswith("file://") or "://" not in settings.storage_root:
        return
    if settings.storage_conn_id is None:
        return  # the default credential chain (AWS_* variables, an instance role) may be meant
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(settings.storage_conn_id)
    except AirflowNotFoundException:
        raise StorageAccessError(
            f"storage {settings.storage_root}: the Airflow connection {settings.storage_conn_id!r} "
            f"(TRAINPIPE_STORAGE_CONN_ID) is not defined; define it, e.g. in {_env_name(settings.storage_conn_id)} "
            f"({STACK_HINT})") from None


@contextlib.contextmanager
def storage_access(settings: Settings) -> Iterator[None]:
    """Turns a refused or unreachable object store into one line naming the setting to fix (a CLI prints it
    instead of a traceback)."""
    check_storage_settings(settings)
    try:
        yield
    except Exception as err:
        message = _access_problem(err, settings)
        if message is None:
            raise
        raise StorageAccessError(f"storage {settings.storage_root}: {message}") from err


def trainer_storage_env(settings: Settings) -> dict[str, str]:
    """For a trainer started from here (the local launcher): the S3 endpoint and keys of the storage
    connection, as the variables s3fs reads. Nothing when the root is local, no connection is set, or the
    environment already has keys (the stack's workers do)."""
    import os

    if settings.storage_root.startswith("file://") or "://" not in settings.storage_root:
        return {}
    if settings.storage_conn_id is None or os.environ.get("AWS_ACCESS_KEY_ID"):
        return {}
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(settings.storage_conn_id)
    extra = conn.extra_dejson or {}
    values = {"AWS_ACCESS_KEY_ID": conn.login or "", "AWS_SECRET_ACCESS_KEY": conn.password or "",
              "AWS_ENDPOINT_URL": extra.get("endpoint_url") or "", "AWS_DEFAULT_REGION": extra.get("region_name") or ""}
    return {name: value for name, value in values.items() if value}


def _access_problem(err: Exception, settings: Settings) -> str | None:
    conn_id = settings.storage_conn_id
    where = (f"the Airflow connection {conn_id!r} (TRAINPIPE_STORAGE_CONN_ID, {_env_name(conn_id)})" if conn_id
             else "TRAINPIPE_STORAGE_CONN_ID (not set)")
    name = type(err).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        fix = ("set its login (access key id) and password (secret key)" if conn_id else
               "set it to an Airflow connection with the S3 endpoint and keys")
        return f"no S3 credentials: {where}; {fix} ({STACK_HINT})"
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
        return (f"cannot reach the S3 endpoint ({err}); check the endpoint_url in the extra of {where} "
                f"({STACK_HINT}: the stack must be running)")
    code = ""
    response = getattr(err, "response", None) or getattr(getattr(err, "__cause__", None), "response", None)
    if isinstance(response, dict):
        code = str((response.get("Error") or {}).get("Code") or "")
    refused = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "403"}
    if code in refused or isinstance(err, PermissionError):
        return f"the S3 endpoint refused the credentials ({code or err}); check the login and password of {where}"
    return None


# The formats read_table reads (data.format).
TABLE_FORMATS: tuple[str, ...] = typing.get_args(DataFormat)


def _members(folder: ObjectStoragePath, formats: tuple[str, ...]) -> list[ObjectStoragePath]:
    """The files a read of ``folder`` opens: its own entries named ``*.<format>``, in a stable order.
    One definition for the read and for the policy check of what it will open."""
    suffixes = tuple(f".{name}" for name in formats)
    return sorted((p for p in folder.iterdir() if p.name.endswith(suffixes)), key=str)


def read_table(path: ObjectStoragePath, file_format: str = "parquet") -> pd.DataFrame:
    """Read one file, or every ``*.parquet``/``*.csv`` file under a directory, as one DataFrame."""
    import pandas as pd

    files = _members(path, (file_format,)) if path.is_dir() else [path]
    frames = []
    for file in files:
        with file.open("rb") as handle:
            raw = handle.read()
        try:
            frames.append(pd.read_csv(io.BytesIO(raw)) if file_format == "csv" else parquet_from_bytes(raw))
        except Exception as error:
            # Parsers quote what they could not parse: the message keeps the path and the kind only.
            raise DataReadError(f"{file}: not a readable {file_format} file ({type(error).__name__}); check "
                                "data.uri and data.format") from None
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def parquet_from_bytes(raw: bytes) -> pd.DataFrame:
    """Decode parquet from memory with Arrow's own buffer and no Arrow thread pool: reading through a
    Python file object can abort the process at exit (apache/arrow#34314)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(raw), use_threads=False).to_pandas()


def read_parquet_uri(uri: str, conn_id: str | None = None) -> pd.DataFrame:
    """Read a parquet file by fsspec URI (the URIs the trainer is given). Given the storage connection, a
    file under the storage root is read with its credentials, as every other read of the root is (plain
    fsspec has only the default AWS chain, which a CLI user with just the connection does not have)."""
    problem = uris.userinfo_problem(uri)
    if problem is not None:  # its connection would win over conn_id
        raise UnsupportedUriError(problem)
    if conn_id is not None:
        from airflow.sdk import ObjectStoragePath

        with ObjectStoragePath(uri, conn_id=conn_id).open("rb") as handle:
            return parquet_from_bytes(handle.read())
    import fsspec

    with fsspec.open(uri, "rb") as handle:
        return parquet_from_bytes(handle.read())


def write_parquet_once(path: ObjectStoragePath, frame: pd.DataFrame) -> None:
    """Write a parquet file that must never change once written (snapshots are immutable)."""
    if path.exists():
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(sink.getvalue().to_pybytes())


# How often a read starts again on an object replaced under it before the last try's error stands.
_REREADS_ON_REPLACED = 4


def read_current_text(path: ObjectStoragePath) -> str:
    """The text of an object that other processes rewrite (a status marker, a ledger).

    An object store's reader pins the version it opened (s3fs: the ETag) and fails with EBUSY
    (``FileExpired``) when a writer replaces the object before the read ends, as a task callback does
    while a retry reads the status: open it again, which reads the newer version."""
    for _ in range(_REREADS_ON_REPLACED):
        try:
            return path.read_text()
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
    return path.read_text()


def read_json(path: ObjectStoragePath) -> Any:
    return json.loads(read_current_text(path))


def write_json(path: ObjectStoragePath, payload: Any, *, overwrite: bool = True) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str)
    if path.exists() and not overwrite:
        existing = path.read_text()
        if existing != text:
            raise StorageConflictError(f"{path} already holds different content; refusing to overwrite it")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        handle.write(text)
