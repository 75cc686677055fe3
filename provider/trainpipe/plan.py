"""Stage 3 of compilation: a validated spec -> an Airflow-free plan, the contract between stages.

Everything a later stage needs is resolved here into plain data: the tasks and their edges, each
step's inputs (data window, checks, metrics and gates, registry names), the trainer config
template, the exact launch (argv and environment, rendezvous included) and the checkpoint
sensor's timings. ``trainpipe render`` prints it, most tests assert on it, and nothing after this
stage reads the spec: ``trainpipe.dag_builder`` turns the plan into Airflow objects and the
operators, runtime steps and launchers read only their part of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.launch import LaunchPlan, plan_launch
from trainpipe.spec.bounds import ParamBound
from trainpipe.spec.loader import format_path
from trainpipe_trainer.config import (
    CHECKPOINT_METRICS,
    PREEMPTION_GRACE_SECONDS,
    CheckpointConfig,
    DeepSpeedConfig,
    EarlyStoppingConfig,
    FeatureTransform,
    ModelConfig,
    OptimizationConfig,
    SearchDimension,
    TrackingConfig,
    TrainingConfig,
    apply_trial_params,
)

# The spec models (pydantic, 0.1 s to import) are imported where a plan is built, not here: a plan
# or DAG unpickled from the plan cache needs only this module (ADR 0012).
if TYPE_CHECKING:
    from trainpipe.spec.kubernetes import KubernetesSpec
    from trainpipe.spec.models import DriftSpec, PipelineSpec, PrunerSpec, TrainingSpec
    from trainpipe.spec.loader import LoadedYaml

TASK_ORDER: tuple[str, ...] = ("snapshot", "validate", "train", "evaluate", "gate", "register", "promote")
TRAIN_TASK = "train"
# With registration.approval required: between register and promote, waits for a person's answer.
APPROVE_TASK = "approve"
# With `tuning:`, between validate and train: the study, its trial workers (one mapped task), the best trial.
TUNING_TASKS: tuple[str, ...] = ("create_study", "trials", "pick_best")
TRIALS_TASK = "trials"
# Runs beside `train` (same upstream), outside the chain: watches its checkpoints for stalls.
CHECKPOINT_SENSOR = "watch_checkpoints"

_TASK_SUMMARIES = {
    "snapshot": "immutable, content-addressed copy of the input window",
    "validate": "Great Expectations suite, volume, schema and drift checks vs the baseline version; stops the run "
                "before training on failure",
    "train": "torchrun the trainer; resumes from this run's latest checkpoint",
    "evaluate": "holdout metrics (per slice too) of the new model and of the current champion, the evaluation report",
    "gate": "every gate must pass, else registration is skipped",
    "register": "new MLflow model version (once per DAG run) with lineage tags and the challenger alias",
    "promote": "moves the production alias to the new version, the old one to the previous alias; tags who, when, why",
    APPROVE_TASK: "waits for a person to approve the version (Required Actions); reject or timeout-reject keeps "
    "it challenger, tagged rejected",
    CHECKPOINT_SENSOR: "beside train: logs checkpoint progress, fails when none is committed for stall_timeout",
    "create_study": "the run's Optuna study (sampler, pruner) and its MLflow parent run",
    "trials": "max_parallel trial workers (mapped): each launches the trainer once and runs trials back to back",
    "pick_best": "the best complete trial; study plots on the parent run; train runs with its parameters",
}

_GATE_SUMMARIES = {
    "skip": _TASK_SUMMARIES["gate"],
    "fail": "every gate must pass, else the run fails (nothing is registered)",
}

# The trainer config template's per-run values, filled by trainpipe.runtime.train for each try.
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
# Tasks that hold GPUs: they take the pool with one slot per GPU.
GPU_TASKS: tuple[str, ...] = ("train", "trials")
# Kubernetes: the PriorityClass (and Kueue WorkloadPriorityClass) of a priority; the platform creates them.
PRIORITY_CLASS_PREFIX = "trainpipe-"


def priority_class_for(priority: str) -> str:
    return f"{PRIORITY_CLASS_PREFIX}{priority}"


def run_key(airflow_run_id: str) -> str:
    """A DAG run id made safe for paths; stable across task tries, distinct across runs."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", airflow_run_id).strip("_")


def checkpoint_poll_seconds(stall_timeout: timedelta) -> float:
    """How often the checkpoint sensor lists the checkpoints: often enough to notice a stall within a
    quarter of its timeout, never more than once a minute."""
    return max(0.5, min(60.0, stall_timeout.total_seconds() / 4))


def snapshot_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/snapshot"


def model_asset_uri(pipeline_id: str) -> str:
    return f"trainpipe://{pipeline_id}/model"


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
    (``trainpipe.runtime.training_cache``)."""

    enabled: bool = True
    max_age: timedelta = timedelta(days=30)


@dataclass(frozen=True, slots=True, kw_only=True)
class BacktestPlan:
    """``registration.backtest``: what a run for a past window may do (``trainpipe.runtime.backtest``)."""

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


# The events ``notify:`` can send a message on (trainpipe.notifications sends them).
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
    # (file, line, column) of training.features and training.label in the spec: the train step's check
    # of the snapshot against them (before torchrun starts) points there.
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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["source_path"], out["spec_text"]
        out["start_date"] = self.start_date.isoformat()
        return out


def _torchrun_restarts(training: TrainingSpec) -> int:
    elastic = training.distributed.elastic is not None
    return training.kubernetes.max_pod_restarts + (training.preemption.max_restarts if elastic else 0)


def _shutdown_timeout(training: TrainingSpec) -> int:
    """How long torchrun waits for its workers after a SIGTERM: a pod's grace period less a margin
    for torchrun's own exit (the kubelet SIGKILLs everything at its end), else the local default."""
    if training.launcher == "kubernetes" and training.kubernetes is not None:
        grace = int(training.kubernetes.termination_grace_period.total_seconds())
        return max(grace - max(grace // 10, 5), 1)
    return PREEMPTION_GRACE_SECONDS


def build_plan(spec: PipelineSpec, *, spec_file: str, spec_text: str, source_path: str = "",
               spec_relative_path: str | None = None, loaded: LoadedYaml | None = None,
               team: TeamPlan | None = None) -> PipelinePlan:
    """``loaded`` (the spec's YAML with positions) locates run parameters for later messages;
    ``spec_relative_path`` is the file relative to its configs root (default: its base name); ``team``
    is the spec's team under the platform policy (owner, tag, pool of the GPU tasks, run-time checks;
    a priority above the team's `limits.max_priority` is refused at the spec stage, not capped here)."""
    pool = team.pool if team is not None and team.pool else DEFAULT_POOL
    training = spec.training
    priority = spec.priority or DEFAULT_PRIORITY
    kubernetes = (_kubernetes(training.kubernetes, priority=priority if spec.priority else None)
                  if training.kubernetes is not None else None)
    resources = _resources(spec, kubernetes, priority,
                           priority_class=priority_class_for(priority) if spec.priority else None,
                           team=team.name if team is not None else spec.owner)
    distributed = training.distributed
    multinode = training.launcher == "kubernetes" and distributed.nnodes > 1 and kubernetes is not None
    launch = plan_launch(
        launcher=training.launcher, nproc_per_node=distributed.nproc_per_node, nnodes=distributed.nnodes,
        strategy=distributed.strategy,
        rendezvous_port=kubernetes.rendezvous_port if multinode else None,
        # Elastic: each preemption of a node costs the other nodes' torchrun one restart (their ranks stop
        # after committing the step and rejoin at the new size). Without it, a preempted step ends every
        # pod with the preempted exit code, which the Job's podFailurePolicy ignores: they are recreated.
        max_restarts=_torchrun_restarts(training) if multinode else 0,
        min_nodes=distributed.elastic.min_nodes if multinode and distributed.elastic is not None else None,
        extra_env=tuple(kubernetes.env.items()) if kubernetes is not None and training.launcher == "kubernetes" else (),
        preemption_restarts=training.preemption.max_restarts,
        shutdown_timeout_seconds=_shutdown_timeout(training),
    )
    stall_timeout = training.checkpoint.stall_timeout
    return PipelinePlan(
        dag_id=spec.pipeline_id,
        spec_file=spec_file,
        spec_sha256=hashlib.sha256(spec_text.encode()).hexdigest(),
        spec_relative_path=spec_relative_path or PurePath(spec_file).name,
        inputs_declared_at={name: loaded.location_of(("training", name)) for name in ("features", "label")}
        if loaded is not None else {},
        description=spec.description,
        # Under a policy the team owns the DAG, whatever the spec says: the policy always wins.
        owner=team.name if team is not None else spec.owner,
        tags=("trainpipe", *spec.tags, *((f"team:{team.name}",) if team is not None else ())),
        schedule=_schedule(spec),
        start_date=spec.start_date,
        retries=spec.retries,
        retry_delay=spec.retry_delay,
        tasks=_tasks(spec.pipeline_id, on_gate_failure=spec.evaluation.on_gate_failure,
                     approval_required=spec.registration.approval.mode == "required", tuning=_tuning(spec),
                     gpu_queue={"pool": pool, "pool_slots": resources.pool_slots,
                                "priority_weight": PRIORITY_WEIGHTS[priority]}),
        params=_params(spec, loaded),
        data=DataPlan(
            uri=spec.data.uri, conn_id=spec.data.conn_id, format=spec.data.resolved_format,
            time_column=spec.data.time_column, window=spec.data.window,
            holdout_fraction=spec.evaluation.holdout_fraction,
            holdout_key=training.group_column if training.task == "ranking" else None,
            allowed_uris=team.data_uris if team is not None else None,
            uri_declared_at=loaded.location_of(("data", "uri")) if loaded is not None else ("", None, None),
        ),
        validation=ValidationPlan(
            expectations=tuple((e.name, dict(e.kwargs)) for e in spec.validation.expectations),
            required_columns=tuple(dict.fromkeys((
                *training.features, training.label, *([training.group_column] if training.group_column else []),
                *spec.evaluation.slices))),
            max_volume_change=spec.validation.max_volume_change,
            schema=SchemaPolicy(
                added_columns=spec.validation.schema_.added_columns,
                removed_columns=spec.validation.schema_.removed_columns,
                retyped_columns=spec.validation.schema_.retyped_columns,
                used_columns=tuple(dict.fromkeys(
                    (*training.features, training.label,
                     *([training.group_column] if training.group_column else []),
                     *([spec.data.time_column] if spec.data.time_column else [])))),
            ),
            drift=_drift(spec.validation.drift) if spec.validation.drift is not None else None,
            features=tuple(training.features),
        ),
        trainer=_trainer_template(spec),
        launch=launch,
        sensor=SensorPlan(stall_timeout=stall_timeout, checkpoint_poll_seconds=checkpoint_poll_seconds(stall_timeout),
                          status_poll_seconds=STATUS_POLL_SECONDS, waiting_poke=WAITING_POKE,
                          train_start_grace=TRAIN_START_GRACE),
        evaluation=EvaluationPlan(
            task=training.task, features=tuple(training.features), label=training.label,
            group_column=training.group_column, metrics=tuple(spec.evaluation.metrics),
            decision_threshold=spec.evaluation.decision_threshold,
            gates=tuple(Gate(metric=g.metric, op=g.op, threshold=g.threshold, relative=g.relative, text=str(g),
                             worst_slice=g.worst_slice, baseline=g.baseline)
                        for g in spec.evaluation.gates),
            on_gate_failure=spec.evaluation.on_gate_failure,
            slices=tuple(spec.evaluation.slices),
        ),
        registration=RegistrationPlan(model_name=spec.registration.model_name, alias=spec.registration.alias,
                                      challenger_alias=spec.registration.challenger_alias,
                                      previous_alias=spec.registration.previous_alias,
                                      description=spec.description, approval=_approval(spec),
                                      owner_team=team.name if team is not None else None,
                                      backtest=_backtest(spec)),
        testing=FaultPlan(inject_nan_at_step=training.testing.inject_nan_at_step,
                          crash_first_try_after_step=training.testing.crash_first_try_after_step,
                          step_delay_seconds=training.testing.step_delay_seconds),
        kubernetes=kubernetes,
        notify=_notify(spec),
        tuning=_tuning(spec),
        team=team,
        resources=resources,
        cache=CachePlan(enabled=training.cache.enabled, max_age=min(
            training.cache.max_age, team.max_cache_age if team is not None and team.max_cache_age else timedelta.max)),
        source_path=source_path,
        spec_text=spec_text,
    )


def _notify(spec: PipelineSpec) -> NotifyPlan:
    if spec.notify is None:
        return NotifyPlan()
    channels = []
    if (email := spec.notify.email) is not None:
        channels.append(NotifyChannel(kind="email", conn_id=email.conn_id, events=tuple(dict.fromkeys(email.events)),
                                      to=tuple(email.to), from_email=email.from_email))
    if (slack := spec.notify.slack) is not None:
        channels.append(NotifyChannel(kind="slack", conn_id=slack.conn_id, events=tuple(dict.fromkeys(slack.events)),
                                      channel=slack.channel))
    deadline = spec.notify.deadline
    return NotifyPlan(channels=tuple(channels), deadline_within=deadline.within if deadline is not None else None)


def _backtest(spec: PipelineSpec) -> BacktestPlan:
    backtest = spec.registration.backtest
    return BacktestPlan(register=backtest.register_version, alias=backtest.alias, promote=backtest.promote)


def _approval(spec: PipelineSpec) -> ApprovalPlan:
    approval = spec.registration.approval
    if approval.mode != "required":
        return ApprovalPlan(required=False)
    return ApprovalPlan(required=True, timeout=approval.timeout, on_timeout=approval.on_timeout)


def task_order(*, approval_required: bool = False) -> tuple[str, ...]:
    """The chain's task ids; with approval required, ``approve`` sits between register and promote."""
    if not approval_required:
        return TASK_ORDER
    at = TASK_ORDER.index("promote")
    return (*TASK_ORDER[:at], APPROVE_TASK, *TASK_ORDER[at:])


def _tasks(pipeline_id: str, *, on_gate_failure: str = "skip", approval_required: bool = False,
           tuning: TuningPlan | None = None, gpu_queue: dict[str, Any] | None = None) -> tuple[PlannedTask, ...]:
    """The chain snapshot -> ... -> promote, with the sensor beside train (same upstream); with
    tuning, create_study -> trials -> pick_best between validate and train."""
    # The model asset is updated where the production alias moves: downstream pipelines follow the champion.
    outlets = {"snapshot": (snapshot_asset_uri(pipeline_id),), "promote": (model_asset_uri(pipeline_id),)}
    summaries = {**_TASK_SUMMARIES, "gate": _GATE_SUMMARIES[on_gate_failure]}
    order = list(task_order(approval_required=approval_required))
    if tuning is not None:
        train_at = order.index(TRAIN_TASK)
        order[train_at:train_at] = TUNING_TASKS
    # One long-lived trial worker per parallel trial (not one task per trial): ADR 0011.
    mapped = {TRIALS_TASK: {"mapped_slots": tuning.max_parallel, "max_active_per_run": tuning.max_parallel},
              "pick_best": {"trigger_rule": "all_done"}} if tuning else {}
    queued = {task_id: gpu_queue for task_id in GPU_TASKS} if gpu_queue else {}
    tasks = [
        PlannedTask(task_id=task_id, upstream=(order[i - 1],) if i else (), summary=summaries[task_id],
                    outlets=outlets.get(task_id, ()), **mapped.get(task_id, {}), **queued.get(task_id, {}))
        for i, task_id in enumerate(order)
    ]
    train = order.index(TRAIN_TASK)
    sensor = PlannedTask(task_id=CHECKPOINT_SENSOR, upstream=tasks[train].upstream,
                         summary=_TASK_SUMMARIES[CHECKPOINT_SENSOR])
    return (*tasks[: train + 1], sensor, *tasks[train + 1 :])


def pruner_arguments(pruner: PrunerSpec) -> dict[str, int]:
    """The pruner's Optuna keyword arguments (``trainpipe_trainer.config.PRUNER_ARGUMENTS``) from the
    spec's options over the measured defaults; the resource is the percent of a trial done."""
    options = pruner.options()
    if pruner.type == "median":
        # Optuna's steps are our percent: median's warm-up is the first percent it may stop a trial at.
        return {"n_startup_trials": options["n_startup_trials"], "n_warmup_steps": options["min_resource"]}
    return options


def _trainer_target(spec_path: tuple[str, ...]) -> tuple[str, ...]:
    # The trainer config keeps the spec's training field names, without optimization's own section name.
    return spec_path[1:]


def _tuning(spec: PipelineSpec) -> TuningPlan | None:
    import json

    from trainpipe.spec.models import TUNABLE_PARAMS

    tuning = spec.tuning
    if tuning is None:
        return None
    dimensions = []
    for name, distribution in tuning.space.items():
        kind = distribution.kind
        low_high = distribution.log_uniform or distribution.uniform or distribution.int_range
        dimensions.append(SearchDimension(
            name=name, target=_trainer_target(TUNABLE_PARAMS[name][0]), distribution=kind,
            low=low_high[0] if low_high else None, high=low_high[1] if low_high else None,
            choices=tuple(json.dumps(c) for c in distribution.choice) if distribution.choice is not None else (),
        ))
    return TuningPlan(
        metric=tuning.metric, direction=tuning.direction or CHECKPOINT_METRICS[spec.training.task][tuning.metric],
        n_trials=tuning.n_trials,
        max_parallel=min(tuning.max_parallel, tuning.n_trials), timeout=tuning.timeout, sampler=tuning.sampler,
        seed=tuning.seed, pruner=tuning.pruner.type, pruner_options=pruner_arguments(tuning.pruner),
        trial_epochs=tuning.trial_epochs or spec.training.epochs, space=tuple(dimensions),
        warm_start=tuning.warm_start,
    )


def _trainer_template(spec: PipelineSpec) -> TrainingConfig:
    training = spec.training
    distributed = training.distributed
    optimization = training.optimization
    checkpoint = training.checkpoint
    return TrainingConfig(
        pipeline_id=spec.pipeline_id,
        task=training.task,
        train_data_uri=SNAPSHOT_TRAIN_URI,
        dataset_digest=SNAPSHOT_DIGEST,
        features=tuple(training.features),
        transforms=_feature_transforms(spec),
        label=training.label,
        group_column=training.group_column,
        model=ModelConfig(type=training.model.type, hidden_layers=tuple(training.model.hidden_layers),
                          dropout=training.model.dropout, ranking_loss=training.model.ranking_loss),
        epochs=training.epochs,
        batch_size=training.batch_size,
        learning_rate=training.learning_rate,
        early_stopping=EarlyStoppingConfig(**training.early_stopping.model_dump())
        if training.early_stopping is not None else None,
        seed=training.seed,
        data_placement=training.data_placement,
        strategy=distributed.strategy,
        optimization=OptimizationConfig(**optimization.model_dump()),
        deepspeed=DeepSpeedConfig(zero_stage=distributed.zero_stage, offload_optimizer=distributed.offload_optimizer,
                                  offload_param=distributed.offload_param)
        if distributed.strategy == "deepspeed" else None,
        checkpoint=CheckpointConfig(
            root_uri=RUN_CHECKPOINTS_URI,
            every_n_steps=checkpoint.every_n_steps,
            every_seconds=checkpoint.every.total_seconds() if checkpoint.every else None,
            keep_last=checkpoint.keep_last,
            keep_best=checkpoint.keep_best,
            validation_fraction=checkpoint.validation_fraction,
        ),
        tracking=TrackingConfig(tracking_uri=TRACKING_URI, experiment_name=f"trainpipe/{spec.pipeline_id}"),
        output_uri=RUN_OUTPUT_URI,
    )


def _levels(section: Any) -> DriftLevels | None:
    return DriftLevels(warn=section.warn, fail=section.fail) if section is not None else None


def _drift(section: DriftSpec) -> DriftPlan:
    return DriftPlan(
        reference=section.reference, bins=section.bins, psi=_levels(section.psi), ks=_levels(section.ks),
        features=tuple((name, FeatureDriftLevels(psi=_levels(f.psi), ks=_levels(f.ks), ignore=f.ignore))
                       for name, f in section.features.items()),
    )


def _feature_transforms(spec: PipelineSpec) -> tuple[FeatureTransform, ...]:
    """The declared transforms in feature order; undeclared features keep the trainer's default."""
    transforms = []
    for name in spec.training.features:
        declared = spec.training.transforms.get(name)
        if declared is None:
            continue
        if declared.resolved_type == "categorical":
            # Options left out keep the trainer's defaults (one_hot, 20 categories, 32 buckets).
            options = {"encode": declared.encode, "max_categories": declared.max_categories,
                       "hash_buckets": declared.hash_buckets}
            transforms.append(FeatureTransform(feature=name, type="categorical",
                                               **{k: v for k, v in options.items() if v is not None}))
        else:
            transforms.append(FeatureTransform(
                feature=name, impute=declared.impute, fill_value=declared.fill_value,
                missing_indicator=declared.missing_indicator,
                clip_min=declared.clip.min if declared.clip else None, clip_max=declared.clip.max if declared.clip else None,
                transform=declared.transform, standardize=declared.standardize))
    return tuple(transforms)


def _kubernetes(section: KubernetesSpec, *, priority: str | None = None) -> KubernetesPlan:
    """``priority``: the spec's (capped) priority when it sets one: the pods' PriorityClass unless the
    section names its own."""
    raw = section.model_dump()
    for name in ("image_pull_secrets", "tolerations", "env_from_secrets"):
        raw[name] = tuple(raw[name])
    if priority is not None:
        raw["priority_class"] = raw["priority_class"] or priority_class_for(priority)
    return KubernetesPlan(**raw)


def _resources(spec: PipelineSpec, kubernetes: KubernetesPlan | None, priority: str, *,
               priority_class: str | None, team: str) -> ResourcePlan:
    from trainpipe.costs import cpu_quantity, selects_spot_only

    distributed = spec.training.distributed
    if spec.training.launcher == "kubernetes" and kubernetes is not None:
        nodes = distributed.nnodes
        gpus = nodes * kubernetes.resources["gpus"]
        return ResourcePlan(gpus=gpus, cpus=nodes * cpu_quantity(kubernetes.resources["cpu"]),
                            gpu_resource=kubernetes.resources["gpu_resource"] if gpus else None,
                            # With a capacity section the first tries run on its spot placement (each try's
                            # own placement is in its usage entry: runtime.usage prices them apart).
                            spot=kubernetes.capacity is not None
                            or selects_spot_only(kubernetes.node_selector, kubernetes.affinity["required"]),
                            priority=priority, priority_class=priority_class, team=team)
    return ResourcePlan(gpus=0, cpus=float(distributed.nnodes * distributed.nproc_per_node), gpu_resource=None,
                        spot=False, priority=priority, priority_class=priority_class, team=team)


def _schedule(spec: PipelineSpec) -> str | AssetSchedule | None:
    from trainpipe.spec.models import AssetScheduleSpec

    if isinstance(spec.schedule, AssetScheduleSpec):
        return AssetSchedule(uris=tuple(spec.schedule.assets), mode=spec.schedule.mode)
    return spec.schedule


def _param_target(spec_path: tuple[str, ...]) -> tuple[str, ...]:
    # The trainer config keeps the spec's training field names (epochs, model.dropout, ...).
    return ("trainer", *spec_path[1:]) if spec_path[0] == "training" else spec_path


def _params(spec: PipelineSpec, loaded: LoadedYaml | None) -> tuple[PlannedParam, ...]:
    from trainpipe.spec.models import OVERRIDABLE_PARAMS, overridden_value, param_bounds

    planned = []
    for name, param in spec.params.items():
        path, json_type = OVERRIDABLE_PARAMS[name]
        planned.append(PlannedParam(
            name=name, target=_param_target(path), type=json_type,
            default=param.default if param.default is not None else overridden_value(spec, name),
            description=param.description or f"overrides {'.'.join(path)} for this run",
            bounds=param_bounds(name, param),
            declared_at=loaded.location_of(("params", name)) if loaded is not None else ("", None, None),
        ))
    return tuple(planned)


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = getattr(obj, part)
    return obj


def _replace(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """``obj`` with the field at ``path`` replaced (each frozen section re-checks its own values)."""
    head, *rest = path
    return dataclasses.replace(obj, **{head: _replace(getattr(obj, head), tuple(rest), value) if rest else value})


def apply_run_params(plan: PipelinePlan, values: dict[str, Any]) -> tuple[PipelinePlan, dict[str, Any]]:
    """The plan of one run: declared params present in ``values`` replace their planned values.

    Each value is checked against the param's type and bounds (the same ones the trigger form
    enforces); a refused value is a ``SpecError`` located at the param's declaration. Returns the
    run's plan and the overrides that changed something (recorded in MLflow).
    """
    changed: dict[str, Any] = {}
    for param in plan.params:
        if values.get(param.name) is None:
            continue
        value = _checked_param_value(param, values[param.name])
        if _get(plan, param.target) != value:
            changed[param.name] = value
            plan = _replace(plan, param.target, value)
    return plan, changed


def _checked_param_value(param: PlannedParam, value: Any) -> float | int:
    problem = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        problem = f"is not a {param.type}"
    elif param.type == "integer" and value != int(value):
        problem = "is not a whole number"
    else:
        value = int(value) if param.type == "integer" else value
        problem = next((f"is not {b.describe()} ({b.source})" for b in param.bounds if not b.admits(value)), None)
    if problem is not None:
        file, line, column = param.declared_at
        raise SpecError([SpecProblem(file, line, column, format_path(("params", param.name)),
                                     f"this run's value {value!r} {problem}; trigger the run with a value within "
                                     "the param's bounds")])
    return value


def with_trial_params(plan: PipelinePlan, params: dict[str, Any], *, trial_epochs: bool = False) -> PipelinePlan:
    """The plan whose trainer config takes a trial's hyperparameters (as Optuna stores them: a choice
    that is a list is its JSON text), and, for a trial, the search's epochs per trial."""
    if plan.tuning is None:
        raise ValueError("the plan has no tuning section")
    trainer = apply_trial_params(plan.trainer, plan.tuning.space, params)
    if trial_epochs:
        trainer = dataclasses.replace(trainer, epochs=plan.tuning.trial_epochs)
    return dataclasses.replace(plan, trainer=trainer)
