"""The fleet's rows: Airflow's facts per pipeline joined with what MLflow holds (Airflow-free).

MLflow is read in batches for all pipelines at once (experiments and registered models page by page, model
versions and runs with ``IN`` filters over chunks of names and experiments), never one request per pipeline,
and what MLflow said about a pipeline is kept until its last DAG run changes (state, end, note, a parked
approval) or ``ttl_seconds`` pass (a promotion or rollback from the CLI moves aliases without a DAG run).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from trainpipe.fleet.outcome import DriftFacts, RunFacts, attention_rank, outcome_of

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)

EXPERIMENT_PREFIX = "trainpipe/"
# Tags that tie an MLflow run to its DAG run (trainpipe.hooks.mlflow.MlflowHook.run_for_dag_run).
RUN_ID_TAG = "trainpipe.airflow_run_id"
VERSION_DAG_ID_TAG = "dag_id"
# Cost of a training run (MLflow metrics, logged by the cost accounting of issue 23).
COST_METRICS = ("gpu_hours", "cpu_hours", "cost")
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
    cost_30d: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(COST_METRICS))


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _in_list(values: Iterable[str]) -> str:
    return "(" + ", ".join(_quoted(v) for v in values) + ")"


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
                        run_id=version.run_id, rejected=(version.tags or {}).get("trainpipe.rejected") == "true")


def drift_facts(run: Run) -> DriftFacts | None:
    tags = run.data.tags
    if "trainpipe.drift_verdict" not in tags:
        return None
    metrics = run.data.metrics
    return DriftFacts(
        verdict=tags.get("trainpipe.drift_verdict"),
        failed_features=tuple(f for f in tags.get("trainpipe.drift_failed_features", "").split(",") if f),
        psi={k.removeprefix("drift_psi."): v for k, v in metrics.items() if k.startswith("drift_psi.")},
        ks={k.removeprefix("drift_ks."): v for k, v in metrics.items() if k.startswith("drift_ks.")})


class FleetReader:
    """Reads MLflow for many pipelines at once and keeps the answers per DAG-run change."""

    def __init__(self, client: MlflowClient, *, ttl_seconds: float = 300.0, clock=time.monotonic,
                 baseline: Callable[[str], dict[str, Any] | None] | None = None) -> None:
        self.client = client
        # pipeline_id -> its last accepted dataset version (trainpipe.runtime.snapshot.baseline_version)
        self.baseline = baseline
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._lock = threading.Lock()
        # pipeline_id -> (signature of its last DAG run, when read, facts)
        self._cache: dict[str, tuple[Any, float, MlflowFacts]] = {}
        self._experiments: dict[str, str] = {}
        self.requests = 0  # MLflow requests made (the benchmark and the tests read it)

    @staticmethod
    def signature(pipeline: PipelineFacts) -> Any:
        run = pipeline.last_run
        if run is None:
            return None
        return (run.run_id, run.state, run.end_date, run.note, run.awaiting_input_since,
                tuple((t.task_id, t.state, t.try_number) for t in run.tasks))

    def facts(self, pipelines: Sequence[PipelineFacts], *, now: datetime | None = None) -> dict[str, MlflowFacts]:
        now = now or datetime.now(UTC)
        with self._lock:
            stale = []
            out: dict[str, MlflowFacts] = {}
            for p in pipelines:
                cached = self._cache.get(p.pipeline_id)
                if (cached is not None and cached[0] == self.signature(p)
                        and self._clock() - cached[1] < self.ttl_seconds):
                    out[p.pipeline_id] = cached[2]
                else:
                    stale.append(p)
            if stale:
                fresh = self._read(stale, now=now)
                read_at = self._clock()
                for p in stale:
                    self._cache[p.pipeline_id] = (self.signature(p), read_at, fresh[p.pipeline_id])
                out.update(fresh)
            return out

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

    def _models(self, names: set[str]) -> dict[str, Any]:
        """Registered models by name, paged through once (their aliases and latest version)."""
        found: dict[str, Any] = {}
        token = None
        while True:
            self.requests += 1
            page = self.client.search_registered_models(max_results=1000, page_token=token)
            for model in page:
                if model.name in names:
                    found[model.name] = model
            token = page.token
            if not token:
                break
        return found

    def _recent_versions(self, models: dict[str, Any]) -> dict[str, list[ModelVersion]]:
        """The last SPARKLINE_VERSIONS versions of each model: one search per chunk of models whose latest
        version falls in the same band of 8 (so one floor serves them all)."""
        floors: dict[int, list[str]] = {}
        for name, model in models.items():
            latest = max((int(v.version) for v in (model.latest_versions or ())), default=0)
            if latest:
                floor = max(1, latest - SPARKLINE_VERSIONS + 1)
                floors.setdefault(floor - floor % 8, []).append(name)
        out: dict[str, list[ModelVersion]] = {}
        for floor, names in sorted(floors.items()):
            for chunk in _chunks(sorted(names)):
                filter_string = f"name IN {_in_list(chunk)} AND version_number >= {max(1, floor)}"
                token = None
                while True:
                    self.requests += 1
                    page = self.client.search_model_versions(filter_string, max_results=10_000, page_token=token)
                    for version in page:
                        out.setdefault(version.name, []).append(version)
                    token = page.token
                    if not token:
                        break
        return out

    def _runs(self, experiment_ids: dict[str, str], since: datetime) -> dict[str, list[Run]]:
        by_experiment: dict[str, list[Run]] = {}
        ids = sorted(set(experiment_ids.values()))
        start_ms = int(since.timestamp() * 1000)
        for chunk in _chunks(ids, 100):
            token = None
            while True:
                self.requests += 1
                page = self.client.search_runs(list(chunk), filter_string=f"attributes.start_time >= {start_ms}",
                                               max_results=50_000, page_token=token)
                for run in page:
                    by_experiment.setdefault(run.info.experiment_id, []).append(run)
                token = page.token
                if not token:
                    break
        return by_experiment

    def _run_of(self, experiment_id: str, airflow_run_id: str) -> Run | None:
        self.requests += 1
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = {_quoted(airflow_run_id)}",
                                        max_results=1)
        return found[0] if found else None

    def _read(self, pipelines: Sequence[PipelineFacts], *, now: datetime) -> dict[str, MlflowFacts]:
        ids = [p.pipeline_id for p in pipelines]
        experiments = self._experiment_ids(ids)
        models = self._models(set(ids))
        recent = self._recent_versions(models)
        runs = self._runs(experiments, now - COST_WINDOW) if experiments else {}
        out = {}
        for p in pipelines:
            facts = MlflowFacts(experiment_id=experiments.get(p.pipeline_id))
            model = models.get(p.pipeline_id)
            if model is not None:
                facts = self._model_facts(facts, model, recent.get(model.name, []))
            if facts.experiment_id is not None:
                facts = self._run_facts(facts, runs.get(facts.experiment_id, []), p)
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

    def _model_facts(self, facts: MlflowFacts, model: Any, versions: list[ModelVersion]) -> MlflowFacts:
        aliases = {alias: int(v) for alias, v in (model.aliases or {}).items()}
        points = sorted((_point(v) for v in versions), key=lambda p: p.version)
        by_number = {p.version: p for p in points}
        champion = None
        if "champion" in aliases:
            champion = by_number.get(aliases["champion"])
            if champion is None:  # older than the sparkline's versions: one read, for this model only
                self.requests += 1
                champion = _point(self.client.get_model_version(model.name, str(aliases["champion"])))
        metric = main_metric(champion.metrics if champion else (points[-1].metrics if points else ()))
        return replace(facts, model_name=model.name, champion=champion, challenger=aliases.get("challenger"),
                       main_metric=metric, recent=tuple(points[-SPARKLINE_VERSIONS:]))

    def _run_facts(self, facts: MlflowFacts, runs: list[Run], pipeline: PipelineFacts) -> MlflowFacts:
        totals: dict[str, float | None] = dict.fromkeys(COST_METRICS)
        for run in runs:
            for key in COST_METRICS:
                if key in run.data.metrics:
                    totals[key] = (totals[key] or 0.0) + run.data.metrics[key]
        facts = replace(facts, cost_30d=totals)
        last = pipeline.last_run
        if last is None:
            return facts
        mine = next((r for r in runs if r.data.tags.get(RUN_ID_TAG) == last.run_id), None)
        if mine is None and (last.start_date is None or last.start_date < datetime.now(UTC) - COST_WINDOW):
            mine = self._run_of(facts.experiment_id, last.run_id)
        if mine is None:
            return facts
        tags = mine.data.tags
        return replace(facts, run_id=mine.info.run_id, drift=drift_facts(mine),
                       dataset_digest=tags.get("trainpipe.dataset_digest"),
                       has_evaluation_report="trainpipe.gates_passed" in tags,
                       has_drift_report="trainpipe.drift_verdict" in tags)


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
        "drift": None if facts.drift is None else asdict(facts.drift),
        "cost_30d": {"gpu_hours": facts.cost_30d.get("gpu_hours"), "cpu_hours": facts.cost_30d.get("cpu_hours"),
                     "cost": facts.cost_30d.get("cost")},
        "links": links or {},
    }


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Needs attention first (most urgent outcome first), then by team and pipeline."""
    return sorted(rows, key=lambda r: (r["attention_rank"], r["team"], r["pipeline_id"]))


def promotion_log(model: Any) -> list[dict[str, Any]]:
    """The registered model's promotion log (``trainpipe.promotion_log``), newest first."""
    try:
        entries = json.loads((model.tags or {}).get("trainpipe.promotion_log", "[]"))
    except json.JSONDecodeError:
        return []
    return [e for e in reversed(entries) if isinstance(e, dict)]
