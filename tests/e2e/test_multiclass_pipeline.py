"""The multiclass example (`dag_configs/digit_classifier.yaml`) end to end: real dag.test(), torchrun with 2
processes, GE, MLflow. It registers a 10-class model that serves a label and a probability per class; a worse
candidate stops at its gate on macro_f1 against the champion; a candidate that lacks a class is not compared
with the champion at all and stops at the gate naming the missing class."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import REPO, edited_spec, load_dag, run_dag, task_result

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 10, 1, tzinfo=UTC)
PIPELINE = "mc_digits"


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainpipe.demo.synthetic import generate_digits

    data = state_dir / "storage" / "multiclass" / "digits.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_digits(end=END).to_parquet(data, index=False)
    folder = tmp_path_factory.mktemp("multiclass_configs")
    (folder / f"{PIPELINE}.yaml").write_text(_shipped_spec())
    return folder


def _shipped_spec() -> str:
    return edited_spec(REPO / "dag_configs" / "digit_classifier.yaml", (
        ("pipeline_id: digit_classifier", f"pipeline_id: {PIPELINE}"),
        ("model_name: digit_classifier", f"model_name: {PIPELINE}"),
        ("uri: demo/digits/digits.parquet", "uri: multiclass/digits.parquet"), ("retries: 1", "retries: 0")))


def _run(configs: Path, monkeypatch: pytest.MonkeyPatch, logical_date: datetime, conf: dict | None = None):
    return run_dag(load_dag(configs, PIPELINE, monkeypatch), logical_date=logical_date, run_conf=conf)


def _note(dag_run) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return DagRun.find(dag_id=dag_run.dag_id, run_id=dag_run.run_id, session=session)[0].note or ""


def test_digits_register_serve_and_a_worse_or_different_candidate_stops_at_the_gate(
        configs: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow
    import pandas as pd

    client = mlflow.MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])

    first, states = _run(configs, monkeypatch, END)
    assert first.state == "success" and states["promote"] == "success", (states, _note(first))
    evaluation = task_result(first, "evaluate")
    candidate, baseline = evaluation["candidate"], evaluation["baseline"]
    # The trainer's MLP against multinomial logistic regression on the same split (the spec's own gate too).
    assert candidate["accuracy"] >= baseline["accuracy"] - 0.02, evaluation
    assert candidate["accuracy"] > 0.9 and 0 < candidate["log_loss"] < baseline["log_loss"] * 2, evaluation
    run = client.get_run(evaluation["mlflow_run_id"] if "mlflow_run_id" in evaluation
                         else client.get_model_version_by_alias(PIPELINE, "champion").run_id)
    assert {f"holdout_f1.{digit}" for digit in range(10)} <= set(run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/report.html", "evaluation/confusion_matrix.png"} <= artifacts
    report = Path(client.download_artifacts(run.info.run_id, "evaluation/report.html")).read_text()
    assert "Per class" in report and "confusion_matrix.png" in report

    # Served: the most probable digit and one probability per digit, from the registered champion.
    model = mlflow.pyfunc.load_model(f"models:/{PIPELINE}@champion")
    rows = pd.read_parquet(state_dir / "storage" / "multiclass" / "digits.parquet").head(20)
    served = model.predict(rows.drop(columns=["event_time", "digit"]))
    assert list(served.columns) == ["label", *(f"probability_{digit}" for digit in range(10))]
    assert (served["label"] == rows["digit"].astype(str)).mean() >= 0.9
    assert served.filter(like="probability_").sum(axis=1).round(6).eq(1.0).all()

    # One epoch at a thousandth of the learning rate: far below the champion's macro F1, so not promoted.
    worse, states = _run(configs, monkeypatch, END + timedelta(hours=1), conf={"learning_rate": 0.00001, "epochs": 1})
    assert states["gate"] == "success" and states["register"] == "skipped", states
    note = _note(worse)
    assert note.startswith("gates failed (3 of 3): ") and "; nothing registered" in note, note
    assert "macro_f1 >= -1% vs champion (got " in note, note
    assert int(client.get_model_version_by_alias(PIPELINE, "champion").version) == 1

    # The 9s are gone from the data and the classes are no longer pinned: a 9-class candidate is not compared
    # with the 10-class champion.
    (configs / f"{PIPELINE}.yaml").write_text(_shipped_spec().replace(
        "  label_classes: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n", ""))
    data = state_dir / "storage" / "multiclass" / "digits.parquet"
    frame = pd.read_parquet(data)
    frame[frame["digit"] != 9].to_parquet(data, index=False)
    # Its own expectation (digits in 0..9) still holds.
    fewer, states = _run(configs, monkeypatch, END + timedelta(hours=2))
    assert states["train"] == "success" and states["register"] == "skipped", states
    note = _note(fewer)
    assert "the candidate's classes differ from the champion's: missing '9'" in note, note
    evaluation = task_result(fewer, "evaluate")
    assert "champion" not in evaluation or not evaluation["champion"], evaluation
    assert int(client.get_model_version_by_alias(PIPELINE, "champion").version) == 1
