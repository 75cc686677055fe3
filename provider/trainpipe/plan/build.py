"""Stage 3 of compilation: a validated spec -> the Airflow-free plan."""


from __future__ import annotations

import copy
import hashlib
from datetime import timedelta
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from trainpipe.plan.launch import plan_launch
from trainpipe.plan.model import (
    DEFAULT_POOL,
    DEFAULT_PRIORITY,
    PRIORITY_WEIGHTS,
    RUN_CHECKPOINTS_URI,
    RUN_OUTPUT_URI,
    SNAPSHOT_DIGEST,
    SNAPSHOT_TRAIN_URI,
    STATUS_POLL_SECONDS,
    TRACKING_URI,
    TRAIN_START_GRACE,
    WAITING_POKE,
    ApprovalPlan,
    AssetSchedule,
    BacktestPlan,
    CachePlan,
    DataPlan,
    DriftLevels,
    DriftPlan,
    EvaluationPlan,
    FaultPlan,
    FeatureDriftLevels,
    Gate,
    KubernetesPlan,
    NotifyChannel,
    NotifyPlan,
    PipelinePlan,
    PlannedParam,
    PlannedTask,
    RegistrationPlan,
    ResourcePlan,
    SchemaPolicy,
    SensorPlan,
    TeamPlan,
    TuningPlan,
    ValidationPlan,
    checkpoint_poll_seconds,
    model_asset_uri,
    priority_class_for,
    snapshot_asset_uri,
)
from trainpipe.plan.steps import (
    _GATE_SUMMARIES,
    _TASK_SUMMARIES,
    APPROVE_TASK,
    CHECKPOINT_SENSOR,
    GATE,
    GPU_TASKS,
    PICK_BEST,
    PROMOTE,
    SNAPSHOT,
    TASK_ORDER,
    TRAIN_TASK,
    TRIALS_TASK,
    TUNING_TASKS,
)
from trainpipe.plan.tracking import experiment_name
from trainpipe_trainer.config import (
    BUILT_IN_MODEL_TYPES,
    CHECKPOINT_METRICS,
    DEFAULT_TEXT_HASH_BUCKETS,
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
)

# The spec models (pydantic, 0.1 s to import) are imported where a plan is built, not here: a plan
# or DAG unpickled from the plan cache needs only this module (ADR 0012).
if TYPE_CHECKING:
    from trainpipe.spec.loader import FieldPath, LoadedYaml
    from trainpipe.spec.sections.kubernetes import KubernetesSpec
    from trainpipe.spec.sections.pipeline import PipelineSpec
    from trainpipe.spec.sections.training import TrainingSpec
    from trainpipe.spec.sections.tuning import PrunerSpec
    from trainpipe.spec.sections.validation import DriftLevelsSpec, DriftSpec, KsLevelsSpec


def _torchrun_restarts(training: TrainingSpec, kubernetes: KubernetesSpec) -> int:
    elastic = training.distributed.elastic is not None
    return kubernetes.max_pod_restarts + (training.preemption.max_restarts if elastic else 0)


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
    # The pods of a multi-node run (torchrun rendezvouses across them), else None.
    multinode = training.kubernetes if training.launcher == "kubernetes" and distributed.nnodes > 1 else None
    launch = plan_launch(
        launcher=training.launcher, nproc_per_node=distributed.nproc_per_node, nnodes=distributed.nnodes,
        strategy=distributed.strategy,
        rendezvous_port=multinode.rendezvous_port if multinode is not None else None,
        # Elastic: each preemption of a node costs the other nodes' torchrun one restart (their ranks stop
        # after committing the step and rejoin at the new size). Without it, a preempted step ends every
        # pod with the preempted exit code, which the Job's podFailurePolicy ignores: they are recreated.
        max_restarts=_torchrun_restarts(training, multinode) if multinode is not None else 0,
        min_nodes=distributed.elastic.min_nodes if multinode is not None and distributed.elastic is not None else None,
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
        inputs_declared_at=_inputs_declared_at(spec, loaded) if loaded is not None else {},
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
            snapshot=spec.data.snapshot,
        ),
        validation=ValidationPlan(
            expectations=tuple((e.name, dict(e.kwargs)) for e in spec.validation.expectations),
            required_columns=tuple(dict.fromkeys((
                *training.features, *_label(spec), *([training.group_column] if training.group_column else []),
                *spec.evaluation.slices))),
            max_volume_change=spec.validation.max_volume_change,
            schema=SchemaPolicy(
                added_columns=spec.validation.schema_.added_columns,
                removed_columns=spec.validation.schema_.removed_columns,
                retyped_columns=spec.validation.schema_.retyped_columns,
                used_columns=tuple(dict.fromkeys(
                    (*training.features, *_label(spec),
                     *([training.group_column] if training.group_column else []),
                     *([spec.data.time_column] if spec.data.time_column else [])))),
            ),
            drift=_drift(spec.validation.drift) if spec.validation.drift is not None else None,
            features=tuple(training.features),
            text_features=_text_features(spec),
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
            text_features=_text_features(spec),
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
    at = TASK_ORDER.index(PROMOTE.task_id)
    return (*TASK_ORDER[:at], APPROVE_TASK, *TASK_ORDER[at:])


def _tasks(pipeline_id: str, *, on_gate_failure: str = "skip", approval_required: bool = False,
           tuning: TuningPlan | None = None, gpu_queue: dict[str, Any] | None = None) -> tuple[PlannedTask, ...]:
    """The chain snapshot -> ... -> promote, with the sensor beside train (same upstream); with
    tuning, create_study -> trials -> pick_best between validate and train."""
    # The model asset is updated where the production alias moves: downstream pipelines follow the champion.
    outlets = {SNAPSHOT.task_id: (snapshot_asset_uri(pipeline_id),), PROMOTE.task_id: (model_asset_uri(pipeline_id),)}
    summaries = {**_TASK_SUMMARIES, GATE.task_id: _GATE_SUMMARIES[on_gate_failure]}
    order = list(task_order(approval_required=approval_required))
    if tuning is not None:
        train_at = order.index(TRAIN_TASK)
        order[train_at:train_at] = TUNING_TASKS
    # One long-lived trial worker per parallel trial (not one task per trial): ADR 0011.
    mapped: dict[str, dict[str, Any]] = {
        TRIALS_TASK: {"mapped_slots": tuning.max_parallel, "max_active_per_run": tuning.max_parallel},
        PICK_BEST.task_id: {"trigger_rule": "all_done"}} if tuning else {}
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

    from trainpipe.spec.sections.tuning import TUNABLE_PARAMS

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


def _inputs_declared_at(spec: PipelineSpec, loaded: LoadedYaml) -> dict[str, tuple[str, int | None, int | None]]:
    """Where the train step's checks before launch point: the snapshot's columns and classes, a family's params
    (each top-level parameter at its own line; the mlp takes none) and the lookup of a family that is not built
    in. Only what the spec has, so the plans of other specs stay as they were."""
    training = spec.training
    names: list[FieldPath] = [("features",), ("label",)]
    if training.label_classes is not None:
        names.append(("label_classes",))
    if training.model.type not in BUILT_IN_MODEL_TYPES:
        names.append(("model", "type"))
    if training.model.type != "mlp":
        names += [("model", "params"), *(("model", "params", key) for key in training.model.params)]
    if training.model.pretrained is not None:
        names.append(("model", "pretrained"))
    return {".".join(map(str, name)): loaded.location_of(("training", *name)) for name in names}


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
        # The pinned classes as the text the label's values are compared with; unpinned, the snapshot's.
        label_classes=tuple(str(name) for name in training.label_classes or ()),
        group_column=training.group_column,
        model=ModelConfig(type=training.model.type, hidden_layers=tuple(training.model.hidden_layers),
                          dropout=training.model.dropout, ranking_loss=training.model.ranking_loss,
                          # The spec's literal values: the family checks them in the train task (never rendered).
                          params=copy.deepcopy(training.model.params),
                          # As the spec wrote it; the train step resolves a storage path against its worker's root
                          # and checks it again, as the snapshot step does data.uri (steps.train.pretrained_uri).
                          pretrained_uri=training.model.pretrained),
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
        tracking=TrackingConfig(tracking_uri=TRACKING_URI, experiment_name=experiment_name(spec.pipeline_id)),
        output_uri=RUN_OUTPUT_URI,
    )


def _levels(section: DriftLevelsSpec | KsLevelsSpec) -> DriftLevels:
    return DriftLevels(warn=section.warn, fail=section.fail)


def _feature_levels(section: DriftLevelsSpec | KsLevelsSpec | None) -> DriftLevels | None:
    """A feature's own levels, None where it keeps the section's."""
    return _levels(section) if section is not None else None


def _drift(section: DriftSpec) -> DriftPlan:
    return DriftPlan(
        reference=section.reference, bins=section.bins, psi=_levels(section.psi), ks=_levels(section.ks),
        features=tuple((name, FeatureDriftLevels(psi=_feature_levels(f.psi), ks=_feature_levels(f.ks), ignore=f.ignore))
                       for name, f in section.features.items()),
    )


def _label(spec: PipelineSpec) -> tuple[str, ...]:
    """The label column, if any: a causal_lm spec without one learns every next token of its text."""
    return (spec.training.label,) if spec.training.label else ()


def _text_features(spec: PipelineSpec) -> tuple[str, ...]:
    """The features declared ``type: text``, in feature order."""
    transforms = spec.training.transforms
    return tuple(name for name in spec.training.features if name in transforms and transforms[name].type == "text")


def _feature_transforms(spec: PipelineSpec) -> tuple[FeatureTransform, ...]:
    """The declared transforms in feature order; undeclared features keep the trainer's default."""
    transforms = []
    for name in spec.training.features:
        declared = spec.training.transforms.get(name)
        if declared is None:
            continue
        if declared.resolved_type == "text":
            # The trainer's hash_buckets default (32) is categorical's: text passes its own.
            default = FeatureTransform(feature=name, type="text", hash_buckets=DEFAULT_TEXT_HASH_BUCKETS)
            transforms.append(FeatureTransform(
                feature=name, type="text",
                hash_buckets=default.hash_buckets if declared.hash_buckets is None else declared.hash_buckets,
                max_tokens=default.max_tokens if declared.max_tokens is None else declared.max_tokens,
                ngrams=default.ngrams if declared.ngrams is None else declared.ngrams))
        elif declared.resolved_type == "categorical":
            # Options left out keep the trainer's defaults (one_hot, 20 categories, 32 buckets).
            options: dict[str, Any] = {"encode": declared.encode, "max_categories": declared.max_categories,
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
    from trainpipe.plan.costs import selects_spot_only
    from trainpipe.quantities import quantity_value

    distributed = spec.training.distributed
    if spec.training.launcher == "kubernetes" and kubernetes is not None:
        nodes = distributed.nnodes
        gpus = nodes * kubernetes.resources["gpus"]
        return ResourcePlan(gpus=gpus, cpus=nodes * float(quantity_value(kubernetes.resources["cpu"])),
                            gpu_resource=kubernetes.resources["gpu_resource"] if gpus else None,
                            # With a capacity section the first tries run on its spot placement (each try's
                            # own placement is in its usage entry: state.usage prices them apart).
                            spot=kubernetes.capacity is not None
                            or selects_spot_only(kubernetes.node_selector, kubernetes.affinity["required"]),
                            priority=priority, priority_class=priority_class, team=team)
    return ResourcePlan(gpus=0, cpus=float(distributed.nnodes * distributed.nproc_per_node), gpu_resource=None,
                        spot=False, priority=priority, priority_class=priority_class, team=team)


def _schedule(spec: PipelineSpec) -> str | AssetSchedule | None:
    from trainpipe.spec.sections.pipeline import AssetScheduleSpec

    if isinstance(spec.schedule, AssetScheduleSpec):
        return AssetSchedule(uris=tuple(spec.schedule.assets), mode=spec.schedule.mode)
    return spec.schedule


def _param_target(spec_path: tuple[str, ...]) -> tuple[str, ...]:
    # The trainer config keeps the spec's training field names (epochs, model.dropout, ...).
    return ("trainer", *spec_path[1:]) if spec_path[0] == "training" else spec_path


def _params(spec: PipelineSpec, loaded: LoadedYaml | None) -> tuple[PlannedParam, ...]:
    from trainpipe.spec.sections.params import OVERRIDABLE_PARAMS
    from trainpipe.spec.sections.pipeline import overridden_value, param_bounds

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
