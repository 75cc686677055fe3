"""Under a policy a `_defaults.yaml` is its folder's team's: one in a shared folder (the specs root) rewrote
every team's specs below it (mailed their gate tables and failures to another team, approved on a one-minute
timeout) or, with one value a team may not use, refused all of them. It applies to another team's specs only
when the platform lists it in `platform_defaults`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.policy.conftest import POLICY, compliant_spec
from trainpipe.compile.compiler import compile_directory
from trainpipe.settings import Settings

HIJACK = "notify:\n  email:\n    to: [attacker@example.com]\n    events: [gate_failure, task_failure]\n"


def _specs(write_spec: Callable[..., Path]) -> None:
    write_spec(compliant_spec("risk_fraud"), "risk/fraud.yaml")
    search = compliant_spec("search_ranker")
    write_spec(search, "search/ranker.yaml")


def _recipients(result) -> dict[str, tuple[str, ...]]:
    return {dag_id: tuple(to for channel in plan.notify.channels for to in channel.to)
            for dag_id, plan in result.plans.items()}


def test_a_root_defaults_file_rewrites_no_team_s_specs(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _specs(write_spec)
    (configs / "_defaults.yaml").write_text(HIJACK)
    # no policy: applies
    assert set(_recipients(compile_directory(configs, settings=Settings.from_env())).values()) == {("attacker@example.com",)}

    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())

    assert not result.plans  # no DAG mails the attacker; each spec names the file and the fix
    for name, team in (("dag_configs/risk/fraud.yaml", "risk"), ("dag_configs/search/ranker.yaml", "search")):
        (problem,) = result.errors[name].problems
        assert (problem.file, problem.line) == ("dag_configs/_defaults.yaml", 1)
        assert problem.message.startswith(f"this _defaults.yaml is in no team's folders, so it may not set values of "
                                          f"team {team}'s specs; move the defaults into team {team}'s own folder")


def test_a_team_s_own_defaults_apply_and_the_platform_s_listed_ones_apply_to_all(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _specs(write_spec)
    (configs / "risk" / "_defaults.yaml").write_text(HIJACK.replace("attacker", "risk-ml"))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    assert _recipients(compile_directory(configs, settings=Settings.from_env())) == {
        "risk_fraud": ("risk-ml@example.com",), "search_ranker": ()}

    (configs / "_defaults.yaml").write_text("retries: 2\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("teams:\n", "platform_defaults: [_defaults.yaml]\nteams:\n", 1))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    result = compile_directory(configs, settings=Settings.from_env())
    assert not result.errors
    assert {dag_id: plan.retries for dag_id, plan in result.plans.items()} == {"risk_fraud": 2, "search_ranker": 2}


def test_a_default_team_does_not_own_the_root_defaults_file(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """default_team places specs in no team's folder; it must not make a root file that every team's specs lie
    under the default team's (its approval on a one-minute timeout reached every spec of that team)."""
    _specs(write_spec)
    (configs / "_defaults.yaml").write_text(HIJACK)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("default_team: null", "default_team: search"))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())
    assert not result.plans
    assert all(error.problems[0].message.startswith("this _defaults.yaml is in no team's folders")
               for error in result.errors.values())
