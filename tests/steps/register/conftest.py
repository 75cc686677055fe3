"""The registry tests' real MLflow store (the session's SQLite one), and a way to make model versions
the way the DAG's register task does: a training run with an artifact folder, then register_candidate."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.model import RegistrationPlan
from trainpipe.settings import Settings

from .helpers import hook_register

_names = itertools.count(1)


@pytest.fixture(scope="session")
def hook() -> MlflowHook:
    # The session's store (tests/conftest.py): MlflowHook points MLflow's process-wide tracking URI at
    # its store, so a store of its own would move every later test's. Each test has its own model name.
    return MlflowHook(Settings.from_env())


@pytest.fixture
def model_name() -> str:
    return f"registry_model_{next(_names)}"


@pytest.fixture
def registration(model_name: str) -> RegistrationPlan:
    return RegistrationPlan(model_name=model_name, alias="champion", challenger_alias="challenger",
                            previous_alias="previous_champion", description="registry test model")


@pytest.fixture
def train_and_register(hook: MlflowHook, registration: RegistrationPlan) -> Callable[..., dict[str, Any]]:
    """register_candidate for DAG run ``run``: its MLflow run is made (or found) as the train task does."""

    def make(run: str, *, dag_id: str = "registry_dag", **evaluation_extra: Any) -> dict[str, Any]:
        mlflow_run_id = hook.run_for_dag_run(pipeline_id=dag_id, dag_id=dag_id, airflow_run_id=run, tags={})
        hook.client.log_text(mlflow_run_id, "artifact_path: model\n", "model/MLmodel")
        return hook_register(hook, registration, mlflow_run_id=mlflow_run_id, dag_id=dag_id, run=run,
                             evaluation_extra=evaluation_extra)

    return make
