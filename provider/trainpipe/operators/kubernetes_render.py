"""``trainpipe render FILE --k8s``: the manifests the train task would submit, without a cluster (the command
prints them as YAML).

It builds the train operator exactly as the DAG does (``kubernetes_train_operator``), binds it to a
run the way ``execute`` does, and asks the operator for its request objects in dry-run mode: the
render and the real submission share one code path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError
from trainpipe.kubernetes.builders import TrainerLaunch, to_manifest
from trainpipe.plan.steps import TRAIN
from trainpipe_trainer.run_layout import TRAINER_CONFIG_FILE

if TYPE_CHECKING:
    from trainpipe.plan.model import PipelinePlan
    from trainpipe.settings import Settings

# Rendering happens outside any DAG run: its run-specific values are those of this run id.
RENDER_RUN_ID = "render"


def render_launch(plan: PipelinePlan, *, settings: Settings, airflow_run_id: str = RENDER_RUN_ID,
                  try_number: int = 1) -> TrainerLaunch:
    """The launch a run with this id would get under these settings (storage root, MLflow)."""
    from trainpipe import storage
    from trainpipe.state.run_folder import run_dir_for

    config = run_dir_for(plan.dag_id, settings, airflow_run_id) / TRAINER_CONFIG_FILE
    return TrainerLaunch(config_uri=storage.fsspec_uri(config), mlflow_tracking_uri=settings.mlflow_tracking_uri,
                         dag_id=plan.dag_id, airflow_run_id=airflow_run_id, try_number=try_number)


def render_manifests(plan: PipelinePlan, *, settings: Settings,
                     launch: TrainerLaunch | None = None) -> list[dict[str, Any]]:
    """Pod (one node), or Service + Job (several), as the dicts the API server would receive."""
    if plan.launch.launcher != "kubernetes":
        raise SpecError(
            f"{plan.spec_file}: training.launcher: is {plan.launch.launcher!r}; only 'kubernetes' submits "
            "manifests: set training.launcher: kubernetes and a training.kubernetes section (docs/kubernetes.md)"
        )
    from trainpipe.operators.kubernetes import KubernetesTrainJobOperator, kubernetes_train_operator, resources_for_try

    operator = kubernetes_train_operator(plan=plan, task_id=TRAIN.task_id)
    launch = launch or render_launch(plan, settings=settings)
    # The try's memory and placement after the run's earlier tries, read as the try itself reads them.
    operator.bind_launch(launch, resources_for_try(plan, settings=settings, airflow_run_id=launch.airflow_run_id,
                                                   try_number=launch.try_number))
    if isinstance(operator, KubernetesTrainJobOperator):
        job = operator.build_job_request_obj(dry_run=True)
        return [to_manifest(operator.build_service(job)), to_manifest(job)]
    return [to_manifest(operator.build_pod_request_obj(dry_run=True))]
