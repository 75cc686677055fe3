"""Two real short runs of a pipeline (dag.test, torchrun with 2 processes, MLflow), then: every run recorded its
CPU-hours and cost (metrics, version tags, run note); `trainpipe gc` lists without deleting, `gc --apply` deletes
exactly what it listed, and `trainpipe reproduce MODEL@champion` still rebuilds the same weights."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.support import REPO, load_dag
from trainpipe.commands.main import main
from trainpipe.demo.synthetic import generate_transactions
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 5, 31, tzinfo=UTC)
PIPELINE = "fraud_gc"
FEATURES = ["amount", "merchant_risk", "hour_of_day", "account_age_days", "is_foreign"]


def _storage_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame = generate_transactions(rows=6000, days=20, end=END)
    data = state_dir / "storage" / "demo" / PIPELINE / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(data, index=False)
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec.update(pipeline_id=PIPELINE, schedule="none", retries=0, params={}, owner="team-gc", priority="high")
    spec["data"].update(uri=f"demo/{PIPELINE}/transactions.parquet", window="10d")
    spec["validation"] = {"expectations": [{"expect_column_values_to_not_be_null": {"column": "amount"}}]}
    spec["training"].update(features=FEATURES, epochs=2, transforms={})
    spec["evaluation"]["gates"] = ["auc >= 0.6"]  # short trainings: the test is about cost and retention
    spec["registration"]["model_name"] = PIPELINE
    folder = tmp_path_factory.mktemp("dag_configs")
    (folder / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def two_runs(configs: Path, monkeypatch_module: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    # A platform policy with one team (every spec is its) and a price table.
    policy.write_text("default_team: team-gc\nteams: {team-gc: {}}\ncosts: {gpu_hour: {default: 3.0}, cpu_hour: 0.5}\n")
    monkeypatch_module.setenv("TRAINPIPE_POLICY", str(policy))
    monkeypatch_module.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    # A dataset version nothing refers to (snapshot taken, never accepted nor trained on), written before the runs.
    spec = yaml.safe_load((configs / f"{PIPELINE}.yaml").read_text())
    orphan = take_snapshot(PIPELINE, DataPlan(uri=spec["data"]["uri"], conn_id=None, format="parquet",
                                              time_column="event_time", window=timedelta(days=10),
                                              holdout_fraction=0.2, holdout_key=None),
                           settings=Settings.from_env(), logical_date=END - timedelta(days=6))
    dag = load_dag(configs, PIPELINE, monkeypatch_module)
    runs = [dag.test(logical_date=END - timedelta(days=3)), dag.test(logical_date=END)]
    for run in runs:
        states = {ti.task_id: ti.state for ti in run.get_task_instances()}
        assert set(states.values()) == {"success"}, states
    return (*runs, orphan)


def test_train_task_takes_the_pool_with_its_priority(two_runs) -> None:
    task = two_runs[0].get_task_instance("train")
    assert (task.pool, task.pool_slots, task.priority_weight) == ("default_pool", 1, 100)


def test_each_run_records_its_hours_and_cost(two_runs) -> None:
    import mlflow

    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias(PIPELINE, "champion")
    metrics = client.get_run(version.run_id).data.metrics
    # The local launcher holds no GPU: 2 trainer processes, each a CPU device; cost = cpu_hours x 0.5.
    assert metrics["gpu_hours"] == 0 and metrics["cpu_hours"] > 0
    assert metrics["cost"] == pytest.approx(metrics["cpu_hours"] * 0.5)
    assert version.tags["cpu_hours"] == f"{metrics['cpu_hours']:.6g}" and version.tags["cost"] == f"{metrics['cost']:.6g}"
    note = two_runs[1].get_task_instance("train").xcom_pull(task_ids="train", key="trainpipe_run_note")
    assert note.startswith(f"training used 0 GPU-hours, {metrics['cpu_hours']:.3g} CPU-hours, cost ")
    # ... and how fast it trained (issue 31).
    assert re.search(r"over 1 try, at [\d,]+ samples/s$", note), note
    assert main(["cost", "--by", "team", "--json"]) == 0


def test_gc_lists_without_deleting_then_deletes_what_it_listed(two_runs, configs: Path, state_dir: Path,
                                                                capsys) -> None:
    import mlflow

    root = state_dir / "storage"
    orphan = two_runs[2]
    before = _storage_files(root)
    run_folders = sorted((root / "runs" / PIPELINE).iterdir(), key=lambda p: p.name)
    assert all((folder / "checkpoints").is_dir() for folder in run_folders)

    assert main(["gc", "--older-than", "1s", "--keep-runs", "1"]) == 0
    listed = capsys.readouterr().out
    assert _storage_files(root) == before  # nothing deleted without --apply
    assert "nothing was deleted; run again with --apply" in listed
    assert len(run_folders) == 2
    first_run = run_folders[0]  # run ids start with the time they were triggered
    assert f"checkpoints runs/{PIPELINE}/{first_run.name}/checkpoints" in listed
    assert f"snapshot    snapshots/{PIPELINE}/{orphan.digest[:16]}" in listed
    champion = mlflow.MlflowClient().get_model_version_by_alias(PIPELINE, "champion")
    assert f"snapshots/{PIPELINE}/{champion.tags['dataset_digest'][:16]}: a registered model version" in listed

    assert main(["gc", "--older-than", "1s", "--keep-runs", "1", "--apply"]) == 0
    applied = capsys.readouterr().out
    # Only this pipeline's files are asserted on: other tests of the session left runs of their own.
    deleted = {p for p in before - _storage_files(root) if f"/{PIPELINE}/" in p}
    deleted_tops = {str(Path(p).parents[len(Path(p).parents) - 4]) for p in deleted}
    assert deleted_tops == {f"runs/{PIPELINE}/{first_run.name}", f"snapshots/{PIPELINE}/{orphan.digest[:16]}"}
    assert all(p.startswith((f"runs/{PIPELINE}/{first_run.name}/checkpoints/", f"snapshots/{PIPELINE}/{orphan.digest[:16]}/"))
               for p in deleted)
    assert (first_run / "usage.json").exists() and (first_run / "output" / "result.json").exists()
    assert "deleting " in applied and "deleted " in applied

    assert main(["reproduce", f"{PIPELINE}@champion", "--configs", str(configs)]) == 0
    assert "weights match: yes" in capsys.readouterr().out
