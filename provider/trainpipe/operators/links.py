"""Buttons on trainpipe's task instances (``operator_extra_links``): ``MLflow run``, ``Evaluation report``, ``Drift
report``, ``Model version``.

Airflow computes a link once, in the worker when the task ends, and keeps it as an XCom the UI reads. The reports
open through the fleet view's report route (``/trainpipe/runs/<run>/artifacts/...``, behind Airflow's login and
the DAG's read permission), so they work with any tracking store; the MLflow pages only when the store is an MLflow
server (a database file has no UI). A link that cannot be made is empty, and never fails the task.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from trainpipe.plan.steps import REGISTER, TRAIN, VALIDATE

log = logging.getLogger(__name__)

EVALUATION_REPORT = "evaluation/report.html"
DRIFT_REPORT = "drift/drift_report.html"
# The MLflow run validate logged its drift check to (pushed whether the check passed or failed).
DRIFT_RUN_XCOM = "drift_mlflow_run_id"


def _airflow_base() -> str:
    from airflow.configuration import conf

    # [api] base_url when set (the api-server may sit under a path); else the link is relative to the UI's host.
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def _mlflow_ui(operator: Any) -> str | None:
    uri = operator.hook.settings.mlflow_tracking_uri
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def _mlflow_run_id(ti: Any) -> str | None:
    """The DAG run's MLflow run: train's, else the one validate's drift check logged to (from their XComs).

    Never asks the tracking store: these links are made as each task ends, and on a new SQLite store the first
    question creates its tables, which raced with the train task doing the same (its first try failed)."""
    trained = ti.xcom_pull(task_ids=TRAIN.task_id) or {}
    if trained.get("mlflow_run_id"):
        return trained["mlflow_run_id"]
    return ti.xcom_pull(task_ids=VALIDATE.task_id, key=DRIFT_RUN_XCOM) or None


class _TrainpipeLink(BaseOperatorLink):
    def url(self, operator: Any, ti: Any) -> str | None:
        raise NotImplementedError

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        try:
            return self.url(operator, ti_key) or ""
        except Exception:  # a missing link must not fail the task that just succeeded
            log.warning("could not make the %r link", self.name, exc_info=True)
            return ""


class MlflowRunLink(_TrainpipeLink):
    name = "MLflow run"

    def url(self, operator: Any, ti: Any) -> str | None:
        ui = _mlflow_ui(operator)
        run_id = _mlflow_run_id(ti) if ui else None
        if not run_id:
            return None
        experiment = operator.hook.client.get_run(run_id).info.experiment_id
        return f"{ui}/#/experiments/{experiment}/runs/{run_id}"


class _ReportLink(_TrainpipeLink):
    artifact = ""

    def url(self, operator: Any, ti: Any) -> str | None:
        run_id = _mlflow_run_id(ti)
        return f"{_airflow_base()}/trainpipe/runs/{run_id}/artifacts/{self.artifact}" if run_id else None


class EvaluationReportLink(_ReportLink):
    name = "Evaluation report"
    artifact = EVALUATION_REPORT


class DriftReportLink(_ReportLink):
    name = "Drift report"
    artifact = DRIFT_REPORT


class ModelVersionLink(_TrainpipeLink):
    """The registered version in MLflow's UI; with no MLflow server, the pipeline's page in the fleet view."""

    name = "Model version"

    def url(self, operator: Any, ti: Any) -> str | None:
        registered = ti.xcom_pull(task_ids=REGISTER.task_id) or {}
        ui = _mlflow_ui(operator)
        if ui and registered.get("version"):
            return f"{ui}/#/models/{quote(registered['model_name'], safe='')}/versions/{registered['version']}"
        return f"{_airflow_base()}/trainpipe/pipelines/{quote(operator.dag_id, safe='')}"
