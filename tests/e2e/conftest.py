"""The end-to-end fixtures: ``dag_from(configs, dag_id)`` loads a DAG as Airflow does (tests.support);
``small_pipeline`` writes the small spec and transactions data that the issue-33 tests share; ``fraud_run`` and
``small_run`` are finished runs built once per session (tests/e2e/scenarios.py), and ``fraud_stores`` and
``small_stores`` a consumer's own copy of their stores, which the environment names while the consumer runs.

Every module that uses ``fraud_run`` (or ``small_run``) must run on one pytest-xdist worker (tests/conftest.py
groups them), or each worker runs it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import scenarios
from tests.e2e.scenarios import FinishedRun, SmallPipeline, copy_stores, using_stores
from tests.support import load_dag


@pytest.fixture
def dag_from(monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> Callable:
    return lambda configs, dag_id: load_dag(configs, dag_id, monkeypatch)


@pytest.fixture(scope="session")
def small_pipeline(state_dir: Path, airflow_db: Path) -> SmallPipeline:
    return SmallPipeline(state_dir)


@pytest.fixture(scope="session")
def fraud_run(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """The shipped fraud_detector spec run once (scenarios.build_fraud_run). Never point the environment at its
    stores: take a copy (``fraud_stores``)."""
    return scenarios.build_fraud_run(tmp_path_factory.mktemp("fraud_run"))


@pytest.fixture(scope="session")
def small_run(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """The small pipeline run once for scenarios.SMALL_END (scenarios.build_small_run); copies: ``small_stores``."""
    return scenarios.build_small_run(tmp_path_factory.mktemp("small_run"))


@pytest.fixture(scope="module")
def fraud_stores(fraud_run: FinishedRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's own copy of ``fraud_run``'s stores (its tests share it)."""
    with using_stores(copy_stores(fraud_run.home, tmp_path_factory.mktemp("fraud_stores") / "home")) as home:
        yield home


@pytest.fixture
def small_stores(small_run: FinishedRun, tmp_path: Path) -> Iterator[Path]:
    """The test's own copy of ``small_run``'s stores: each test starts from the run's champion and baseline."""
    with using_stores(copy_stores(small_run.home, tmp_path / "small_stores")) as home:
        yield home
