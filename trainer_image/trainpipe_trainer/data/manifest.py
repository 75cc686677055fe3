"""A dataset version that lists its files instead of copying them (``data.snapshot: manifest``).

Like Delta's add actions and Iceberg's manifests, each file is recorded by what identifies its bytes
without reading them: its size and, on S3, its ETag and (with bucket versioning) its VersionId; on a local
disk its modification time (size and mtime, as Delta and make judge a file). The parquet footer gives the
row count of each row group and the schema. The manifest's digest is the dataset version.

The unit of a split and of the streamed reader is one (file, row group). The holdout split is chosen per
unit by a hash of the file's path within the source and the row group's index, so a unit held out today
is held out tomorrow (a file appended to the folder does not move the others), and nothing is read to
choose it.

Standard library only: the provider's snapshot step writes a manifest, the validate step and the trainer
read it and check each file against it (``file_change``) before using the file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# In a dataset version's folder, beside its manifest.json (the provider's version record).
MANIFEST_FILE = "data_manifest.json"
MANIFEST_FORMAT = 1
_HOLDOUT_BUCKETS = 10_000
Split = Literal["train", "holdout"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestFile:
    """One parquet file of the version, as it was when the snapshot listed it."""

    uri: str
    # Relative to the source folder: the file's name in the version (the holdout hash key).
    path: str
    size: int
    rows: int
    # Rows of each row group, in file order.
    row_groups: tuple[int, ...]
    # Indices of the row groups held out (the evaluation split); the others are the train split.
    holdout_row_groups: tuple[int, ...]
    schema_hash: str
    # S3: the object's ETag and, in a versioned bucket, its VersionId (then read by version).
    etag: str | None = None
    version_id: str | None = None
    # A local file: its modification time (seconds, as the filesystem reports it).
    mtime: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "path": self.path, "size": self.size, "rows": self.rows,
                "row_groups": list(self.row_groups), "holdout_row_groups": list(self.holdout_row_groups),
                "schema_hash": self.schema_hash, "etag": self.etag, "version_id": self.version_id,
                "mtime": self.mtime}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ManifestFile:
        return cls(uri=raw["uri"], path=raw["path"], size=int(raw["size"]), rows=int(raw["rows"]),
                   row_groups=tuple(int(n) for n in raw["row_groups"]),
                   holdout_row_groups=tuple(int(i) for i in raw["holdout_row_groups"]),
                   schema_hash=raw["schema_hash"], etag=raw.get("etag"), version_id=raw.get("version_id"),
                   mtime=raw.get("mtime"))


@dataclass(frozen=True, slots=True)
class Unit:
    """One row group of one file: what the streamed reader reads at once and shuffles by."""

    file: int
    row_group: int
    rows: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DataManifest:
    source_uri: str
    files: tuple[ManifestFile, ...]
    # The ordered (column, arrow type) pairs every file has.
    schema: tuple[tuple[str, str], ...]
    holdout_fraction: float
    format: int = MANIFEST_FORMAT
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hashlib.sha256(_canonical(self._content())).hexdigest())

    def _content(self) -> dict[str, Any]:
        return {"format": self.format, "source_uri": self.source_uri, "schema": [list(c) for c in self.schema],
                "holdout_fraction": self.holdout_fraction, "files": [f.to_dict() for f in self.files]}

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.schema)

    def units(self, split: Split) -> list[Unit]:
        """The split's row groups in manifest order (file order, then row group order)."""
        found = []
        for index, entry in enumerate(self.files):
            held = set(entry.holdout_row_groups)
            for group, rows in enumerate(entry.row_groups):
                if (group in held) == (split == "holdout"):
                    found.append(Unit(index, group, rows))
        return found

    def rows(self, split: Split | None = None) -> int:
        if split is None:
            return sum(entry.rows for entry in self.files)
        return sum(unit.rows for unit in self.units(split))

    @property
    def size_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {**self._content(), "digest": self.digest}

    def dumps(self) -> bytes:
        return _canonical(self.to_dict())

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DataManifest:
        if raw.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"data manifest format {raw.get('format')!r}: this trainpipe reads format "
                             f"{MANIFEST_FORMAT}; snapshot the data again with this release")
        manifest = cls(source_uri=raw["source_uri"], files=tuple(ManifestFile.from_dict(f) for f in raw["files"]),
                       schema=tuple((str(name), str(kind)) for name, kind in raw["schema"]),
                       holdout_fraction=float(raw["holdout_fraction"]))
        if raw.get("digest") not in (None, manifest.digest):
            raise ValueError(f"data manifest of {raw['source_uri']}: its digest does not match its content "
                             "(edited after it was written); snapshot the data again")
        return manifest

    @classmethod
    def loads(cls, text: str | bytes) -> DataManifest:
        return cls.from_dict(json.loads(text))


def _canonical(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def _bucket(path: str, row_group: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{path}#{row_group}".encode()).digest()[:8], "big") % _HOLDOUT_BUCKETS


def holdout_row_groups(files: Iterable[tuple[str, int]], fraction: float) -> list[tuple[int, ...]]:
    """Per ``(path, row group count)``, the row groups held out: those whose hash bucket falls under the
    fraction. With a fraction above 0 at least one unit is held out and one kept (the lowest and the
    highest bucket), so neither split is empty when the version has two units or more."""
    listed = list(files)
    chosen = [tuple(g for g in range(count) if _bucket(path, g) < int(fraction * _HOLDOUT_BUCKETS))
              for path, count in listed]
    units = [(_bucket(path, g), i, g) for i, (path, count) in enumerate(listed) for g in range(count)]
    if fraction <= 0 or len(units) < 2:
        return chosen
    held = sum(len(groups) for groups in chosen)
    if held == 0:
        _, i, g = min(units)
        chosen[i] = (g,)
    elif held == len(units):
        _, i, g = max(units)
        chosen[i] = tuple(x for x in chosen[i] if x != g)
    return chosen


def file_change(entry: ManifestFile, info: Mapping[str, Any]) -> str | None:
    """What differs between the manifest's record of a file and the store's ``info`` of it now (fsspec's
    ``info``: size, ETag or mtime); None when it is the file the snapshot listed. A file read by its
    VersionId is that version whatever the key holds now, so only its presence matters."""
    changes = []
    size = info.get("size")
    if entry.version_id is not None:
        return None
    if size is not None and int(size) != entry.size:
        changes.append(f"size {entry.size} -> {int(size)} bytes")
    etag = info.get("ETag") or info.get("etag")
    if entry.etag is not None and etag is not None and etag.strip('"') != entry.etag.strip('"'):
        changes.append(f"ETag {entry.etag.strip(chr(34))} -> {etag.strip(chr(34))}")
    mtime = info.get("mtime")
    if entry.mtime is not None and mtime is not None and float(mtime) != entry.mtime:
        changes.append("modified after the snapshot")
    return ", ".join(changes) or None


def changed_file_message(entry: ManifestFile, change: str, digest: str) -> str:
    """The error that stops a reader when a file differs from the manifest: names the file and the fix."""
    return (f"{entry.uri}: changed since dataset version {digest[:16]} listed it ({change}); the version is "
            "immutable, so its data cannot be read as it was: restore the file, or run the DAG again for a new "
            "snapshot of the folder as it is now")


# What both messages above say, whoever relays them (the trainer's one-line error, read back by the provider).
_DATA_CHANGE = re.compile(r": (changed since dataset version [0-9a-f]{16} listed it|listed by dataset version "
                          r"[0-9a-f]{16} but gone from the store)")


def is_data_change(message: str) -> bool:
    """Whether ``message`` is a reader's report of a file changed or gone since the snapshot (no retry mends it)."""
    return _DATA_CHANGE.search(message) is not None


def missing_file_message(entry: ManifestFile, digest: str) -> str:
    return (f"{entry.uri}: listed by dataset version {digest[:16]} but gone from the store; restore the file, or "
            "run the DAG again for a new snapshot of the folder as it is now")
