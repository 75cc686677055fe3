"""One case per policy rule: a spec that compiles without the policy is, under it, a located error
naming the field, the team and the rule. Effective values (defaults, _defaults.yaml) count."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_file

from .conftest import POLICY, compliant_spec


def _set(spec: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value


_DELETE = object()
K8S = "training.kubernetes"

# (rule, changes to the compliant spec, field path of the error, the refused value as shown). The
# Slack rules (notify.slack_channels, a Slack conn_id) need the Slack provider, not installed here.
CASES = [
    ("kubernetes.images", {f"{K8S}.image": "docker.io/attacker/miner:latest"}, f"{K8S}.image", "docker.io/attacker"),
    # Another path under the allowed prefix is another image ("../" is no reference at all: refused by the spec).
    ("kubernetes.images", {f"{K8S}.image": "ghcr.io/trainpipe/trainer/evil:1"}, f"{K8S}.image", "evil"),
    ("kubernetes.namespaces", {f"{K8S}.namespace": "kube-system"}, f"{K8S}.namespace", "kube-system"),
    ("kubernetes.kubernetes_conn_ids", {f"{K8S}.kubernetes_conn_id": "prod_cluster"}, f"{K8S}.kubernetes_conn_id",
     "prod_cluster"),
    ("kubernetes.service_accounts", {f"{K8S}.service_account": "cluster-admin"}, f"{K8S}.service_account",
     "cluster-admin"),
    # Not written: the pod gets the namespace's `default` account, judged like a written one.
    ("kubernetes.service_accounts", {f"{K8S}.service_account": _DELETE}, f"{K8S}.service_account", "'default'"),
    ("kubernetes.secrets", {f"{K8S}.secret_env": {"TOKEN_X": "search-credentials/token"}}, f"{K8S}.secret_env.TOKEN_X",
     "search-credentials"),
    ("kubernetes.secrets", {f"{K8S}.env_from_secrets": ["search-bucket"]}, f"{K8S}.env_from_secrets[0]", "search-bucket"),
    ("kubernetes.secrets", {f"{K8S}.image_pull_secrets": ["other-pull"]}, f"{K8S}.image_pull_secrets[0]", "other-pull"),
    ("kubernetes.priority_classes", {f"{K8S}.priority_class": "system-cluster-critical"}, f"{K8S}.priority_class",
     "system-cluster-critical"),
    ("kubernetes.max_gpus_per_pod", {f"{K8S}.resources.gpus": 2, "training.distributed.nproc_per_node": 2},
     f"{K8S}.resources.gpus", "2"),
    ("kubernetes.max_nodes", {"training.distributed.nnodes": 16}, "training.distributed.nnodes", "16"),
    # Growth after an OOM kill is judged where it ends: on_oom.max_memory (the request itself too).
    ("kubernetes.max_memory_per_pod", {f"{K8S}.on_oom": {"memory_factor": 2, "max_memory": "512Gi"}},
     f"{K8S}.on_oom.max_memory", "512Gi"),
    ("kubernetes.max_memory_per_pod", {f"{K8S}.resources.memory": "300Gi"}, f"{K8S}.resources.memory", "300Gi"),
    # The on-demand placement a run falls back to after its preemptions is judged like the spec's own.
    ("kubernetes.node_labels", {f"{K8S}.capacity": {"spot": {"node_selector": {"karpenter.sh/capacity-type": "spot"}},
                                                    "on_demand": {"node_selector": {"pool": "reserved-h100"}}}},
     f"{K8S}.capacity.on_demand.node_selector.pool", "pool=reserved-h100"),
    ("kubernetes.tolerations", {f"{K8S}.capacity": {"spot": {}, "on_demand": {"tolerations": [
        {"key": "dedicated", "operator": "Exists"}]}}}, f"{K8S}.capacity.on_demand.tolerations[0]", "dedicated"),
    ("kubernetes.node_labels", {f"{K8S}.node_selector": {"hostname": "n1"}}, f"{K8S}.node_selector.hostname",
     "hostname=n1"),
    # Node affinity selects nodes as a node selector does: the same patterns judge it, preferences too.
    ("kubernetes.node_labels", {f"{K8S}.affinity": {"required": [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
     f"{K8S}.affinity.required[0]", "node-role.kubernetes.io/control-plane=*"),
    ("kubernetes.node_labels", {f"{K8S}.affinity": {"preferred": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-node-7"]}]}},
     f"{K8S}.affinity.preferred[0]", "kubernetes.io/hostname=gpu-node-7"),
    # Any value of an allowed key with only one value allowed: Exists asks for every value.
    ("kubernetes.node_labels", {f"{K8S}.affinity": {"required": [
        {"key": "nvidia.com/gpu.present", "operator": "Exists"}]}},
     f"{K8S}.affinity.required[0]", "nvidia.com/gpu.present=*"),
    ("kubernetes.label_keys", {f"{K8S}.labels": {"cost-center": "risk-1", "owner": "mallory"}}, f"{K8S}.labels.owner",
     "owner"),
    ("kubernetes.annotation_keys", {f"{K8S}.annotations": {"billing-owner": "search"}},
     f"{K8S}.annotations.billing-owner", "billing-owner"),
    ("kubernetes.max_cpu_per_pod", {f"{K8S}.resources.cpu": "100000"}, f"{K8S}.resources.cpu", "100000"),
    ("kubernetes.max_cpu_per_pod", {f"{K8S}.resources.limits": {"cpu": "32500m"}}, f"{K8S}.resources.limits.cpu",
     "32500m"),
    # /dev/shm is memory-backed: a huge one is a huge pod.
    ("kubernetes.max_memory_per_pod", {f"{K8S}.shm_size": "100Ti"}, f"{K8S}.shm_size", "100Ti"),
    # Another accelerator than the team's (a whole 80 GB MIG slice, another vendor's cards).
    ("kubernetes.gpu_resources", {f"{K8S}.resources.gpu_resource": "nvidia.com/mig-7g.80gb"},
     f"{K8S}.resources.gpu_resource", "nvidia.com/mig-7g.80gb"),
    ("limits.max_retries", {f"{K8S}.max_pod_restarts": 1000000}, f"{K8S}.max_pod_restarts", "1000000"),
    # An elastic Job adds them to torchrun's --max_restarts, which restarts a crashing trainer that often.
    ("limits.max_retries", {"training.preemption": {"max_restarts": 50}}, "training.preemption.max_restarts", "50"),
    ("limits.max_nproc_per_node", {"training.distributed.nproc_per_node": 8, f"{K8S}.resources.gpus": 0},
     "training.distributed.nproc_per_node", "8"),
    ("data.uris", {"data.uri": "s3://search-data/clicks/", "data.conn_id": "aws_risk"}, "data.uri", "search-data"),
    ("data.uris", {"data.uri": "snapshots/search_ranker/abc/train.parquet"}, "data.uri", "snapshots/search_ranker"),
    ("data.uris", {"data.uri": "file:///etc/airflow/airflow.cfg"}, "data.uri", "airflow.cfg"),
    ("data.uris", {"data.uri": "s3://risk-data/../search-data/x", "data.conn_id": "aws_risk"}, "data.uri", "search-data"),
    ("data.conn_ids", {"data.uri": "s3://risk-data/tx/", "data.conn_id": "aws_default"}, "data.conn_id", "aws_default"),
    ("data.conn_ids", {"data.uri": "s3://risk-data/tx/"}, "data.conn_id", "worker's own credentials"),
    ("notify.conn_ids", {"notify": {"email": {"to": ["ml@example.com"], "conn_id": "smtp_ceo"}}},
     "notify.email.conn_id", "smtp_ceo"),
    ("notify.email_domains", {"notify": {"email": {"to": ["ml@example.com", "x@attacker.net"]}}},
     "notify.email.to[1]", "attacker.net"),
    ("notify.email_domains", {"notify": {"email": {"to": ["ml@example.com"], "from_email": "ceo@corp.org"}}},
     "notify.email.from_email", "ceo@corp.org"),
    # At an allowed domain, but not a sender the platform gave the team: the mail would sign as security.
    ("notify.from_addresses", {"notify": {"email": {"to": ["ml@example.com"], "from_email": "Security@example.com"}}},
     "notify.email.from_email", "Security@example.com"),
    ("limits.min_schedule_interval", {"schedule": "* * * * *"}, "schedule", "* * * * *"),
    ("limits.min_schedule_interval", {"schedule": "0,30 3 * * *"}, "schedule", "0,30 3"),
    ("limits.min_schedule_interval", {"schedule": "*/20 * * * 1"}, "schedule", "20m after"),
    ("limits.max_epochs", {"training.epochs": 1000}, "training.epochs", "1000"),
    ("limits.max_epochs", {"params": {"epochs": {"description": "epochs of this run"}}}, "params.epochs", "no maximum"),
    ("limits.max_retries", {"retries": 1000000}, "retries", "1000000"),
    ("limits.max_priority", {"priority": "high"}, "priority", "'high'"),
    ("limits.max_cache_age", {"training.cache": {"max_age": "2w"}}, "training.cache.max_age", "'14d'"),
    ("limits.max_deadline_within", {"notify": {"email": {"to": ["ml@example.com"]}, "deadline": {"within": "1d"}}},
     "notify.deadline.within", "'1d'"),
    # Not written: the PriorityClass a spec's priority maps to is judged like a written one.
    ("kubernetes.priority_classes", {"priority": "low"}, "priority", "trainpipe-low"),
    ("kubernetes.queues", {f"{K8S}.queue": "search-gpu"}, f"{K8S}.queue", "search-gpu"),
    ("pipeline_id_prefix", {"pipeline_id": "search_ranker_gpu"}, "pipeline_id", "search_ranker_gpu"),
    ("model_name_prefix", {"registration.model_name": "search_ranker"}, "registration.model_name", "search_ranker"),
    ("team tag", {"tags": ["fraud", "team:search"]}, "tags[1]", "team:search"),
    ("team tag", {"tags": ["fraud", " Team:search"]}, "tags[1]", "Team:search"),
    # A family is code the trainer runs: only those the platform named for the team.
    ("models.families", {"training.model": {"type": "search_ranknet", "params": {"depth": 2}}}, "training.model.type",
     "'search_ranknet'"),
]
TUNING = {"n_trials": 4, "max_parallel": 2, "trial_epochs": 1, "space": {"learning_rate": {"log_uniform": [0.0001, 0.1]}}}
LOCAL = {"training.launcher": "local", "training.kubernetes": _DELETE, "training.distributed.nnodes": 1}
CASES += [
    ("limits.max_trials", {**LOCAL, "tuning": {**TUNING, "n_trials": 500}}, "tuning.n_trials", "500"),
    ("limits.max_parallel_trials", {**LOCAL, "tuning": {**TUNING, "max_parallel": 64}}, "tuning.max_parallel", "64"),
    ("limits.max_epochs", {**LOCAL, "tuning": {**TUNING, "trial_epochs": 999}}, "tuning.trial_epochs", "999"),
]


@pytest.mark.parametrize(("rule", "changes", "field", "shown"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_refuses_at_the_field_with_the_team_and_the_rule(write_spec: Callable[..., Path], monkeypatch,
                                                                   rule, changes, field, shown):
    spec = compliant_spec()
    for dotted, value in changes.items():
        _set(spec, dotted, value)
    path = write_spec(spec)
    try:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())  # valid without a policy ...
    except SpecError as err:  # ... but for a worker's own file, which no platform allowed
        assert [p.message.split(";")[0] for p in err.problems] == [
            f"{spec['data']['uri']!r} is a local path outside the storage root"], err

    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    with pytest.raises(SpecError, match=re.escape(f"not allowed by policy (team risk, rule {rule})")) as caught:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())
    ours = [p for p in caught.value.problems if p.field_path == field and f"rule {rule})" in p.message]
    assert len(ours) == 1, caught.value
    problem = ours[0]
    assert shown in problem.message and "allowed:" in problem.message
    # Located at the key, or at its nearest written section when the value is a default.
    loaded = load_yaml_file(path, "risk/spec.yaml")
    parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]\.?", field) if p)
    assert (problem.file, problem.line, problem.column) == loaded.location_of(parts)
    assert str(problem).startswith(f"risk/spec.yaml:{problem.line}:{problem.column}: {field}: not allowed by policy")


def test_the_compliant_spec_passes_and_the_dag_carries_its_team(write_spec, monkeypatch):
    path = write_spec(compliant_spec())
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    plan = compile_file(path, "risk/spec.yaml", settings=Settings.from_env())
    assert plan.owner == "risk" and "team:risk" in plan.tags
    assert plan.team is not None and plan.team.pool == "risk_gpu"
    assert plan.registration.owner_team == "risk"
    assert plan.data.allowed_uris == ("s3://risk-data/**", "demo/**")


def test_a_sender_the_platform_gave_the_team_is_the_mail_s_sender(write_spec, monkeypatch):
    """notify.from_addresses: a matching from_email (any case) compiles into the notifier's sender."""
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    for sender in ("ml-bot@example.com", "Risk-Alerts@Example.com"):
        spec = compliant_spec()
        spec["notify"] = {"email": {"to": ["ml@example.com"], "from_email": sender}}
        (email,) = compile_file(write_spec(spec), "risk/spec.yaml", settings=Settings.from_env()).notify.channels
        assert (email.kind, email.from_email) == ("email", sender)


def test_an_hourly_cron_and_preset_meet_a_one_hour_minimum(write_spec, monkeypatch):
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    # 0 23,0: the day's last run and the next day's first are exactly the minimum apart.
    for schedule in ("@hourly", "15 * * * *", "0 */2 * * 1-5", "0 23,0 * * *", "none"):
        spec = compliant_spec()
        spec["schedule"] = schedule
        assert compile_file(write_spec(spec), "risk/spec.yaml", settings=Settings.from_env()).dag_id == "risk_fraud"


def test_a_value_from_defaults_is_judged_and_located_in_the_defaults_file(configs, write_spec, monkeypatch):
    (configs / "risk" / "_defaults.yaml").write_text("training:\n  kubernetes:\n    namespace: kube-system\n")
    spec = compliant_spec()
    del spec["training"]["kubernetes"]["namespace"]
    path = write_spec(spec)
    assert compile_file(path, "risk/spec.yaml",
                        settings=Settings.from_env()).kubernetes.namespace == "kube-system"  # no policy: the defaults apply

    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    with pytest.raises(SpecError) as caught:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())
    assert str(caught.value).endswith("dag_configs/risk/_defaults.yaml:3:5: training.kubernetes.namespace: not allowed by "
                                      "policy (team risk, rule kubernetes.namespaces): 'kube-system'; allowed: 'ml-training'")


def test_a_default_connection_is_judged_like_a_written_one(configs, write_spec, monkeypatch, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("kubernetes_conn_ids: [kubernetes_default]",
                                                 "kubernetes_conn_ids: [risk_cluster]"))
    path = write_spec(compliant_spec())
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    with pytest.raises(SpecError, match=r"risk/spec.yaml:\d+:\d+: training.kubernetes.kubernetes_conn_id: not allowed "
                                        r"by policy \(team risk, rule kubernetes.kubernetes_conn_ids\): "
                                        r"'kubernetes_default' \(not written in the spec: its default\)"):
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())


def test_a_spec_in_no_teams_folder_is_refused_without_a_default_team(write_spec, monkeypatch, tmp_path):
    path = write_spec(compliant_spec(), "elsewhere/spec.yaml")
    compile_file(path, "elsewhere/spec.yaml", settings=Settings.from_env())
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    with pytest.raises(SpecError, match="refused by policy: 'elsewhere/spec.yaml' matches no team's folders"):
        compile_file(path, "elsewhere/spec.yaml", settings=Settings.from_env())
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("default_team: null", "default_team: risk"))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    assert compile_file(path, "elsewhere/spec.yaml", settings=Settings.from_env()).team.name == "risk"


@pytest.mark.parametrize(("fault", "value"), [("inject_nan_at_step", 3), ("crash_first_try_after_step", 2),
                                              # A delay after every step holds the GPUs idle while it seems to train.
                                              ("step_delay_seconds", 10.0)])
def test_fault_injection_needs_the_platforms_consent(write_spec, monkeypatch, tmp_path, fault, value):
    spec = compliant_spec()
    spec["training"]["testing"] = {fault: value}
    path = write_spec(spec)
    with pytest.raises(SpecError, match=r"risk/spec.yaml:\d+:\d+: training.testing: fault injection is for "
                                        r"trainpipe's own tests and is off on this platform"):
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())
    monkeypatch.setenv("TRAINPIPE_ALLOW_FAULT_INJECTION", "1")
    assert getattr(compile_file(path, "risk/spec.yaml", settings=Settings.from_env()).testing, fault) == value
    # Under a policy, only the team's `testing: true` allows it (the switch does not).
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    with pytest.raises(SpecError, match=r"training.testing: not allowed by policy \(team risk, rule testing\)"):
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text().replace("    pipeline_id_prefix: risk_\n",
                                                 "    pipeline_id_prefix: risk_\n    testing: true\n", 1))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    assert getattr(compile_file(path, "risk/spec.yaml", settings=Settings.from_env()).testing, fault) == value


@pytest.mark.parametrize(("slack", "field", "rule"), [
    ({"channel": "#general", "conn_id": "slack_risk"}, "notify.slack.channel", "notify.slack_channels"),
    # Not written: slack_api_default, the default connection, is not one of the team's.
    ({"channel": "#risk-ml"}, "notify.slack.conn_id", "notify.conn_ids"),
])
def test_slack_rules_on_the_validated_spec(write_spec, slack, field, rule):
    """The Slack provider is not installed here, so validation refuses any notify.slack: the rules are
    judged on the spec models directly, as the compiler does after validation."""
    from trainpipe.policy.check import check_spec
    from trainpipe.policy.model import load_policy
    from trainpipe.spec.sections.pipeline import PipelineSpec

    spec = compliant_spec()
    spec["notify"] = {"slack": slack}
    path = write_spec(spec)
    loaded = load_yaml_file(path, "risk/spec.yaml")
    problems = check_spec(PipelineSpec.model_validate(loaded.data), loaded, policy=load_policy(POLICY), team="risk",
                          storage_root="file:///srv/storage")
    assert [(p.field_path, f"rule {rule})" in p.message) for p in problems] == [(field, True)]
    assert (problems[0].line, problems[0].column) == loaded.location_of(tuple(field.split(".")))[1:]


def test_an_unwritten_cache_age_is_lowered_to_the_team_s_cap(write_spec: Callable[..., Path], monkeypatch):
    """Issue 33: the default 30d is above the team's limits.max_cache_age (7d): the plan keeps versions for 7d
    only, and the spec (which wrote nothing) still compiles."""
    from datetime import timedelta

    path = write_spec(compliant_spec())
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    assert compile_file(path, "risk/spec.yaml", settings=Settings.from_env()).cache.max_age == timedelta(days=7)


def _family_problems(write_spec, monkeypatch, family: str | None, name: str = "risk/spec.yaml") -> list[str]:
    spec = compliant_spec("search_fraud" if name.startswith("search/") else "risk_fraud")
    if family is not None:
        spec["training"]["model"] = {"type": family}
    path = write_spec(spec, name)
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    try:
        compile_file(path, name, settings=Settings.from_env())
    except SpecError as err:
        return [f"{p.field_path}: {p.message}" for p in err.problems if "models.families" in p.message]
    return []


def test_a_family_the_platform_named_for_the_team_compiles(write_spec, monkeypatch):
    assert _family_problems(write_spec, monkeypatch, "risk_tabnet") == []
    assert _family_problems(write_spec, monkeypatch, "mlp") == []


def test_a_team_without_a_models_rule_gets_the_built_in_families_only(write_spec, monkeypatch):
    [problem] = _family_problems(write_spec, monkeypatch, "risk_tabnet", "search/spec.yaml")

    assert problem == (
        "training.model.type: not allowed by policy (team search, rule models.families): 'risk_tabnet'; allowed: "
        "'mlp', 'text_bag', 'transformer' (the built-in families; the platform allows others in the team's "
        "models.families)")


def test_a_built_in_family_the_team_s_list_leaves_out_is_refused_at_its_line(write_spec, monkeypatch):
    """text_bag is built in, but the risk team's models.families names mlp and risk_tabnet only."""
    spec = compliant_spec()
    spec["training"]["model"] = {"type": "text_bag"}
    path = write_spec(spec)
    monkeypatch.setenv("TRAINPIPE_POLICY", str(POLICY))
    with pytest.raises(SpecError) as raised:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())

    [problem] = [p for p in raised.value.problems if "models.families" in p.message]
    assert problem.field_path == "training.model.type"
    assert "'text_bag'" in problem.message and "allowed: 'mlp', 'risk_tabnet'" in problem.message
    loaded = load_yaml_file(path, "risk/spec.yaml")
    assert (problem.line, problem.column) == loaded.location_of(("training", "model", "type"))[1:]


def test_an_empty_families_list_refuses_even_the_default_mlp(tmp_path, write_spec, monkeypatch):
    text = POLICY.read_text().replace("families: [mlp, risk_tabnet]", "families: []")
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    spec = compliant_spec()
    del spec["training"]["model"]["type"]
    path = write_spec(spec)
    monkeypatch.setenv("TRAINPIPE_POLICY", str(policy))
    with pytest.raises(SpecError) as raised:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())

    [problem] = [p for p in raised.value.problems if "models.families" in p.message]
    assert problem.field_path == "training.model.type"
    assert problem.message == ("not allowed by policy (team risk, rule models.families): 'mlp' (not written in the "
                               "spec: its default); allowed: nothing (an empty list)")
