"""The model asset event says what moved (issue 33): a real dag.test() run promotes version 1, its `promote` task's
asset event carries {model, version, alias, previous_version, metrics, dataset_digest}, and a plain deployment DAG
scheduled on that asset, given its run by the scheduler's own code, reads the version from
`triggering_asset_events` when `airflow tasks test` runs its task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 9, 30, tzinfo=UTC)
PIPELINE = "asset_payload"
DEPLOY_DAG = "deploy_asset_payload"
# What a team writes to deploy the champion: nothing of trainpipe, only the asset and its event.
DEPLOY = f'''\
"""A deployment DAG (airflow dag): runs when trainpipe's model asset changes."""
import json
import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Asset, task

MODEL = Asset("trainpipe://{PIPELINE}/model")

with DAG("{DEPLOY_DAG}", schedule=[MODEL], start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def deploy(*, triggering_asset_events=None):
        [event] = triggering_asset_events[MODEL]
        Path(os.environ["DEPLOYED_FILE"]).write_text(json.dumps(event.extra))

    deploy()
'''


@pytest.fixture
def folders(small_pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    configs, dags = tmp_path / "configs", tmp_path / "dags"
    configs.mkdir()
    dags.mkdir()
    (configs / f"{PIPELINE}.yaml").write_text(small_pipeline.spec(PIPELINE, "asset_payload"))
    (dags / "trainpipe_dags.py").write_text("from trainpipe import load_dags  # an airflow dag file\n\n"
                                            "load_dags(globals())\n")
    (dags / "deploy.py").write_text(DEPLOY)
    small_pipeline.data(PIPELINE, "asset_payload", end=END)
    # Airflow reads its configuration from the environment on each look-up: this test's DAGs folder, and DAGs
    # that are live when they appear (the downstream DAG must be unpaused to be queued by the event).
    for key, value in {"TRAINPIPE_DAG_CONFIGS": str(configs), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                       "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"}.items():
        monkeypatch.setenv(key, value)
    return {"configs": configs, "dags": dags, "out": tmp_path / "deployed.json"}


def _register_live(dags: Path, dag_id: str) -> None:
    """The DAG folder written to the metadata DB as the dag-processor would (the bundle dag.test() syncs may be the
    session's earlier DAGs folder), with ``dag_id`` unpaused: a paused DAG is not queued by an asset event."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    bag = BundleDagBag(dag_folder=str(dags), bundle_path=str(dags), bundle_name="dags-folder")
    assert bag.import_errors == {}
    sync_bag_to_db(bag, "dags-folder", None)
    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=False))


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


def test_a_deployment_dag_reads_the_promoted_version_from_its_triggering_event(folders):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    bag = DagBag(dag_folder=str(folders["dags"]))
    assert bag.import_errors == {}
    _register_live(folders["dags"], DEPLOY_DAG)
    dag_run = bag.get_dag(PIPELINE).test(logical_date=END)
    assert dag_run.state == "success"

    with create_session() as session:
        [event] = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                  .where(AssetModel.uri == f"trainpipe://{PIPELINE}/model")).all()
        extra = dict(event.extra)
    assert set(extra) == {"model", "version", "alias", "previous_version", "metrics", "dataset_digest"}
    assert (extra["model"], extra["version"], extra["alias"], extra["previous_version"]) == (PIPELINE, 1, "champion",
                                                                                             None)
    assert set(extra["metrics"]) == {"auc", "f1"} and len(extra["dataset_digest"]) == 64

    run_id = _asset_triggered_run(DEPLOY_DAG)
    env = {**os.environ, "DEPLOYED_FILE": str(folders["out"])}
    done = subprocess.run([str(Path(sys.executable).with_name("airflow")), "tasks", "test", DEPLOY_DAG, "deploy",
                           run_id], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    deployed = json.loads(folders["out"].read_text())
    assert deployed["version"] == 1 and deployed["model"] == PIPELINE and deployed == extra
