"""trainpipe.steps.register.model_registry against a real MLflow store (SQLite): register gives `challenger` once per DAG
run, promote moves `champion` and keeps the old one as `previous_champion` with who/when/why tags,
re-runs move nothing, reject tags without moving, rollback restores in one call, describe reads it back."""

from __future__ import annotations

import json

import pytest

from trainpipe.plan import tracking
from trainpipe.steps.register import model_registry as registry
from trainpipe.steps.register.model_registry import RegistryError

from .helpers import GATES, hook_register


def _aliases(hook, name: str) -> dict[str, int]:
    return {alias: int(v) for alias, v in hook.client.get_registered_model(name).aliases.items()}


def _versions(hook, name: str) -> list[int]:
    return sorted(int(v.version) for v in hook.client.search_model_versions(f"name = '{name}'"))


def test_register_creates_a_version_with_the_challenger_alias_only(hook, model_name, train_and_register):
    registered = train_and_register("manual__1")

    assert registered == {"model_name": model_name, "version": 1, "alias": "challenger",
                          "model_uri": f"models:/{model_name}/1", "metrics": {"auc": 0.91, "ndcg@10": 0.5},
                          "created": True}
    assert _aliases(hook, model_name) == {"challenger": 1}  # registering promotes nothing
    version = hook.client.get_model_version(model_name, "1")
    assert version.tags["holdout_auc"] == "0.910000" and version.tags["holdout_ndcg_at_10"] == "0.500000"
    assert version.tags["airflow_run_id"] == "manual__1" and tracking.STAGED_AT_TAG in version.tags
    assert "gates passed (2/2)" in version.description
    # MLflow's UI renders it as Markdown: the spec's description is escaped to show as written.
    assert hook.client.get_registered_model(model_name).description == "registry test model"


def test_register_rerun_of_the_same_dag_run_reuses_its_version(hook, model_name, registration, train_and_register):
    first = train_and_register("manual__1")
    version = hook.client.get_model_version(model_name, "1")

    again = hook_register(hook, registration, mlflow_run_id=version.run_id, dag_id="registry_dag", run="manual__1")

    assert again == {**first, "created": False}
    assert _versions(hook, model_name) == [1]
    assert hook.client.get_model_version(model_name, "1").tags[tracking.STAGED_AT_TAG] == version.tags[tracking.STAGED_AT_TAG]


def test_register_rerun_after_a_newer_version_does_not_take_the_challenger_back(hook, model_name, registration,
                                                                              train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")
    assert _aliases(hook, model_name) == {"challenger": 2}
    old_run = hook.client.get_model_version(model_name, "1").run_id

    again = hook_register(hook, registration, mlflow_run_id=old_run, dag_id="registry_dag", run="manual__1")

    assert again["version"] == 1 and again["created"] is False
    assert _versions(hook, model_name) == [1, 2]
    assert _aliases(hook, model_name) == {"challenger": 2}


def test_register_links_the_evaluation_report(hook, model_name, train_and_register):
    report = {"run_id": "abc123", "artifact_path": "evaluation/report.html",
              "artifact_uri": "file:///somewhere/abc123/artifacts/evaluation/report.html"}

    train_and_register("manual__1", report=report)

    version = hook.client.get_model_version(model_name, "1")
    # runs:/ names the report the same way on every machine (no path of the one that ran it).
    assert version.tags[tracking.EVALUATION_REPORT_TAG] == "runs:/abc123/evaluation/report.html"
    assert "Evaluation report: runs:/abc123/evaluation/report.html" in version.description


def test_promote_moves_champion_and_keeps_the_old_one_as_previous(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")

    first = registry.promote(hook.client, model_name, 1, actor="alice", reason="first model")
    second = registry.promote(hook.client, model_name, 2, actor="bob", reason="better auc",
                              details={"gates": [{"gate": "auc >= 0.8", "passed": True}]})

    assert first.moved and first.replaced_version is None
    assert second.moved and second.replaced_version == 1 and second.actor == "bob"
    assert _aliases(hook, model_name) == {"champion": 2, "previous_champion": 1, "challenger": 2}
    tags = hook.client.get_model_version(model_name, "2").tags
    assert tags[tracking.PROMOTED_BY_TAG] == "bob" and tags[tracking.PROMOTION_REASON_TAG] == "better auc"
    assert tags[tracking.PROMOTED_AT_TAG] == second.at and second.at.endswith("+00:00")
    assert tags[tracking.REPLACED_VERSION_TAG] == "1"
    assert json.loads(tags[tracking.PROMOTION_DETAILS_TAG]) == {"gates": [{"gate": "auc >= 0.8", "passed": True}]}
    assert _versions(hook, model_name) == [1, 2]  # nothing deleted


def test_promoting_the_champion_again_moves_nothing(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")
    registry.promote(hook.client, model_name, 1, actor="alice", reason="first")
    first = registry.promote(hook.client, model_name, 2, actor="bob", reason="second")

    again = registry.promote(hook.client, model_name, 2, actor="carol", reason="again")

    assert not again.moved and again.actor == "bob" and again.at == first.at
    assert _aliases(hook, model_name) == {"champion": 2, "previous_champion": 1, "challenger": 2}
    assert hook.client.get_model_version(model_name, "2").tags[tracking.PROMOTED_BY_TAG] == "bob"


def test_promote_completes_the_tags_of_an_interrupted_promotion(hook, model_name, train_and_register):
    train_and_register("manual__1")
    # As if a promotion died after moving the alias and before tagging the version.
    hook.client.set_registered_model_alias(model_name, "champion", "1")

    promotion = registry.promote(hook.client, model_name, 1, actor="airflow", reason="gates passed")

    assert not promotion.moved
    assert hook.client.get_model_version(model_name, "1").tags[tracking.PROMOTED_BY_TAG] == "airflow"


def test_promote_once_never_moves_an_alias_twice_for_a_version(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")
    registry.promote_once(hook.client, model_name, 1, actor="dag", reason="gates passed")
    registry.promote_once(hook.client, model_name, 2, actor="dag", reason="gates passed")
    registry.rollback(hook.client, model_name, actor="alice", reason="v2 misbehaves")
    assert _aliases(hook, model_name)["champion"] == 1

    # Re-running run 2's promote task after the rollback must not undo the person's decision.
    again = registry.promote_once(hook.client, model_name, 2, actor="dag", reason="gates passed")

    assert not again.moved
    assert _aliases(hook, model_name) == {"champion": 1, "previous_champion": 2, "challenger": 2}


def test_reject_tags_the_version_and_moves_no_alias(hook, model_name, train_and_register):
    train_and_register("manual__1")
    registry.promote(hook.client, model_name, 1, actor="dag", reason="gates passed")
    train_and_register("manual__2")

    registry.reject(hook.client, model_name, 2, actor="alice", reason="drift in region EU")
    promotion = registry.promote_once(hook.client, model_name, 2, actor="dag", reason="gates passed")

    tags = hook.client.get_model_version(model_name, "2").tags
    assert tags[tracking.REJECTED_TAG] == "true" and tags[tracking.REJECTED_BY_TAG] == "alice"
    assert tags[tracking.REJECTION_REASON_TAG] == "drift in region EU" and tracking.REJECTED_AT_TAG in tags
    assert not promotion.moved  # the DAG never promotes a rejected version
    assert _aliases(hook, model_name) == {"champion": 1, "challenger": 2}


def test_rollback_restores_the_previous_champion_in_one_call(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")
    registry.promote(hook.client, model_name, 1, actor="dag", reason="gates passed", details={"run": 1})
    registry.promote(hook.client, model_name, 2, actor="dag", reason="gates passed")

    rolled = registry.rollback(hook.client, model_name, actor="alice", reason="v2 misbehaves")

    assert rolled.moved and rolled.version == 1 and rolled.replaced_version == 2
    assert _aliases(hook, model_name) == {"champion": 1, "previous_champion": 2, "challenger": 2}
    restored = hook.client.get_model_version(model_name, "1").tags
    assert restored[tracking.PROMOTED_BY_TAG] == "alice"
    assert restored[tracking.PROMOTION_REASON_TAG] == "rollback: v2 misbehaves"
    # The first promotion's details are not left beside the rollback's reason.
    assert json.loads(restored[tracking.PROMOTION_DETAILS_TAG]) == {"rollback_of": 2}
    demoted = hook.client.get_model_version(model_name, "2").tags
    assert demoted[tracking.ROLLED_BACK_BY_TAG] == "alice" and demoted[tracking.ROLLBACK_REASON_TAG] == "v2 misbehaves"
    assert _versions(hook, model_name) == [1, 2]
    # The model's log keeps every move, the first promotion of version 1 included.
    assert [(p.version, p.by, p.reason) for p in registry.describe(hook.client, model_name).promotions] == [
        (1, "alice", "rollback: v2 misbehaves"), (2, "dag", "gates passed"), (1, "dag", "gates passed")]


def test_rollback_without_a_previous_champion_says_what_to_do(hook, model_name, train_and_register):
    train_and_register("manual__1")
    registry.promote(hook.client, model_name, 1, actor="dag", reason="gates passed")

    with pytest.raises(RegistryError, match=rf"{model_name} has no 'previous_champion' version to roll back to; "
                                            rf"promote a version with `trainpipe promote {model_name} VERSION`"):
        registry.rollback(hook.client, model_name, actor="alice", reason="oops")
    assert _aliases(hook, model_name) == {"champion": 1, "challenger": 1}


def test_unknown_model_and_version_are_named(hook, model_name, train_and_register):
    with pytest.raises(RegistryError, match=f"no registered model '{model_name}' in this tracking store"):
        registry.promote(hook.client, model_name, 1, actor="a", reason="r")
    train_and_register("manual__1")
    with pytest.raises(RegistryError, match=f"{model_name} has no version 7; its versions are 1"):
        registry.promote(hook.client, model_name, 7, actor="a", reason="r")


def test_describe_lists_every_alias_and_the_last_promotions(hook, model_name, train_and_register):
    for run in ("manual__1", "manual__2", "manual__3"):
        train_and_register(run)
    registry.promote(hook.client, model_name, 1, actor="dag", reason="first")
    registry.promote(hook.client, model_name, 2, actor="dag", reason="second")
    registry.reject(hook.client, model_name, 3, actor="alice", reason="no")

    summary = registry.describe(hook.client, model_name)

    assert summary.version_count == 3
    assert summary.aliases == {"challenger": 3, "champion": 2, "previous_champion": 1}
    assert [(v.version, v.aliases, v.rejected) for v in summary.aliased_versions] == [
        (3, ("challenger",), True), (2, ("champion",), False), (1, ("previous_champion",), False)]
    assert summary.aliased_versions[1].airflow_run_id == "manual__2"
    assert summary.aliased_versions[1].metrics == {"holdout_auc": "0.910000", "holdout_ndcg_at_10": "0.500000"}
    assert [(p.version, p.reason, p.replaced_version) for p in summary.promotions] == [(2, "second", 1), (1, "first", None)]
    assert summary.rejected_versions == (3,)


def test_gate_summary_is_one_line_with_every_gate():
    assert registry.gate_summary(GATES) == ("gates passed (2/2): auc >= 0.8: 0.9100; "
                                            "auc >= +0.1% vs champion: 0.9100 (+1.111% vs champion)")
    first_model = [{**GATES[1], "baseline": None, "compared": 0.0, "note": "no champion yet"}]
    assert registry.gate_summary(first_model) == "gates passed (1/1): auc >= +0.1% vs champion: 0.9100 (no champion yet)"
    failed = [{**GATES[0], "passed": False, "value": 0.7}]
    assert registry.gate_summary(failed) == "gates failed (0/1): auc >= 0.8: 0.7000 FAIL"
    assert registry.gate_summary([]) == "no gates configured"


def test_the_promotion_history_is_a_short_tag_and_takes_over_the_old_json_log(hook, model_name, train_and_register):
    train_and_register("manual__1")
    train_and_register("manual__2")
    # A model promoted before the compact history: its JSON log is carried over, then removed.
    old = [{"version": 1, "replaced_version": None, "alias": "champion", "at": "2026-01-01T00:00:00+00:00",
            "by": "carol", "reason": "first, by hand"}]
    hook.client.set_registered_model_tag(model_name, tracking.PROMOTION_LOG_TAG, json.dumps(old))
    long_reason = "gates passed (4/4): " + "; ".join(f"gate {i} >= 0.5: 0.9" for i in range(40))

    registry.promote(hook.client, model_name, 2, actor="airflow DAG x (run manual__2)", reason=long_reason)

    tags = hook.client.get_registered_model(model_name).tags
    assert tracking.PROMOTION_LOG_TAG not in tags
    lines = tags[tracking.PROMOTION_HISTORY_TAG].splitlines()
    assert len(lines) == 2 and all(len(line) < 250 for line in lines)
    assert lines[0] == "2026-01-01T00:00:00+00:00\t1\t-\tcarol\tfirst, by hand"
    assert [(p.version, p.by, p.replaced_version) for p in registry.describe(hook.client, model_name).promotions] == [
        (2, "airflow DAG x (run manual__2)", None), (1, "carol", None)]
    # The full reason stays on the version itself.
    assert hook.client.get_model_version(model_name, "2").tags[tracking.PROMOTION_REASON_TAG] == long_reason


def test_the_model_description_shows_the_spec_s_words_not_its_markdown(hook, model_name, registration):
    import dataclasses

    phishing = dataclasses.replace(registration, description="# Approved [re-approve](https://evil.example)")
    run_id = hook.run_for_dag_run(pipeline_id="registry_dag", dag_id="registry_dag", airflow_run_id="manual__md", tags={})
    hook.client.log_text(run_id, "artifact_path: model\n", "model/MLmodel")
    hook_register(hook, phishing, mlflow_run_id=run_id, dag_id="registry_dag", run="manual__md")
    assert hook.client.get_registered_model(model_name).description == (
        "\\# Approved \\[re\\-approve\\]\\(https\\:\\/\\/evil\\.example\\)")
