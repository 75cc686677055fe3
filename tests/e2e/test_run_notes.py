"""Every run that ends without a new champion, and every promotion, says why in the run's note: real dag.test()
runs (torchrun, GE, MLflow), the note written by trainpipe's listener, read back from Airflow's database.

Small data and one epoch: the training itself is not under test.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import load_dag, run_dag, task_result
from trainpipe.demo.synthetic import drift_feature, generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 8, 31, tzinfo=UTC)
FEATURES = ("[amount, merchant_risk, hour_of_day, distance_from_home_km, transactions_last_24h, account_age_days, "
            "is_foreign]")


def _spec(pipeline_id: str, *, validation: str = "", gates: str = '["f1 >= 0.0"]', slices: str = "",
          testing: str = "") -> str:
    return f"""\
pipeline_id: {pipeline_id}
schedule: none
retries: 0
data:
  uri: run_notes/{pipeline_id}.parquet
  time_column: event_time
  window: 30d
{validation}training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [8]}}
  features: {FEATURES}
  label: is_fraud
  epochs: 1
  batch_size: 128
  distributed: {{nproc_per_node: 1}}
  checkpoint: {{every_n_steps: 50}}
{testing}evaluation:
  metrics: [auc, f1]
  gates: {gates}
{slices}registration:
  model_name: {pipeline_id}
"""


CHECKED = """validation:
  expectations:
    - expect_column_values_to_be_between: {column: amount, min_value: 0}
  max_volume_change: 0.5
  schema: {added_columns: allow, removed_columns: fail, retyped_columns: fail}
  drift:
    psi: {warn: 0.1, fail: 0.25}
    ks: {warn: 0.05, fail: 0.1}
"""

SPECS = {
    # A run parameter seed: the second run on the same rows trains another model (the same inputs would train
    # nothing, training.cache, issue 33).
    "notes_lifecycle": _spec("notes_lifecycle", validation=CHECKED) + "params:\n  seed: {description: this run's}\n",
    "notes_quality": _spec("notes_quality", validation="""validation:
  expectations:
    - expect_column_values_to_be_between: {column: amount, max_value: 50}
"""),
    "notes_slice": _spec("notes_slice", gates='["f1 >= 0.0", "worst_slice(auc) >= 0.99"]', slices="  slices: [region]\n"),
    "notes_nan": _spec("notes_nan", testing="  testing: {inject_nan_at_step: 3}\n"),
}


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("note_configs")
    for name, text in SPECS.items():
        (folder / f"{name}.yaml").write_text(text)
        _data(state_dir, name, generate_transactions(rows=3000, days=20, end=END))
    return folder


def _data(state_dir: Path, pipeline_id: str, frame) -> None:
    path = state_dir / "storage" / "run_notes" / f"{pipeline_id}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def _run(configs: Path, monkeypatch: pytest.MonkeyPatch, dag_id: str, logical_date: datetime = END,
         conf: dict | None = None):
    # notes_nan injects a NaN (training.testing): the platform allows fault injection here (ADR 0014).
    monkeypatch.setenv("TRAINPIPE_ALLOW_FAULT_INJECTION", "1")
    return run_dag(load_dag(configs, dag_id, monkeypatch), logical_date=logical_date, run_conf=conf)


def _note(dag_run) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        note = DagRun.find(dag_id=dag_run.dag_id, run_id=dag_run.run_id, session=session)[0].note
    assert note, "the run has no note"
    # The reason is the first line; after it only the cost of the training (issue 23), when it ran.
    reason, *rest = note.splitlines()
    # A candidate worse than the baseline model on some metric says so on a line of its own (issue 34).
    rest = [line for line in rest if not line.startswith("below baseline (")]
    assert all(line.startswith("training used ") for line in rest), note
    # ... and the training throughput of the try that finished (issue 31).
    assert all(re.search(r", at [\d,]+ samples/s$", line) for line in rest), note
    return reason


def test_promotions_then_a_drift_stop_then_a_volume_and_schema_stop(configs, state_dir, monkeypatch):
    dag_id = "notes_lifecycle"
    first, states = _run(configs, monkeypatch, dag_id)
    assert first.state == "success" and states["promote"] == "success", states
    auc_1 = task_result(first, "evaluate")["candidate"]["auc"]
    assert _note(first) == f"promoted: {dag_id} version 1 is champion; auc {auc_1:.6f} (no previous champion)"

    # The same rows again: the same dataset version, a second model, compared with the first on the holdout.
    second, states = _run(configs, monkeypatch, dag_id, END + timedelta(days=1), conf={"seed": 1})
    assert second.state == "success" and states["promote"] == "success", states
    evaluation = task_result(second, "evaluate")
    auc_2, champion_auc = evaluation["candidate"]["auc"], evaluation["champion"]["auc"]
    assert _note(second) == (f"promoted: {dag_id} version 2 is champion; auc {auc_2:.6f} vs {champion_auc:.6f} of "
                             f"version 1 ({auc_2 - champion_auc:+.6f})")

    normal = generate_transactions(rows=3000, days=20, end=END)
    _data(state_dir, dag_id, drift_feature(normal, "amount"))
    drifted, states = _run(configs, monkeypatch, dag_id, END + timedelta(days=2))
    assert drifted.state == "failed" and states["validate"] == "failed", states
    note = _note(drifted)
    assert note.startswith("validation failed: drift in amount (PSI "), note
    assert "\n" not in note and "merchant_risk" not in note
    psi = float(note.split("(PSI ")[1].split(" ")[0])
    assert psi >= 0.25

    # A third of the rows and a feature column gone: both facts, with the numbers.
    _data(state_dir, dag_id, normal.drop(columns=["merchant_risk"]).sample(n=1000, random_state=1))
    shrunk, states = _run(configs, monkeypatch, dag_id, END + timedelta(days=3))
    assert shrunk.state == "failed" and states["validate"] == "failed", states
    note = _note(shrunk)
    assert note.startswith("validation failed: "), note
    assert "row count 3000 -> 1000 (-66.7% vs version " in note and ", limit 50%)" in note
    assert "schema changed vs version " in note and ": - merchant_risk: float64" in note
    # The required column's own expectation says it too, without the list of the columns present.
    assert "expect_column_to_exist(merchant_risk): column 'merchant_risk' is missing (11 columns present); " in note


def test_a_failed_expectation_names_itself_and_the_rows(configs, monkeypatch):
    dag_run, states = _run(configs, monkeypatch, "notes_quality")

    assert dag_run.state == "failed" and states["validate"] == "failed", states
    note = _note(dag_run)
    assert note.startswith("validation failed: expect_column_values_to_be_between(amount): "), note
    unexpected, of, total = note.split("): ")[1].split(" ")[:3]
    assert of == "of" and 0 < int(unexpected) < int(total)
    assert note.split("): ")[1].startswith(f"{unexpected} of {total} values unexpected (")


def test_a_slice_gate_note_gives_the_worst_slice_value(configs, monkeypatch):
    dag_run, states = _run(configs, monkeypatch, "notes_slice")

    assert dag_run.state == "success" and states["register"] == "skipped", states
    evaluation = task_result(dag_run, "evaluate")
    [slice_gate] = [g for g in evaluation["gates"] if g["gate"] == "worst_slice(auc) >= 0.99"]
    assert slice_gate["value"] != evaluation["candidate"]["auc"]  # else the test could not tell them apart
    region = slice_gate["note"].split("worst slice region=")[1].split(" ")[0]
    assert _note(dag_run) == (
        f"gates failed (1 of 2): worst_slice(auc) >= 0.99 (got {slice_gate['value']:.6f}, worst slice "
        f"region={region} ({slice_gate['note'].split('(')[1].split(')')[0]})); nothing registered")


def test_a_nan_stop_names_the_guard_and_the_step(configs, monkeypatch):
    dag_run, states = _run(configs, monkeypatch, "notes_nan")

    assert dag_run.state == "failed" and states["train"] == "failed", states
    assert _note(dag_run) == "training failed: NaN guard at step 3 (non-finite loss (nan))"


def test_a_successful_run_logs_no_warning_or_error(configs, state_dir, monkeypatch, capfd, caplog):
    """Every task's log of a clean run: no foreign warnings, no library chatter shown as errors."""
    import logging

    caplog.set_level(logging.DEBUG)
    _data(state_dir, "notes_quiet", generate_transactions(rows=3000, days=20, end=END))
    (configs / "notes_quiet.yaml").write_text(_spec("notes_quiet", validation=CHECKED))
    capfd.readouterr()

    dag_run, states = _run(configs, monkeypatch, "notes_quiet")

    assert dag_run.state == "success" and states["promote"] == "success", states
    # dag.test() prints each task's log to stdout (structlog's "[warning  ]" form); stdlib records reach caplog.
    printed = capfd.readouterr()
    lines = (printed.out + printed.err).splitlines()
    flagged = [line for line in lines if any(mark in line for mark in ("[warning", "[error", "[critical", " WARNING ",
                                                                       " ERROR ", "Warning:", "Traceback"))]
    flagged += [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert flagged == []
    assert not [line for line in lines if "because it is a closure" in line]
