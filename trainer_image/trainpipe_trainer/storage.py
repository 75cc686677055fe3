"""Small fsspec helpers so every URI (local path, file://, s3://) is read and written one way."""

from __future__ import annotations

import os
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


def url_to_fs(uri: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    # Empty options on purpose for the config file itself: fsspec then applies its env-driven
    # defaults (FSSPEC_S3_* variables, AWS_* for s3fs), the only ones known before the config is read.
    return fsspec.core.url_to_fs(uri, **(storage_options or {}))


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def read_text(uri: str, storage_options: dict[str, Any] | None = None) -> str:
    fs, path = url_to_fs(uri, storage_options)
    with fs.open(path, "r", encoding="utf-8") as handle:
        return handle.read()


def write_text(uri: str, text: str, storage_options: dict[str, Any] | None = None) -> None:
    """Write a whole file so that readers see either nothing or all of it."""
    write_bytes(uri, text.encode("utf-8"), storage_options)


def write_bytes(uri: str, data: bytes, storage_options: dict[str, Any] | None = None) -> None:
    """Write a whole file so that readers see either nothing or all of it."""
    fs, path = url_to_fs(uri, storage_options)
    parent = path.rsplit("/", 1)[0]
    if is_local(fs):
        os.makedirs(parent, exist_ok=True)
        # Rename is atomic on a local filesystem; a crash leaves only a stray temp file.
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    else:
        # Object stores make a single PUT visible atomically.
        fs.pipe_file(path, data)
