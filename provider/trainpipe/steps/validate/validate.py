"""The ``validate`` step: a snapshot's Great Expectations suite (``quality``), its volume and schema against the
baseline version, and its drift (``drift``); a version that passes is accepted and becomes the baseline.

A copy version is read whole into one frame. A manifest version (files listed, possibly far larger than memory)
is read once, one row group at a time (``_stream_version``): exact counts decide the expectations that are sums
or bounds (row count, nulls, between, in set, min, max, column present), every row group's columns and types are
checked against the manifest, a seeded uniform sample of at most ``SAMPLE_ROWS`` rows is drawn for the rest (GE's
distribution expectations, drift), and the train split's feature statistics are computed for the trainer.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
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
    MANIFEST_KIND,
    SnapshotInfo,
    baseline_version,
    find_version,
    version_folder,
    versions_root,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.steps.validate.drift import DriftReport
    from trainpipe.steps.validate.quality import StreamedSuite, ValidationReport
    from trainpipe_trainer.config import TrainingConfig

log = logging.getLogger(__name__)

# The most rows of a manifest version that its distribution checks (GE's sampled expectations, drift) see: a
# uniform sample this large puts a quantile within about 1/sqrt(100000) = 0.3% of rank of the whole version's,
# and bounds the memory of the check whatever the version's size.
SAMPLE_ROWS = 100_000
# A column's profile keeps this many distinct values, then says "more than" this many.
PROFILE_VALUES = 50


def _read_version_frame(settings: Settings, uri: str) -> pd.DataFrame:
    import pandas as pd
    from airflow.sdk import ObjectStoragePath

    folder = ObjectStoragePath(uri, conn_id=settings.storage_conn_id)
    return pd.concat(
        [storage.read_table(folder / "train.parquet"), storage.read_table(folder / "holdout.parquet")], ignore_index=True
    )


def validate_snapshot(pipeline_id: str, validation: ValidationPlan, snapshot: SnapshotInfo, *,
                      settings: Settings, dag_id: str | None = None, run_id: str | None = None,
                      hook: MlflowHook | None = None, move_baseline: bool = True,
                      trainer: TrainingConfig | None = None, sample_rows: int = SAMPLE_ROWS) -> dict[str, Any]:
    """Run the spec's Great Expectations suite, the volume, schema and drift checks against the
    baseline (the last accepted version); raise when anything fails, else accept the version (and,
    unless ``move_baseline`` is False, as for a backtest, make it the baseline).

    With ``hook`` and ``run_id``, drift results go to the DAG run's MLflow run (the one training
    then uses): metrics ``drift_psi.<feature>``, ``drift_ks.<feature>`` and ``drift/drift_report.html``.

    A manifest version is streamed (the module's docstring); its distribution checks see a seeded sample of at
    most ``sample_rows`` rows, and with ``trainer`` (the plan's trainer config template) the train split's
    feature statistics are written beside the manifest when the version passes.
    """
    from trainpipe.steps.validate import drift, quality

    streamed = None
    if snapshot.kind == MANIFEST_KIND:
        streamed = _stream_version(pipeline_id, validation, snapshot, settings=settings, trainer=trainer,
                                   sample_rows=sample_rows)
        frame, report = streamed.sample, streamed.report
    else:
        frame = _read_version_frame(settings, snapshot.uri)
        report = quality.validate_dataframe(
            frame, expectations=list(validation.expectations), required_columns=list(validation.required_columns))
    log.info("data quality of snapshot %s:\n%s", snapshot.digest[:16], report.summary())
    failures = [] if report.success else ["Great Expectations suite failed (see the lines above)"]
    # The same failures in a few words each, for the run's note.
    notes = [quality.note_text(outcome) for outcome in report.failures]
    if streamed is not None:
        failures += streamed.type_problems
        notes += [problem.split(" (", 1)[0] for problem in streamed.type_problems]

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
        baseline_schema = baseline.get("schema") or _stored_schema(settings, pipeline_id, baseline)
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
        drift_report, problem = _check_drift(pipeline_id, validation, snapshot, frame, baseline, settings=settings,
                                             current_total_rows=streamed.rows if streamed is not None else None,
                                             sample_rows=sample_rows)
        if problem:
            failures.append(problem)
            notes.append(drift.note_text(drift_report) if drift_report is not None else problem)
        if drift_report is not None and hook is not None and run_id is not None:
            drift_run = _log_drift(hook, drift_report, pipeline_id=pipeline_id, dag_id=dag_id or pipeline_id,
                                   run_id=run_id, failed=bool(failures))

    if failures:
        raise ValidationFailedError(f"snapshot {snapshot.digest[:16]} of {pipeline_id} failed validation: "
                                    + "; ".join(failures), note_parts=tuple(notes), drift_mlflow_run_id=drift_run)
    extra: dict[str, Any] = {}
    if streamed is not None:
        extra = {"sample_rows": len(frame), "sampled_expectations": streamed.sampled_expectations,
                 "profile": streamed.profile, "statistics_uri": _write_statistics(streamed, snapshot, settings)}
    _accept(settings, pipeline_id, snapshot, current_schema, dag_id=dag_id, run_id=run_id, move_baseline=move_baseline)
    return {**extra, "success": True, "baseline_moved": move_baseline, "rows": snapshot.rows, "volume_change": change,
            "baseline": baseline["digest"] if baseline else None,
            "schema_diff": diff.to_dict() if diff is not None else None,
            "drift": drift_report.to_dict() if drift_report is not None else None, "drift_mlflow_run_id": drift_run,
            "expectations": [{"name": o.name, "success": o.success, "observed": o.observed} for o in report.outcomes]}


def _check_drift(pipeline_id: str, validation: ValidationPlan, snapshot: SnapshotInfo, frame: pd.DataFrame,
                 baseline: dict[str, Any] | None, *, settings: Settings, current_total_rows: int | None = None,
                 sample_rows: int = SAMPLE_ROWS) -> tuple[DriftReport | None, str | None]:
    """The drift report against the plan's reference, and the failure line when a feature fails.

    ``current_total_rows``: ``frame`` is a sample of a manifest version of that many rows; the reference is
    then sampled too (streamed when it is a manifest, read whole and cut to ``sample_rows`` when a copy)."""
    from trainpipe.steps.validate import drift

    plan = validation.drift
    if plan.reference == "baseline":
        if baseline is None:
            log.info("drift check: no accepted version yet, nothing to compare with")
            return None, None
        reference_digest, reference_uri = baseline["digest"], baseline["uri"]
        # A baseline records its kind when it is a manifest (every baseline before manifests is a copy).
        info = find_version(settings, pipeline_id, reference_digest) if baseline.get("kind") == MANIFEST_KIND else None
    else:
        pinned = find_version(settings, pipeline_id, plan.reference)
        if pinned is None:
            return None, (f"drift reference version {plan.reference} (validation.drift.reference) is not stored for "
                          f"{pipeline_id}; `trainpipe datasets {pipeline_id}` lists the versions")
        reference_digest, reference_uri, info = pinned.digest, pinned.uri, pinned
    reference_total = None
    if info is not None and info.kind == MANIFEST_KIND:
        read = _stream_version(pipeline_id, None, info, settings=settings, trainer=None, sample_rows=sample_rows,
                               role="drift reference")
        reference, reference_total = read.sample, read.rows
    else:
        reference = _read_version_frame(settings, reference_uri)
        if current_total_rows is not None and len(reference) > sample_rows:
            # The same bound as the current side: both compared at the precision the report states.
            reference_total = len(reference)
            import numpy as np

            reference = reference.sample(n=sample_rows, random_state=np.random.default_rng(_seed(reference_digest, "copy")))
    report = drift.compare(reference, frame, plan, features=validation.features,
                           reference_digest=reference_digest, current_digest=snapshot.digest,
                           text_features=validation.text_features, reference_total_rows=reference_total,
                           current_total_rows=current_total_rows)
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
    # The kind only for a manifest: a copy's record stays as it was, and a record without one is a copy.
    kind = {"kind": snapshot.kind} if snapshot.kind == MANIFEST_KIND else {}
    storage.write_json(versions_root(settings, pipeline_id) / BASELINE_FILE,
                       {"digest": snapshot.digest, "rows": snapshot.rows, "uri": snapshot.uri, "schema": schema,
                        "schema_hash": drift.schema_hash(schema), **{k: accepted[k] for k in ("accepted_at", "run_id")},
                        **kind})


def _stored_schema(settings: Settings, pipeline_id: str, baseline: dict[str, Any]) -> list[list[str]]:
    """A baseline accepted before versions recorded their schema: read off its files (a copy's frame, or the
    recorded schema of its version)."""
    from trainpipe.steps.validate import drift

    if baseline.get("kind") == MANIFEST_KIND:
        info = find_version(settings, pipeline_id, baseline["digest"])
        return [list(column) for column in (info.schema if info is not None else None) or []]
    return [list(c) for c in drift.frame_schema(_read_version_frame(settings, baseline["uri"]).head(0))]


def _seed(digest: str, key: str) -> int:
    """A seed fixed by the version and the part of it: a rerun draws the same sample and gives the same verdict."""
    return int.from_bytes(hashlib.sha256(f"{digest}:{key}".encode()).digest()[:8], "big")


class _Sample:
    """A seeded uniform sample of at most ``bound`` rows of a stream of frames: each row gets a key from a
    generator seeded by the version and its row group, and the ``bound`` smallest keys are kept (bottom-k, so
    the sample is the same in any reading order). Memory: about two samples and one row group."""

    def __init__(self, bound: int, digest: str) -> None:
        import numpy as np

        self.bound, self.digest = bound, digest
        self._keys: np.ndarray = np.empty(0)
        self._frame: pd.DataFrame | None = None
        self._pending: list[tuple[np.ndarray, pd.DataFrame]] = []
        self._pending_rows = 0
        self._threshold = np.inf

    def offer(self, frame: pd.DataFrame, key: str) -> None:
        import numpy as np

        keys = np.random.default_rng(_seed(self.digest, key)).random(len(frame))
        keep = keys < self._threshold
        if not keep.all():
            frame, keys = frame[keep], keys[keep]
        if len(keys):
            self._pending.append((keys, frame))
            self._pending_rows += len(keys)
            if self._pending_rows >= self.bound:
                self._merge()

    def _merge(self) -> None:
        import numpy as np
        import pandas as pd

        frames = ([self._frame] if self._frame is not None else []) + [frame for _, frame in self._pending]
        keys = np.concatenate([self._keys, *(k for k, _ in self._pending)])
        frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)
        self._pending, self._pending_rows = [], 0
        if len(keys) > self.bound:
            chosen = np.argpartition(keys, self.bound - 1)[: self.bound]
            frame, keys = frame.iloc[chosen].reset_index(drop=True), keys[chosen]
        self._frame, self._keys = frame, keys
        if len(keys) >= self.bound:
            self._threshold = float(keys.max())

    def frame(self, empty: pd.DataFrame) -> pd.DataFrame:
        """The sample in key order (the same rows in the same order on every read of the version)."""
        import numpy as np

        if self._pending:
            self._merge()
        if self._frame is None:
            return empty
        return self._frame.iloc[np.argsort(self._keys, kind="stable")].reset_index(drop=True)


@dataclass(slots=True)
class _ColumnProfile:
    """Exact aggregates of one column over the whole version."""

    nulls: int = 0
    minimum: Any = None
    maximum: Any = None
    values: set[Any] = field(default_factory=set)
    more_values: bool = False

    def update(self, column: pd.Series) -> None:
        from trainpipe.steps.validate.drift import is_numeric

        present = column.dropna()
        self.nulls += len(column) - len(present)
        if not len(present):
            return
        if is_numeric(column):
            low, high = present.min(), present.max()
            self.minimum = low if self.minimum is None else min(self.minimum, low)
            self.maximum = high if self.maximum is None else max(self.maximum, high)
        if not self.more_values:
            self.values.update(present.unique().tolist()[: PROFILE_VALUES + 1])
            if len(self.values) > PROFILE_VALUES:
                self.more_values, self.values = True, set()  # an identifier or a measure: no value set kept

    def to_dict(self) -> dict[str, Any]:
        from trainpipe.steps.validate.quality import _plain

        try:
            values = sorted(self.values)
        except TypeError:
            values = sorted(self.values, key=repr)
        return {"nulls": self.nulls, "min": _plain(self.minimum), "max": _plain(self.maximum),
                "values": None if self.more_values else [_plain(v) for v in values],
                "more_than": PROFILE_VALUES if self.more_values else None}


@dataclass(slots=True, kw_only=True)
class _Streamed:
    """What one pass over a manifest version found."""

    rows: int
    sample: pd.DataFrame
    report: ValidationReport | None
    sampled_expectations: list[str]
    profile: dict[str, dict[str, Any]]
    # One line per row group whose columns or types differ from the manifest's schema.
    type_problems: list[str]
    statistics: dict[str, Any] | None
    statistics_config: TrainingConfig | None


def _stream_version(pipeline_id: str, validation: ValidationPlan | None, snapshot: SnapshotInfo, *,
                    settings: Settings, trainer: TrainingConfig | None, sample_rows: int,
                    role: str = "snapshot") -> _Streamed:
    """One pass over every row group of a manifest version (train and holdout): the exact tallies of
    ``validation``'s expectations (None: only the sample, for a drift reference), the columns' profile, the
    type check, the seeded sample and the train split's statistics. A file changed since the snapshot fails
    the validation, naming it."""
    import pandas as pd

    from trainpipe.errors import ValidationFailedError
    from trainpipe.state.datasets import load_manifest
    from trainpipe.steps.validate import quality
    from trainpipe_trainer.data.reading import iter_units
    from trainpipe_trainer.errors import DataChangedError

    suite: StreamedSuite | None = None
    if validation is not None:
        suite = quality.StreamedSuite(expectations=list(validation.expectations),
                                      required_columns=list(validation.required_columns))
    manifest, fs = load_manifest(snapshot, settings=settings)
    sample = _Sample(sample_rows, manifest.digest)
    profile: dict[str, _ColumnProfile] = {name: _ColumnProfile() for name in manifest.columns}
    expected_types = [list(column) for column in manifest.schema]
    held = {(i, g) for i, entry in enumerate(manifest.files) for g in entry.holdout_row_groups}
    statistics, config = _statistics_pass(snapshot, trainer) if validation is not None else (None, None)
    type_problems: list[str] = []
    rows = 0
    empty = None
    # A drift reference whose file changed since it was accepted is compared on its other files (said in the log):
    # failing instead would fail every later run, as the baseline moves only when a validation passes.
    skipped: list[str] = []
    try:
        for unit, table in iter_units(fs, manifest, skipped=skipped if role == "drift reference" else None):
            entry = manifest.files[unit.file]
            found = [[field.name, str(field.type)] for field in table.schema]
            if found != expected_types and len(type_problems) < 10:
                type_problems.append(_type_problem(entry.uri, unit.row_group, found, expected_types, manifest.digest))
            frame = table.to_pandas()
            del table
            if empty is None:
                empty = frame.head(0)
            rows += len(frame)
            if suite is not None:
                suite.update(frame)
            for name, column in profile.items():
                if name in frame.columns:
                    column.update(frame[name])
            sample.offer(frame, f"{entry.path}#{unit.row_group}")
            if statistics is not None and (unit.file, unit.row_group) not in held:
                statistics = _statistics_update(statistics, frame, snapshot)
    except DataChangedError as err:
        raise ValidationFailedError(
            f"{role} {snapshot.digest[:16]} of {pipeline_id} failed validation: {err}",
            # The message opens with the file's URI (which has no ": " in it).
            note_parts=(f"data changed since the snapshot: {str(err).split(': ', 1)[0]}",),
        ) from err
    for message in skipped:
        log.warning("%s %s: %s; its other files are compared (%d rows)", role, snapshot.digest[:16], message, rows)
    if empty is None:
        empty = pd.DataFrame({name: pd.Series(dtype=kind) for name, kind in (snapshot.schema or [])})
    frame = sample.frame(empty)
    report = suite.report(frame) if suite is not None else None
    log.info("%s %s: %d rows of %d files read in one pass, a seeded uniform sample of %d rows kept%s", role,
             snapshot.digest[:16], rows, len(manifest.files), len(frame),
             f"; judged on it: {', '.join(suite.sampled)}" if suite is not None and suite.sampled else "")
    result = None
    if statistics is not None:
        result = _statistics_result(statistics, snapshot)
    return _Streamed(rows=rows, sample=frame, report=report, sampled_expectations=suite.sampled if suite else [],
                     profile={name: column.to_dict() for name, column in profile.items()},
                     type_problems=type_problems, statistics=result, statistics_config=config)


def _type_problem(uri: str, row_group: int, found: list[list[str]], expected: list[list[str]], digest: str) -> str:
    expected_types, found_types = dict(map(tuple, expected)), dict(map(tuple, found))
    differences = [f"{name} is missing" for name in expected_types if name not in found_types]
    differences += [f"{name} is {kind}, not {expected_types[name]}" for name, kind in found_types.items()
                    if name in expected_types and expected_types[name] != kind]
    differences += [f"{name} is not in the manifest's schema" for name in found_types if name not in expected_types]
    return (f"{uri}: row group {row_group}: column {'; column '.join(differences) or 'order differs'} (dataset version "
            f"{digest[:16]} records its schema from the files it listed; snapshot the folder again once its files "
            "share one schema)")


def _statistics_pass(snapshot: SnapshotInfo, trainer: TrainingConfig | None) -> tuple[Any, TrainingConfig | None]:
    """The trainer's statistics pass over the train split, with the config the run will train with (its data
    and classes), or None when there is no trainer config or its task has no streamed statistics."""
    if trainer is None:
        return None, None
    import dataclasses

    from trainpipe_trainer.data.statistics import StatisticsPass
    from trainpipe_trainer.errors import TrainerDataError

    config = dataclasses.replace(trainer, train_data_uri=snapshot.train_uri, dataset_digest=snapshot.digest,
                                 label_classes=trainer.label_classes or tuple(snapshot.label_classes or ()))
    try:
        return StatisticsPass(config, source=snapshot.train_uri), config
    except TrainerDataError as err:
        log.info("no feature statistics from the validation pass: %s", err)
        return None, None


def _statistics_update(statistics: Any, frame: pd.DataFrame, snapshot: SnapshotInfo) -> Any:
    """One train row group into the statistics; a row group they cannot use stops them (the trainer computes
    them again and reports that row group itself), never the validation."""
    from trainpipe_trainer.errors import TrainerDataError

    try:
        statistics.update(frame)
    except TrainerDataError as err:
        log.warning("feature statistics of version %s not computed here (the trainer will): %s",
                    snapshot.digest[:16], err)
        return None
    return statistics


def _statistics_result(statistics: Any, snapshot: SnapshotInfo) -> dict[str, Any] | None:
    from trainpipe_trainer.errors import TrainerDataError

    try:
        return statistics.result()
    except TrainerDataError as err:
        log.warning("feature statistics of version %s not computed here (the trainer will): %s",
                    snapshot.digest[:16], err)
        return None


def _write_statistics(streamed: _Streamed, snapshot: SnapshotInfo, settings: Settings) -> str | None:
    """The train split's feature statistics beside the manifest, where the trainer looks for them first."""
    if streamed.statistics is None or streamed.statistics_config is None:
        return None
    from trainpipe_trainer.data.statistics import write_statistics

    options = dict(storage.resolve_uri(snapshot.train_uri, settings, settings.storage_conn_id).fs.storage_options)
    uri = write_statistics(snapshot.train_uri, streamed.statistics_config, streamed.statistics, options)
    log.info("feature statistics of the train split (%d rows) written to %s", streamed.statistics["rows"], uri)
    return uri
