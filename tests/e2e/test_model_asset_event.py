"""The model asset event says what moved (issue 33): a real dag.test() run promotes version 1, its `promote` task's
asset event carries {model, version, alias, previous_version, metrics, dataset_digest}, and a plain deployment DAG
scheduled on that asset, given its run by the scheduler's own code, reads the version from
`triggering_asset_events` when `airflow tasks test` runs its task.

The run is the session's run of the shipped fraud_detector spec (``fraud_run``): the deployment DAG
(scenarios.DEPLOY) was registered live before it, and the run's asset events were read right after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.scenarios import DEPLOY_DAG

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PIPELINE = "fraud_detector"
METRICS = {"auc", "f1", "precision", "recall", "log_loss"}  # the shipped spec's evaluation.metrics


@pytest.fixture
def folders(fraud_run, fraud_stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    # The DAGs folder and specs the run had: `airflow tasks test` parses the deployment DAG from there.
    for key, value in {"TRAINPIPE_DAG_CONFIGS": str(fraud_run.configs),
                       "AIRFLOW__CORE__DAGS_FOLDER": str(fraud_run.dags)}.items():
        monkeypatch.setenv(key, value)
    return {"configs": fraud_run.configs, "dags": fraud_run.dags, "out": tmp_path / "deployed.json"}


def _asset_triggered_run(dag_id: str) -> str:
    """The scheduler's own step that turns queued asset events into a DAG run (what `airflow scheduler` does on
    its next loop), run once; the new run's id."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runner = SchedulerJobRunner(job=Job(), num_runs=1)
        model = session.scalars(select(DagModel).where(DagModel.dag_id == dag_id)).one()
        runner._create_dag_runs_asset_triggered(dag_models=[model], session=session)
    with create_session() as session:
        [run] = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
        return run.run_id


def test_a_deployment_dag_reads_the_promoted_version_from_its_triggering_event(fraud_run, folders):
    assert fraud_run.dag_id == PIPELINE and fraud_run.state == "success"

    [extra] = fraud_run.model_events
    assert set(extra) == {"model", "version", "alias", "previous_version", "metrics", "dataset_digest"}
    assert (extra["model"], extra["version"], extra["alias"], extra["previous_version"]) == (PIPELINE, 1, "champion",
                                                                                             None)
    assert set(extra["metrics"]) == METRICS and len(extra["dataset_digest"]) == 64

    run_id = _asset_triggered_run(DEPLOY_DAG)
    env = {**os.environ, "DEPLOYED_FILE": str(folders["out"])}
    done = subprocess.run([str(Path(sys.executable).with_name("airflow")), "tasks", "test", DEPLOY_DAG, "deploy",
                           run_id], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    deployed = json.loads(folders["out"].read_text())
    assert deployed["version"] == 1 and deployed["model"] == PIPELINE and deployed == extra
