"""The ``snapshot`` and ``validate`` steps: an immutable copy of the input window, then its checks.

The holdout split is by a hash of each row (of the query id for ranking), not by a seeded shuffle:
a row that was held out yesterday is held out today, so the champion trained yesterday is never
scored on rows it trained on.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import SpecError, ValidationFailedError
from trainpipe.settings import Settings
from trainpipe.plan import DataPlan, ValidationPlan

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

_HOLDOUT_BUCKETS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        raise SpecError(f"data.time_column: column {data.time_column!r} is not in {data.uri}; columns are {list(frame.columns)}")
    times = pd.to_datetime(frame[data.time_column], utc=True)
    end = pd.Timestamp(logical_date).tz_convert("UTC") if pd.Timestamp(logical_date).tzinfo else pd.Timestamp(logical_date, tz="UTC")
    start = end - pd.Timedelta(data.window)
    window = frame[(times > start) & (times <= end)].reset_index(drop=True)
    return window, start.isoformat(), end.isoformat()


def take_snapshot(pipeline_id: str, data: DataPlan, *, settings: Settings, logical_date: datetime) -> SnapshotInfo:
    source = storage.resolve_uri(data.uri, settings, data.conn_id)
    frame = storage.read_table(source, data.format)
    window, window_start, window_end = _cut_window(frame, data, logical_date)
    # Stable row order, so the same rows always give the same digest and files.
    window = window.sort_values(list(window.columns), kind="stable").reset_index(drop=True)
    digest = content_digest(window)
    folder = storage.storage_root(settings) / "snapshots" / pipeline_id / digest[:16]
    mask = holdout_mask(window, data)
    train, holdout = window[~mask].reset_index(drop=True), window[mask].reset_index(drop=True)
    manifest = folder / "manifest.json"
    info = SnapshotInfo(
        digest=digest,
        uri=str(folder),
        train_uri=storage.fsspec_uri(folder / "train.parquet"),
        holdout_uri=storage.fsspec_uri(folder / "holdout.parquet"),
        rows=len(window),
        train_rows=len(train),
        holdout_rows=len(holdout),
        window_start=window_start,
        window_end=window_end,
        source_uri=str(source),
    )
    if manifest.exists():
        log.info("snapshot %s already exists with the same content; reusing it", folder)
    else:
        storage.write_parquet_once(folder / "train.parquet", train)
        storage.write_parquet_once(folder / "holdout.parquet", holdout)
        # The manifest is written last: a folder without it is an interrupted snapshot.
        storage.write_json(manifest, info.to_dict(), overwrite=False)
    log.info("snapshot %s: %d rows (%d train, %d holdout), window %s .. %s, sha256 %s",
             folder, info.rows, info.train_rows, info.holdout_rows, window_start, window_end, digest)
    return info


def validate_snapshot(pipeline_id: str, validation: ValidationPlan, snapshot: SnapshotInfo, *,
                      settings: Settings) -> dict[str, Any]:
    """Run the spec's Great Expectations suite and the volume check; raise when anything fails."""
    import pandas as pd

    from trainpipe import quality
    from airflow.sdk import ObjectStoragePath

    folder = ObjectStoragePath(snapshot.uri, conn_id=settings.storage_conn_id)
    frame = pd.concat(
        [storage.read_table(folder / "train.parquet"), storage.read_table(folder / "holdout.parquet")], ignore_index=True
    )
    report = quality.validate_dataframe(
        frame, expectations=list(validation.expectations), required_columns=list(validation.required_columns))
    log.info("data quality of snapshot %s:\n%s", snapshot.digest[:16], report.summary())
    failures = [] if report.success else ["Great Expectations suite failed (see the lines above)"]

    latest_path = storage.storage_root(settings) / "snapshots" / pipeline_id / "LATEST.json"
    previous = storage.read_json(latest_path) if latest_path.exists() else None
    change = quality.volume_change(snapshot.rows, previous["rows"] if previous else None)
    limit = validation.max_volume_change
    if change is None:
        log.info("volume check: no previous validated snapshot; %d rows", snapshot.rows)
    else:
        verdict = "PASS" if limit is None or change <= limit else "FAIL"
        log.info("volume check %s: %d rows vs %d in snapshot %s (change %.1f%%, limit %s)", verdict, snapshot.rows,
                 previous["rows"], previous["digest"][:16], change * 100, f"{limit:.0%}" if limit is not None else "none")
        if verdict == "FAIL":
            failures.append(f"row count changed by {change:.1%} vs the previous snapshot (limit {limit:.0%})")
    if failures:
        raise ValidationFailedError(f"snapshot {snapshot.digest[:16]} of {pipeline_id} failed validation: " + "; ".join(failures))
    storage.write_json(latest_path, {"digest": snapshot.digest, "rows": snapshot.rows, "uri": snapshot.uri})
    return {"success": True, "rows": snapshot.rows, "volume_change": change,
            "expectations": [{"name": o.name, "success": o.success, "observed": o.observed} for o in report.outcomes]}
