"""Two ways a spec passed every rule and still took what the platform did not give it (red-team, twelfth
session): a tag that only looks like another team's, and an asset schedule on the pipeline's own asset,
which starts each run from the one before, without end and beyond limits.min_schedule_interval; and the
same loop through several specs (each on another's asset)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.policy.conftest import POLICY, compliant_spec
from trainpipe.compile.compiler import compile_directory
from trainpipe.compile.plan_cache import PlanCache
from trainpipe.settings import Settings

LOOKALIKES = [
    ("team\u200b:search", "contains the invisible or control character U+200B"),
    ("t\u0435am:search",
     "mixes Latin letters with look-alike letters of another script in 't\u0435am' (U+0435 CYRILLIC SMALL LETTER IE)"),
    ("team\uff1asearch", "uses full-width or styled characters; write it as 'team:search'"),
    ("TEAM:search", "not allowed by policy"),
]


@pytest.mark.parametrize(("tag", "why"), LOOKALIKES, ids=["zero-width", "cyrillic-e", "full-width", "upper-case"])
def test_a_tag_that_looks_like_another_team_s_is_refused_and_no_dag_carries_it(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tag: str, why: str) -> None:
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    write_spec(compliant_spec("risk_honest"), "risk/honest.yaml")
    spoof = compliant_spec("risk_spoof")
    spoof["tags"] = ["fraud", tag]
    write_spec(spoof, "risk/spoof.yaml")

    result = compile_directory(configs, settings=Settings.from_env())

    assert {plan.dag_id for plan in result.plans.values()} == {"risk_honest"}
    assert all(tag not in plan.tags for plan in result.plans.values())
    (error,) = result.errors.values()
    (problem,) = error.problems
    assert problem.field_path == "tags[1]" and why in problem.message, problem


def test_tags_in_one_script_each_stay_allowed(configs: Path, write_spec: Callable[..., Path]) -> None:
    spec = compliant_spec()
    spec["tags"] = ["不正検知", "Größe", "fraud-v2", "équipe risque"]
    write_spec(spec)
    (plan,) = compile_directory(configs, settings=Settings.from_env()).plans.values()
    assert {"不正検知", "Größe", "fraud-v2", "équipe risque"} <= set(plan.tags)


@pytest.mark.parametrize("policy", [False, True], ids=["no-policy", "policy"])
@pytest.mark.parametrize("uri", ["trainpipe://risk_loop/snapshot", "TRAINPIPE://risk_loop/model/", "trainpipe://risk_loop/snapshot#again"])
def test_a_schedule_on_the_pipeline_s_own_asset_is_refused_at_the_item(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, uri: str, policy: bool) -> None:
    if policy:
        monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    upstream = compliant_spec("risk_upstream")
    write_spec(upstream, "risk/upstream.yaml")
    loop = compliant_spec("risk_loop")
    loop["schedule"] = {"assets": ["trainpipe://risk_upstream/model", uri], "mode": "any"}
    write_spec(loop, "risk/loop.yaml")

    result = compile_directory(configs, settings=Settings.from_env())

    assert {plan.dag_id for plan in result.plans.values()} == {"risk_upstream"}
    (error,) = result.errors.values()
    (problem,) = error.problems
    assert problem.field_path == "schedule.assets[1]"
    assert "is this pipeline's own" in problem.message and "without end" in problem.message
    # Another pipeline's asset is a schedule of its own.
    loop["schedule"] = {"assets": ["trainpipe://risk_upstream/model"]}
    write_spec(loop, "risk/loop.yaml")
    assert {p.dag_id for p in compile_directory(configs,
                                                settings=Settings.from_env()).plans.values()} == {"risk_upstream", "risk_loop"}


@pytest.mark.parametrize("policy", [False, True], ids=["no-policy", "policy"])
def test_pipelines_that_start_each_other_are_all_refused_and_recover_when_the_loop_is_broken(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, policy: bool) -> None:
    """A on B's model and B on A's snapshot (any mode, beside an outside asset): any one run starts the other
    without end. Both are refused at the item that closes the loop, whichever file comes first; a pipeline
    that only follows the loop (C) keeps its DAG; cached plans are judged the same."""
    if policy:
        monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    a = compliant_spec("risk_a")
    a["schedule"] = {"assets": ["s3://landing/transactions", "trainpipe://risk_b/model"], "mode": "any"}
    b = compliant_spec("risk_b")
    b["schedule"] = {"assets": ["TRAINPIPE://risk_a/snapshot/"]}
    c = compliant_spec("risk_c")
    c["schedule"] = {"assets": ["trainpipe://risk_a/model"]}
    lines = {name: _line_of(write_spec(spec, f"risk/{name}"), uri) for name, spec, uri in [
        ("a.yaml", a, "trainpipe://risk_b/model"), ("b.yaml", b, "TRAINPIPE://risk_a/snapshot/")]}
    write_spec(c, "risk/c.yaml")
    for _ in range(2):  # compiled, then every plan from the cache (a later parse)
        cache = PlanCache(configs.resolve(), "all", home=tmp_path / "home").load()
        result = compile_directory(configs, relative_to=configs.parent, cache=cache, settings=Settings.from_env())
        assert set(result.plans) == {"risk_c"}
        located = {name: [(p.field_path, p.line) for p in error.problems] for name, error in result.errors.items()}
        assert located == {"dag_configs/risk/a.yaml": [("schedule.assets[1]", lines["a.yaml"])],
                           "dag_configs/risk/b.yaml": [("schedule.assets[0]", lines["b.yaml"])]}, located
        message = result.errors["dag_configs/risk/a.yaml"].problems[0].message
        assert "start each other without end: risk_a (dag_configs/risk/a.yaml), risk_b (dag_configs/risk/b.yaml)" in message
        cache.save()
    assert result.cached == {"dag_configs/risk/a.yaml", "dag_configs/risk/b.yaml", "dag_configs/risk/c.yaml"}

    b["schedule"] = "@daily"
    write_spec(b, "risk/b.yaml")
    assert set(compile_directory(configs, relative_to=configs.parent, cache=cache,
                                 settings=Settings.from_env()).plans) == {"risk_a", "risk_b", "risk_c"}


def test_an_all_schedule_that_also_waits_for_an_outside_asset_is_no_loop(
        configs: Path, write_spec: Callable[..., Path]) -> None:
    a = compliant_spec("risk_a")
    a["schedule"] = {"assets": ["s3://landing/transactions", "trainpipe://risk_b/model"], "mode": "all"}
    b = compliant_spec("risk_b")
    b["schedule"] = {"assets": ["trainpipe://risk_a/model"]}
    write_spec(a, "risk/a.yaml")
    write_spec(b, "risk/b.yaml")
    result = compile_directory(configs, settings=Settings.from_env())
    assert set(result.plans) == {"risk_a", "risk_b"} and not result.errors


def _line_of(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_team_without_prefixes_cannot_write_in_another_team_s(
        configs: Path, write_spec: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A team the policy gives no prefix (a sandbox) took risk's pipeline id, which refused both files as
    duplicates (risk's DAG was gone), and risk's model name, which register claims and promote moves."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("teams:\n", "teams:\n  sandbox:\n    folders: [\"sandbox/**\"]\n", 1))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    write_spec(compliant_spec("risk_fraud"), "risk/fraud.yaml")
    write_spec(compliant_spec("risk_fraud", model_name="sandbox_fraud"), "sandbox/same_id.yaml")
    write_spec(compliant_spec("sandbox_fraud", model_name="risk_fraud"), "sandbox/same_model.yaml")
    write_spec(compliant_spec("sandbox_own"), "sandbox/own.yaml")

    result = compile_directory(configs, relative_to=configs.parent, settings=Settings.from_env())

    assert set(result.plans) == {"risk_fraud", "sandbox_own"}
    assert result.plans["risk_fraud"].spec_file == "dag_configs/risk/fraud.yaml"
    refused = {name: [(p.field_path, p.message) for p in error.problems] for name, error in result.errors.items()}
    assert refused == {
        "dag_configs/sandbox/same_id.yaml": [("pipeline_id", "not allowed by policy (team sandbox, rule pipeline_id_prefix): "
                                              "'risk_fraud'; allowed: ids not starting with 'risk_' (team risk's prefix)")],
        "dag_configs/sandbox/same_model.yaml": [("registration.model_name", "not allowed by policy (team sandbox, rule "
                                                 "model_name_prefix): 'risk_fraud'; allowed: names not starting with "
                                                 "'risk_' (team risk's prefix)")]}
