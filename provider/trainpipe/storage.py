"""Paths in trainpipe's storage, all through Airflow's ``ObjectStoragePath`` (file:// or s3://).

Layout under the storage root::

    snapshots/<pipeline_id>/<digest16>/{train,holdout}.parquet, manifest.json   (immutable dataset version)
    snapshots/<pipeline_id>/<digest16>/accepted.json                             (last passed validation)
    snapshots/<pipeline_id>/LATEST.json                                          (baseline: last accepted)
    runs/<pipeline_id>/<run_key>/trainer_config.json, checkpoints/, output/      (per DAG run)
"""

from __future__ import annotations

import io
import json
import posixpath
from typing import TYPE_CHECKING, Any

from trainpipe import uris
from trainpipe.errors import (
    DataReadError,
    OutsideStorageRootError,
    PolicyViolationError,
    StorageConflictError,
    UnsupportedUriError,
)
from trainpipe.settings import Settings

if TYPE_CHECKING:
    import pandas as pd
    from airflow.sdk import ObjectStoragePath


def storage_root(settings: Settings) -> ObjectStoragePath:
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(settings.storage_root, conn_id=settings.storage_conn_id)


def resolve_uri(uri: str, settings: Settings, conn_id: str | None = None) -> ObjectStoragePath:
    """A spec URI: absolute (``file://``, ``s3://``, ``/abs``) or relative to the storage root, inside
    it. The spec stage already refuses another scheme and a relative URI that climbs out; this refuses
    them again, before any I/O, for callers that did not come through a spec."""
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


def require_allowed(uri: str, path: ObjectStoragePath, patterns: tuple[str, ...], settings: Settings) -> None:
    """Refuse, before any read, a data path outside the team's allowed URIs (the policy's data.uris):
    the spec's URI as resolved against this worker's storage root and, for a local path, where its
    symlinks really lead."""
    import os

    from trainpipe.policy import globs

    allowed = globs.uri_allowed(uri, patterns, settings.storage_root)
    if allowed and path.protocol == "file":
        real = os.path.realpath(path.path)
        root = settings.storage_root
        real_root = ("file://" + os.path.realpath(root.removeprefix("file://"))) if root.startswith("file://") else root
        allowed = any(globs.uri_allowed(real, patterns, base) for base in {root, real_root})
    if not allowed:
        raise PolicyViolationError(
            f"data.uri {uri!r} resolves outside the URIs the platform policy allows this pipeline's team "
            f"({', '.join(map(repr, patterns)) or 'none'}); nothing was read. Use data the team may read, or ask "
            "the platform team to allow it")


def fsspec_uri(path: ObjectStoragePath) -> str:
    """The URI a process without Airflow (the trainer) opens with fsspec: no connection id in it
    (``str()`` of a path with a ``conn_id`` reads ``s3://conn_id@bucket/key``)."""
    return path.as_uri() if path.protocol == "file" else f"{path.protocol}://{path.path}"


def read_table(path: ObjectStoragePath, file_format: str = "parquet") -> pd.DataFrame:
    """Read one file, or every ``*.parquet``/``*.csv`` file under a directory, as one DataFrame."""
    import pandas as pd

    files = [path]
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.name.endswith(f".{file_format}")), key=str)
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


def read_parquet_uri(uri: str) -> pd.DataFrame:
    """Read a parquet file by fsspec URI (the URIs the trainer is given)."""
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


def read_json(path: ObjectStoragePath) -> Any:
    with path.open("r") as handle:
        return json.load(handle)


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
