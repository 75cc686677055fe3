"""Dataset versions: the record of each snapshot (``SnapshotInfo``, its ``manifest.json``), where a pipeline's
versions are stored (``snapshots/<pipeline>/<digest16>/``), which were accepted and which is the baseline; and a
snapshot's train and holdout splits as MLflow dataset inputs of the training run.

The ``snapshot`` step writes a version and ``validate`` accepts it; ``trainpipe datasets``, the fleet view,
backtests, ``reproduce`` and ``gc`` read them here.

As MLflow dataset inputs, the run page's Datasets panel names the data the model was trained and judged
on: name (``<pipeline>-train``, ``<pipeline>-holdout``), digest, source, schema and row count. Nothing is
read for it: the schema is the holdout's (both splits come from one frame), the row counts are the
snapshot's.

* digest: MLflow keeps at most 36 characters of a dataset digest, so it holds the first 36 hex
  digits of the snapshot's sha256; the profile carries the whole of it (``snapshot_sha256``), the
  same value as the run's ``trainpipe.dataset_digest`` tag.
* source: for local storage, the file's path relative to the trainpipe storage root
  (``snapshots/<pipeline>/<digest16>/train.parquet``), as no path of the machine belongs in MLflow;
  for a bucket, the full URI (``s3://bucket/prefix/snapshots/...``), which means the same
  everywhere.
"""

from __future__ import annotations

import json
import typing
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.settings import Settings

if TYPE_CHECKING:
    import fsspec
    import pandas as pd
    import pyarrow as pa

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe_trainer.data.manifest import DataManifest, Split

# Next to the versions: the last accepted one, the baseline of the next validation.
BASELINE_FILE = "LATEST.json"
# In a version's folder: when and by which run it last passed validation.
ACCEPTED_FILE = "accepted.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    """A snapshot's manifest: the record of one dataset version.

    ``name`` is the pipeline's dataset, ``digest`` its version (content sha256). The fields after
    ``source_uri`` were added with dataset versions; manifests written before have their defaults.
    """

    digest: str
    uri: str
    train_uri: str
    holdout_uri: str
    rows: int
    train_rows: int
    holdout_rows: int
    window_start: str | None
    window_end: str | None
    source_uri: str
    name: str = ""
    size_bytes: int | None = None
    # The ordered (column, dtype) pairs, and the SHA-256 of them.
    schema: list[list[str]] | None = None
    schema_hash: str | None = None
    split: dict[str, Any] | None = None
    created_by_dag_id: str | None = None
    created_by_run_id: str | None = None
    created_at: str | None = None
    # Multiclass: the label's classes in the window (train and holdout), in output order
    # (trainpipe_trainer.preprocessing.label_class_names); None for other tasks and older versions.
    label_classes: list[str] | None = None
    # "copy": train.parquet and holdout.parquet in the version's folder. "manifest": the version lists the
    # source's files (``data_manifest.json``, trainpipe_trainer.data.manifest); then ``train_uri`` and
    # ``holdout_uri`` are both the manifest's URI (a split is the manifest's units of it: ``read_split``).
    kind: str = "copy"
    manifest_uri: str | None = None

    @property
    def version(self) -> str:
        return self.digest

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SnapshotInfo:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in known})


def versions_root(settings: Settings, pipeline_id: str):
    return storage.storage_root(settings) / "snapshots" / pipeline_id


def version_folder(settings: Settings, pipeline_id: str, digest: str):
    return versions_root(settings, pipeline_id) / digest[:16]


def list_versions(settings: Settings, pipeline_id: str) -> list[tuple[SnapshotInfo, dict[str, Any] | None]]:
    """Every stored version of a pipeline's dataset with its acceptance record (None if never
    accepted), oldest first."""
    root = versions_root(settings, pipeline_id)
    if not root.exists():
        return []
    found = []
    for folder in root.iterdir():
        manifest = folder / "manifest.json"
        if not manifest.exists():
            continue  # LATEST.json, or an interrupted snapshot
        accepted = folder / ACCEPTED_FILE
        found.append((SnapshotInfo.from_dict(storage.read_json(manifest)),
                      storage.read_json(accepted) if accepted.exists() else None))
    return sorted(found, key=lambda pair: (pair[0].created_at or "", pair[0].digest))


def find_version(settings: Settings, pipeline_id: str, prefix: str) -> SnapshotInfo | None:
    """The stored version whose digest starts with ``prefix`` (16 or more hex characters)."""
    manifest = version_folder(settings, pipeline_id, prefix) / "manifest.json"
    if len(prefix) < 16 or not manifest.exists():
        return None
    info = SnapshotInfo.from_dict(storage.read_json(manifest))
    return info if info.digest.startswith(prefix) else None


def baseline_version(settings: Settings, pipeline_id: str) -> dict[str, Any] | None:
    """The last accepted version (``LATEST.json``): digest, rows, uri and, since dataset versions,
    schema; None before any version passed validation."""
    path = versions_root(settings, pipeline_id) / BASELINE_FILE
    return storage.read_json(path) if path.exists() else None


MANIFEST_KIND = "manifest"
COPY_KIND = "copy"


def source_filesystem(uri: str, *, settings: Settings, conn_id: str | None = None) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem that reads a manifest's files: the local one, or the object store through
    ``conn_id`` (default: the storage connection, whose credentials the trainer is given too)."""
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(uri, conn_id=conn_id or settings.storage_conn_id).fs


def load_manifest(snapshot: SnapshotInfo, *, settings: Settings,
                  conn_id: str | None = None) -> tuple[DataManifest, fsspec.AbstractFileSystem]:
    """A manifest version's file list and the filesystem its files are read with (``iter_units``)."""
    from trainpipe_trainer.data.manifest import DataManifest

    if snapshot.kind != MANIFEST_KIND or snapshot.manifest_uri is None:
        raise ValueError(f"dataset version {snapshot.digest[:16]} is a copy, not a manifest; read it with read_split")
    path = storage.resolve_uri(snapshot.manifest_uri, settings, settings.storage_conn_id)
    manifest = DataManifest.loads(storage.read_current_text(path))
    fs = source_filesystem(manifest.source_uri, settings=settings, conn_id=conn_id)
    # fsspec shares filesystem instances within a process, with their listings cached (s3fs): the files are
    # judged against the store as it is now, not as an earlier listing saw it.
    fs.invalidate_cache()
    return manifest, fs


def manifest_file_problems(snapshot: SnapshotInfo, *, settings: Settings, conn_id: str | None = None) -> list[str]:
    """Each file of a manifest version that is gone or changed since the snapshot, one message each naming it
    (a file pinned by its S3 VersionId: only whether that version is still there); empty when all are as
    listed. Sizes, ETags and mtimes only: nothing is read."""
    from concurrent.futures import ThreadPoolExecutor

    from trainpipe_trainer.data.manifest import ManifestFile, changed_file_message, file_change, missing_file_message

    manifest, fs = load_manifest(snapshot, settings=settings, conn_id=conn_id)
    versioned = fs
    if any(entry.version_id for entry in manifest.files) and not getattr(fs, "version_aware", True):
        versioned = type(fs)(**{**fs.storage_options, "version_aware": True})

    def problem(entry: ManifestFile) -> str | None:
        path = fs._strip_protocol(entry.uri)
        try:
            if entry.version_id is not None:
                versioned.info(path, version_id=entry.version_id)
                return None
            change = file_change(entry, fs.info(path))
        except FileNotFoundError:
            return missing_file_message(entry, manifest.digest)
        return changed_file_message(entry, change, manifest.digest) if change is not None else None

    # HEAD requests wait on the store: threads overlap them.
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(manifest.files)))) as pool:
        return [found for found in pool.map(problem, manifest.files) if found is not None]


def read_split(snapshot: SnapshotInfo, split: str, *, settings: Settings, columns: list[str] | None = None,
               max_rows: int | None = None, conn_id: str | None = None) -> pd.DataFrame:
    """One split of a version as a DataFrame, for either kind: a copy's parquet file, or a manifest's units
    read one at a time until ``max_rows`` (None: all). A file of a manifest changed or gone since the
    snapshot raises ``DatasetChangedError`` naming it."""
    if split not in ("train", "holdout"):
        raise ValueError(f"split {split!r}: 'train' or 'holdout'")
    if snapshot.kind != MANIFEST_KIND:
        uri = snapshot.train_uri if split == "train" else snapshot.holdout_uri
        frame = storage.read_parquet_uri(uri, conn_id=settings.storage_conn_id)
        frame = frame[list(columns)] if columns is not None else frame
        return frame.head(max_rows).reset_index(drop=True) if max_rows is not None else frame
    import contextlib

    tables = []
    rows = 0
    # Closed when max_rows stops the loop early: its open files are closed now, not at garbage collection.
    with contextlib.closing(iter_split_tables(snapshot, split, settings=settings, columns=columns,
                                              conn_id=conn_id)) as read:
        for table in read:
            tables.append(table)
            rows += table.num_rows
            if max_rows is not None and rows >= max_rows:
                break
    if not tables:
        return _empty_frame(snapshot, columns)
    import pyarrow as pa

    frame = pa.concat_tables(tables).to_pandas()
    return frame.head(max_rows).reset_index(drop=True) if max_rows is not None else frame


def iter_split_tables(snapshot: SnapshotInfo, split: str, *, settings: Settings, columns: list[str] | None = None,
                      conn_id: str | None = None) -> Iterator[pa.Table]:
    """A manifest version's split as Arrow tables, one row group at a time (bounded memory); a changed or
    missing file raises ``DatasetChangedError`` naming it."""
    from trainpipe.errors import DatasetChangedError
    from trainpipe_trainer.data.reading import iter_units
    from trainpipe_trainer.errors import DataChangedError

    manifest, fs = load_manifest(snapshot, settings=settings, conn_id=conn_id)
    try:
        for _, table in iter_units(fs, manifest, typing.cast("Split", split), columns=columns):
            yield table
    except DataChangedError as err:
        raise DatasetChangedError(str(err)) from err


def _empty_frame(snapshot: SnapshotInfo, columns: list[str] | None) -> pd.DataFrame:
    """An empty split with the version's columns and pandas dtypes (its recorded schema)."""
    import pandas as pd

    frame = pd.DataFrame({name: pd.Series(dtype=kind) for name, kind in (snapshot.schema or [])})
    return frame[list(columns)] if columns is not None else frame


# mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE
MLFLOW_DIGEST_LENGTH = 36
# MLflow's own context values of a dataset input (the Datasets panel shows them).
TRAIN_CONTEXT = "training"
HOLDOUT_CONTEXT = "evaluation"


def dataset_source_uri(uri: str, settings: Settings) -> str:
    """A snapshot file's URI as recorded in MLflow: relative to a local storage root, else as it is."""
    root = storage.fsspec_uri(storage.storage_root(settings)).rstrip("/") + "/"
    if uri.startswith("file://") and uri.startswith(root):
        return uri[len(root):]
    return uri


def snapshot_datasets(pipeline_id: str, snapshot: SnapshotInfo, holdout: pd.DataFrame, *,
                      settings: Settings) -> list[tuple[Any, str]]:
    """``(mlflow.entities.Dataset, context)`` of the train and the holdout split."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset
    from mlflow.models import infer_signature

    with warnings.catch_warnings():
        # MLflow's hint that integer columns cannot hold missing values concerns model signatures.
        warnings.simplefilter("ignore", UserWarning)
        schema = json.dumps({"mlflow_colspec": infer_signature(holdout.head(0)).inputs.to_dict()})
    listed: dict[str, Any] = {}
    if snapshot.kind == MANIFEST_KIND:
        # The source is the manifest (both splits' URI): it names the files, which are not copied.
        manifest, _ = load_manifest(snapshot, settings=settings)
        listed = {"snapshot_kind": MANIFEST_KIND, "num_files": len(manifest.files)}
    splits = (("train", snapshot.train_uri, snapshot.train_rows, TRAIN_CONTEXT),
              ("holdout", snapshot.holdout_uri, snapshot.holdout_rows, HOLDOUT_CONTEXT))
    datasets = []
    for split, uri, rows, context in splits:
        with warnings.catch_warnings():
            # A plain path matches MLflow's local source twice over and it warns that it picked one.
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(dataset_source_uri(uri, settings))
        profile = {"num_rows": rows, "num_elements": rows * len(holdout.columns),
                   "snapshot_sha256": snapshot.digest, "split": split, **listed}
        datasets.append((Dataset(name=f"{pipeline_id}-{split}", digest=snapshot.digest[:MLFLOW_DIGEST_LENGTH],
                                 source_type=source._get_source_type(), source=source.to_json(), schema=schema,
                                 profile=json.dumps(profile)), context))
    return datasets


def log_snapshot_inputs(hook: MlflowHook, mlflow_run_id: str, pipeline_id: str, snapshot: SnapshotInfo,
                        holdout: pd.DataFrame, *, settings: Settings) -> None:
    """Log both splits on the run; a retried task logs the same inputs again, which MLflow keeps once."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [DatasetInput(dataset=dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
              for dataset, context in snapshot_datasets(pipeline_id, snapshot, holdout, settings=settings)]
    hook.client.log_inputs(mlflow_run_id, datasets=inputs)
