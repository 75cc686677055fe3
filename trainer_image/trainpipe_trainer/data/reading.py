"""Reading a manifest's row groups, each file checked against the manifest first (or opened by its S3
VersionId): a file changed after the snapshot stops the reader with ``DataChangedError`` naming it, never
silently different data. pyarrow and fsspec; used by the provider's validate step and the trainer alike.
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from trainpipe_trainer.data.manifest import (
    DataManifest,
    ManifestFile,
    Split,
    Unit,
    changed_file_message,
    file_change,
    missing_file_message,
)
from trainpipe_trainer.errors import DataChangedError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq


def _versioned(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """The same store, able to open an object by VersionId (s3fs needs ``version_aware`` for it)."""
    if getattr(fs, "version_aware", True):
        return fs
    return type(fs)(**{**fs.storage_options, "version_aware": True})


def open_checked(fs: fsspec.AbstractFileSystem, entry: ManifestFile, digest: str) -> Any:
    """A binary handle on the file as the manifest recorded it."""
    path = fs._strip_protocol(entry.uri)
    try:
        if entry.version_id is not None and hasattr(fs, "version_aware"):
            return _versioned(fs).open(path, "rb", version_id=entry.version_id)
        # refresh: a listing cached by the filesystem (s3fs) would show the file as the snapshot saw it.
        change = file_change(entry, fs.info(path, refresh=True))
    except FileNotFoundError:
        raise DataChangedError(missing_file_message(entry, digest)) from None
    if change is not None:
        raise DataChangedError(changed_file_message(entry, change, digest))
    if isinstance(fs, LocalFileSystem):
        import pyarrow as pa

        # Arrow's own file reads a row group at half the cost of a Python file object (no bytes objects between).
        # Read, not memory-mapped: a file cut short while open fails a read (judged as changed), where a mapping
        # would kill the process.
        return pa.OSFile(path)
    return fs.open(path, "rb")


class UnitReader:
    """Reads row groups of one manifest, keeping the last few files open (one footer read per file)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, manifest: DataManifest, *, columns: Sequence[str] | None = None,
                 open_files: int = 4) -> None:
        self.fs, self.manifest, self.columns, self.limit = fs, manifest, list(columns) if columns else None, open_files
        self._open: OrderedDict[int, tuple[Any, pq.ParquetFile]] = OrderedDict()

    def _file(self, index: int) -> pq.ParquetFile:
        import pyarrow.parquet as pq

        if index in self._open:
            self._open.move_to_end(index)
            return self._open[index][1]
        entry = self.manifest.files[index]
        handle = open_checked(self.fs, entry, self.manifest.digest)
        parquet = pq.ParquetFile(handle, pre_buffer=False)
        groups = tuple(parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups))
        if groups != entry.row_groups:
            handle.close()
            raise DataChangedError(changed_file_message(entry, "its row groups differ", self.manifest.digest))
        self._open[index] = (handle, parquet)
        while len(self._open) > self.limit:
            _, (old, _) = self._open.popitem(last=False)
            old.close()
        return parquet

    def read(self, unit: Unit) -> pa.Table:
        """One row group. A failed read is judged against the manifest again: a file rewritten while it was open
        reads as garbage or (s3fs, pinned to the ETag it opened) fails, and is then named as changed."""
        import pyarrow as pa

        try:
            return self._file(unit.file).read_row_group(unit.row_group, columns=self.columns, use_threads=False)
        except (OSError, pa.ArrowException) as err:
            changed = self._changed(unit, err)
            if changed is None:
                raise
            raise changed from err

    def _changed(self, unit: Unit, err: Exception) -> DataChangedError | None:
        entry, digest = self.manifest.files[unit.file], self.manifest.digest
        if isinstance(err, OSError) and err.errno == errno.EBUSY:  # s3fs FileExpired: replaced mid-read
            return DataChangedError(changed_file_message(entry, "replaced while being read", digest))
        try:
            change = file_change(entry, self.fs.info(self.fs._strip_protocol(entry.uri), refresh=True))
        except FileNotFoundError:
            return DataChangedError(missing_file_message(entry, digest))
        return DataChangedError(changed_file_message(entry, change, digest)) if change is not None else None

    def close(self) -> None:
        while self._open:
            _, (handle, _) = self._open.popitem()
            handle.close()

    def __enter__(self) -> UnitReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_units(fs: fsspec.AbstractFileSystem, manifest: DataManifest, split: Split | None = None, *,
               columns: Sequence[str] | None = None,
               skipped: list[str] | None = None) -> Iterator[tuple[Unit, pa.Table]]:
    """Every row group of the split (None: both) in manifest order, one at a time (bounded memory). With
    ``skipped``, a file changed or gone since the snapshot is left out (its message appended there) instead of
    stopping the read."""
    units = (manifest.units(split) if split is not None
             else sorted(manifest.units("train") + manifest.units("holdout"), key=lambda u: (u.file, u.row_group)))
    left_out: set[int] = set()
    with UnitReader(fs, manifest, columns=columns) as reader:
        for unit in units:
            if unit.file in left_out:
                continue
            try:
                table = reader.read(unit)
            except DataChangedError as err:
                if skipped is None:
                    raise
                left_out.add(unit.file)
                skipped.append(str(err).split("; ", 1)[0])
                continue
            yield unit, table
