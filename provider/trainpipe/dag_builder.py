"""Stage 4 of compilation: a ``PipelinePlan`` -> an Airflow DAG. The only stage that imports Airflow."""

from __future__ import annotations

from airflow.sdk import DAG, Asset, AssetAll, AssetAny, Param, chain

from trainpipe.operators.pipeline import (
    EvaluateOperator,
    GateOperator,
    RegisterModelOperator,
    SnapshotOperator,
    TrainOperator,
    ValidateDataOperator,
)
from trainpipe.plan import TASK_ORDER, AssetSchedule, PipelinePlan

_OPERATORS = {
    "snapshot": SnapshotOperator,
    "validate": ValidateDataOperator,
    "train": TrainOperator,
    "evaluate": EvaluateOperator,
    "gate": GateOperator,
    "register": RegisterModelOperator,
}


def _doc(plan: PipelinePlan) -> str:
    lines = [f"**{plan.dag_id}**: {plan.description}", "", f"Compiled by trainpipe from `{plan.spec_file}`.", ""]
    lines += [f"- `{t.task_id}`: {t.summary}" for t in plan.tasks]
    return "\n".join(lines)


def _schedule(plan: PipelinePlan):  # noqa: ANN202 - str | None | asset condition
    if isinstance(plan.schedule, AssetSchedule):
        assets = [Asset(uri) for uri in plan.schedule.uris]
        return AssetAny(*assets) if plan.schedule.mode == "any" else AssetAll(*assets)
    return plan.schedule


def _params(plan: PipelinePlan) -> dict[str, Param]:
    params = {}
    for p in plan.params:
        bounds = {k: v for k, v in (("minimum", p.minimum), ("maximum", p.maximum)) if v is not None}
        json_type = [p.type, "null"] if p.default is None else p.type
        params[p.name] = Param(p.default, type=json_type, description=p.description, **bounds)
    return params


def build_dag(plan: PipelinePlan) -> DAG:
    spec = plan.spec
    dag = DAG(
        dag_id=plan.dag_id,
        description=plan.description or None,
        schedule=_schedule(plan),
        params=_params(plan),
        start_date=plan.start_date,
        catchup=False,
        tags=list(plan.tags),
        doc_md=_doc(plan),
        max_active_runs=1,  # two retrains of one pipeline at once would race for the alias
        default_args={"owner": plan.owner, "retries": plan.retries, "retry_delay": spec.retry_delay},
    )
    with dag:
        tasks = {
            t.task_id: _OPERATORS[t.task_id](task_id=t.task_id, plan=plan, outlets=[Asset(uri) for uri in t.outlets])
            for t in plan.tasks
        }
        chain(*(tasks[task_id] for task_id in TASK_ORDER))
    return dag

