"""Stage 4 of compilation: a ``PipelinePlan`` -> an Airflow DAG. The only stage that imports Airflow."""

from __future__ import annotations

import functools
from typing import Any

from airflow.sdk import DAG, Asset, AssetAll, AssetAny, BaseOperator, Param

from trainpipe.errors import SpecFieldError, markdown_text, shown_value
from trainpipe.operators.pipeline import (
    EvaluateOperator,
    GateOperator,
    PromoteOperator,
    RegisterModelOperator,
    SnapshotOperator,
    TrainOperator,
    ValidateDataOperator,
)
from trainpipe.operators.tuning import CreateStudyOperator, PickBestOperator, TrialOperator
from trainpipe.plan.model import PROMOTION, TASK_FAILURE, AssetSchedule, PipelinePlan, PlannedTask
from trainpipe.plan.steps import (
    APPROVE_TASK,
    CHECKPOINT_SENSOR,
    CREATE_STUDY,
    EVALUATE,
    GATE,
    PICK_BEST,
    PROMOTE,
    REGISTER,
    SNAPSHOT,
    TRAIN,
    TRAIN_TASK,
    TRIALS,
    VALIDATE,
)
from trainpipe.sensors.checkpoint import CheckpointSensor

_OPERATORS = {
    SNAPSHOT.task_id: SnapshotOperator,
    VALIDATE.task_id: ValidateDataOperator,
    TRAIN.task_id: TrainOperator,
    EVALUATE.task_id: EvaluateOperator,
    GATE.task_id: GateOperator,
    REGISTER.task_id: RegisterModelOperator,
    PROMOTE.task_id: PromoteOperator,
    CHECKPOINT_SENSOR: CheckpointSensor,
    CREATE_STUDY.task_id: CreateStudyOperator,
    TRIALS.task_id: TrialOperator,
    PICK_BEST.task_id: PickBestOperator,
}


@functools.cache
def _airflow_config_defaults() -> dict[str, Any]:
    """Defaults Airflow reads from its config for every DAG (and sensor) that does not pass them:
    read once per process and passed explicitly, the very same values (the stored DAG is identical).
    Each DAG-processor parse is a new process, so a config change still applies at the next parse."""
    from airflow.sdk.configuration import conf

    return {
        "dag": {
            "max_active_tasks": conf.getint("core", "max_active_tasks_per_dag"),
            "max_consecutive_failed_dag_runs": conf.getint("core", "max_consecutive_failed_dag_runs_per_dag"),
            "disable_bundle_versioning": conf.getboolean("dag_processor", "disable_bundle_versioning"),
        },
        "sensor": {"timeout": conf.getfloat("sensors", "default_timeout")},
    }


def _operator(plan: PipelinePlan, task_id: str, **kwargs: Any) -> BaseOperator:
    if task_id == CHECKPOINT_SENSOR:
        kwargs = {**_airflow_config_defaults()["sensor"], **kwargs}
    if task_id == APPROVE_TASK:
        # The standard provider's human-in-the-loop operator, imported only by specs that ask for it.
        from trainpipe.operators.approval import ApproveOperator

        # No retries: a retry would ask the person again and could answer for them with the timeout default.
        # No team execution timeout: it waits for a person (its own timeout) and holds no worker.
        return ApproveOperator(task_id=task_id, plan=plan, retries=0, **kwargs, **(
            {"execution_timeout": None} if plan.team is not None and plan.team.execution_timeout else {}))
    if task_id == PROMOTE.task_id and plan.notify.for_event(PROMOTION):
        from trainpipe.notifications.channels import PromotionNotification

        kwargs["on_success_callback"] = PromotionNotification(plan.notify)
    if task_id != TRAIN_TASK:
        return _OPERATORS[task_id](task_id=task_id, plan=plan, **kwargs)
    from trainpipe.operators.callbacks import training_status_callbacks

    # status.json for the checkpoint sensor: start, success, retry, final failure.
    kwargs.update(training_status_callbacks(plan.dag_id))
    # A task's own callback replaces the DAG's default one: keep notify's.
    kwargs["on_failure_callback"] = [kwargs["on_failure_callback"],
                                     *_failure_callbacks(plan).values()]
    if plan.launch.launcher == "kubernetes":
        from trainpipe.operators.kubernetes import kubernetes_train_operator

        return kubernetes_train_operator(task_id=task_id, plan=plan, **kwargs)
    return TrainOperator(task_id=task_id, plan=plan, **kwargs)


def _task(plan: PipelinePlan, planned: PlannedTask):
    kwargs: dict[str, Any] = {"outlets": [Asset(uri) for uri in planned.outlets]}
    if planned.trigger_rule != "all_success":
        kwargs["trigger_rule"] = planned.trigger_rule
    if planned.pool is not None:
        # One pool slot per GPU held; the weight as given ("absolute"), comparable across DAGs.
        kwargs.update(pool=planned.pool, pool_slots=planned.pool_slots, priority_weight=planned.priority_weight,
                      weight_rule="absolute")
    if planned.mapped_slots is None:
        return _operator(plan, planned.task_id, **kwargs)
    # One task instance per slot; Airflow runs at most max_active_per_run of them at once in a DAG run.
    return _OPERATORS[planned.task_id].partial(
        task_id=planned.task_id, plan=plan, max_active_tis_per_dagrun=planned.max_active_per_run, **kwargs,
    ).expand(slot=list(range(planned.mapped_slots)))


def _doc(plan: PipelinePlan) -> str:
    lines = [f"**{plan.dag_id}**: {markdown_text(plan.description)}", "",
             f"Compiled by trainpipe from {markdown_text(plan.spec_file)}.", ""]
    lines += [f"- `{t.task_id}`: {t.summary}" for t in plan.tasks]
    return "\n".join(lines)


def _schedule(plan: PipelinePlan):
    if isinstance(plan.schedule, AssetSchedule):
        assets = [_asset(uri, ("schedule", "assets", index)) for index, uri in enumerate(plan.schedule.uris)]
        return AssetAny(*assets) if plan.schedule.mode == "any" else AssetAll(*assets)
    return plan.schedule


def _asset(uri: str, field_path: tuple[str | int, ...]) -> Asset:
    try:
        return Asset(uri)
    except (ValueError, TypeError) as err:
        raise SpecFieldError(f"{shown_value(uri)} is not an Airflow asset URI ({err}); "
                             "write one such as trainpipe://fraud_detector/model", field_path=field_path) from None


def _params(plan: PipelinePlan) -> dict[str, Param]:
    params = {}
    for p in plan.params:
        json_type = [p.type, "null"] if p.default is None else p.type
        params[p.name] = Param(p.default, type=json_type, description=p.description,
                               **{bound.keyword: bound.value for bound in p.bounds})
    return params


def _failure_callbacks(plan: PipelinePlan) -> dict[str, Any]:
    """``notify: ... events: [task_failure]``: every task sends a message when it fails for good."""
    if not plan.notify.for_event(TASK_FAILURE):
        return {}
    from trainpipe.notifications.channels import TaskFailureNotification

    return {"on_failure_callback": TaskFailureNotification(plan.notify)}


def _deadline(plan: PipelinePlan) -> dict[str, Any]:
    """``notify.deadline``: an Airflow Deadline Alert from the run's queued time; its callback runs on the
    triggerer and sends the notify channels which step the run is in (``notifications.deadline_missed``)."""
    within = plan.notify.deadline_within
    if within is None:
        return {}
    from dataclasses import asdict

    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    from trainpipe.notifications.channels import deadline_missed

    # Plain data only: the callback's arguments are stored with the serialized DAG and the missed deadline.
    kwargs = {"within_seconds": int(within.total_seconds()),
              "channels": [asdict(channel) for channel in plan.notify.channels]}
    return {"deadline": DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=within,
                                      callback=AsyncCallback(deadline_missed, kwargs=kwargs),
                                      name=_deadline_name(plan.dag_id, within))}


# Airflow stores a deadline alert's name in a 250-character column (a DAG id may be 250 long itself).
DEADLINE_NAME_MAX_LENGTH = 250


def _deadline_name(dag_id: str, within: Any) -> str:
    suffix = f" within {within}"
    return dag_id[:DEADLINE_NAME_MAX_LENGTH - len(suffix)] + suffix


def _team_arguments(plan: PipelinePlan) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DAG arguments, default_args) the platform policy gives the spec's team (ADR 0014)."""
    team = plan.team
    if team is None:
        return {}, {}
    dag_args: dict[str, Any] = {}
    if team.access_control:
        # Synced into roles by the FAB auth manager; the SimpleAuthManager keeps it and ignores it.
        dag_args["access_control"] = {role: set(permissions) for role, permissions in team.access_control}
    default_args = {"execution_timeout": team.execution_timeout} if team.execution_timeout else {}
    return dag_args, default_args


def build_dag(plan: PipelinePlan) -> DAG:
    # Params are attached after the tasks (ADR 0006). Passed to DAG(), Airflow 3.3 re-validates each
    # default with jsonschema and every operator deep-copies them: two thirds of a DAG's build time,
    # checking what the spec stage already proved (trainpipe.spec.validate._param_problems). Tasks
    # still see them: at run time Airflow merges dag.params under the task's (process_params).
    team_dag_args, team_default_args = _team_arguments(plan)
    team_runs = plan.team.max_active_runs if plan.team is not None and plan.team.max_active_runs else 1
    dag = DAG(
        dag_id=plan.dag_id,
        description=plan.description or None,
        schedule=_schedule(plan),
        start_date=plan.start_date,
        catchup=False,
        tags=list(plan.tags),
        doc_md=_doc(plan),
        # Two retrains of one pipeline at once would race for the alias: a team's cap can only lower it.
        max_active_runs=min(1, team_runs),
        # Only the DAG file's namespace serves a DAG: one whose build failed half way (a task's operator could
        # not be made) would otherwise be registered by the `with` block and served without its tasks.
        auto_register=False,
        default_args={"owner": plan.owner, "retries": plan.retries, "retry_delay": plan.retry_delay,
                      **_failure_callbacks(plan), **team_default_args},
        **_airflow_config_defaults()["dag"],
        **team_dag_args,
        **_deadline(plan),
    )
    with dag:
        tasks = {t.task_id: _task(plan, t) for t in plan.tasks}
        # The edges are the plan's: a new stage is added to the plan, not wired here.
        for t in plan.tasks:
            tasks[t.task_id].set_upstream([tasks[upstream] for upstream in t.upstream])
    dag.params.update(_params(plan))
    return dag

