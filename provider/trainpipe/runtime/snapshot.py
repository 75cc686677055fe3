"""The ``snapshot`` and ``validate`` steps: an immutable copy of the input window, then its checks.

The holdout split is by a hash of each row (of the query id for ranking), not by a seeded shuffle:
a row that was held out yesterday is held out today, so the champion trained yesterday is never
scored on rows it trained on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import SpecError, ValidationFailedError
from trainpipe.plan.model import DataPlan, ValidationPlan
from trainpipe.settings import Settings

if TYPE_CHECKING:
    import pandas as pd

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.steps.validate.drift import DriftReport

log = logging.getLogger(__name__)

_HOLDOUT_BUCKETS = 10_000
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

    @property
    def version(self) -> str:
        return self.digest

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SnapshotInfo:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in known})


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


def take_snapshot(pipeline_id: str, data: DataPlan, *, settings: Settings, logical_date: datetime,
                  dag_id: str | None = None, run_id: str | None = None) -> SnapshotInfo:
    """Snapshot the window as a dataset version; identical content is stored once (its first
    manifest, with the run that created it, is kept and returned)."""
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
        )
        # The manifest is written last: a folder without it is an interrupted snapshot.
        storage.write_json(manifest, info.to_dict(), overwrite=False)
    log.info("dataset version %s of %s: %d rows (%d train, %d holdout), window %s .. %s, schema %s, stored at %s",
             digest[:16], pipeline_id, info.rows, info.train_rows, info.holdout_rows, info.window_start,
             info.window_end, (info.schema_hash or "unknown")[:16], storage.shown_uri(folder))
    return info


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


def _read_version_frame(settings: Settings, uri: str) -> pd.DataFrame:
    import pandas as pd
    from airflow.sdk import ObjectStoragePath

    folder = ObjectStoragePath(uri, conn_id=settings.storage_conn_id)
    return pd.concat(
        [storage.read_table(folder / "train.parquet"), storage.read_table(folder / "holdout.parquet")], ignore_index=True
    )


def validate_snapshot(pipeline_id: str, validation: ValidationPlan, snapshot: SnapshotInfo, *,
                      settings: Settings, dag_id: str | None = None, run_id: str | None = None,
                      hook: MlflowHook | None = None, move_baseline: bool = True) -> dict[str, Any]:
    """Run the spec's Great Expectations suite, the volume, schema and drift checks against the
    baseline (the last accepted version); raise when anything fails, else accept the version (and,
    unless ``move_baseline`` is False, as for a backtest, make it the baseline).

    With ``hook`` and ``run_id``, drift results go to the DAG run's MLflow run (the one training
    then uses): metrics ``drift_psi.<feature>``, ``drift_ks.<feature>`` and ``drift/drift_report.html``.
    """
    from trainpipe.steps.validate import drift, quality

    frame = _read_version_frame(settings, snapshot.uri)
    report = quality.validate_dataframe(
        frame, expectations=list(validation.expectations), required_columns=list(validation.required_columns))
    log.info("data quality of snapshot %s:\n%s", snapshot.digest[:16], report.summary())
    failures = [] if report.success else ["Great Expectations suite failed (see the lines above)"]
    # The same failures in a few words each, for the run's note.
    notes = [quality.note_text(outcome) for outcome in report.failures]

    baseline = baseline_version(settings, pipeline_id)
    change = quality.volume_change(snapshot.rows, baseline["rows"] if baseline else None)
    limit = validation.max_volume_change
    if change is None:
        log.info("volume check: no previous validated snapshot; %d rows", snapshot.rows)
    else:
        verdict = "PASS" if limit is None or change <= limit else "FAIL"
        log.info("volume check %s: %d rows vs %d in snapshot %s (change %.1f%%, limit %s)", verdict, snapshot.rows,
                 baseline["rows"], baseline["digest"][:16], change * 100, f"{limit:.0%}" if limit is not None else "none")
        if verdict == "FAIL":
            failures.append(f"row count changed by {change:.1%} vs the previous snapshot (limit {limit:.0%})")
            signed = -change if snapshot.rows < baseline["rows"] else change
            notes.append(f"row count {baseline['rows']} -> {snapshot.rows} ({signed:+.1%} vs version "
                         f"{baseline['digest'][:16]}, limit {limit:.0%})")

    current_schema = snapshot.schema or [list(column) for column in drift.frame_schema(frame)]
    diff = None
    if baseline is None:
        log.info("schema check: no accepted version yet; this one (schema %s) becomes the baseline if it passes",
                 drift.schema_hash(current_schema)[:16])
    else:
        baseline_schema = baseline.get("schema") or [list(c) for c in drift.frame_schema(
            _read_version_frame(settings, baseline["uri"]).head(0))]
        diff = drift.schema_diff(baseline_schema, current_schema)
        schema_failures, schema_warnings = drift.schema_violations(diff, validation.schema)
        verdict = "FAIL" if schema_failures else "WARN" if schema_warnings else "PASS"
        shown = "\n".join(diff.lines()) or "(no change)"
        log.info("schema check %s vs version %s:\n%s", verdict, baseline["digest"][:16], shown)
        for line in schema_warnings:
            log.warning("schema change: %s", line)
        if schema_failures:
            failures.append(f"schema changed vs version {baseline['digest'][:16]}: " + "; ".join(schema_failures))
            notes.append(f"schema changed vs version {baseline['digest'][:16]}: "
                         + ", ".join(line.split(" (", 1)[0] for line in schema_failures))

    drift_report = drift_run = None
    if validation.drift is not None:
        drift_report, problem = _check_drift(pipeline_id, validation, snapshot, frame, baseline, settings=settings)
        if problem:
            failures.append(problem)
            notes.append(drift.note_text(drift_report) if drift_report is not None else problem)
        if drift_report is not None and hook is not None and run_id is not None:
            drift_run = _log_drift(hook, drift_report, pipeline_id=pipeline_id, dag_id=dag_id or pipeline_id,
                                   run_id=run_id, failed=bool(failures))

    if failures:
        raise ValidationFailedError(f"snapshot {snapshot.digest[:16]} of {pipeline_id} failed validation: "
                                    + "; ".join(failures), note_parts=tuple(notes), drift_mlflow_run_id=drift_run)
    _accept(settings, pipeline_id, snapshot, current_schema, dag_id=dag_id, run_id=run_id, move_baseline=move_baseline)
    return {"success": True, "baseline_moved": move_baseline, "rows": snapshot.rows, "volume_change": change,
            "baseline": baseline["digest"] if baseline else None,
            "schema_diff": diff.to_dict() if diff is not None else None,
            "drift": drift_report.to_dict() if drift_report is not None else None, "drift_mlflow_run_id": drift_run,
            "expectations": [{"name": o.name, "success": o.success, "observed": o.observed} for o in report.outcomes]}


def _check_drift(pipeline_id: str, validation: ValidationPlan, snapshot: SnapshotInfo, frame: pd.DataFrame,
                 baseline: dict[str, Any] | None, *, settings: Settings) -> tuple[DriftReport | None, str | None]:
    """The drift report against the plan's reference, and the failure line when a feature fails."""
    from trainpipe.steps.validate import drift

    plan = validation.drift
    if plan.reference == "baseline":
        if baseline is None:
            log.info("drift check: no accepted version yet, nothing to compare with")
            return None, None
        reference_digest, reference_uri = baseline["digest"], baseline["uri"]
    else:
        pinned = find_version(settings, pipeline_id, plan.reference)
        if pinned is None:
            return None, (f"drift reference version {plan.reference} (validation.drift.reference) is not stored for "
                          f"{pipeline_id}; `trainpipe datasets {pipeline_id}` lists the versions")
        reference_digest, reference_uri = pinned.digest, pinned.uri
    reference = _read_version_frame(settings, reference_uri)
    report = drift.compare(reference, frame, plan, features=validation.features,
                           reference_digest=reference_digest, current_digest=snapshot.digest)
    log.info("drift check %s vs version %s (%d rows -> %d rows):\n%s", report.verdict.upper(), reference_digest[:16],
             report.reference_rows, report.current_rows, report.table())
    for feature in report.warned():
        log.warning("drift warning: %s: %s", feature.feature, "; ".join(feature.reasons))
    return report, drift.failure_message(report) if report.failed() else None


def _log_drift(hook: MlflowHook, report: DriftReport, *, pipeline_id: str, dag_id: str, run_id: str,
               failed: bool) -> str:
    """Drift metrics, tags and the HTML report on the DAG run's MLflow run (its id returned); a failed validation
    ends it FAILED."""
    import tempfile
    from pathlib import Path

    from mlflow.entities import Metric, RunTag

    mlflow_run_id = hook.run_for_dag_run(pipeline_id=pipeline_id, dag_id=dag_id, airflow_run_id=run_id,
                                         tags={"trainpipe.dataset_digest": report.current_digest})
    now = int(datetime.now(UTC).timestamp() * 1000)
    hook.client.log_batch(
        mlflow_run_id,
        metrics=[Metric(key, value, now, 0) for key, value in report.metrics().items()],
        tags=[RunTag("trainpipe.drift_reference", report.reference_digest),
              RunTag("trainpipe.drift_verdict", report.verdict),
              RunTag("trainpipe.drift_failed_features", ",".join(f.feature for f in report.failed()))],
    )
    with tempfile.TemporaryDirectory(prefix="trainpipe-drift-") as folder:
        page = Path(folder) / "drift_report.html"
        page.write_text(report.html(title=f"{pipeline_id}: drift of version {report.current_digest[:16]}"))
        (Path(folder) / "drift_report.json").write_text(json.dumps(report.to_dict(), indent=2))
        hook.client.log_artifacts(mlflow_run_id, folder, artifact_path="drift")
    if failed:
        hook.client.set_terminated(mlflow_run_id, status="FAILED")
    log.info("drift metrics and drift/drift_report.html logged to MLflow run %s", mlflow_run_id)
    return mlflow_run_id


def _accept(settings: Settings, pipeline_id: str, snapshot: SnapshotInfo, schema: list[list[str]], *,
            dag_id: str | None, run_id: str | None, move_baseline: bool = True) -> None:
    """Record the version as accepted, and make it the baseline of the next validation (a backtest's,
    ``move_baseline`` False, is recorded as accepted only: older data must not become what tomorrow is
    compared with)."""
    from trainpipe.steps.validate import drift

    accepted = {"digest": snapshot.digest, "accepted_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "dag_id": dag_id, "run_id": run_id}
    record = version_folder(settings, pipeline_id, snapshot.digest) / ACCEPTED_FILE
    if not move_baseline:
        accepted["backtest"] = True
        if not record.exists():  # a normal run's acceptance of the same rows is kept as it was
            storage.write_json(record, accepted)
        log.info("dataset version %s accepted as a backtest: the baseline stays as it is", snapshot.digest[:16])
        return
    storage.write_json(record, accepted)
    storage.write_json(versions_root(settings, pipeline_id) / BASELINE_FILE,
                       {"digest": snapshot.digest, "rows": snapshot.rows, "uri": snapshot.uri, "schema": schema,
                        "schema_hash": drift.schema_hash(schema), **{k: accepted[k] for k in ("accepted_at", "run_id")}})
