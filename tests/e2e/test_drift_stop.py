"""Schema and drift checks end to end: real Airflow dag.test(), real torchrun, GE, MLflow.

The fraud example spec (its schema and drift checks as shipped) on its own data file, day after day:
a first day becomes the baseline, a normal day (an independent sample of the same process) passes,
a day with one drifted feature stops at `validate` naming it, and a day without a feature column
stops with the schema diff. Neither failed day becomes the baseline.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import REPO, load_dag, run_dag
from trainpipe.demo.synthetic import drift_feature, generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 6, 30, tzinfo=UTC)
PIPELINE = "fraud_drift_e2e"
DATA = "demo/transactions/drift_e2e.parquet"
AFTER_VALIDATE = ("train", "watch_checkpoints", "evaluate", "gate", "register", "promote")


@pytest.fixture(scope="module")
def pipelines(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    assert "drift:" in spec and "schema:" in spec, "the example spec no longer configures the checks under test"
    variant = (
        spec.replace("pipeline_id: fraud_detector", f"pipeline_id: {PIPELINE}")
        .replace("transactions/transactions.parquet", DATA.removeprefix("demo/"))
        .replace("model_name: fraud_detector", f"model_name: {PIPELINE}")
        .replace("retries: 1", "retries: 0")
        .replace("  epochs: 8\n", "  epochs: 1\n")  # training is not under test here
        .replace("    nproc_per_node: 2\n", "    nproc_per_node: 1\n")
    )
    configs = tmp_path_factory.mktemp("drift_configs")
    (configs / f"{PIPELINE}.yaml").write_text(variant)
    return configs


def _day(state_dir: Path, frame) -> None:
    path = state_dir / "storage" / DATA
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(path, index=False)


def _run(pipelines: Path, monkeypatch: pytest.MonkeyPatch, logical_date: datetime):
    return run_dag(load_dag(pipelines, PIPELINE, monkeypatch), logical_date=logical_date)


def _baseline() -> str | None:
    from trainpipe.settings import Settings
    from trainpipe.state.datasets import baseline_version

    baseline = baseline_version(Settings.from_env(), PIPELINE)
    return baseline["digest"] if baseline else None


def _validate_failure(output: str) -> str:
    """The validate task's failure as its log shows it (dag.test() prints task logs)."""
    lines = [line for line in output.splitlines() if "failed validation: " in line]
    assert lines, "validate logged no failure"
    return lines[-1]


def _take(capfd, caplog) -> str:
    """What the tasks logged since the last call. dag.test() prints task logs to stdout, but a logging
    set-up made earlier in the session (another test module) can hold an older stdout that capfd does
    not see; the stdlib records (trainpipe's own lines) reach caplog either way."""
    out = capfd.readouterr().out + "\n" + caplog.text
    caplog.clear()
    return out


def test_drift_and_schema_checks_day_by_day(pipelines, state_dir, monkeypatch, capfd, caplog):
    first_day = generate_transactions(rows=12000, days=25, end=END)
    _day(state_dir, first_day)
    dag_run, states = _run(pipelines, monkeypatch, END)
    assert dag_run.state == "success", states
    assert states["validate"] == "success" and states["train"] == "success"
    first = _baseline()
    assert first is not None

    # A normal day: another sample of the same process, one day later.
    normal_day = generate_transactions(rows=12000, days=25, end=END + timedelta(days=1), seed=8)
    _day(state_dir, normal_day)
    _take(capfd, caplog)
    dag_run, states = _run(pipelines, monkeypatch, END + timedelta(days=1))
    assert dag_run.state == "success", states
    assert states["validate"] == "success" and states["train"] == "success"
    log = _take(capfd, caplog)
    assert f"drift check PASS vs version {first[:16]} (12000 rows -> 12000 rows):" in log
    table = log.split(f"drift check PASS vs version {first[:16]}")[1].splitlines()[1:10]
    assert table[0].split() == ["feature", "kind", "psi", "ks", "verdict", "why"]
    assert [row.split()[0] for row in table[2:]] == ["amount", "merchant_risk", "hour_of_day", "distance_from_home_km",
                                                     "transactions_last_24h", "account_age_days", "is_foreign"]
    assert all(row.split()[4] == "PASS" for row in table[2:])
    normal = _baseline()
    assert normal != first

    # One drifted feature: validate stops the run and names it, with its PSI and KS.
    _day(state_dir, drift_feature(normal_day, "transactions_last_24h"))
    _take(capfd, caplog)
    dag_run, states = _run(pipelines, monkeypatch, END + timedelta(days=2))
    assert dag_run.state == "failed"
    assert states["snapshot"] == "success" and states["validate"] == "failed"
    assert {states[t] for t in AFTER_VALIDATE} == {"upstream_failed"}
    message = _validate_failure(_take(capfd, caplog))
    assert f"distribution drift vs version {normal[:16]} in transactions_last_24h (psi " in message
    assert ">= fail 0.25; ks " in message and ">= fail 0.1)" in message
    assert "amount" not in message.split("distribution drift")[1]
    assert _baseline() == normal

    # A removed feature column: validate stops the run with the schema diff.
    _day(state_dir, normal_day.drop(columns=["merchant_risk"]))
    _take(capfd, caplog)
    dag_run, states = _run(pipelines, monkeypatch, END + timedelta(days=3))
    assert dag_run.state == "failed"
    assert states["validate"] == "failed"
    assert {states[t] for t in AFTER_VALIDATE} == {"upstream_failed"}
    message = _validate_failure(_take(capfd, caplog))
    assert (f"schema changed vs version {normal[:16]}: - merchant_risk: float64 "
            "(a column the pipeline uses; never allowed)") in message
    assert _baseline() == normal
