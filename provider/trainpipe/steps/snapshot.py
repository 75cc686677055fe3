"""The ``snapshot`` step: an immutable, content-addressed copy of the input window, stored as a dataset version
(``trainpipe.state.datasets``); ``validate`` checks it (``trainpipe.steps.validate``).

The holdout split is by a hash of each row (of the query id for ranking), not by a seeded shuffle:
a row that was held out yesterday is held out today, so the champion trained yesterday is never
scored on rows it trained on.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import SpecError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.state.datasets import SnapshotInfo, version_folder

if TYPE_CHECKING:
    import pandas as pd

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


def _read_source(data: DataPlan, source: Any) -> pd.DataFrame:
    """The input table; a missing or unreadable one is a located error at the spec's data.uri (the
    user's fix), raised before anything is written or launched."""
    from trainpipe.errors import DataReadError, SpecError, SpecProblem

    def located(message: str) -> SpecError:
        file, line, column = data.uri_declared_at
        return SpecError([SpecProblem(file, line, column, "data.uri", message)])

    if not source.exists():
        raise located(f"{data.uri} does not exist (read as {storage.fsspec_uri(source)}); fix data.uri: a path "
                      "relative to the storage root, or a file:// or s3:// URI")
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
