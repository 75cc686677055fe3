"""The ``validate`` step: a snapshot's Great Expectations suite (``quality``), its volume and schema against the
baseline version, and its drift (``drift``); a version that passes is accepted and becomes the baseline.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import ValidationFailedError
from trainpipe.plan.model import ValidationPlan
from trainpipe.plan.tracking import (
    DATASET_DIGEST_TAG,
    DRIFT_FAILED_FEATURES_TAG,
    DRIFT_REFERENCE_TAG,
    DRIFT_VERDICT_TAG,
)
from trainpipe.settings import Settings
from trainpipe.state.datasets import (
    ACCEPTED_FILE,
    BASELINE_FILE,
    SnapshotInfo,
    baseline_version,
    find_version,
    version_folder,
    versions_root,
)

if TYPE_CHECKING:
    import pandas as pd

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.steps.validate.drift import DriftReport

log = logging.getLogger(__name__)


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
                           reference_digest=reference_digest, current_digest=snapshot.digest,
                           text_features=validation.text_features)
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
                                         tags={DATASET_DIGEST_TAG: report.current_digest})
    now = int(datetime.now(UTC).timestamp() * 1000)
    hook.client.log_batch(
        mlflow_run_id,
        metrics=[Metric(key, value, now, 0) for key, value in report.metrics().items()],
        tags=[RunTag(DRIFT_REFERENCE_TAG, report.reference_digest),
              RunTag(DRIFT_VERDICT_TAG, report.verdict),
              RunTag(DRIFT_FAILED_FEATURES_TAG, ",".join(f.feature for f in report.failed()))],
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
