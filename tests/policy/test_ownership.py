"""Run time, on the session's real MLflow store: a pipeline of one team cannot register into or
promote (or roll back) a registered model another team owns; its aliases and versions stay as they were."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.model import RegistrationPlan
from trainpipe.plan.tracking import OWNER_TAG
from trainpipe.settings import Settings
from trainpipe.steps.register.model_registry import (
    OwnershipError,
    promote,
    promote_once,
    register_candidate,
    rollback,
)

_runs = itertools.count(1)


@pytest.fixture(scope="module")
def hook() -> MlflowHook:
    return MlflowHook(Settings.from_env())


def _registration(name: str, team: str | None) -> RegistrationPlan:
    return RegistrationPlan(model_name=name, alias="champion", challenger_alias="challenger",
                            previous_alias="previous_champion", description="ownership test", owner_team=team)


def _register(hook: MlflowHook, registration: RegistrationPlan, dag_id: str) -> dict[str, Any]:
    run = f"run_{next(_runs)}"
    mlflow_run_id = hook.run_for_dag_run(pipeline_id=dag_id, dag_id=dag_id, airflow_run_id=run, tags={})
    hook.client.log_text(mlflow_run_id, "artifact_path: model\n", "model/MLmodel")
    tags = {"dag_id": dag_id, "airflow_run_id": run, "spec_file": "x.yaml", "spec_file_sha256": "0" * 64}
    evaluation = {"candidate": {"auc": 0.9}, "champion": None, "champion_version": None, "gates": [],
                  "gates_passed": True}
    return register_candidate(registration, model_uri=f"runs:/{mlflow_run_id}/model", mlflow_run_id=mlflow_run_id,
                              tags=tags, evaluation=evaluation, hook=hook)


def _state(hook: MlflowHook, name: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]], dict[str, str]]:
    model = hook.client.get_registered_model(name)
    versions = sorted((v.version, dict(v.tags)) for v in hook.client.search_model_versions(f"name = '{name}'"))
    return dict(model.aliases or {}), versions, dict(model.tags or {})


def test_another_teams_pipeline_cannot_register_into_or_promote_a_model_it_does_not_own(hook):
    name = "risk_owned_model"
    risk = _registration(name, "risk")
    first = _register(hook, risk, "risk_fraud")
    second = _register(hook, risk, "risk_fraud")
    promote_once(hook.client, name, first["version"], actor="risk dag", reason="first", team="risk")
    promote_once(hook.client, name, second["version"], actor="risk dag", reason="second", team="risk")
    before = _state(hook, name)
    assert before[2][OWNER_TAG] == "risk"
    assert before[0] == {"challenger": second["version"], "champion": second["version"],
                         "previous_champion": first["version"]}

    intruder = _registration(name, "search")
    with pytest.raises(OwnershipError, match=r"register refused: registered model 'risk_owned_model' belongs to team "
                                             r"risk \(trainpipe.owner\), not to team search"):
        _register(hook, intruder, "search_takeover")
    with pytest.raises(OwnershipError, match="promote refused: .* belongs to team risk"):
        promote_once(hook.client, name, first["version"], actor="search dag", reason="takeover", team="search")
    with pytest.raises(OwnershipError, match="promote refused"):
        promote(hook.client, name, first["version"], actor="someone", reason="cli", team="search")
    with pytest.raises(OwnershipError, match="rollback refused"):
        rollback(hook.client, name, actor="someone", reason="cli", team="search")

    # The attack left no trace: same versions (no new one), same aliases, same tags.
    assert _state(hook, name) == before
    # The owner still can.
    assert rollback(hook.client, name, actor="risk", reason="back", team="risk").version == first["version"]


def test_an_unowned_model_is_claimed_by_register_and_not_promotable_before(hook):
    name = "risk_legacy_model"
    legacy = _register(hook, _registration(name, None), "risk_legacy")  # made without a policy: no owner
    assert OWNER_TAG not in _state(hook, name)[2]
    with pytest.raises(OwnershipError, match=r"no trainpipe.owner tag, so no team owns it"):
        promote(hook.client, name, legacy["version"], actor="x", reason="y", team="risk")
    assert "champion" not in _state(hook, name)[0]
    _register(hook, _registration(name, "risk"), "risk_legacy")
    assert _state(hook, name)[2][OWNER_TAG] == "risk"


def test_the_cli_needs_the_team_under_a_policy_and_refuses_another_teams_model(hook, monkeypatch, capsys):
    from trainpipe.commands.main import main

    from .conftest import POLICY

    name = "risk_cli_model"
    registered = _register(hook, _registration(name, "risk"), "risk_cli")
    before = _state(hook, name)
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    assert main(["promote", name, str(registered["version"])]) == 1
    assert "a platform policy is in force: say which team acts with --team" in capsys.readouterr().err
    assert main(["promote", name, str(registered["version"]), "--team", "search"]) == 1
    assert "belongs to team risk" in capsys.readouterr().err
    assert _state(hook, name) == before
    assert main(["promote", name, str(registered["version"]), "--team", "risk"]) == 0
    assert _state(hook, name)[0]["champion"] == registered["version"]
