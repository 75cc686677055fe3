"""The example specs, end to end: real Airflow dag.test(), real torchrun (2 processes), real GE, real MLflow.

The shipped fraud_detector spec's run is the session's (``fraud_run``, run as shipped); the tests work on a copy
of its stores."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from tests.e2e.scenarios import FRAUD_DATA_DAYS, FRAUD_END
from tests.support import REPO, load_dag, run_dag
from trainpipe.demo.synthetic import generate_clicks, generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = FRAUD_END
# The data spans 25 days and the specs' window is 30 days: runs at END and END + 1h see the same rows.
DATA_DAYS = FRAUD_DATA_DAYS


@pytest.fixture(scope="module")
def pipelines(fraud_stores: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dag_configs folder with the shipped examples plus a variant fed a broken dataset. The stores are this
    module's own (``fraud_stores``, a copy of the session's fraud_detector run's): the tests run the shipped examples
    under their shipped names and count versions from 1, whatever other modules of the session registered."""
    demo = fraud_stores / "storage" / "demo"
    (demo / "clicks").mkdir(parents=True, exist_ok=True)
    # The transactions the session's fraud_detector run trained on.
    transactions = pd.read_parquet(demo / "transactions" / "transactions.parquet")
    transactions.drop(columns=["merchant_risk"]).to_parquet(demo / "transactions" / "no_merchant_risk.parquet", index=False)
    generate_clicks(queries=800, days=DATA_DAYS, end=END).to_parquet(demo / "clicks" / "clicks.parquet", index=False)

    configs = tmp_path_factory.mktemp("dag_configs")
    for spec in (REPO / "dag_configs").glob("*.yaml"):
        shutil.copy(spec, configs / spec.name)
    broken = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    broken = (
        broken.replace("pipeline_id: fraud_detector", "pipeline_id: fraud_missing_column")
        .replace("transactions/transactions.parquet", "transactions/no_merchant_risk.parquet")
        .replace("model_name: fraud_detector", "model_name: fraud_missing_column")
        .replace("retries: 1", "retries: 0")
    )
    (configs / "fraud_missing_column.yaml").write_text(broken)
    return configs


def _run(pipelines: Path, monkeypatch: pytest.MonkeyPatch, dag_id: str, logical_date: datetime):
    return run_dag(load_dag(pipelines, dag_id, monkeypatch), logical_date=logical_date)


def _client():
    import mlflow

    return mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])


def test_fraud_pipeline_registers_version_1_as_champion(fraud_run, fraud_stores):
    # The session's run of the shipped spec, at END on DATA_DAYS of transactions (scenarios.build_fraud_run).
    assert (fraud_run.dag_id, fraud_run.logical_date) == ("fraud_detector", END)
    states = fraud_run.states

    assert states == {t: "success" for t in ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate",
                                             "register", "promote")}
    client = _client()
    champion = client.get_model_version_by_alias("fraud_detector", "champion")
    assert champion.version == 1
    # register staged it as the challenger, promote made it the champion (no champion before: no previous).
    assert {a: int(v) for a, v in client.get_registered_model("fraud_detector").aliases.items()} == {
        "challenger": 1, "champion": 1}
    assert champion.tags["dag_id"] == "fraud_detector"
    assert champion.tags["airflow_run_id"] == fraud_run.run_id
    assert len(champion.tags["dataset_digest"]) == 64
    assert len(champion.tags["spec_file_sha256"]) == 64
    assert champion.tags["seed"] == "42"
    assert "git_commit" not in champion.tags  # the configs were copied out of the checkout: no commit to name
    assert champion.tags["spec_file"] == "fraud_detector.yaml"
    assert len(champion.tags["weights_sha256"]) == 64
    assert float(champion.tags["holdout_auc"]) > 0.8

    run = client.get_run(champion.run_id)
    assert run.data.params["world_size"] == "2"
    assert run.data.tags["trainpipe.gates_passed"] == "true"
    assert len(client.get_metric_history(champion.run_id, "train_loss")) >= 5
    from trainpipe.plan.model import run_key
    from trainpipe.settings import Settings

    storage = Path(Settings.from_env().storage_root.removeprefix("file://"))
    run_dir = storage / "runs" / "fraud_detector" / run_key(fraud_run.run_id)
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*/manifest.json"))
    assert checkpoints, "the trainer committed no checkpoint"

    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model("models:/fraud_detector@champion")
    new_rows = generate_transactions(rows=50, days=3, end=END + timedelta(days=3), seed=99)
    features = ["amount", "merchant_risk", "hour_of_day", "distance_from_home_km", "transactions_last_24h",
                "account_age_days", "is_foreign", "merchant_category"]
    predictions = model.predict(new_rows[features])
    assert len(predictions) == 50
    assert all(0.0 <= float(p) <= 1.0 for p in predictions)


def test_second_run_on_same_data_fails_relative_gate_and_keeps_champion(pipelines, monkeypatch):
    client = _client()
    before = client.search_model_versions("name='fraud_detector'")
    assert [int(v.version) for v in before] == [1]  # the session's run, its store copied

    # The same rows train nothing since the training cache (tests/e2e/test_training_cache.py): force trains
    # them again, so the relative gate is what keeps the champion here.
    dag_run, states = run_dag(load_dag(pipelines, "fraud_detector", monkeypatch), logical_date=END + timedelta(hours=1),
                              run_conf={"force": True})

    assert states["train"] == "success" and states["evaluate"] == "success"
    assert states["gate"] == "success"  # the gate ran and short-circuited
    assert states["register"] == "skipped" and states["promote"] == "skipped"
    [run] = client.search_runs(client.get_experiment_by_name("trainpipe/fraud_detector").experiment_id,
                               filter_string=f"tags.`trainpipe.airflow_run_id` = '{dag_run.run_id}'")
    assert run.data.tags["trainpipe.gates_passed"] == "false"
    after = client.search_model_versions("name='fraud_detector'")
    assert len(after) == len(before)
    assert client.get_model_version_by_alias("fraud_detector", "champion").version == 1


def test_missing_required_column_fails_validate_and_trains_nothing(pipelines, monkeypatch):
    from mlflow.exceptions import MlflowException

    dag_run, states = _run(pipelines, monkeypatch, "fraud_missing_column", END)

    assert dag_run.state == "failed"
    assert states["snapshot"] == "success"
    assert states["validate"] == "failed"
    assert {states[t] for t in ("train", "watch_checkpoints", "evaluate", "gate", "register", "promote")} == {"upstream_failed"}
    with pytest.raises(MlflowException, match="fraud_missing_column"):
        _client().get_registered_model("fraud_missing_column")


def test_ranking_pipeline_end_to_end(pipelines, monkeypatch):
    _, states = _run(pipelines, monkeypatch, "search_ranker_nightly", END)

    assert states == {t: "success" for t in ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate",
                                             "register", "promote")}
    champion = _client().get_model_version_by_alias("search_ranker", "champion")
    assert champion.version == 1
    assert float(champion.tags["holdout_ndcg_at_10"]) > 0.5
    run = _client().get_run(champion.run_id)
    assert run.data.params["world_size"] == "2"
