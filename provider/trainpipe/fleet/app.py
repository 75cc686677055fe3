"""The fleet view's FastAPI app, mounted by the api-server at ``/trainpipe`` (``trainpipe.plugin``).

Every route depends on Airflow's own security dependencies: the caller is the user of the request's token
(``Authorization: Bearer`` or the UI's session cookie), a request without a valid one gets 401/403, and only
the trainpipe DAGs the auth manager lets the caller read are listed or shown.
"""

from __future__ import annotations

import functools
import logging
import re
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from trainpipe.fleet import airflow_state, render
from trainpipe.fleet.collect import (
    DRIFT_REPORT,
    EVALUATION_REPORT,
    FleetReader,
    PipelineFacts,
    drift_facts,
    pipeline_row,
    promotion_log,
    quoted,
    sort_rows,
    version_metrics,
)
from trainpipe.fleet.outcome import NEEDS_ATTENTION
from trainpipe.plan.tracking import (
    BACKTEST_TAG,
    DAG_ID_TAG,
    DATASET_DIGEST_TAG,
    DRIFT_VERDICT_TAG,
    RUN_ID_TAG,
    experiment_name,
)
from trainpipe.settings import Settings

log = logging.getLogger(__name__)

URL_PREFIX = "/trainpipe"
# Artifacts the report route serves: the two reports and the evaluation report's plots, nothing else.
_SERVED_ARTIFACT = re.compile(r"^(evaluation/report\.html|drift/drift_report\.html|evaluation/[\w.-]+\.png)$")


def readable_dag_ids(user: GetUserDep) -> set[str]:
    """The DAGs the caller may read, as Airflow's ``ReadableDagsFilterDep`` computes them (that dependency reads
    the auth manager from ``request.app.state``, which a mounted plugin app does not have)."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_authorized_dag_ids(user=user, method="GET")


ReadableDags = Annotated[set[str], Depends(readable_dag_ids)]
Team = Annotated[str | None, Query(description="only this team")]
Outcome = Annotated[str | None, Query(description="an outcome, or needs_attention")]


@functools.cache
def settings() -> Settings:
    """The platform's settings, read once per api-server process: the app is where the fleet view enters trainpipe."""
    return Settings.from_env()


@functools.cache
def reader() -> FleetReader:
    """One reader (and cache) per api-server process."""
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.state.datasets import baseline_version

    return FleetReader(MlflowHook(settings()).client, baseline=lambda pipeline_id: baseline_version(settings(),
                                                                                                       pipeline_id))


def _mlflow_ui() -> str | None:
    """The MLflow UI, when the tracking store is a server (a database file has no UI to link to)."""
    uri = settings().mlflow_tracking_uri
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None


def links(pipeline_id: str, *, root: str, airflow_root: str, run_id: str | None, experiment_id: str | None,
          mlflow_run_id: str | None, has_evaluation_report: bool, has_drift_report: bool,
          model_name: str | None = None, version: int | None = None) -> dict[str, str | None]:
    dag = f"{airflow_root}/dags/{quote(pipeline_id, safe='')}"
    ui = _mlflow_ui()
    artifact = f"{root}/runs/{mlflow_run_id}/artifacts/" if mlflow_run_id else None
    return {
        "DAG": f"{dag}/runs/{quote(run_id, safe='')}" if run_id else dag,
        "MLflow run": f"{ui}/#/experiments/{experiment_id}/runs/{mlflow_run_id}"
        if ui and experiment_id and mlflow_run_id else None,
        "Evaluation report": artifact + EVALUATION_REPORT if artifact and has_evaluation_report else None,
        "Drift report": artifact + DRIFT_REPORT if artifact and has_drift_report else None,
        "Model version": f"{ui}/#/models/{quote(model_name, safe='')}/versions/{version}"
        if ui and model_name and version else None,
    }


def _roots(request: Request) -> tuple[str, str]:
    """This app's URL path and Airflow's (the api-server may itself be under a path)."""
    root = request.scope.get("root_path", "").rstrip("/") or URL_PREFIX
    return root, root.removesuffix(URL_PREFIX)


def rows_for(pipelines: list[PipelineFacts], request: Request) -> list[dict[str, Any]]:
    now = datetime.now(UTC)
    facts = reader().facts(pipelines, now=now)
    root, airflow_root = _roots(request)
    rows = []
    for p in pipelines:
        f = facts[p.pipeline_id]
        rows.append(pipeline_row(p, f, now=now, links=links(
            p.pipeline_id, root=root, airflow_root=airflow_root, run_id=p.last_run.run_id if p.last_run else None,
            experiment_id=f.experiment_id, mlflow_run_id=f.run_id, has_evaluation_report=f.has_evaluation_report,
            has_drift_report=f.has_drift_report, model_name=f.model_name,
            version=f.champion.version if f.champion else None)))
    return sort_rows(rows)


def _filtered(rows: list[dict[str, Any]], team: str | None, outcome: str | None) -> list[dict[str, Any]]:
    if team:
        rows = [r for r in rows if r["team"] == team]
    if outcome == "needs_attention":
        rows = [r for r in rows if r["needs_attention"]]
    elif outcome:
        rows = [r for r in rows if r["outcome"] == outcome]
    return rows


def detail_for(pipeline: PipelineFacts, session: Any, request: Request) -> dict[str, Any]:
    """The pipeline page's data: metric history over all versions, the promotion log, dataset versions with
    drift per feature, and the approval waiting for an answer."""
    from mlflow.exceptions import MlflowException

    row = rows_for([pipeline], request)[0]
    client = reader().client
    model_name = row["model_name"] or pipeline.pipeline_id
    history, log_entries = [], []
    try:
        model = client.get_registered_model(model_name)
        log_entries = promotion_log(model)
        versions = client.search_model_versions(f"name = {quoted(model_name)}", max_results=10_000)
        history = [{"version": int(v.version), "created_at": datetime.fromtimestamp(
            v.creation_timestamp / 1000, UTC).isoformat(timespec="seconds"), "metrics": version_metrics(v),
            "aliases": sorted(v.aliases or ()), "backtest": (v.tags or {}).get(BACKTEST_TAG) == "true"}
            for v in sorted(versions, key=lambda v: int(v.version))]
    except MlflowException:
        pass  # no model registered yet
    drift_rows = []
    experiment = client.get_experiment_by_name(experiment_name(pipeline.pipeline_id))
    if experiment is not None:
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{DRIFT_VERDICT_TAG}` != ''",
                                  order_by=["attributes.start_time DESC"], max_results=30)
        for run in runs:
            drift = drift_facts(run)
            if drift is not None:
                drift_rows.append({"digest": run.data.tags.get(DATASET_DIGEST_TAG), "verdict": drift.verdict,
                                   "airflow_run_id": run.data.tags.get(RUN_ID_TAG), "psi": drift.psi, "ks": drift.ks,
                                   "when": datetime.fromtimestamp(run.info.start_time / 1000, UTC)
                                   .isoformat(timespec="minutes")})
    return {"pipeline": row, "metric_history": history, "promotion_log": log_entries,
            "dataset_versions": _dataset_versions(pipeline.pipeline_id), "drift_history": drift_rows,
            "pending_approval": airflow_state.pending_approval(session, pipeline.pipeline_id)}


def _dataset_versions(pipeline_id: str) -> list[dict[str, Any]]:
    from trainpipe.state.datasets import list_versions

    try:
        versions = list_versions(settings(), pipeline_id)
    except Exception:  # storage unreachable: the page still shows the rest
        log.warning("could not list the dataset versions of %s", pipeline_id, exc_info=True)
        return []
    return [{"digest": info.digest, "created_at": info.created_at, "rows": info.rows, "schema_hash": info.schema_hash,
             "accepted_at": (accepted or {}).get("accepted_at"), "created_by_run_id": info.created_by_run_id}
            for info, accepted in reversed(versions)]


def _one(session: Any, readable: ReadableDags, pipeline_id: str) -> PipelineFacts:
    found = airflow_state.pipelines(session, readable, only=pipeline_id)
    if not found:
        raise HTTPException(404, f"no trainpipe pipeline {pipeline_id!r} that you may read")
    return found[0]


def create_app() -> FastAPI:
    app = FastAPI(title="trainpipe fleet view", description="Every trainpipe pipeline: last outcome, champion, cost.")

    @app.get("/api/pipelines")
    def list_pipelines(request: Request, session: SessionDep, readable: ReadableDags, team: Team = None,
                       outcome: Outcome = None) -> dict[str, Any]:
        rows = _filtered(rows_for(airflow_state.pipelines(session, readable), request), team, outcome)
        return {"pipelines": rows, "total_entries": len(rows), "needs_attention_outcomes": sorted(NEEDS_ATTENTION)}

    @app.get("/api/pipelines/{dag_id}", dependencies=[Depends(requires_access_dag("GET"))])
    def pipeline_detail(dag_id: str, request: Request, session: SessionDep,
                        readable: ReadableDags) -> dict[str, Any]:
        return detail_for(_one(session, readable, dag_id), session, request)

    @app.get("/", response_class=HTMLResponse)
    def fleet(request: Request, session: SessionDep, readable: ReadableDags, team: Team = None,
              outcome: Outcome = None) -> HTMLResponse:
        rows = rows_for(airflow_state.pipelines(session, readable), request)
        teams = sorted({r["team"] for r in rows})
        root, _ = _roots(request)
        return HTMLResponse(render.fleet_page(_filtered(rows, team, outcome), teams=teams, team=team,
                                              outcome=outcome, base=root))

    @app.get("/pipelines/{dag_id}", response_class=HTMLResponse,
             dependencies=[Depends(requires_access_dag("GET"))])
    def pipeline(dag_id: str, request: Request, session: SessionDep, readable: ReadableDags) -> HTMLResponse:
        detail = detail_for(_one(session, readable, dag_id), session, request)
        root, airflow_root = _roots(request)
        return HTMLResponse(render.pipeline_page(detail, base=root, airflow_api=f"{airflow_root}/api/v2"))

    @app.get("/runs/{mlflow_run_id}/artifacts/{path:path}")
    def artifact(mlflow_run_id: str, path: str, user: GetUserDep) -> Response:
        """A report of a trainpipe run, for a caller who may read the run's DAG; served sandboxed."""
        import tempfile
        from pathlib import Path

        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
        from mlflow.exceptions import MlflowException

        if not _SERVED_ARTIFACT.match(path) or not re.fullmatch(r"[0-9a-f]{32}", mlflow_run_id):
            raise HTTPException(404, "only a trainpipe run's evaluation and drift reports are served here")
        client = reader().client
        try:
            dag_id = client.get_run(mlflow_run_id).data.tags.get(DAG_ID_TAG)
        except MlflowException:
            dag_id = None
        if not dag_id or not get_auth_manager().is_authorized_dag(method="GET", details=DagDetails(id=dag_id),
                                                                   user=user):
            raise HTTPException(404, "no such report, or not one you may read")
        with tempfile.TemporaryDirectory(prefix="trainpipe-report-") as folder:
            try:
                local = client.download_artifacts(mlflow_run_id, path, folder)
            except (MlflowException, OSError) as err:
                raise HTTPException(404, f"{path} is not stored for this run") from err
            content = Path(local).read_bytes()
        media = "image/png" if path.endswith(".png") else "text/html; charset=utf-8"
        # Sandboxed: a report is data; it must not run script with the viewer's Airflow session.
        return Response(content, media_type=media, headers={"Content-Security-Policy": "sandbox"})

    return app
