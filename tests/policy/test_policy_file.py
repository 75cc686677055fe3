"""The policy file itself: its JSON Schema is published and current, its errors are located, the
example policy of the stack admits every example spec, and its patterns mean what they read."""

from __future__ import annotations

import pytest

from trainpipe.commands.main import main
from trainpipe.policy import globs
from trainpipe.policy.model import POLICY_SCHEMA_PATH, PolicyError, load_policy_text, policy_json_schema_text

from .conftest import POLICY, REPO


def test_the_published_policy_schema_is_current_and_accepts_the_policies():
    import json

    import jsonschema
    import yaml

    assert POLICY_SCHEMA_PATH.read_text() == policy_json_schema_text(), (
        "provider/trainpipe/spec/policy_schema.json is stale: run "
        "`trainpipe policy schema > provider/trainpipe/spec/policy_schema.json`")
    validator = jsonschema.Draft202012Validator(json.loads(POLICY_SCHEMA_PATH.read_text()))
    for path in (POLICY, REPO / "deploy" / "policy.yaml"):
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("teams:\n  risk:\n    kubernetes:\n      imagez: [x]\n",
     "policy.yaml:4:7: teams.risk.kubernetes.imagez: unknown key; did you mean `images`?"),
    ("teams:\n  risk:\n    limits:\n      max_epochs: lots\n",
     "policy.yaml:4:7: teams.risk.limits.max_epochs: Input should be a valid integer, unable to parse string as an "
     "integer, got 'lots'"),
    ("default_team: ops\nteams:\n  risk: {}\n", "policy.yaml:1:1: default_team 'ops' is not a team"),
    ("teams:\n  a: {pipeline_id_prefix: risk_}\n  b: {pipeline_id_prefix: risk_credit_}\n",
     "pipeline_id_prefix 'risk_credit_' of team b starts with 'risk_' of team a"),
    ("teams:\n  a:\n    airflow: {access_control: {ops: [can_dance]}}\n",
     "policy.yaml:3:15: teams.a.airflow.access_control: role 'ops': unknown permission(s) 'can_dance'"),
    ("costs: {gpu_hour: {nvidia.com/gpu: 2}}\nteams: {a: {}}\n",
     "policy.yaml:1:9: costs.gpu_hour: give a `default` price"),
    ("costs: {spot_discount: 1.5}\nteams: {a: {}}\n", "costs.spot_discount: Input should be less than or equal to 1"),
    ("teams:\n  a: {folders: ['../other/**']}\n", "teams.a.folders: '../other/**': folders are globs relative"),
    ("teams: [a, b\n", "policy.yaml:2:1: YAML syntax error"),
    ("teams:\n  a:\n    models: {families: [mlp, acme.models]}\n",
     "policy.yaml:3:14: teams.a.models.families: 'acme.models': a family is named as specs name it"),
    ("teams:\n  a:\n    models: {famlies: [mlp]}\n",
     "policy.yaml:3:14: teams.a.models.famlies: unknown key; did you mean `families`?"),
])
def test_policy_errors_are_located(text: str, expected: str):
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "policy.yaml")
    assert expected in str(caught.value)


def test_the_stack_policy_admits_every_example(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("TRAINPIPE_DAG_CONFIGS", raising=False)
    assert main(["policy", "check", "--policy", "deploy/policy.yaml", "dag_configs"]) == 0
    out = capsys.readouterr().out
    assert out.count("  allowed") == len(list((REPO / "dag_configs").glob("*.yaml")))
    assert "dag_configs/fraud_detector.yaml: team risk" in out and "dag_configs/search_ranker_gpu.yaml: team search" in out


def test_policy_check_prints_each_specs_team_and_every_violation(configs, write_spec, capsys):
    from .conftest import compliant_spec

    write_spec(compliant_spec())
    bad = compliant_spec("search_in_risk")
    bad["training"]["kubernetes"]["namespace"] = "kube-system"
    write_spec(bad, "risk/bad.yaml")
    assert main(["policy", "check", "--policy", str(POLICY), str(configs)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"{configs}/risk/bad.yaml: team risk" in lines
    violations = [line for line in lines if "not allowed by policy (team risk" in line]
    assert [v.split(": ")[1] for v in violations] == ["pipeline_id", "training.kubernetes.namespace",
                                                      "registration.model_name"]
    assert lines[-1] == "1 spec(s) allowed, 1 refused (policy policy.yaml)"


def test_validate_says_once_that_no_policy_is_in_force(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    assert main(["validate", "dag_configs/fraud_detector.yaml", "dag_configs/search_ranker_gpu.yaml"]) == 0
    assert capsys.readouterr().err.count("no platform policy in force") == 1


@pytest.mark.parametrize(("value", "pattern", "expected"), [
    ("ghcr.io/trainpipe/trainer:0.1.0", "ghcr.io/trainpipe/trainer:*", True),
    ("ghcr.io/trainpipe/trainer/evil:1", "ghcr.io/trainpipe/trainer*", False),  # * stays within one part
    ("ghcr.io/trainpipe/trainerx:1", "ghcr.io/trainpipe/trainer:*", False),
    ("risk/a/b.yaml", "risk/**", True),
    ("risk", "risk/**", True),
    ("riskier/a.yaml", "risk/**", False),
    ("a[1].yaml", "a[1].yaml", True),  # no character classes: literal
])
def test_glob_patterns(value: str, pattern: str, expected: bool):
    assert globs.matches(value, pattern) is expected


@pytest.mark.parametrize(("uri", "expected"), [
    ("demo/x.parquet", True),
    ("demo/../demo/x.parquet", True),
    ("demo/../snapshots/other/x.parquet", False),
    ("file:///srv/storage/demo/x.parquet", True),
    ("/srv/storage/demo/x.parquet", True),
    ("file:///srv/storage/demo/../secrets", False),
    ("s3://risk-data/a/b/", True),
    ("S3://risk-data/a", True),
    ("s3://risk-data/../other/a", False),
    ("s3://risk-data-other/a", False),
    ("s3://risk-data", True),
])
def test_uris_are_compared_after_resolving_against_the_storage_root(uri: str, expected: bool):
    assert globs.uri_allowed(uri, ["s3://risk-data/**", "demo/**"], "file:///srv/storage") is expected
