"""Pod label and annotation keys that cluster add-ons act on (secret injectors, meshes, batch schedulers,
Karpenter, ...) and GPU resources that are no accelerator: each is refused at its own key, with its line, and
the pod trainpipe builds never carries it. A team's own keys and the accelerators' names still pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.kubernetes.builders import TrainerLaunch
from trainpipe.operators.kubernetes_render import render_manifests
from trainpipe.settings import Settings
from trainpipe.spec.pod_keys import (
    ACCELERATOR_RESOURCES,
    RESERVED_KEY_DOMAINS,
    RESERVED_PLAIN_KEYS,
    is_accelerator_resource,
    metadata_key_problem,
)

LAUNCH = TrainerLaunch(config_uri="s3://bucket/trainpipe/runs/p/r/trainer_config.json",
                       mlflow_tracking_uri="http://mlflow.mlflow.svc:5000", dag_id="p",
                       airflow_run_id="scheduled__2026-06-30T00:00:00+00:00", try_number=1)
K8S = "training.kubernetes"

# (section, key, value, what the message says the key would hand over)
ATTACKS = [
    ("annotations", "vault.hashicorp.com/agent-inject", "true", "secret injector"),
    ("annotations", "vault.hashicorp.com/agent-image", "docker.io/attacker/agent:latest", "secret injector"),
    ("annotations", "vault.hashicorp.com/role", "search-trainer", "secret injector"),
    ("annotations", "consul.hashicorp.com/connect-inject", "true", "secret injector"),
    ("annotations", "dapr.io/app-id", "payments", "sidecar"),
    ("annotations", "instrumentation.opentelemetry.io/inject-python", "true", "sidecar"),
    ("labels", "admission.datadoghq.com/enabled", "true", "library"),
    ("annotations", "kuma.io/sidecar-injection", "enabled", "sidecar"),
    ("annotations", "karpenter.sh/do-not-disrupt", "true", "do-not-disrupt"),
    ("annotations", "scheduling.volcano.sh/queue-name", "platform", "batch scheduler"),
    ("labels", "yunikorn.apache.org/queue", "root.search", "batch scheduler"),
    ("labels", "runai/queue", "platform", "batch scheduler"),
    ("labels", "kai.scheduler/queue", "platform", "batch scheduler"),
    ("annotations", "openshift.io/required-scc", "privileged", "admission policy"),
    ("labels", "training.kubeflow.org/job-name", "another-job", "training operator"),
    ("labels", "queue", "root.search", "YuniKorn"),
    ("labels", "applicationId", "another-app", "YuniKorn"),
    ("labels", "spark-app-selector", "another-app", "YuniKorn"),
    ("labels", "Queue", "root.search", "YuniKorn"),
    ("labels", "project", "another-team", "Run:ai"),
    ("annotations", "gpu-fraction", "0.5", "Run:ai"),
]
TEAM_LABELS = {"team": "search", "cost-center": "search-ml", "example.com/owner": "ranking"}
TEAM_ANNOTATIONS = {"team": "search", "example.com/queue": "root.search", "example.com/runbook": "https://x/y"}


def _spec(**kubernetes: object) -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "search_ranker_gpu.yaml").read_text())
    spec["training"]["kubernetes"].update(kubernetes)
    return spec


def _write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _line_of(path: Path, section: str, key: str) -> int:
    """The 1-based line of ``key`` inside training.kubernetes.<section> of the written spec."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"{section}:" and line.startswith("    "))
    return next(i for i, line in enumerate(lines[start + 1:], start + 2) if line.strip().startswith(f"{key}:"))


def _pod(spec_path: Path) -> dict:
    (pod,) = [m for m in render_manifests(compile_file(spec_path, settings=Settings.from_env()), launch=LAUNCH,
                                          settings=Settings.from_env()) if m["kind"] == "Pod"]
    return pod


@pytest.mark.parametrize(("section", "key", "value", "hands_over"), ATTACKS, ids=[f"{s}:{k}" for s, k, _, _ in ATTACKS])
def test_an_add_on_key_is_refused_at_the_key_with_why_and_the_fix(
    tmp_path: Path, section: str, key: str, value: str, hands_over: str
) -> None:
    path = _write(tmp_path, _spec(**{section: {"cost-center": "search-ml", key: value}}))
    with pytest.raises(SpecError) as caught:
        compile_file(path, settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.field_path == f"{K8S}.{section}.{key}"
    assert problem.line == _line_of(path, section, key)
    assert "which the cluster's own controllers read" in problem.message
    assert hands_over in problem.message
    assert "remove it: " in problem.message


def test_the_whole_repro_is_refused_key_by_key_and_the_pod_carries_none_of_it(tmp_path: Path) -> None:
    labels = {**TEAM_LABELS, **{k: v for s, k, v, _ in ATTACKS if s == "labels"}}
    annotations = {**TEAM_ANNOTATIONS, **{k: v for s, k, v, _ in ATTACKS if s == "annotations"}}
    path = _write(tmp_path, _spec(labels=labels, annotations=annotations))
    with pytest.raises(SpecError) as caught:
        compile_file(path, settings=Settings.from_env())
    refused = {(p.field_path, p.line) for p in caught.value.problems}
    assert refused == {(f"{K8S}.{s}.{k}", _line_of(path, s, k)) for s, k, _, _ in ATTACKS}
    # No plan exists for the spec. Without the refused keys it renders a pod with the team's keys and none
    # of the attack's, whichever section it was written in.
    pod = _pod(_write(tmp_path, _spec(labels=TEAM_LABELS, annotations=TEAM_ANNOTATIONS)))
    metadata = pod["metadata"]
    for section in ("labels", "annotations"):
        carried = metadata.get(section) or {}
        for _, key, value, _ in ATTACKS:
            assert carried.get(key) != value, (section, key)
        for key in carried:
            # Only trainpipe's own keys are in a reserved domain; no plain key a scheduler reads.
            assert key.lower() not in {k.lower() for k in RESERVED_PLAIN_KEYS}, key
    assert {k: metadata["labels"][k] for k in TEAM_LABELS} == TEAM_LABELS
    assert {k: metadata["annotations"][k] for k in TEAM_ANNOTATIONS} == TEAM_ANNOTATIONS
    assert not any(c.get("name", "").startswith("vault") for c in pod["spec"].get("initContainers") or [])


@pytest.mark.parametrize("key", ["team", "cost-center", "example.com/owner", "example.com/queue", "queue-team",
                                 "app", "hashicorp.com.example.com/x", "notvault.hashicorp.co/role"])
def test_a_teams_own_key_passes(key: str) -> None:
    assert metadata_key_problem(key, what="label") is None


def test_every_reserved_domain_covers_its_subdomains_and_no_look_alike() -> None:
    for domain in RESERVED_KEY_DOMAINS:
        assert metadata_key_problem(f"{domain}/x", what="label") is not None, domain
        assert metadata_key_problem(f"sub.{domain}/x", what="annotation") is not None, domain
        assert metadata_key_problem(f"{domain}.example.com/x", what="label") is None, domain
        assert metadata_key_problem(f"x{domain}/x", what="label") is None, domain
    for key in RESERVED_PLAIN_KEYS:
        assert metadata_key_problem(key, what="label") is not None, key
        assert metadata_key_problem(key, what="annotation") is not None, key
        assert metadata_key_problem(f"example.com/{key}", what="label") is None, key


NOT_ACCELERATORS = [
    "devices.kubevirt.io/kvm",  # /dev/kvm of the host
    "devices.kubevirt.io/tun",
    "github.com/fuse",  # /dev/fuse through a generic device plugin
    "squat.ai/video",
    "nvidia.com/rdma_shared_device_a",  # a NIC, named by NVIDIA's network operator
    "nvidia.com/hostdev",
    "gpu.intel.com/i915_monitoring",  # every GPU of the node
    "gpu.intel.com/xe_monitoring",
    "amd.com/gpu-x",
    "nvidia.com/GPU",  # resource names are exact
    "example.com/gpu",
]


@pytest.mark.parametrize("name", NOT_ACCELERATORS)
def test_a_resource_that_is_no_accelerator_is_refused_at_the_field(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, _spec(resources={"gpus": 2, "gpu_resource": name, "cpu": "16", "memory": "64Gi"}))
    with pytest.raises(SpecError, match="is not an accelerator resource") as caught:
        compile_file(path, settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.field_path == f"{K8S}.resources.gpu_resource"
    lines = path.read_text().splitlines()
    assert lines[problem.line - 1].strip() == f"gpu_resource: {name}"
    # The message names the allowed forms and the fix.
    assert "nvidia.com/mig-*" in problem.message and "amd.com/gpu" in problem.message
    assert "use one of these" in problem.message


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb",
                                  "nvidia.com/gpu.shared", "amd.com/gpu", "gpu.intel.com/xe", "habana.ai/gaudi",
                                  "aws.amazon.com/neuroncore", "google.com/tpu", "huawei.com/Ascend910B"])
def test_an_accelerator_resource_takes_the_gpu_count(tmp_path: Path, name: str) -> None:
    pod = _pod(_write(tmp_path, _spec(resources={"gpus": 2, "gpu_resource": name, "cpu": "16", "memory": "64Gi"})))
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "base"] or pod["spec"]["containers"][:1]
    assert container["resources"]["limits"][name] == "2"
    assert container["resources"]["requests"][name] == "2"


def test_the_accelerator_list_is_names_not_domains() -> None:
    assert all("/" in name for name in ACCELERATOR_RESOURCES)
    assert not any(name.endswith("/*") for name in ACCELERATOR_RESOURCES)
    assert is_accelerator_resource("nvidia.com/mig-1g.10gb")
    assert not is_accelerator_resource("nvidia.com/mig-1g.10gb/x")


def test_docs_kubernetes_prints_the_lists_whole() -> None:
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    missing = [f"`{entry}`" for entry in (*RESERVED_KEY_DOMAINS, *RESERVED_PLAIN_KEYS, *ACCELERATOR_RESOURCES)
               if f"`{entry}`" not in guide]
    assert missing == []


@pytest.mark.parametrize(("change", "refused"), [
    ({"annotations": {"vault.hashicorp.com/agent-image": "docker.io/attacker/agent:latest"}}, "pod annotation"),
    ({"labels": {"queue": "root.search"}}, "pod label"),
    ({"resources": {"gpus": 1, "gpu_resource": "devices.kubevirt.io/kvm"}}, "the GPU resource"),
], ids=["annotation", "label", "gpu-resource"])
def test_a_plan_made_without_the_spec_stage_builds_no_pod_with_them(
        tmp_path: Path, change: dict, refused: str) -> None:
    """As for environment names: the pod builder judges the keys again, so a plan that skipped the spec stage
    (edited, or built by other code) cannot hand the pod a Vault role, a queue or a host device."""
    import dataclasses

    from trainpipe.errors import TrainpipeError

    plan = compile_file(_write(tmp_path, _spec(labels=TEAM_LABELS, annotations=TEAM_ANNOTATIONS)), settings=Settings.from_env())
    k = plan.kubernetes
    edited = {name: {**getattr(k, name), **value} for name, value in change.items()}
    plan = dataclasses.replace(plan, kubernetes=dataclasses.replace(k, **edited))
    with pytest.raises(TrainpipeError, match=f"{plan.dag_id}: {refused} .* is refused"):
        render_manifests(plan, launch=LAUNCH, settings=Settings.from_env())


@pytest.mark.parametrize("key", ["k8s.v1.cni.cncf.io/networks", "cni.projectcalico.org/ipAddrs", "co.elastic.logs/enabled",
                                 "gke-gcsfuse/volumes", "hami.io/gpu-scheduler-policy", "apps.kruise.io/inplace-update"])
def test_network_logging_and_device_webhook_keys_are_refused_too(tmp_path: Path, key: str) -> None:
    """Red team, round 4: another network (Multus), a chosen pod IP (Calico), dropped logs (Elastic), an
    injected storage sidecar, a GPU share (HAMi), an in-place update (OpenKruise)."""
    path = _write(tmp_path, _spec(annotations={"cost-center": "search-ml", key: "x"}))
    with pytest.raises(SpecError) as caught:
        compile_file(path, settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.field_path == f"{K8S}.annotations.{key}" and "remove it: " in problem.message


def test_a_trailing_newline_is_no_part_of_a_valid_name() -> None:
    """Patterns ending in `$` admit one trailing newline under re.match: such a key, value, variable or
    address passed the spec and failed (or meant another thing) only where it was used."""
    from trainpipe.spec.environment import env_name_problem
    from trainpipe.spec.pod_keys import label_value_problem

    assert metadata_key_problem("team\n", what="label") is not None
    assert label_value_problem("risk\n") is not None
    assert env_name_problem("NCCL_DEBUG\n") is not None
    assert metadata_key_problem("team", what="label") is None and env_name_problem("NCCL_DEBUG") is None
