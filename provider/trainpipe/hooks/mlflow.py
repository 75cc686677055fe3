"""MLflow access for trainpipe's tasks: one client, experiments with a known artifact location.

The tracking URI is the settings' (``MLFLOW_TRACKING_URI``, see ``trainpipe.settings``), so the trainer
process, the Airflow tasks and the MLflow UI all look at the same store.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING

from trainpipe.plan.tracking import DAG_ID_TAG, RUN_ID_TAG, experiment_name
from trainpipe.settings import Settings

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion


# The loggers MLflow gives a stderr handler of its own at import (mlflow.utils.logging_utils), which stops them
# propagating. In a task, stderr is shown as ERROR: an INFO line of MLflow's would read as a failure.
_MLFLOW_OWNED_LOGGERS = ("mlflow", "alembic", "huey", "sqlalchemy.engine")


def route_mlflow_logging() -> None:
    """MLflow's log records go to the process's own logging (Airflow's task logger in a task) at their own
    level, instead of MLflow's stderr handler. The levels MLflow set are kept. Idempotent."""
    import logging

    import mlflow  # noqa: F401 - its import installs the handlers this removes

    for name in _MLFLOW_OWNED_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = True


def mlflow_metric_key(name: str) -> str:
    """MLflow keys allow no '@': ``ndcg@10`` is logged as ``ndcg_at_10``."""
    return re.sub(r"[^\w./ -]", "_", name.replace("@", "_at_"))


class MlflowHook:
    """Owns the MLflow client; operators call ``self.hook`` instead of building clients themselves."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def client(self) -> MlflowClient:
        import mlflow

        from trainpipe_trainer.tracking.mlflow_store import prepare_store

        route_mlflow_logging()
        mlflow.set_tracking_uri(self.settings.mlflow_tracking_uri)
        prepare_store(self.settings.mlflow_tracking_uri)
        return mlflow.MlflowClient(tracking_uri=self.settings.mlflow_tracking_uri)

    def load_pyfunc(self, model_uri: str):
        """A model by URI (``models:/...``, ``runs:/...``) from this hook's store. MLflow resolves such
        URIs against its process-wide tracking URI, which is set here first: unset (``MLFLOW_TRACKING_URI``
        not exported, the store defaulting to ``$TRAINPIPE_HOME/mlflow.db``) it is ``mlflow.db`` of the
        working directory, where the model is not."""
        import mlflow.pyfunc

        self.client  # noqa: B018 - sets the tracking URI
        # No check of the model's pip requirements against this worker: it reads the metadata of every
        # installed distribution (seconds per task), and the serving environment is decided elsewhere.
        return mlflow.pyfunc.load_model(model_uri, suppress_warnings=True)

    def experiment_id(self, pipeline_id: str) -> str:
        name = experiment_name(pipeline_id)
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        # An explicit artifact location, or MLflow writes ./mlruns of whatever directory we run in.
        location = f"{self.settings.mlflow_artifact_root.rstrip('/')}/{pipeline_id}"
        if "://" not in location:
            location = f"file://{location}"
        return self.client.create_experiment(name, artifact_location=location)

    def run_for_dag_run(self, *, pipeline_id: str, dag_id: str, airflow_run_id: str, tags: dict[str, str]) -> str:
        """The MLflow run of one DAG run: created by its first step that logs (validate's drift check,
        else train), reused by later steps and retries, which add their ``tags``."""
        from mlflow.entities import RunTag

        experiment_id = self.experiment_id(pipeline_id)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{airflow_run_id}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
            if tags:
                self.client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])
            return run_id
        run = self.client.create_run(
            experiment_id,
            run_name=f"{pipeline_id} {airflow_run_id}",
            tags={RUN_ID_TAG: airflow_run_id, DAG_ID_TAG: dag_id, **tags},
        )
        return run.info.run_id

    def version_by_alias(self, model_name: str, alias: str) -> ModelVersion | None:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(model_name, alias)
        except MlflowException:
            # No registered model, or no version holds the alias yet.
            return None
