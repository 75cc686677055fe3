"""The fleet's rows: Airflow's facts per pipeline joined with what MLflow holds (Airflow-free).

MLflow is read in batches for all pipelines at once (experiments and registered models page by page, model
versions and runs with ``IN`` filters over chunks of names and experiments), never one request per pipeline,
and what MLflow said about a pipeline is kept until its last DAG run changes (state, end, note, a parked
approval) or ``ttl_seconds`` pass (a promotion or rollback from the CLI moves aliases without a DAG run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from trainpipe.fleet.outcome import DriftFacts, RunFacts, attention_rank, outcome_of

# Cost of a training run (MLflow metrics, logged by trainpipe.state.usage): GPU-hours in all and on spot
# and on-demand capacity apart (a run falls back to on-demand after preemptions: training.kubernetes.capacity).
from trainpipe.plan.costs import USAGE_KEYS
from trainpipe.plan.tracking import (
    DATASET_DIGEST_TAG,
    DRIFT_FAILED_FEATURES_TAG,
    DRIFT_VERDICT_TAG,
    EXPERIMENT_PREFIX,
    GATES_PASSED_TAG,
    REJECTED_TAG,
    RUN_ID_TAG,
    STUDY_RUN_ID_TAG,
    VERSION_DAG_ID_TAG,
)
from trainpipe_trainer.tuning import PROGRESS_METRICS, TRIAL_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

# Metrics a pipeline is usually judged by, in order; otherwise the first holdout metric by name.
MAIN_METRICS = ("auc", "ndcg_at_10", "ndcg", "map", "accuracy", "f1", "r2", "rmse", "mae", "log_loss")
SPARKLINE_VERSIONS = 12
COST_WINDOW = timedelta(days=30)
EVALUATION_REPORT = "evaluation/report.html"
DRIFT_REPORT = "drift/drift_report.html"
CHUNK = 200  # names or experiment ids per IN filter: far below SQLite's and MLflow's limits


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineFacts:
    """What Airflow knows about one pipeline (one trainpipe DAG)."""

    pipeline_id: str
    owner: str
    team: str
    schedule: str | None
    is_paused: bool
    last_run: RunFacts | None


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionPoint:
    version: int
    created_at: str
    metrics: dict[str, float]
    aliases: tuple[str, ...] = ()
    run_id: str | None = None
    rejected: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MlflowFacts:
    """What MLflow holds about one pipeline, as the list needs it."""

    model_name: str | None = None
    champion: VersionPoint | None = None
    challenger: int | None = None
    main_metric: str | None = None
    # The last versions, oldest first (the sparkline).
    recent: tuple[VersionPoint, ...] = ()
    experiment_id: str | None = None
    # The last DAG run's MLflow run, its drift record and which reports it has.
    run_id: str | None = None
    drift: DriftFacts | None = None
    dataset_digest: str | None = None
    # The last accepted dataset version: digest, rows, accepted_at, schema_hash.
    accepted_dataset: dict[str, Any] | None = None
    has_evaluation_report: bool = False
    has_drift_report: bool = False
    # None: no run in the window logged that metric (shown as "—").
    cost_30d: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(USAGE_KEYS))
    # Being read from MLflow in the background: what is shown may be from before the last DAG run.
    refreshing: bool = False
    # The last DAG run's study progress (RunRecord.study), when it searches hyperparameters.
    study: dict[str, Any] | None = None


def quoted(value: str) -> str:
    """A filter-string literal; MLflow's filter parser takes either quote (as ``steps.register.model_registry`` does)."""
    return f'"{value}"' if "'" in value else f"'{value}'"


def _in_list(values: Iterable[str]) -> str:
    return "(" + ", ".join(quoted(v) for v in values) + ")"


def _chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _iso(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else None


def version_metrics(version: ModelVersion) -> dict[str, float]:
    """The ``holdout_<metric>`` tags register writes on each version, as numbers."""
    out = {}
    for key, value in (version.tags or {}).items():
        if key.startswith("holdout_"):
            try:
                out[key.removeprefix("holdout_")] = float(value)
            except ValueError:
                continue
    return out


def main_metric(metrics: Iterable[str]) -> str | None:
    names = set(metrics)
    return next((m for m in MAIN_METRICS if m in names), min(names) if names else None)


def _point(version: ModelVersion) -> VersionPoint:
    return VersionPoint(version=int(version.version), created_at=_iso(version.creation_timestamp) or "",
                        metrics=version_metrics(version), aliases=tuple(sorted(version.aliases or ())),
                        run_id=version.run_id, rejected=(version.tags or {}).get(REJECTED_TAG) == "true")


def drift_facts(run: Run) -> DriftFacts | None:
    tags = run.data.tags
    if DRIFT_VERDICT_TAG not in tags:
        return None
    metrics = run.data.metrics
    return DriftFacts(
        verdict=tags.get(DRIFT_VERDICT_TAG),
        failed_features=tuple(f for f in tags.get(DRIFT_FAILED_FEATURES_TAG, "").split(",") if f),
        psi={k.removeprefix("drift_psi."): v for k, v in metrics.items() if k.startswith("drift_psi.")},
        ks={k.removeprefix("drift_ks."): v for k, v in metrics.items() if k.startswith("drift_ks.")})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """What the fleet keeps of one MLflow run (a finished run does not change)."""

    run_id: str
    start_ms: int
    airflow_run_id: str | None
    cost: dict[str, float]
    drift: DriftFacts | None
    dataset_digest: str | None
    has_evaluation_report: bool
    has_drift_report: bool
    # A study's parent run (hyperparameter search): the DAG run it searches for, and its progress so far.
    study_of: str | None = None
    study: dict[str, Any] | None = None

    @classmethod
    def of(cls, run: Run) -> RunRecord:
        tags, metrics = run.data.tags, run.data.metrics
        study_of = tags.get(STUDY_RUN_ID_TAG) if tags.get(TRIAL_TAG) == "study" else None
        study = None
        if study_of is not None:
            study = {name.removeprefix("study_"): metrics[name] for name in PROGRESS_METRICS if name in metrics}
            study.update(n_trials=int(run.data.params.get("tuning.n_trials", 0)) or None,
                         metric=run.data.params.get("tuning.metric"))
        return cls(run_id=run.info.run_id, start_ms=run.info.start_time or 0, airflow_run_id=tags.get(RUN_ID_TAG),
                   cost={k: metrics[k] for k in USAGE_KEYS if k in metrics}, drift=drift_facts(run),
                   dataset_digest=tags.get(DATASET_DIGEST_TAG),
                   has_evaluation_report=GATES_PASSED_TAG in tags,
                   has_drift_report=DRIFT_VERDICT_TAG in tags, study_of=study_of, study=study)


class FleetReader:
    """Reads MLflow for many pipelines at once and keeps the answers per DAG-run change.

    A pipeline is read again when its last DAG run changed (or ``ttl_seconds`` passed), and then only what can
    have changed: its versions from the last known one on (one search per chunk of models) and its runs of the
    last ``RECENT_RUNS`` (one search per chunk of experiments); older runs are kept from before. When more than
    ``sync_limit`` pipelines are stale (the first request after the api-server started, or the first after a
    night in which every pipeline ran), they are read in a background thread and the request answers at once
    with what is known, the rows marked ``refreshing``: a page load never waits for thousands of MLflow runs.
    """

    RECENT_RUNS = timedelta(days=2)

    def __init__(self, client: MlflowClient, *, ttl_seconds: float = 600.0, clock=time.monotonic,
                 baseline: Callable[[str], dict[str, Any] | None] | None = None, sync_limit: int = 100) -> None:
        self.client = client
        # pipeline_id -> its last accepted dataset version (trainpipe.state.datasets.baseline_version)
        self.baseline = baseline
        self.ttl_seconds = ttl_seconds
        self.sync_limit = sync_limit
        self._clock = clock
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._background: threading.Thread | None = None
        # pipeline_id -> (signature of its last DAG run, when read, facts)
        self._cache: dict[str, tuple[Any, float, MlflowFacts]] = {}
        self._experiments: dict[str, str] = {}
        self._points: dict[str, dict[int, VersionPoint]] = {}  # model -> its last versions read
        # pipeline -> its registered model: the one its versions' dag_id tag names, else the one of its name
        self._model_of: dict[str, str] = {}
        self._runs: dict[str, dict[str, RunRecord]] = {}  # experiment -> run id -> record
        self.requests = 0  # MLflow requests made (the benchmark and the tests read it)

    @staticmethod
    def signature(pipeline: PipelineFacts) -> Any:
        run = pipeline.last_run
        if run is None:
            return None
        return (run.run_id, run.state, run.end_date, run.note, run.awaiting_input_since,
                tuple((t.task_id, t.state, t.try_number) for t in run.tasks))

    def _stale(self, pipelines: Sequence[PipelineFacts]) -> list[PipelineFacts]:
        now = self._clock()
        stale = []
        for p in pipelines:
            cached = self._cache.get(p.pipeline_id)
            if cached is None or cached[0] != self.signature(p) or now - cached[1] >= self.ttl_seconds:
                stale.append(p)
        return stale

    def facts(self, pipelines: Sequence[PipelineFacts], *, now: datetime | None = None,
              wait: bool = False) -> dict[str, MlflowFacts]:
        """Facts for every pipeline. Stale ones are read in this call when ``wait``, or when none of them was
        read before and they are few (a small fleet's first look); otherwise in the background, and until then
        their rows show what was read before, marked ``refreshing``."""
        now = now or datetime.now(UTC)
        with self._lock:
            stale = self._stale(pipelines)
            never_read = all(p.pipeline_id not in self._cache for p in stale)
        in_request = bool(stale) and (wait or (never_read and len(stale) <= self.sync_limit))
        if in_request:
            self.refresh(stale, now=now)
        elif stale:
            self._refresh_in_background(stale, now)
        behind = set() if in_request else {p.pipeline_id for p in stale}
        with self._lock:
            out = {}
            for p in pipelines:
                cached = self._cache.get(p.pipeline_id)
                if cached is None:
                    out[p.pipeline_id] = MlflowFacts(refreshing=True)
                else:
                    out[p.pipeline_id] = replace(cached[2], refreshing=True) if p.pipeline_id in behind else cached[2]
            return out

    def _refresh_in_background(self, stale: Sequence[PipelineFacts], now: datetime) -> None:
        with self._lock:
            if self._background is not None and self._background.is_alive():
                return

            def run() -> None:
                try:
                    self.refresh(stale, now=now)
                except Exception:  # the next request tries again; the page shows what is known meanwhile
                    log.exception("reading MLflow for %d pipelines failed", len(stale))

            self._background = threading.Thread(target=run, name="trainpipe-fleet-refresh", daemon=True)
            self._background.start()

    def wait_for_refresh(self, timeout: float | None = None) -> None:
        thread = self._background
        if thread is not None:
            thread.join(timeout)

    def refresh(self, pipelines: Sequence[PipelineFacts], *, now: datetime) -> None:
        with self._refresh_lock:
            fresh = self._read(pipelines, now=now)
            read_at = self._clock()
            with self._lock:
                for p in pipelines:
                    self._cache[p.pipeline_id] = (self.signature(p), read_at, fresh[p.pipeline_id])

    def invalidate(self, pipeline_id: str | None = None) -> None:
        with self._lock:
            if pipeline_id is None:
                self._cache.clear()
            else:
                self._cache.pop(pipeline_id, None)

    # -- batched reads ------------------------------------------------------------------------

    def _experiment_ids(self, pipeline_ids: Sequence[str]) -> dict[str, str]:
        missing = [p for p in pipeline_ids if p not in self._experiments]
        if missing:
            token = None
            while True:
                self.requests += 1
                page = self.client.search_experiments(filter_string=f"name LIKE '{EXPERIMENT_PREFIX}%'",
                                                      max_results=1000, page_token=token)
                for experiment in page:
                    self._experiments[experiment.name.removeprefix(EXPERIMENT_PREFIX)] = experiment.experiment_id
                token = page.token
                if not token:
                    break
        return {p: self._experiments[p] for p in pipeline_ids if p in self._experiments}

    def _list_models(self, pipeline_ids: set[str]) -> dict[str, Any]:
        """Every registered model, paged (MLflow's search returns aliases and the latest version only here);
        maps each pipeline to its model: the one whose latest version's ``dag_id`` tag names it, else its
        namesake."""
        models: dict[str, Any] = {}
        token = None
        while True:
            self.requests += 1
            page = self.client.search_registered_models(max_results=1000, page_token=token)
            for model in page:
                models[model.name] = model
                for version in model.latest_versions or ():
                    dag_id = (version.tags or {}).get(VERSION_DAG_ID_TAG)
                    if dag_id in pipeline_ids:
                        self._model_of[dag_id] = model.name
                if model.name in pipeline_ids:
                    self._model_of.setdefault(model.name, model.name)
            token = page.token
            if not token:
                break
        return models

    def _versions(self, models: dict[str, Any]) -> dict[str, dict[int, VersionPoint]]:
        """The last SPARKLINE_VERSIONS versions of each model. Only what is new is searched: from the second
        newest version read before (its tags may have been completed since) to the latest; one search per chunk
        of models whose floor falls in the same band of 8."""
        floors: dict[int, list[str]] = {}
        for name, model in models.items():
            latest = max((int(v.version) for v in (model.latest_versions or ())), default=0)
            known = self._points.get(name, {})
            floor = max(1, latest - SPARKLINE_VERSIONS + 1)
            if known:
                floor = max(floor, min(max(known) - 1, latest))
            if latest:
                floors.setdefault(max(1, floor - floor % 8), []).append(name)
        for floor, group in sorted(floors.items()):
            for chunk in _chunks(sorted(group)):
                filter_string = f"name IN {_in_list(chunk)} AND version_number >= {floor}"
                token = None
                while True:
                    self.requests += 1
                    page = self.client.search_model_versions(filter_string, max_results=10_000, page_token=token)
                    for version in page:
                        self._points.setdefault(version.name, {})[int(version.version)] = _point(version)
                    token = page.token
                    if not token:
                        break
        for name in models:
            points = self._points.get(name, {})
            for number in sorted(points)[:-SPARKLINE_VERSIONS]:
                del points[number]
        return {name: self._points.get(name, {}) for name in models}

    def _load_runs(self, experiment_ids: Sequence[str], now: datetime) -> None:
        """Runs of the cost window for experiments not loaded before, the recent ones for the others."""
        window_ms = int((now - COST_WINDOW).timestamp() * 1000)
        recent_ms = int((now - self.RECENT_RUNS).timestamp() * 1000)
        groups = {window_ms: [e for e in experiment_ids if e not in self._runs],
                  recent_ms: [e for e in experiment_ids if e in self._runs]}
        for since, ids in groups.items():
            for chunk in _chunks(sorted(ids), 100):
                token = None
                while True:
                    self.requests += 1
                    page = self.client.search_runs(list(chunk), filter_string=f"attributes.start_time >= {since}",
                                                   max_results=50_000, page_token=token)
                    for run in page:
                        self._runs.setdefault(run.info.experiment_id, {})[run.info.run_id] = RunRecord.of(run)
                    token = page.token
                    if not token:
                        break
                for experiment_id in chunk:
                    kept = self._runs.setdefault(experiment_id, {})
                    for run_id in [r for r, record in kept.items() if record.start_ms < window_ms]:
                        del kept[run_id]

    def _run_of(self, experiment_id: str, airflow_run_id: str) -> RunRecord | None:
        self.requests += 1
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = {quoted(airflow_run_id)}",
                                        max_results=1)
        return RunRecord.of(found[0]) if found else None

    def _read(self, pipelines: Sequence[PipelineFacts], *, now: datetime) -> dict[str, MlflowFacts]:
        ids = [p.pipeline_id for p in pipelines]
        experiments = self._experiment_ids(ids)
        registered = self._list_models(set(ids))
        models = {p: self._model_of[p] for p in ids if self._model_of.get(p) in registered}
        recent = self._versions({m: registered[m] for m in set(models.values())})
        self._load_runs(sorted(set(experiments.values())), now)
        out = {}
        for p in pipelines:
            facts = MlflowFacts(experiment_id=experiments.get(p.pipeline_id))
            model = models.get(p.pipeline_id)
            if model is not None:
                facts = self._model_facts(facts, registered[model], recent[model])
            if facts.experiment_id is not None:
                facts = self._run_facts(facts, self._runs.get(facts.experiment_id, {}), p, now)
            if self.baseline is not None:
                try:
                    accepted = self.baseline(p.pipeline_id)
                except Exception:  # storage unreachable: the row is still useful without it
                    log.warning("could not read the accepted dataset version of %s", p.pipeline_id, exc_info=True)
                    accepted = None
                if accepted:
                    facts = replace(facts, accepted_dataset={k: accepted.get(k) for k in
                                                             ("digest", "rows", "accepted_at", "schema_hash")})
            out[p.pipeline_id] = facts
        return out

    def _model_facts(self, facts: MlflowFacts, model: Any, points: dict[int, VersionPoint]) -> MlflowFacts:
        aliases = {alias: int(v) for alias, v in (model.aliases or {}).items()}
        by_version: dict[int, list[str]] = {}
        for alias, number in aliases.items():
            by_version.setdefault(number, []).append(alias)
        ordered = [replace(p, aliases=tuple(sorted(by_version.get(n, ())))) for n, p in sorted(points.items())]
        champion = None
        if "champion" in aliases:
            number = aliases["champion"]
            champion = next((p for p in ordered if p.version == number), None)
            if champion is None:  # older than the sparkline's versions: one read, for this model only
                self.requests += 1
                champion = replace(_point(self.client.get_model_version(model.name, str(number))),
                                   aliases=tuple(sorted(by_version[number])))
        metric = main_metric(champion.metrics if champion else (ordered[-1].metrics if ordered else ()))
        return replace(facts, model_name=model.name, champion=champion, challenger=aliases.get("challenger"),
                       main_metric=metric, recent=tuple(ordered[-SPARKLINE_VERSIONS:]))

    def _run_facts(self, facts: MlflowFacts, runs: dict[str, RunRecord], pipeline: PipelineFacts,
                   now: datetime) -> MlflowFacts:
        totals: dict[str, float | None] = dict.fromkeys(USAGE_KEYS)
        for record in runs.values():
            for key, value in record.cost.items():
                totals[key] = (totals[key] or 0.0) + value
        facts = replace(facts, cost_30d=totals)
        last = pipeline.last_run
        if last is None:
            return facts
        # While the run searches, its training run does not exist yet: the study's progress is what there is.
        study = next((r.study for r in runs.values() if r.study_of == last.run_id), None)
        facts = replace(facts, study=study)
        mine = next((r for r in runs.values() if r.airflow_run_id == last.run_id), None)
        if mine is None and (last.start_date is None or last.start_date < now - COST_WINDOW):
            mine = self._run_of(facts.experiment_id, last.run_id)
        if mine is None:
            return facts
        return replace(facts, run_id=mine.run_id, drift=mine.drift, dataset_digest=mine.dataset_digest,
                       has_evaluation_report=mine.has_evaluation_report, has_drift_report=mine.has_drift_report)


# ---------------------------------------------------------------------------------------------
# rows


def _age_days(created_at: str | None, now: datetime) -> float | None:
    if not created_at:
        return None
    return (now - datetime.fromisoformat(created_at)).total_seconds() / 86400


def _date(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat(timespec="seconds") if value else None


def pipeline_row(pipeline: PipelineFacts, facts: MlflowFacts, *, now: datetime, stale_after_days: float = 14.0,
                 links: dict[str, str | None] | None = None) -> dict[str, Any]:
    """One pipeline of ``GET /trainpipe/api/pipelines`` (plain JSON types)."""
    outcome, reason = outcome_of(pipeline.last_run, now=now, drift=facts.drift)
    champion = facts.champion
    age = _age_days(champion.created_at, now) if champion else None
    metric = facts.main_metric
    run = pipeline.last_run
    return {
        "pipeline_id": pipeline.pipeline_id,
        "team": pipeline.team,
        "owner": pipeline.owner,
        "schedule": pipeline.schedule,
        "is_paused": pipeline.is_paused,
        "outcome": outcome,
        "needs_attention": attention_rank(outcome, champion_age_days=age, stale_after_days=stale_after_days) <= 5,
        "attention_rank": attention_rank(outcome, champion_age_days=age, stale_after_days=stale_after_days),
        "last_run": None if run is None else {
            "state": run.state, "reason": reason, "run_id": run.run_id, "logical_date": _date(run.logical_date),
            "start_date": _date(run.start_date), "end_date": _date(run.end_date), "note": run.note,
            "mlflow_run_id": facts.run_id,
        },
        "model_name": facts.model_name,
        "champion": None if champion is None else {
            "version": champion.version, "created_at": champion.created_at,
            "age_days": round(age, 2) if age is not None else None, "metrics": champion.metrics,
            "main_metric": metric, "run_id": champion.run_id,
        },
        "challenger_version": facts.challenger,
        "sparkline": [{"version": p.version, "value": p.metrics.get(metric)} for p in facts.recent
                      if metric and metric in p.metrics],
        "dataset_version": facts.dataset_digest,
        "accepted_dataset": facts.accepted_dataset,
        # By hand: dataclasses.asdict deep-copies, two thirds of a warm list's time at 2,000 rows.
        "drift": None if facts.drift is None else {
            "verdict": facts.drift.verdict, "failed_features": list(facts.drift.failed_features),
            "psi": dict(facts.drift.psi), "ks": dict(facts.drift.ks)},
        "cost_30d": {key: facts.cost_30d.get(key) for key in USAGE_KEYS},
        "links": links or {},
        "refreshing": facts.refreshing,
        # The last run's hyperparameter search: trials_done, trials_pruned, trials_running, trials_failed,
        # best_value (so far), n_trials, metric; None without one.
        "study": facts.study,
    }


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Needs attention first (most urgent outcome first), then by team and pipeline."""
    return sorted(rows, key=lambda r: (r["attention_rank"], r["team"], r["pipeline_id"]))


def promotion_log(model: Any) -> list[dict[str, Any]]:
    """The registered model's promotions and rollbacks, newest first (the registry's own reader)."""
    from trainpipe.steps.register.model_registry import read_promotion_history

    return list(reversed(read_promotion_history(dict(model.tags or {}))))
