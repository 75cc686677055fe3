"""The ``snapshot`` step: an immutable, content-addressed dataset version of the input window
(``trainpipe.state.datasets``); ``validate`` checks it (``trainpipe.steps.validate``).

A version is either a copy of the window (``train.parquet``/``holdout.parquet``) or, for data larger than
memory, a manifest of the source's parquet files (``data.snapshot: manifest``, or ``auto`` on a folder of
256 MiB or more): each file's size, ETag/VersionId or mtime, row groups and schema, read from listings and
footers only (``trainpipe_trainer.data.manifest``). Readers check each file against it before use.

A copy's holdout split is by a hash of each row (of the query id for ranking), not by a seeded shuffle:
a row that was held out yesterday is held out today, so the champion trained yesterday is never
scored on rows it trained on. A manifest's holdout is chosen the same way per row group (a hash of the
file's relative path and the row group's index).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import SpecError, StorageConflictError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.state.datasets import MANIFEST_KIND, SnapshotInfo, version_folder

if TYPE_CHECKING:
    import fsspec
    import pandas as pd
    import pyarrow as pa

    from trainpipe_trainer.data.manifest import DataManifest

log = logging.getLogger(__name__)

_HOLDOUT_BUCKETS = 10_000


def content_digest(frame: pd.DataFrame) -> str:
    """sha256 of the rows' contents, column names and dtypes (independent of parquet encoding)."""
    import pandas as pd

    digest = hashlib.sha256()
    digest.update(repr([(str(c), str(t)) for c, t in frame.dtypes.items()]).encode())
    digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return digest.hexdigest()


def holdout_mask(frame: pd.DataFrame, data: DataPlan) -> Any:
    import pandas as pd

    if data.holdout_key:
        hashes = pd.util.hash_pandas_object(frame[data.holdout_key], index=False).to_numpy()
    else:
        hashes = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return (hashes % _HOLDOUT_BUCKETS) < int(data.holdout_fraction * _HOLDOUT_BUCKETS)


def _cut_window(frame: pd.DataFrame, data: DataPlan, logical_date: datetime) -> tuple[pd.DataFrame, str | None, str | None]:
    import pandas as pd

    if data.window is None or data.time_column is None:
        return frame, None, None
    if data.time_column not in frame.columns:
        # The columns are not listed: the URI may name any file, and its header is its content.
        raise SpecError(f"data.time_column: column {data.time_column!r} is not in {data.uri} "
                        f"({len(frame.columns)} columns); check data.uri and data.time_column")
    try:
        times = pd.to_datetime(frame[data.time_column], utc=True)
    except (ValueError, TypeError, OverflowError) as error:  # pandas quotes the value it could not parse
        raise SpecError(f"data.time_column: column {data.time_column!r} of {data.uri} does not hold dates and times "
                        f"({type(error).__name__}); check data.time_column") from None
    stamp = pd.Timestamp(logical_date)
    end = stamp.tz_convert("UTC") if stamp.tzinfo else pd.Timestamp(logical_date, tz="UTC")
    start = end - pd.Timedelta(data.window)
    window = frame[(times > start) & (times <= end)].reset_index(drop=True)
    return window, start.isoformat(), end.isoformat()


def _window_text(start: str | None, end: str | None) -> str:
    return f"{start} .. {end}" if start or end else "(the whole source, no time_column)"


def _located(data: DataPlan, message: str) -> SpecError:
    """An error at the spec's data.uri: the user's fix is there."""
    from trainpipe.errors import SpecProblem

    file, line, column = data.uri_declared_at
    return SpecError([SpecProblem(file, line, column, "data.uri", message)])


def _require_source_exists(data: DataPlan, source: Any) -> None:
    if not source.exists():
        raise _located(data, f"{data.uri} does not exist (read as {storage.fsspec_uri(source)}); fix data.uri: a "
                             "path relative to the storage root, or a file:// or s3:// URI")


def _read_source(data: DataPlan, source: Any) -> pd.DataFrame:
    """The input table; a missing or unreadable one is a located error at the spec's data.uri (the
    user's fix), raised before anything is written or launched."""
    from trainpipe.errors import DataReadError

    def located(message: str) -> SpecError:
        return _located(data, message)

    _require_source_exists(data, source)
    try:
        return storage.read_table(source, data.format)
    except DataReadError as err:
        raise located(f"{err}") from None
    except OSError as err:
        raise located(f"{data.uri} cannot be read ({err.strerror or type(err).__name__}); check data.uri and the "
                      "storage's permissions") from None


def _label_classes(window: pd.DataFrame, label: str, data: DataPlan) -> list[str] | None:
    """The window's classes of a multiclass label; None when the label cannot give them (the train step's
    input check then reports the column at the spec's label line)."""
    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import label_class_names

    if label not in window.columns:
        return None
    try:
        return list(label_class_names(window[label], label=label, source=data.uri))
    except TrainerDataError:
        return None


def take_snapshot(pipeline_id: str, data: DataPlan, *, settings: Settings, logical_date: datetime,
                  dag_id: str | None = None, run_id: str | None = None,
                  class_label: str | None = None) -> SnapshotInfo:
    """Snapshot the window as a dataset version; identical content is stored once (its first
    manifest, with the run that created it, is kept and returned). ``class_label``: a multiclass
    label column, whose classes the version records."""
    from trainpipe.steps.validate import drift

    source = storage.resolve_uri(data.uri, settings, data.conn_id)
    if data.allowed_uris is not None:  # under a policy: checked here again, with this worker's storage root
        storage.require_allowed(data.uri, source, data.allowed_uris, settings)
    else:  # without one, local data only under the storage root (links followed)
        storage.require_inside_root(data.uri, source, settings)
    listed = _manifest_listing(data, source, settings)
    if listed is not None:
        return _take_manifest_snapshot(pipeline_id, data, source, listed, settings=settings, dag_id=dag_id,
                                       run_id=run_id)
    frame = _read_source(data, source)
    window, window_start, window_end = _cut_window(frame, data, logical_date)
    # Stable row order, so the same rows always give the same digest and files.
    window = window.sort_values(list(window.columns), kind="stable").reset_index(drop=True)
    digest = content_digest(window)
    folder = version_folder(settings, pipeline_id, digest)
    manifest = folder / "manifest.json"
    if manifest.exists():
        info = SnapshotInfo.from_dict(storage.read_json(manifest))
        # This run's window first: the manifest keeps the window of the run that stored the rows.
        log.info("dataset version %s: this run's window %s holds the same rows as the stored version (created by "
                 "%s at %s for the window %s); reusing it", digest[:16], _window_text(window_start, window_end),
                 info.created_by_run_id or "an earlier run", info.created_at or "an unknown time",
                 _window_text(info.window_start, info.window_end))
    else:
        mask = holdout_mask(window, data)
        train, holdout = window[~mask].reset_index(drop=True), window[mask].reset_index(drop=True)
        storage.write_parquet_once(folder / "train.parquet", train)
        storage.write_parquet_once(folder / "holdout.parquet", holdout)
        schema = drift.frame_schema(window)
        info = SnapshotInfo(
            digest=digest,
            # Plain URIs (the connection is the setting's, not part of the text): other tools accept them.
            uri=storage.fsspec_uri(folder),
            train_uri=storage.fsspec_uri(folder / "train.parquet"),
            holdout_uri=storage.fsspec_uri(folder / "holdout.parquet"),
            rows=len(window),
            train_rows=len(train),
            holdout_rows=len(holdout),
            window_start=window_start,
            window_end=window_end,
            source_uri=storage.fsspec_uri(source),
            name=pipeline_id,
            size_bytes=sum((folder / part).stat().st_size for part in ("train.parquet", "holdout.parquet")),
            schema=[list(column) for column in schema],
            schema_hash=drift.schema_hash(schema),
            split={"holdout_fraction": data.holdout_fraction, "holdout_key": data.holdout_key,
                   "method": f"hash of {'column ' + data.holdout_key if data.holdout_key else 'each row'} "
                             f"mod {_HOLDOUT_BUCKETS}"},
            created_by_dag_id=dag_id,
            created_by_run_id=run_id,
            created_at=datetime.now(UTC).isoformat(timespec="microseconds"),  # orders versions made within a second
            label_classes=_label_classes(window, class_label, data) if class_label is not None else None,
        )
        # The manifest is written last: a folder without it is an interrupted snapshot.
        storage.write_json(manifest, info.to_dict(), overwrite=False)
    log.info("dataset version %s of %s: %d rows (%d train, %d holdout), window %s .. %s, schema %s, stored at %s",
             digest[:16], pipeline_id, info.rows, info.train_rows, info.holdout_rows, info.window_start,
             info.window_end, (info.schema_hash or "unknown")[:16], storage.shown_uri(folder))
    return info


# --- manifest versions: the source's files listed, nothing copied ---------------------------------------------

# Footers are small reads that wait on the store: threads overlap them (1,000 files in about the listing's time).
_FOOTER_THREADS = 32


@dataclass(frozen=True, slots=True)
class _Listed:
    """One parquet file of the source as the listing gave it."""

    name: str  # the filesystem's path (no protocol)
    path: str  # relative to the source folder: the file's name in the version
    size: int
    etag: str | None
    version_id: str | None
    mtime: float | None


def _source_fs(source: Any) -> fsspec.AbstractFileSystem:
    """The source's filesystem; on S3 version-aware, so the listing gives each object's VersionId (one
    ListObjectVersions pass instead of a HEAD per file) and a footer is read from that very version."""
    fs = source.fs
    if source.protocol == "file" or getattr(fs, "version_aware", True):
        return fs
    return type(fs)(**{**fs.storage_options, "version_aware": True})


def _hidden(relative: str) -> bool:
    # Spark's _SUCCESS, Delta's _delta_log/, editors' and uploaders' .files: not data files.
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def _list_parquet(source: Any, fs: fsspec.AbstractFileSystem) -> list[_Listed]:
    """Every ``*.parquet`` file under the source folder (or the source file itself), by relative path."""
    base = fs._strip_protocol(source.path).rstrip("/")
    if not source.is_dir():
        info = fs.info(base)
        return [_listed(base, base.rsplit("/", 1)[-1], info)]
    found = []
    for name, info in fs.find(base, detail=True).items():
        relative = name[len(base) + 1:] if name.startswith(base + "/") else name
        # A local link lists as "other" (fsspec does not follow it): kept, so the root/policy check judges it.
        if info.get("type") != "file" and not info.get("islink"):
            continue
        if not relative.endswith(".parquet") or _hidden(relative):
            continue
        found.append(_listed(name, relative, info))
    return sorted(found, key=lambda entry: entry.path)


def _listed(name: str, relative: str, info: dict[str, Any]) -> _Listed:
    etag = info.get("ETag") or info.get("etag")
    version = info.get("VersionId")
    mtime = info.get("mtime")
    return _Listed(name=name, path=relative, size=int(info["size"]), etag=etag.strip('"') if etag else None,
                   # An unversioned bucket lists VersionId "null": then the ETag identifies the bytes.
                   version_id=version if version and version != "null" else None,
                   mtime=float(mtime) if mtime is not None else None)


def _manifest_listing(data: DataPlan, source: Any, settings: Settings) -> list[_Listed] | None:
    """The files a manifest version lists, or None for a copy: ``data.snapshot`` decides, and ``auto``
    by the listed sizes alone (a folder of parquet files of ``plan.model.AUTO_MANIFEST_BYTES`` or more)."""
    from trainpipe.plan import model

    if data.snapshot == "copy":
        return None
    if data.snapshot != "manifest":
        # auto: only where a manifest gives the same version a copy would (whole files, no window).
        if data.format != "parquet" or data.window is not None or data.time_column is not None:
            return None
        if data.holdout_key is not None:  # ranking: a held-out query must be whole, which row groups cannot promise
            return None
        if data.conn_id is not None and data.conn_id != settings.storage_conn_id:
            # Readers open a manifest's files with the storage connection (a copy is read once, here).
            return None
        if not source.exists() or not source.is_dir():
            return None
        listed = _list_parquet(source, _source_fs(source))
        if sum(entry.size for entry in listed) < model.AUTO_MANIFEST_BYTES:
            return None
        log.info("data.snapshot auto: %d parquet files, %d bytes under %s: a manifest version (no copy)",
                 len(listed), sum(entry.size for entry in listed), storage.shown_uri(source))
    else:
        if data.window is not None or data.time_column is not None or data.format != "parquet":
            # The spec stage refuses these; a plan built another way is refused here, before any read.
            raise _located(data, "data.snapshot manifest versions whole parquet files: no data.window, "
                                 "data.time_column or csv; point data.uri at the window's own folder or prefix, "
                                 "or use data.snapshot: copy")
        if data.holdout_key is not None:
            raise _located(data, "data.snapshot manifest splits the holdout by row group, which would cut queries "
                                 "in two; ranking takes data.snapshot: copy")
        if data.conn_id is not None and data.conn_id != settings.storage_conn_id:
            raise _located(data, f"data.snapshot manifest: the trainer and every step read the listed files with "
                                 f"trainpipe's storage connection ({settings.storage_conn_id or 'none'}), not "
                                 f"data.conn_id {data.conn_id!r}; drop data.conn_id (grant the storage connection "
                                 "read access to the source) or use data.snapshot: copy")
        _require_source_exists(data, source)
        listed = _list_parquet(source, _source_fs(source))
    if not listed:
        raise _located(data, f"{data.uri} holds no parquet files (names starting with _ or . are skipped); a "
                             "manifest version needs at least one: fix data.uri")
    return _require_listed_allowed(data, source, listed, settings)


def _require_listed_allowed(data: DataPlan, source: Any, listed: list[_Listed], settings: Settings) -> list[_Listed]:
    """Every listed local file passes the check its folder passed, by real path (links followed), before
    any footer is read: a link in the folder to a file outside the root or the policy is refused, unread.
    A link that passes is recorded as its target (size, mtime), as a reader's ``info`` of it sees it."""
    if source.protocol != "file":
        return listed  # objects are read by the connection the policy judged for the prefix; no links
    real_folder = os.path.realpath(source.path)
    if not source.is_dir():
        real_folder = os.path.dirname(real_folder)
    checked = []
    for entry in listed:
        if os.path.realpath(entry.name) == os.path.join(real_folder, entry.path):
            checked.append(entry)  # no link on the way: inside the folder already judged
            continue
        member_uri = f"file://{entry.name}"
        member = storage.resolve_uri(member_uri, settings)
        if data.allowed_uris is not None:
            storage.require_allowed(member_uri, member, data.allowed_uris, settings)
        else:
            storage.require_inside_root(member_uri, member, settings)
        try:
            target = os.stat(entry.name)
        except FileNotFoundError:
            raise _located(data, f"{entry.path} of {data.uri} is a link to nothing; remove it or restore its "
                                 "target") from None
        if not stat.S_ISREG(target.st_mode):
            continue  # a link to a folder or a device: not a data file
        checked.append(_Listed(name=entry.name, path=entry.path, size=target.st_size, etag=None, version_id=None,
                               mtime=target.st_mtime))
    if not checked:
        raise _located(data, f"{data.uri} holds no parquet files; fix data.uri")
    return checked


def _footer(fs: fsspec.AbstractFileSystem, entry: _Listed) -> tuple[tuple[int, ...], pa.Schema]:
    import pyarrow.parquet as pq

    # A small block: only the footer is read, whatever the file's size.
    options: dict[str, Any] = {"block_size": 1 << 20}
    if entry.version_id is not None:
        options["version_id"] = entry.version_id
    with fs.open(entry.name, "rb", **options) as handle:
        metadata = pq.ParquetFile(handle).metadata
        schema = metadata.schema.to_arrow_schema()
        return tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)), schema


def _schema_pairs(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    return tuple((field.name, str(field.type)) for field in schema)


def _schema_difference(first: tuple[tuple[str, str], ...], other: tuple[tuple[str, str], ...]) -> str:
    a, b = dict(first), dict(other)
    parts = [f"missing {name} ({a[name]})" for name in a if name not in b]
    parts += [f"extra {name} ({b[name]})" for name in b if name not in a]
    parts += [f"{name} is {b[name]}, not {a[name]}" for name in a if name in b and a[name] != b[name]]
    return ", ".join(parts) or "the same columns in another order"


def _read_footers(data: DataPlan, fs: fsspec.AbstractFileSystem,
                  listed: list[_Listed]) -> list[tuple[tuple[int, ...], pa.Schema]]:
    def read(entry: _Listed) -> tuple[tuple[int, ...], pa.Schema]:
        try:
            return _footer(fs, entry)
        except FileNotFoundError:
            raise _located(data, f"{entry.path} of {data.uri} was removed while the snapshot listed it; run "
                                 "the snapshot again once the folder is complete") from None
        except OSError as err:
            raise _located(data, f"{entry.path} of {data.uri} cannot be read ({err.strerror or type(err).__name__})"
                                 "; check the storage's permissions") from None
        except Exception as err:  # pyarrow's parse errors quote bytes: the kind only
            raise _located(data, f"{entry.path} of {data.uri}: not a readable parquet file "
                                 f"({type(err).__name__}); remove it from the folder or fix it") from None

    with ThreadPoolExecutor(max_workers=max(1, min(_FOOTER_THREADS, len(listed)))) as pool:
        return list(pool.map(read, listed))


def _build_manifest(data: DataPlan, source: Any, fs: fsspec.AbstractFileSystem,
                    listed: list[_Listed]) -> tuple[DataManifest, pa.Schema]:
    from trainpipe_trainer.data.manifest import DataManifest, ManifestFile, holdout_row_groups

    footers = _read_footers(data, fs, listed)
    first_schema = footers[0][1]
    first = _schema_pairs(first_schema)
    for entry, (_, schema) in zip(listed, footers, strict=True):
        pairs = _schema_pairs(schema)
        if pairs != first:
            raise _located(data, f"{entry.path} of {data.uri} has another schema than {listed[0].path} "
                                 f"({_schema_difference(first, pairs)}); every file of a manifest version has "
                                 "one schema: rewrite or move the odd file")
    schema_hash = hashlib.sha256(json.dumps([list(p) for p in first], separators=(",", ":")).encode()).hexdigest()
    held = holdout_row_groups([(entry.path, len(groups)) for entry, (groups, _) in zip(listed, footers, strict=True)],
                              data.holdout_fraction)
    files = tuple(
        ManifestFile(uri=fs.unstrip_protocol(entry.name), path=entry.path, size=entry.size, rows=sum(groups),
                     row_groups=groups, holdout_row_groups=holdout, schema_hash=schema_hash, etag=entry.etag,
                     version_id=entry.version_id, mtime=entry.mtime if source.protocol == "file" else None)
        for entry, (groups, _), holdout in zip(listed, footers, held, strict=True))
    manifest = DataManifest(source_uri=storage.fsspec_uri(source), files=files, schema=first,
                            holdout_fraction=data.holdout_fraction)
    return manifest, first_schema


def _write_bytes_once(path: Any, payload: bytes) -> None:
    """A version's file is never rewritten: the same bytes again are a no-op, other bytes a conflict."""
    if path.exists():
        if path.read_bytes() != payload:
            raise StorageConflictError(f"{storage.shown_uri(path)} already holds different content; refusing to "
                                       "overwrite it")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.write(payload)


def _take_manifest_snapshot(pipeline_id: str, data: DataPlan, source: Any, listed: list[_Listed], *,
                            settings: Settings, dag_id: str | None, run_id: str | None) -> SnapshotInfo:
    from trainpipe.steps.validate import drift
    from trainpipe_trainer.data.manifest import MANIFEST_FILE

    manifest, arrow_schema = _build_manifest(data, source, _source_fs(source), listed)
    folder = version_folder(settings, pipeline_id, manifest.digest)
    record = folder / "manifest.json"
    if record.exists():
        info = SnapshotInfo.from_dict(storage.read_json(record))
        log.info("dataset version %s: the same %d files as the stored manifest version (created by %s at %s); "
                 "reusing it", manifest.digest[:16], len(manifest.files), info.created_by_run_id or "an earlier run",
                 info.created_at or "an unknown time")
        return info
    manifest_path = folder / MANIFEST_FILE
    _write_bytes_once(manifest_path, manifest.dumps())
    schema = drift.frame_schema(arrow_schema.empty_table().to_pandas())
    manifest_uri = storage.fsspec_uri(manifest_path)
    info = SnapshotInfo(
        digest=manifest.digest,
        uri=storage.fsspec_uri(folder),
        # Both splits are the manifest's units of them (trainpipe.state.datasets.read_split).
        train_uri=manifest_uri,
        holdout_uri=manifest_uri,
        rows=manifest.rows(),
        train_rows=manifest.rows("train"),
        holdout_rows=manifest.rows("holdout"),
        window_start=None,
        window_end=None,
        source_uri=manifest.source_uri,
        name=pipeline_id,
        size_bytes=manifest.size_bytes,
        schema=[list(column) for column in schema],
        schema_hash=drift.schema_hash(schema),
        split={"holdout_fraction": data.holdout_fraction, "holdout_key": None,
               "method": f"row groups by a hash of (file path, row group index) mod {_HOLDOUT_BUCKETS}"},
        created_by_dag_id=dag_id,
        created_by_run_id=run_id,
        created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        # Listing and footers only: the classes would need the label column read (the train step does it).
        label_classes=None,
        kind=MANIFEST_KIND,
        manifest_uri=manifest_uri,
    )
    # The record is written last: a folder without it is an interrupted snapshot.
    storage.write_json(record, info.to_dict(), overwrite=False)
    log.info("dataset version %s of %s: a manifest of %d files, %d rows (%d train, %d holdout in %d row groups), "
             "%d bytes, schema %s, stored at %s", manifest.digest[:16], pipeline_id, len(manifest.files), info.rows,
             info.train_rows, info.holdout_rows, len(manifest.units("holdout")), manifest.size_bytes,
             (info.schema_hash or "")[:16], storage.shown_uri(folder))
    return info
