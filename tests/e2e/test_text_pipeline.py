"""The text example (`dag_configs/ticket_router.yaml`) end to end: real dag.test(), torchrun with 2 processes,
GE, drift on the texts' lengths, MLflow. The text_bag family trains from the tickets' subject and body, scores
within 0.03 of the TF-IDF + logistic-regression baseline on the same split, registers, and the champion takes
raw text."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import REPO, edited_spec, load_dag, run_dag, task_result

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 10, 1, tzinfo=UTC)
PIPELINE = "text_tickets"


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainpipe.demo.synthetic import generate_tickets

    data = state_dir / "storage" / "text" / "tickets.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_tickets(end=END).to_parquet(data, index=False)
    text = edited_spec(REPO / "dag_configs" / "ticket_router.yaml", (
        ("pipeline_id: ticket_router", f"pipeline_id: {PIPELINE}"), ("model_name: ticket_router", f"model_name: {PIPELINE}"),
        ("uri: demo/tickets/tickets.parquet", "uri: text/tickets.parquet"), ("retries: 1", "retries: 0")))
    folder = tmp_path_factory.mktemp("text_configs")
    (folder / f"{PIPELINE}.yaml").write_text(text)
    return folder


def test_tickets_train_from_text_register_and_the_champion_takes_raw_text(
        configs: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    import pandas as pd

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    dag_run, states = run_dag(load_dag(configs, PIPELINE, monkeypatch), logical_date=END)
    assert dag_run.state == "success" and states["promote"] == "success", states

    evaluation = task_result(dag_run, "evaluate")
    candidate, baseline = evaluation["candidate"], evaluation["baseline"]
    assert "TF-IDF" in evaluation["baseline_model"], evaluation
    assert candidate["accuracy"] >= baseline["accuracy"] - 0.03, evaluation
    version = client.get_model_version_by_alias(PIPELINE, "champion")
    assert version.tags["trainpipe.model_family"] == "text_bag"

    model = mlflow.pyfunc.load_model(f"models:/{PIPELINE}@champion")
    rows = pd.read_parquet(state_dir / "storage" / "text" / "tickets.parquet").tail(200)
    served = model.predict(rows[["subject", "body", "channel"]])
    assert list(served.columns) == ["label", *(f"probability_{q}" for q in
                                               ("account", "billing", "shipping", "technical"))]
    assert (served["label"] == rows["queue"]).mean() >= 0.85
    # A ticket as a user types it, in a shape the training rows never had.
    typed = model.predict(pd.DataFrame({"subject": ["I was CHARGED TWICE!!"],
                                        "body": ["My card was charged twice for one invoice, refund please."],
                                        "channel": ["email"]}))
    assert typed["label"].iloc[0] == "billing", typed
