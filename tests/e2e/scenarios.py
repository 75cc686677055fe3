"""The pipelines the end-to-end tests run: the small spec (``SmallPipeline``), and finished runs built once per test
session, with a copy of their stores for each consumer.

A pipeline run under ``dag.test()`` costs about 50 CPU-seconds. Tests that only inspect a finished run, or need one
as their starting point (a champion, a validation baseline), take it from a session fixture of
``tests/e2e/conftest.py``: the run happens once, on stores of its own (storage root, MLflow SQLite and artifacts,
Optuna journal: ``home``), and each consumer works on a copy of those stores, so that what one consumer adds cannot
be seen by another. What a consumer needs from Airflow (the run id, the task states, the evaluate XCom, the asset
events) is captured into the run's record right after it ends, before other runs of the session share the DB.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, run_dag

# The stores a run writes, under its home; the variables that name them.
MLFLOW_DB = "mlflow.db"


class SmallPipeline:
    """A one-epoch MLP on a few thousand transactions (the training itself is not under test), under
    ``storage/<folder>/<pipeline_id>.parquet`` of the stores under ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home

    @staticmethod
    def spec(pipeline_id: str, folder: str, *, validation: str = "", training: str = "", tail: str = "") -> str:
        """The spec's text; ``validation`` (a whole block), ``training`` (lines under it) and ``tail`` (lines at
        the end, under ``registration:`` first) are what a test adds."""
        return f"""\
pipeline_id: {pipeline_id}
schedule: none
retries: 0
data:
  uri: {folder}/{pipeline_id}.parquet
  time_column: event_time
  window: 30d
{validation}training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [8]}}
  features: [amount, merchant_risk, hour_of_day]
  label: is_fraud
  epochs: 1
  batch_size: 128
{training}  distributed: {{nproc_per_node: 1}}
  checkpoint: {{every_n_steps: 50}}
evaluation:
  metrics: [auc, f1]
  gates: ["f1 >= 0.0"]
registration:
  model_name: {pipeline_id}
{tail}"""

    def data(self, pipeline_id: str, folder: str, *, end: datetime, rows: int = 2000, days: int = 20,
             **generate: object) -> Path:
        """The pipeline's source data: ``days`` of transactions up to ``end`` (written again each call)."""
        from trainpipe.demo.synthetic import generate_transactions

        path = self.home / "storage" / folder / f"{pipeline_id}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        generate_transactions(rows=rows, days=days, end=end, **generate).to_parquet(path, index=False)
        return path


def store_env(home: Path) -> dict[str, str]:
    return {
        "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / MLFLOW_DB}",
        "TRAINPIPE_MLFLOW_ARTIFACT_ROOT": str(home / "mlartifacts"),
        "TRAINPIPE_OPTUNA_STORAGE": str(home / "optuna" / "journal.log"),
    }


@contextmanager
def using_stores(home: Path) -> Iterator[Path]:
    """The environment names the stores under ``home`` while the block runs; MLflow's process-wide tracking URI
    (which an MLflow hook sets while a task runs, and which wins over the environment) too."""
    import mlflow

    try:
        with pytest.MonkeyPatch.context() as patch:
            for key, value in store_env(home).items():
                patch.setenv(key, value)
            mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
            yield home
    finally:
        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])  # back to the session's store


def copy_stores(source: Path, target: Path) -> Path:
    """A copy of the stores under ``source`` as ``target`` (which must not exist), every absolute path of
    ``source`` that they hold rewritten to ``target``: MLflow keeps artifact locations as absolute paths, and the
    storage's manifests and baseline name their files by absolute URIs. A copy that still pointed into ``source``
    would read, or write, the shared stores."""
    shutil.copytree(source, target, symlinks=True)
    old, new = f"{source}/", f"{target}/"
    for path in target.rglob("*"):
        if not path.is_file() or path.name.endswith(("-wal", "-shm", "-journal")):
            continue
        if path.name == ".metadata" and "checkpoints" in path.parts:
            # torch.distributed.checkpoint records where it saved (StorageMeta.checkpoint_id, pickled); a load reads
            # the folder it is given, never that path.
            continue
        if path.name == MLFLOW_DB:
            _rewrite_database(path, old, new)
            continue
        data = path.read_bytes()
        if old.encode() not in data:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise AssertionError(f"{path} is binary and holds the path {old}: its copy cannot be rewritten") from None
        path.write_text(text.replace(old, new), encoding="utf-8")
    return target


def _rewrite_database(path: Path, old: str, new: str) -> None:
    """``old`` replaced by ``new`` in every text value of the SQLite database ``path`` (MLflow's: the experiments'
    artifact locations, the runs' artifact URIs, the model versions' sources, ...), whatever its tables."""
    with closing(sqlite3.connect(path)) as db, db:
        left = 0
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for column in [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]:
                db.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                           f'WHERE typeof("{column}") = \'text\' AND instr("{column}", ?) > 0', (old, new, old))
                left += db.execute(f'SELECT count(*) FROM "{table}" WHERE instr(CAST("{column}" AS TEXT), ?) > 0',
                                   (old,)).fetchone()[0]
    assert left == 0, f"{path} still names {old} in {left} values that are not text"


@dataclass(frozen=True, kw_only=True)
class FinishedRun:
    """One finished DAG run: its stores (``home``), the specs and DAG files it ran, and what Airflow recorded."""

    home: Path
    configs: Path
    dags: Path
    dag_id: str
    logical_date: datetime
    run_id: str
    state: str
    states: dict[str, str]
    evaluation: dict[str, Any] | None
    # The extras of the asset events on the pipeline's model asset, in order, right after the run.
    model_events: list[dict[str, Any]]


def _finished(dag_run, states: dict[str, str], *, home: Path, configs: Path, dags: Path) -> FinishedRun:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    evaluate = next((ti for ti in dag_run.get_task_instances() if ti.task_id == "evaluate"), None)
    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.uri == f"trainpipe://{dag_run.dag_id}/model")
                                 .order_by(AssetEvent.id)).all()
        model_events = [dict(event.extra) for event in events]
    return FinishedRun(home=home, configs=configs, dags=dags, dag_id=dag_run.dag_id,
                       logical_date=dag_run.logical_date, run_id=dag_run.run_id, state=dag_run.state, states=states,
                       evaluation=evaluate.xcom_pull(task_ids="evaluate") if evaluate else None,
                       model_events=model_events)


def _checkpoint(home: Path) -> None:
    """Everything MLflow wrote in the database file itself (none left in a write-ahead log): the copy is whole."""
    with closing(sqlite3.connect(home / MLFLOW_DB)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _run_in(home: Path, configs: Path, dags: Path, dag_id: str, logical_date: datetime,
            before_run: Callable[[], None] | None = None) -> FinishedRun:
    """``dag_id`` of the specs in ``configs`` run by ``dag.test()`` with ``dags`` as Airflow's DAGs folder, on the
    stores under ``home``."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as patch, using_stores(home):
        # Airflow reads its configuration from the environment on each look-up.
        patch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
        patch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(dags))
        # DAGs live when they appear: a paused DAG is not queued by an asset event (the deployment DAG below).
        patch.setenv("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")
        bag = DagBag(dag_folder=str(dags))
        assert bag.import_errors == {}
        if before_run is not None:
            before_run()
        dag_run, states = run_dag(bag.get_dag(dag_id), logical_date=logical_date)
        finished = _finished(dag_run, states, home=home, configs=configs, dags=dags)
    _checkpoint(home)
    return finished


def _dags_folder(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainpipe_dags.py").write_text("from trainpipe import load_dags  # an airflow dag file\n\n"
                                              "load_dags(globals())\n")
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


# The shipped fraud example (it slices by region), run as shipped on its own data.
FRAUD = "fraud_detector"
FRAUD_END = datetime(2026, 6, 30, tzinfo=UTC)
# 25 days of rows in the spec's 30-day window: a run at FRAUD_END + 1h sees the same rows.
FRAUD_DATA_DAYS = 25
FRAUD_ROWS = 16000

# What a team writes to deploy the fraud champion: nothing of trainpipe, only the asset and its event
# (tests/e2e/test_model_asset_event.py runs it).
DEPLOY_DAG = "deploy_fraud_detector"
DEPLOY = f'''\
"""A deployment DAG (airflow dag): runs when trainpipe's model asset changes."""
import json
import os
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Asset, task

MODEL = Asset("trainpipe://{FRAUD}/model")

with DAG("{DEPLOY_DAG}", schedule=[MODEL], start_date=datetime(2026, 1, 1), catchup=False):
    @task
    def deploy(*, triggering_asset_events=None):
        [event] = triggering_asset_events[MODEL]
        Path(os.environ["DEPLOYED_FILE"]).write_text(json.dumps(event.extra))

    deploy()
'''


def register_live(dags: Path, dag_id: str) -> None:
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


def build_fraud_run(work: Path) -> FinishedRun:
    """One run of the shipped ``dag_configs/fraud_detector.yaml``, unchanged, at FRAUD_END on 16,000 transactions of
    its own, with a deployment DAG scheduled on its model asset registered live before it (so the promotion's asset
    event queues a run of it). Stores under ``work / "home"``."""
    from trainpipe.demo.synthetic import generate_transactions

    home = work / "home"
    data = home / "storage" / "demo" / "transactions" / "transactions.parquet"
    data.parent.mkdir(parents=True)
    generate_transactions(rows=FRAUD_ROWS, days=FRAUD_DATA_DAYS, end=FRAUD_END).to_parquet(data, index=False)
    # A folder that is not a git checkout (as a deployed copy): the version names no commit.
    configs = work / "configs"
    configs.mkdir()
    shutil.copy(REPO / "dag_configs" / f"{FRAUD}.yaml", configs / f"{FRAUD}.yaml")
    dags = _dags_folder(work / "dags", deploy=DEPLOY)
    return _run_in(home, configs, dags, FRAUD, FRAUD_END, before_run=lambda: register_live(dags, DEPLOY_DAG))


# A small pipeline (SmallPipeline above): a one-epoch MLP on 60 days of transactions, run for
# SMALL_END. Its version 1, champion, and its dataset version, the validation baseline, are where the backtests
# (tests/e2e/test_backtest.py) and the lineage run (tests/e2e/test_openlineage.py) start.
SMALL = "fraud_small"
SMALL_FOLDER = "small"
SMALL_END = datetime(2026, 11, 27, tzinfo=UTC)
SMALL_VALIDATION = """\
validation:
  expectations:
    - expect_column_values_to_be_between: {column: amount, min_value: 0}
"""


def small_spec(*, validation: str = SMALL_VALIDATION, tail: str = "") -> str:
    """The small pipeline's spec; its consumers' variants add to ``validation`` or the ``tail``."""
    return SmallPipeline.spec(SMALL, SMALL_FOLDER, validation=validation, tail=tail)


def small_data(home: Path, *, end: datetime, **generate: Any) -> Path:
    """The small pipeline's source data under the stores of ``home`` (written again each call)."""
    return SmallPipeline(home).data(SMALL, SMALL_FOLDER, end=end, **generate)


def build_small_run(work: Path) -> FinishedRun:
    home = work / "home"
    # 60 days of rows: both the current window and one three weeks back are full (the backtests run that one).
    small_data(home, end=SMALL_END, rows=4000, days=60)
    configs = work / "configs"
    configs.mkdir()
    (configs / f"{SMALL}.yaml").write_text(small_spec())
    return _run_in(home, configs, _dags_folder(work / "dags"), SMALL, SMALL_END)
