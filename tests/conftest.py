"""Test-wide environment: every test session gets its own TRAINPIPE_HOME, Airflow DB and MLflow store.

Set before anything imports Airflow (its configuration is read at import time).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import REPO, copy_airflow_db

_STATE = Path(tempfile.mkdtemp(prefix="trainpipe-tests-"))

os.environ.update(
    {
        "TRAINPIPE_HOME": str(_STATE),
        "AIRFLOW_HOME": str(_STATE / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_STATE / 'airflow' / 'airflow.db'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{_STATE / 'mlflow.db'}",
        "TRAINPIPE_MLFLOW_ARTIFACT_ROOT": str(_STATE / "mlartifacts"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "GX_ANALYTICS_ENABLED": "false",
        "TORCH_EXTENSIONS_DIR": str(REPO / ".trainpipe" / "torch_extensions"),
    }
)
(_STATE / "airflow").mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated Airflow metadata DB (SQLite, one file) for the whole test session, every pytest-xdist worker
    included: `airflow db migrate` runs once, and each consumer copies the file (``copy_airflow_db``)."""
    from filelock import FileLock

    # The workers' temporary folders share this parent (pytest-xdist's recipe for session-wide data).
    shared = tmp_path_factory.getbasetemp().parent
    template = shared / "airflow-template.db"
    with FileLock(str(shared / "airflow-template.lock")):
        if not template.exists():
            building = shared / "airflow-template.building.db"
            home = shared / "airflow-template-home"
            env = {**os.environ, "AIRFLOW_HOME": str(home),
                   "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{building}"}
            airflow = Path(sys.executable).with_name("airflow")
            subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, env=env)
            building.rename(template)  # whole or absent: a worker never copies a half-migrated file
    return template


@pytest.fixture(scope="session")
def airflow_db(airflow_db_template: Path) -> Path:
    """The session's migrated Airflow metadata DB (SQLite) for DagBag and dag.test()."""
    database = copy_airflow_db(airflow_db_template, _STATE / "airflow" / "airflow.db")
    # An earlier test may have opened the (then empty) database in this process: its pooled connections would
    # keep reading the file they opened, not the copy. New connections open the copy.
    if "airflow.settings" in sys.modules:
        from airflow import settings

        if getattr(settings, "engine", None) is not None:
            settings.engine.dispose()
    return database


# `make test` runs two pytest-xdist workers (-n 2 --no-loadscope-reorder). One worker runs each group: a module,
# a package whose fixture starts a server once (tests/fleet), or the Airflow servers below. The longest groups go
# first, so that no long one is left to run alone at the end.
_PACKAGE_GROUPS = ("tests/fleet/",)
# The one Airflow server boot of the session: the stack (tests/stack), which also runs the approval and deadline
# scenarios. Two Airflows with their running tasks on two cores starved each other's api-servers past a 60 s read
# (seen in CI), so no other test module starts a server of its own.
_AIRFLOW_SERVERS = ("tests/stack/test_stack_",)
_AIRFLOW_SERVERS_GROUP = "airflow servers"
# Modules that inspect one finished run of the session (tests/e2e/scenarios.py): one worker each, so the run is
# built once, not once per worker.
_SHARED_RUN_GROUPS = {
    "e2e fraud_run": ("tests/e2e/test_evaluation_report.py", "tests/e2e/test_example_pipelines.py",
                      "tests/e2e/test_model_asset_event.py"),
    "e2e small_run": ("tests/e2e/test_backtest.py", "tests/e2e/test_openlineage.py"),
}
_LONGEST_FIRST = (_AIRFLOW_SERVERS_GROUP, "tests/e2e/test_transformer_pipeline.py", "tests/launchers/test_preemption_relaunch.py",
                  "tests/e2e/test_tuned_pipeline.py", "tests/e2e/test_model_lifecycle.py", "tests/fleet/",
                  "tests/trainer/test_fault_tolerance.py", "tests/commands/test_train.py", "tests/e2e/test_drift_stop.py",
                  "e2e fraud_run", "e2e small_run", "tests/e2e/test_run_notes.py", "tests/trainer/test_preemption.py",
                  "tests/trainer/test_deepspeed.py", "tests/examples/test_acme_family.py")


def _group(nodeid: str) -> str:
    path = "tests/" + nodeid.split("::", 1)[0].split("tests/", 1)[-1]
    if path.startswith(_AIRFLOW_SERVERS):
        return _AIRFLOW_SERVERS_GROUP
    shared = next((name for name, modules in _SHARED_RUN_GROUPS.items() if path in modules), None)
    if shared is not None:
        return shared
    return next((package for package in _PACKAGE_GROUPS if path.startswith(package)), path)


def _rank(group: str) -> int:
    return next((rank for rank, prefix in enumerate(_LONGEST_FIRST) if group.startswith(prefix)), len(_LONGEST_FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable: each module keeps its order. Within a group, a test that kills stack services goes first, before the
    # stack tier starts its overlapping runs (tests/stack/conftest.py), which a killed worker would take down too.
    items.sort(key=lambda item: (_rank(_group(item.nodeid)), item.get_closest_marker("stack_exclusive") is None))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    # Scopes of our own: xdist's loadgroup marks do not take with pytest 9 (nodeid is read-only there).
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)
