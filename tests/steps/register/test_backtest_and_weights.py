"""Issue 33 in the registry (real MLflow store): a backtest's version is tagged and takes its own alias, never the
challenger; a candidate with the production version's weights is found out, except by the run that made it."""

from __future__ import annotations

import dataclasses

from trainpipe.plan import tracking
from trainpipe.plan.model import BacktestPlan
from trainpipe.steps.register import model_registry as registry

from .helpers import evaluation


def _register(hook, registration, run: str, *, weights: str = "w" * 64, backtest: bool = False):
    mlflow_run_id = hook.run_for_dag_run(pipeline_id="registry_dag", dag_id="registry_dag", airflow_run_id=run, tags={})
    hook.client.log_text(mlflow_run_id, "artifact_path: model\n", "model/MLmodel")
    tags = {"dag_id": "registry_dag", "airflow_run_id": run, "weights_sha256": weights}
    return registry.register_candidate(registration, model_uri=f"runs:/{mlflow_run_id}/model",
                                       mlflow_run_id=mlflow_run_id, tags=tags, evaluation=evaluation(), hook=hook)


def _aliases(hook, name: str) -> dict[str, int]:
    return {alias: int(v) for alias, v in hook.client.get_registered_model(name).aliases.items()}


def test_a_backtest_version_is_tagged_and_takes_its_own_alias_not_challenger(hook, model_name, registration):
    registration = dataclasses.replace(registration, backtest=BacktestPlan(register=True, alias="backtest"))
    _register(hook, registration, "manual__today")
    mlflow_run_id = hook.run_for_dag_run(pipeline_id="registry_dag", dag_id="registry_dag",
                                         airflow_run_id="backfill__past", tags={})
    hook.client.log_text(mlflow_run_id, "artifact_path: model\n", "model/MLmodel")
    registered = registry.register_candidate(
        registration, model_uri=f"runs:/{mlflow_run_id}/model", mlflow_run_id=mlflow_run_id, backtest=True,
        tags={"dag_id": "registry_dag", "airflow_run_id": "backfill__past"}, evaluation=evaluation(), hook=hook)

    assert (registered["version"], registered["alias"]) == (2, "backtest")
    assert _aliases(hook, model_name) == {"challenger": 1, "backtest": 2}
    assert hook.client.get_model_version(model_name, "2").tags[tracking.BACKTEST_TAG] == "true"
    assert tracking.BACKTEST_TAG not in hook.client.get_model_version(model_name, "1").tags


def test_a_backtest_without_an_alias_moves_none(hook, model_name, registration):
    registration = dataclasses.replace(registration, backtest=BacktestPlan(register=True))
    mlflow_run_id = hook.run_for_dag_run(pipeline_id="registry_dag", dag_id="registry_dag",
                                         airflow_run_id="backfill__x", tags={})
    hook.client.log_text(mlflow_run_id, "artifact_path: model\n", "model/MLmodel")
    registered = registry.register_candidate(
        registration, model_uri=f"runs:/{mlflow_run_id}/model", mlflow_run_id=mlflow_run_id, backtest=True,
        tags={"dag_id": "registry_dag", "airflow_run_id": "backfill__x"}, evaluation=evaluation(), hook=hook)

    assert registered["alias"] is None
    assert _aliases(hook, model_name) == {}


def test_the_production_version_s_weights_are_found_out_except_by_its_own_run(hook, model_name, registration):
    def same(weights: str, run: str = "manual__2") -> int | None:
        return registry.same_weights_as_production(hook.client, registration, weights, dag_id="registry_dag",
                                                   airflow_run_id=run)

    assert same("a" * 64) is None  # no model yet
    _register(hook, registration, "manual__1", weights="a" * 64)
    assert same("a" * 64) is None  # registered, not yet production
    registry.promote(hook.client, model_name, 1, actor="test", reason="first")

    assert same("a" * 64) == 1
    assert same("b" * 64) is None
    assert same("a" * 64, run="manual__1") is None  # a re-run of register of version 1's own run
