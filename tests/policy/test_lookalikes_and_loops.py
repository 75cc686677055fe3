"""Two ways a spec passed every rule and still took what the platform did not give it (red-team, twelfth
session): a tag that only looks like another team's, and an asset schedule on the pipeline's own asset,
which starts each run from the one before, without end and beyond limits.min_schedule_interval."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.policy.conftest import POLICY, compliant_spec
from trainpipe.compile.compiler import compile_directory

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

    result = compile_directory(configs)

    assert {plan.dag_id for plan in result.plans.values()} == {"risk_honest"}
    assert all(tag not in plan.tags for plan in result.plans.values())
    (error,) = result.errors.values()
    (problem,) = error.problems
    assert problem.field_path == "tags[1]" and why in problem.message, problem


def test_tags_in_one_script_each_stay_allowed(configs: Path, write_spec: Callable[..., Path]) -> None:
    spec = compliant_spec()
    spec["tags"] = ["不正検知", "Größe", "fraud-v2", "équipe risque"]
    write_spec(spec)
    (plan,) = compile_directory(configs).plans.values()
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

    result = compile_directory(configs)

    assert {plan.dag_id for plan in result.plans.values()} == {"risk_upstream"}
    (error,) = result.errors.values()
    (problem,) = error.problems
    assert problem.field_path == "schedule.assets[1]"
    assert "is this pipeline's own" in problem.message and "without end" in problem.message
    # Another pipeline's asset is a schedule of its own.
    loop["schedule"] = {"assets": ["trainpipe://risk_upstream/model"]}
    write_spec(loop, "risk/loop.yaml")
    assert {p.dag_id for p in compile_directory(configs).plans.values()} == {"risk_upstream", "risk_loop"}
