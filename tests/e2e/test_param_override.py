"""A manual trigger with params: the run trains with the overridden hyperparameters, and MLflow records them."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.demo.synthetic import generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 6, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = state_dir / "storage" / "params_demo" / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=6000, days=25, end=END).to_parquet(data, index=False)
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    spec = (
        spec.replace("pipeline_id: fraud_detector", "pipeline_id: fraud_params")
        .replace("demo/transactions/transactions.parquet", "params_demo/transactions.parquet")
        .replace("model_name: fraud_detector", "model_name: fraud_params")
        .replace("retries: 1", "retries: 0")
        .replace("expect_table_row_count_to_be_between: {min_value: 1000}",
                 "expect_table_row_count_to_be_between: {min_value: 100}")
        # Gates any one-epoch model passes: this test is about what gets recorded, so register must run.
        .replace("    - auc >= 0.80\n    - f1 >= 0.30\n", "    - auc >= 0.50\n")
    )
    assert "auc >= 0.50" in spec
    folder = tmp_path_factory.mktemp("param_configs")
    (folder / "fraud_params.yaml").write_text(spec)
    return folder


def test_trigger_with_params_overrides_hyperparameters_for_that_run(configs, dag_from):
    import mlflow

    dag = dag_from(configs, "fraud_params")

    dag_run = dag.test(logical_date=END, run_conf={"epochs": 1, "learning_rate": 0.01, "seed": 7})

    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["train"] == "success" and states["register"] == "success", states
    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("trainpipe/fraud_params")
    (run,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`trainpipe.airflow_run_id` = '{dag_run.run_id}'")
    assert run.data.params["epochs"] == "1"  # the spec says 8
    assert run.data.params["learning_rate"] == "0.01"  # the spec says 0.003
    assert run.data.params["seed"] == "7"  # the spec says 42
    assert run.data.params["batch_size"] == "64"  # not overridden
    assert run.data.tags["trainpipe.param_overrides"] == '{"epochs": 1, "learning_rate": 0.01, "seed": 7}'
    # The registered version's lineage names the seed the run really used.
    version = client.get_model_version_by_alias("fraud_params", "champion")
    assert version.run_id == run.info.run_id
    assert version.tags["seed"] == "7"
