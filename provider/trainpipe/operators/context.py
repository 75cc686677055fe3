"""What a trainpipe task reads from its Airflow context, in one place for every operator and launcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainpipe.plan import PipelinePlan
    from trainpipe.runtime.snapshot import SnapshotInfo
    from trainpipe.runtime.train import RunContext
    from trainpipe.spec.models import PipelineSpec
    from trainpipe_trainer.config import TrainingResult


def run_spec(plan: PipelinePlan, context: Any) -> tuple[PipelineSpec, dict[str, Any]]:
    """The spec with this run's params applied (``Trigger DAG w/ config``), and what they changed."""
    from trainpipe.plan import apply_param_overrides

    return apply_param_overrides(plan, dict(context.get("params") or {}))


def snapshot_info(context: Any) -> SnapshotInfo:
    from trainpipe.runtime.snapshot import SnapshotInfo

    return SnapshotInfo(**context["ti"].xcom_pull(task_ids="snapshot"))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainInputs:
    spec: PipelineSpec
    param_overrides: dict[str, Any]
    run: RunContext
    snapshot: SnapshotInfo


def train_inputs(plan: PipelinePlan, context: Any) -> TrainInputs:
    """Everything the train step needs from Airflow, whatever the launcher."""
    from trainpipe.lineage import git_commit
    from trainpipe.runtime.train import RunContext

    spec, overrides = run_spec(plan, context)
    ti = context["ti"]
    run = RunContext(dag_id=ti.dag_id, airflow_run_id=context["run_id"], try_number=ti.try_number,
                     spec_sha256=plan.spec_sha256, git_commit=git_commit(plan.spec_file))
    return TrainInputs(spec=spec, param_overrides=overrides, run=run, snapshot=snapshot_info(context))


def log_trained(log: Any, result: TrainingResult) -> None:
    log.info("trained: model %s, weights sha256 %s, %d steps on %d processes",
             result.model_uri, result.weights_sha256, result.global_step, result.world_size)
