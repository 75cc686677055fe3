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

REPO = Path(__file__).resolve().parent.parent
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
def airflow_db() -> Path:
    """A migrated Airflow metadata DB (SQLite) for DagBag and dag.test()."""
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, env=os.environ.copy())
    return _STATE / "airflow" / "airflow.db"
