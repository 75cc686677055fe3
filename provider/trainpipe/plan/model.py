"""The plan's dataclasses and the fixed values the later stages share."""


from __future__ import annotations

import dataclasses
import hashlib
import re
import urllib.parse
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from trainpipe.plan.launch import LaunchPlan
from trainpipe.spec.bounds import ParamBound
from trainpipe_trainer.config import (
    SearchDimension,
    TrainingConfig,
)

# The spec models (pydantic, 0.1 s to import) are imported where a plan is built, not here: a plan
# or DAG unpickled from the plan cache needs only this module (ADR 0012).
if TYPE_CHECKING:
    pass


# The trainer config template's per-run values, filled by trainpipe.steps.train.train for each try.
SNAPSHOT_TRAIN_URI = "<snapshot>/train.parquet"
SNAPSHOT_DIGEST = "<snapshot digest>"
RUN_CHECKPOINTS_URI = "<run_dir>/checkpoints"
RUN_OUTPUT_URI = "<run_dir>/output"
TRACKING_URI = "<MLFLOW_TRACKING_URI>"

# The checkpoint sensor's timings (trainpipe.sensors.checkpoint, trainpipe.triggers.checkpoint):
# How often the train task's status.json (one small file) is read: the sensor ends within about
# this long after training does. Listing the checkpoints (a stall check) keeps its own, slower pace.
STATUS_POLL_SECONDS = 2.0
# While training has not started (or a failed try waits for its retry) the sensor looks again this
# often, holding no slot in between (reschedule mode). Not much shorter: Airflow 3.3 may fail a
# reschedule-mode sensor whose previous poke's executor event is processed after the next poke
# started (apache/airflow#71172), and a loaded scheduler can take seconds to process it.
WAITING_POKE = timedelta(seconds=15)
# Airflow queued train with the sensor (same upstream) but train has not written its status yet:
# it does so right after its own DAG parse, so the sensor looks every half second for up to this
# long instead of rescheduling, and defers as soon as training runs.
TRAIN_START_GRACE = timedelta(seconds=30)


# Fair sharing of GPUs (docs/cost-and-retention.md). The spec's `priority` -> Airflow priority_weight, the
# one mapping; train and trials use the "absolute" weight rule so that the weight is compared as given.
PRIORITY_WEIGHTS: dict[str, int] = {"low": 1, "normal": 10, "high": 100}
DEFAULT_PRIORITY = "normal"
DEFAULT_POOL = "default_pool"  # Airflow's own pool, until the platform policy names the team's
# Kubernetes: the PriorityClass (and Kueue WorkloadPriorityClass) of a priority; the platform creates them.
PRIORITY_CLASS_PREFIX = "trainpipe-"


def priority_class_for(priority: str) -> str:
    return f"{PRIORITY_CLASS_PREFIX}{priority}"


def run_key(airflow_run_id: str) -> str:
    """A DAG run id made safe for paths; stable across task tries, distinct across runs."""
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", airflow_run_id).strip("_")
    if not key.strip("."):
        # Airflow's run id pattern admits ".", "~.~" or "_._": as a path part that is the pipeline's runs folder
        # itself (or its parent), not a run's own folder.
        return "run-" + hashlib.sha256(airflow_run_id.encode()).hexdigest()[:16]
    return key


def checkpoint_poll_seconds(stall_timeout: timedelta) -> float:
    """How often the checkpoint sensor lists the checkpoints: often enough to notice a stall within a
    quarter of its timeout, never more than once a minute."""
    return max(0.5, min(60.0, stall_timeout.total_seconds() / 4))


def snapshot_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/snapshot"


def model_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/model"


def asset_key(uri: str) -> tuple[str, str, str]:
    """An asset URI as Airflow compares it: scheme lower-cased, a trailing '/' and the fragment dropped."""
    parts = urllib.parse.urlsplit(uri)
    return parts.scheme.lower(), parts.netloc, parts.path.rstrip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTask:
    task_id: str
    upstream: tuple[str, ...]
    summary: str
    # URIs of the Airflow Assets this task updates when it succeeds.
    outlets: tuple[str, ...] = ()
    # A mapped task: one task instance per slot 0..mapped_slots-1, at most max_active_per_run at once.
    mapped_slots: int | None = None
    max_active_per_run: int | None = None
    # Airflow's trigger rule; pick_best runs once every trial is done, so that none is left running.
    trigger_rule: str = "all_success"
    # GPU tasks (train, trials): the Airflow pool, its slots (GPUs held), and the absolute priority weight.
    pool: str | None = None
    pool_slots: int = 1
    priority_weight: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedParam:
    """A run parameter (Airflow Param) that overrides the plan's value at ``target`` for one run."""

    name: str
    # Path in the plan: ("trainer", "epochs"), ("evaluation", "decision_threshold"), ...
    target: tuple[str, ...]
    type: str
    default: float | int | None
    description: str
    # The declared minimum/maximum within the field's own (JSON Schema keywords).
    bounds: tuple[ParamBound, ...] = ()
    # Where the spec declares it (file, line, column), for the message about a refused value.
    declared_at: tuple[str, int | None, int | None] = ("", None, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class AssetSchedule:
    uris: tuple[str, ...]
    mode: str  # "all" or "any"


# data.snapshot auto: a folder of parquet files at least this large is snapshotted as a manifest (judged by the
# listed sizes alone); smaller ones are copied.
AUTO_MANIFEST_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class DataPlan:
    """The ``snapshot`` step: which rows, and how they split into train and holdout."""

    uri: str
    conn_id: str | None
    format: str
    time_column: str | None
    window: timedelta | None
    holdout_fraction: float
    # The holdout is chosen by a hash of this column (the query id for ranking), else of each row.
    holdout_key: str | None
    # Under a policy: the team's allowed data URI patterns (data.uris), checked again before reading.
    allowed_uris: tuple[str, ...] | None = None
    # (file, line, column) of data.uri in the spec, so a run that cannot read it says where to fix it.
    uri_declared_at: tuple[str, int | None, int | None] = ("", None, None)
    # data.snapshot: "auto", "copy" or "manifest" (trainpipe.spec.sections.data.SnapshotMode).
    snapshot: str = "auto"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaPolicy:
    """``validation.schema``: what each kind of change vs the baseline does ("allow", "warn", "fail")."""

    added_columns: str = "allow"
    removed_columns: str = "fail"
    retyped_columns: str = "fail"
    # Removing or retyping one of these always fails: features, label, query and time columns.
    used_columns: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftLevels:
    warn: float | None = None
    fail: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureDriftLevels:
    psi: DriftLevels | None
    ks: DriftLevels | None
    ignore: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftPlan:
    """``validation.drift``: the reference version and the levels, for all features and per feature."""

    reference: str  # "baseline" or a digest prefix
    bins: int
    psi: DriftLevels
    ks: DriftLevels
    features: tuple[tuple[str, FeatureDriftLevels], ...] = ()

    def levels_for(self, feature: str) -> FeatureDriftLevels:
        """A feature's own levels replace the common ones statistic by statistic."""
        own = dict(self.features).get(feature)
        if own is None:
            return FeatureDriftLevels(psi=self.psi, ks=self.ks)
        return FeatureDriftLevels(psi=own.psi or self.psi, ks=own.ks or self.ks, ignore=own.ignore)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationPlan:
    """The ``validate`` step: the Great Expectations suite, the volume, schema and drift checks."""

    expectations: tuple[tuple[str, dict[str, Any]], ...]
    required_columns: tuple[str, ...]
    max_volume_change: float | None
    schema: SchemaPolicy = SchemaPolicy()
    drift: DriftPlan | None = None
    # The columns compared for drift: the features.
    features: tuple[str, ...] = ()
    # Those declared text (training.transforms): compared on their words per row, every text being unique.
    text_features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    metric: str
    op: str
    threshold: float
    relative: bool
    # As the spec states it ("auc >= 0.8", "auc >= +0.5% vs champion"), for logs and reports.
    text: str
    # On the worst slice of EvaluationPlan.slices (lowest value; highest where lower is better).
    worst_slice: bool = False
    # Against the evaluation's baseline model: value OP baseline's value + threshold.
    baseline: bool = False

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationPlan:
    """The ``evaluate`` and ``gate`` steps."""

    task: str
    features: tuple[str, ...]
    label: str
    group_column: str | None
    metrics: tuple[str, ...]
    decision_threshold: float
    gates: tuple[Gate, ...]
    # Columns the holdout is sliced by: every metric per value of each (the report, worst_slice gates).
    slices: tuple[str, ...] = ()
    # "skip": a failed gate short-circuits registration and the run succeeds; "fail": the run fails.
    on_gate_failure: str = "skip"
    # Features declared text (training.transforms): the baseline reads them as TF-IDF of words and word pairs.
    text_features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalPlan:
    """``registration.approval``: with ``required``, the ``approve`` task waits for a person's answer."""

    required: bool
    # None: waits until answered.
    timeout: timedelta | None = None
    # The answer taken when nobody answered within timeout: "reject" or "approve".
    on_timeout: str = "reject"


@dataclass(frozen=True, slots=True, kw_only=True)
class CachePlan:
    """``training.cache``: a run whose training key a registered version carries trains nothing
    (``trainpipe.state.training_cache``)."""

    enabled: bool = True
    max_age: timedelta = timedelta(days=30)


@dataclass(frozen=True, slots=True, kw_only=True)
class BacktestPlan:
    """``registration.backtest``: what a run for a past window may do (``trainpipe.steps.backtest``)."""

    # Register the backtest's model, tagged trainpipe.backtest=true (never challenger).
    register: bool = False
    # With register: the alias of its own the version takes; None: none.
    alias: str | None = None
    # "deny": no alias of the lifecycle moves, the baseline stays; "allow": treated as any run.
    promote: str = "deny"


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistrationPlan:
    model_name: str
    # The production alias (champion); `promote` moves it.
    alias: str
    # Given by `register` to every new version.
    challenger_alias: str
    # Held by the version the production alias left, for `trainpipe rollback`.
    previous_alias: str
    description: str
    approval: ApprovalPlan = dataclasses.field(default_factory=lambda: ApprovalPlan(required=False))
    # Under a policy: the team that owns the model (its `trainpipe.owner` tag); register and promote
    # refuse a model another team owns.
    owner_team: str | None = None
    backtest: BacktestPlan = dataclasses.field(default_factory=BacktestPlan)


# The events ``notify:`` can send a message on (trainpipe.notifications.channels sends them).
GATE_FAILURE = "gate_failure"
TASK_FAILURE = "task_failure"
APPROVAL = "approval"
PROMOTION = "promotion"


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyChannel:
    """One ``notify:`` channel: where to send, through which Airflow connection, on which events."""

    kind: str  # "email" or "slack"
    conn_id: str
    events: tuple[str, ...]
    to: tuple[str, ...] = ()  # email
    from_email: str | None = None  # email; the connection's when None
    channel: str | None = None  # slack


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyPlan:
    channels: tuple[NotifyChannel, ...] = ()
    # notify.deadline.within: an Airflow Deadline Alert from the run's queued time (None: no deadline).
    deadline_within: timedelta | None = None

    def for_event(self, event: str) -> tuple[NotifyChannel, ...]:
        return tuple(c for c in self.channels if event in c.events)


@dataclass(frozen=True, slots=True, kw_only=True)
class SensorPlan:
    """The checkpoint sensor's timings."""

    stall_timeout: timedelta
    checkpoint_poll_seconds: float
    status_poll_seconds: float
    waiting_poke: timedelta
    train_start_grace: timedelta


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """``training.testing``: faults trainpipe's own tests inject into the trainer."""

    inject_nan_at_step: int | None = None
    crash_first_try_after_step: int | None = None
    step_delay_seconds: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourcePlan:
    """What one try of the training holds while it runs: the pool slots it takes and what it costs."""

    # GPUs of all nodes (Kubernetes: nodes x resources.gpus; the local launcher asks for none).
    gpus: int
    # CPU cores of all nodes (Kubernetes: nodes x the CPU request; local: one per trainer process).
    cpus: float
    gpu_resource: str | None
    # Placed on spot capacity only (a node selector or required affinity on a spot label): priced with the discount.
    spot: bool
    priority: str = DEFAULT_PRIORITY
    # Set when the spec sets `priority`: the pods' default PriorityClass and, in a queue, Kueue's
    # WorkloadPriorityClass (trainpipe-<priority>, created by the platform).
    priority_class: str | None = None
    # Cost is grouped by team: the spec's owner.
    team: str = ""

    @property
    def pool_slots(self) -> int:
        return self.gpus or 1


@dataclass(frozen=True, slots=True, kw_only=True)
class KubernetesPlan:
    """``training.kubernetes`` as plain data; ``trainpipe.kubernetes.builders`` makes the API objects.

    Nested sections are plain dicts with the spec's keys (``resources``: gpus, gpu_resource, cpu,
    memory, limits; ``tolerations``; ``affinity``: required, preferred; ``secret_env``: secret, key).
    """

    image: str
    namespace: str
    kubernetes_conn_id: str
    service_account: str | None
    image_pull_policy: str
    image_pull_secrets: tuple[str, ...]
    resources: dict[str, Any]
    node_selector: dict[str, str]
    tolerations: tuple[dict[str, Any], ...]
    affinity: dict[str, Any]
    priority_class: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    env: dict[str, str]
    secret_env: dict[str, dict[str, str]]
    env_from_secrets: tuple[str, ...]
    shm_size: str
    run_as_user: int
    on_finish_action: str
    schedule_timeout: timedelta
    startup_timeout: timedelta
    log_interval: timedelta
    termination_grace_period: timedelta
    max_pod_restarts: int
    ttl_after_finished: timedelta
    rendezvous_port: int
    # Kueue LocalQueue: the Job/pod is labelled for it and created suspended.
    queue: str | None = None
    # Retry with more memory after an OOM kill: {memory_factor, max_memory} (trainpipe.kubernetes.tries).
    on_oom: dict[str, Any] | None = None
    # Spot placement with an on-demand fallback: {spot: {node_selector, tolerations}, on_demand: {...},
    # on_demand_after_preemptions} (trainpipe.kubernetes.tries).
    capacity: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TuningPlan:
    """The hyperparameter search (``create_study``, ``trials``, ``pick_best``); storage is the environment's."""

    metric: str
    direction: str
    n_trials: int
    max_parallel: int
    timeout: timedelta | None
    sampler: str
    seed: int
    pruner: str
    # The pruner's keyword arguments: every process that loads the study builds the same pruner.
    pruner_options: dict[str, Any]
    # Each trial's epochs (the final training runs the trainer template's own).
    trial_epochs: int
    space: tuple[SearchDimension, ...]
    # champion | previous_study | none: what create_study enqueues as the first trials.
    warm_start: str = "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamPlan:
    """The spec's team under the platform policy (``trainpipe.policy``): what its DAG carries."""

    name: str
    pool: str | None = None  # of the train and trial tasks
    execution_timeout: timedelta | None = None  # of every task but the approval
    max_active_runs: int | None = None
    access_control: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (Airflow role, DAG permissions)
    data_uris: tuple[str, ...] | None = None
    # limits.max_cache_age: the cache's max_age when the spec does not write one (a written one above it is refused).
    max_cache_age: timedelta | None = None
    # sha256 of the policy's text the plan was compiled under.
    policy_digest: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    dag_id: str
    # The spec file as users name it (relative to the configs folder's parent), and its sha256.
    spec_file: str
    spec_sha256: str
    # The spec file relative to the configs root (the registry's `spec_file` tag: the same on every machine).
    spec_relative_path: str
    # (file, line, column) of training.features and training.label in the spec (and, where the spec has them,
    # label_classes, model.params and each top-level model.params.<name> of a family other than the mlp, and
    # model.type of one that is not built in): the train step's checks before torchrun starts point there.
    inputs_declared_at: dict[str, tuple[str, int | None, int | None]] = dataclasses.field(default_factory=dict)
    description: str
    owner: str
    tags: tuple[str, ...]
    schedule: str | AssetSchedule | None
    start_date: datetime
    retries: int
    retry_delay: timedelta
    tasks: tuple[PlannedTask, ...]
    params: tuple[PlannedParam, ...] = ()
    data: DataPlan
    validation: ValidationPlan
    # The trainer config of every run, with the per-run values as the placeholders above.
    trainer: TrainingConfig
    launch: LaunchPlan
    sensor: SensorPlan
    evaluation: EvaluationPlan
    registration: RegistrationPlan
    testing: FaultPlan
    kubernetes: KubernetesPlan | None = None
    notify: NotifyPlan = NotifyPlan()
    tuning: TuningPlan | None = None
    # Under a platform policy: the team the spec belongs to (None without a policy).
    team: TeamPlan | None = None
    resources: ResourcePlan = ResourcePlan(gpus=0, cpus=1.0, gpu_resource=None, spot=False)
    cache: CachePlan = CachePlan()
    # Where the spec file is on the machine that compiled it: for git lineage only, never shown.
    source_path: str = dataclasses.field(default="", repr=False, compare=False)
    # The spec file's text (what spec_sha256 hashes), logged on the training run as an artifact.
    spec_text: str = dataclasses.field(default="", repr=False, compare=False)

    def task(self, task_id: str) -> PlannedTask:
        return next(t for t in self.tasks if t.task_id == task_id)

    @property
    def class_label(self) -> str | None:
        """The label column whose classes each dataset version records: multiclass only."""
        return self.trainer.label if self.trainer.task == "multiclass_classification" else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["source_path"], out["spec_text"]
        out["trainer"] = self.trainer.to_dict()
        out["start_date"] = self.start_date.isoformat()
        # Plans of specs without text columns stay byte-identical to those from before them.
        for section in ("validation", "evaluation"):
            if not out[section]["text_features"]:
                del out[section]["text_features"]
        return out
