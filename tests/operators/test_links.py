"""The task buttons' URLs, made as each task ends, come from the run's XComs and never from the tracking store.

On a new SQLite store, asking it anything creates its tables; validate's links asked while the train task
created them too, and train's first try failed on the half-made tables (first run of `airflow standalone`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.operators.links import DRIFT_RUN_XCOM, DriftReportLink, EvaluationReportLink, MlflowRunLink
from trainpipe.settings import Settings


class RunXComs:
    """A task instance's view of its DAG run's XComs, as ``xcom_pull`` answers in the worker."""

    def __init__(self, xcoms: dict[tuple[str, str], Any]) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))


@pytest.fixture
def operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return SimpleNamespace(hook=MlflowHook(Settings.from_env()), plan=SimpleNamespace(dag_id="fraud"), dag_id="fraud")


def test_validate_of_a_first_run_makes_no_link_and_leaves_a_new_store_untouched(operator, tmp_path: Path) -> None:
    ti = RunXComs({("validate", "return_value"): {"success": True}})

    assert DriftReportLink().get_link(operator, ti_key=ti) == ""
    assert MlflowRunLink().get_link(operator, ti_key=ti) == ""

    assert not (tmp_path / "mlflow.db").exists()


def test_the_drift_report_button_opens_the_run_validate_logged_to(operator, tmp_path: Path) -> None:
    ti = RunXComs({("validate", DRIFT_RUN_XCOM): "0a1b2c"})

    assert DriftReportLink().get_link(operator, ti_key=ti).endswith("/trainpipe/runs/0a1b2c/artifacts/drift/drift_report.html")
    assert not (tmp_path / "mlflow.db").exists()


def test_after_train_the_reports_open_the_training_run(operator) -> None:
    ti = RunXComs({("validate", DRIFT_RUN_XCOM): "0a1b2c", ("train", "return_value"): {"mlflow_run_id": "9f8e"}})

    assert EvaluationReportLink().get_link(operator, ti_key=ti).endswith(
        "/trainpipe/runs/9f8e/artifacts/evaluation/report.html")
