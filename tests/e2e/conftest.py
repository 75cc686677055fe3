"""The end-to-end fixture: ``dag_from(configs, dag_id)`` loads a DAG as Airflow does (tests/e2e/dags.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .dags import load_dag


@pytest.fixture
def dag_from(monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> Callable:
    return lambda configs, dag_id: load_dag(configs, dag_id, monkeypatch)
