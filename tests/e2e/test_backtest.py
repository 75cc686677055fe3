"""Runs for the past are backtests (issue 33): a spec run for today, then for a date three weeks earlier, under real
dag.test() (torchrun, GE, MLflow, trainpipe's note listener). The backtest trains and records its metrics, but
`champion` and the validation baseline stay where today's run put them and the note says why; with
`registration.backtest.register: true` its version is tagged and takes its own alias; with `promote: allow`
the past run is promoted and becomes the baseline, as before.

Today's run is the session's run of the small pipeline (``small_run``, 60 days of rows up to TODAY); each test runs
the past on a copy of its stores, with the spec's `registration.backtest` as the test wants it (it applies to past
runs only). Small data and one epoch: the training itself is not under test.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.scenarios import SMALL, SMALL_END, small_spec
from tests.support import load_dag, run_dag, task_result

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TODAY = SMALL_END
PAST = TODAY - timedelta(days=21)
PAST_WINDOW = "2026-10-07..2026-11-06"  # the 30d window of the past run, as the note shows it


BACKTEST = {
    "default": "",
    "registered": "  backtest: {register: true, alias: backtest}\n",
    "allowed": "  backtest: {promote: allow}\n",
}


def _run(configs: Path, monkeypatch: pytest.MonkeyPatch, dag_id: str, logical_date: datetime):
    return run_dag(load_dag(configs, dag_id, monkeypatch), logical_date=logical_date)


def _note(dag_run) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        note = DagRun.find(dag_id=dag_run.dag_id, run_id=dag_run.run_id, session=session)[0].note
    assert note, "the run has no note"
    return note.splitlines()[0]  # the reason; the cost line follows


def _aliases(client, model: str) -> dict[str, int]:
    return {alias: int(v) for alias, v in client.get_registered_model(model).aliases.items()}


def _baseline(pipeline_id: str) -> str:
    from trainpipe.settings import Settings
    from trainpipe.state.datasets import baseline_version

    return baseline_version(Settings.from_env(), pipeline_id)["digest"]


def _mlflow_run(client, dag_run):
    """The DAG run's MLflow run, as train reported it."""
    return client.get_run(task_result(dag_run, "train")["mlflow_run_id"])


def _today_then_past(small_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backtest: str):
    """Today's run (the session's), then this test's past run on its copy of the stores."""
    today = small_run
    assert today.logical_date == TODAY
    assert today.state == "success" and today.states["promote"] == "success", today.states
    baseline = _baseline(SMALL)
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{SMALL}.yaml").write_text(small_spec(tail=backtest))
    past, states = _run(configs, monkeypatch, SMALL, PAST)
    assert past.state == "success", states
    return today, baseline, past, states


def test_a_past_run_trains_and_records_but_moves_neither_champion_nor_baseline(small_run, small_stores, tmp_path,
                                                                                monkeypatch):
    import mlflow

    client = mlflow.MlflowClient()
    dag_id = SMALL
    _, baseline, past, states = _today_then_past(small_run, tmp_path, monkeypatch, BACKTEST["default"])

    assert states["train"] == states["evaluate"] == "success", states
    assert states["register"] == states["promote"] == "skipped", states
    assert _aliases(client, dag_id) == {"champion": 1, "challenger": 1}
    assert len(client.search_model_versions(f"name = '{dag_id}'")) == 1
    assert _baseline(dag_id) == baseline
    # Recorded: the MLflow run has its holdout metrics and says it is a backtest.
    run = _mlflow_run(client, past)
    assert run.data.tags["trainpipe.backtest"] == "true"
    assert {"holdout_auc", "holdout_f1"} <= set(run.data.metrics)
    assert _note(past) == f"backtest for {PAST_WINDOW}: not promoted (run for a past window)"


def test_a_registered_backtest_is_tagged_and_takes_its_own_alias(small_run, small_stores, tmp_path, monkeypatch):
    import mlflow

    client = mlflow.MlflowClient()
    dag_id = SMALL
    _, baseline, past, states = _today_then_past(small_run, tmp_path, monkeypatch, BACKTEST["registered"])

    assert states["register"] == "success" and states["promote"] == "skipped", states
    assert _aliases(client, dag_id) == {"champion": 1, "challenger": 1, "backtest": 2}
    version = client.get_model_version(dag_id, "2")
    assert version.tags["trainpipe.backtest"] == "true"
    assert version.tags["trainpipe.window_end"].startswith(PAST_WINDOW[-10:])
    assert _baseline(dag_id) == baseline
    assert _note(past) == (f"backtest for {PAST_WINDOW}: not promoted (run for a past window); registered as "
                           f"{dag_id} version 2 (alias backtest)")


def test_promote_allow_treats_a_past_run_as_any_run(small_run, small_stores, tmp_path, monkeypatch):
    import mlflow

    client = mlflow.MlflowClient()
    dag_id = SMALL
    _, baseline, past, states = _today_then_past(small_run, tmp_path, monkeypatch, BACKTEST["allowed"])

    assert states["register"] == states["promote"] == "success", states
    assert _aliases(client, dag_id) == {"champion": 2, "challenger": 2, "previous_champion": 1}
    assert "trainpipe.backtest" not in client.get_model_version(dag_id, "2").tags
    assert _baseline(dag_id) != baseline
    assert _note(past).startswith(f"promoted: {dag_id} version 2 is champion; ")
