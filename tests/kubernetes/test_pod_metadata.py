"""A spec's pod labels and annotations: its own keys reach the pod; the domains the cluster's controllers
read (Kueue's queue and priority, cloud identities, AppArmor, the autoscaler, trainpipe's selectors,
service meshes) are refused at the key, so the pod never carries them."""

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

LAUNCH = TrainerLaunch(config_uri="s3://bucket/trainpipe/runs/p/r/trainer_config.json",
                       mlflow_tracking_uri="http://mlflow.mlflow.svc:5000", dag_id="p",
                       airflow_run_id="scheduled__2026-06-30T00:00:00+00:00", try_number=1)

RESERVED = [
    ("labels", "kueue.x-k8s.io/queue-name", "platform-reserved"),
    ("labels", "kueue.x-k8s.io/priority-class", "system-critical"),
    ("labels", "trainpipe.io/job", "job-search-ranker-gpu-01234567-t1"),
    ("labels", "trainpipe.io/pipeline", "search_ranker"),
    ("annotations", "iam.amazonaws.com/role", "arn:aws:iam::1:role/platform-admin"),
    ("annotations", "eks.amazonaws.com/role-arn", "arn:aws:iam::1:role/platform-admin"),
    ("annotations", "iam.gke.io/gcp-service-account", "admin@project.iam.gserviceaccount.com"),
    ("labels", "azure.workload.identity/use", "true"),
    ("annotations", "container.apparmor.security.beta.kubernetes.io/base", "unconfined"),
    ("annotations", "cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
    ("annotations", "sidecar.istio.io/inject", "false"),
    ("labels", "jobset.sigs.k8s.io/jobset-name", "another-run"),
]


def _write(tmp_path: Path, kubernetes: dict) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / "search_ranker_gpu.yaml").read_text())
    spec["training"]["kubernetes"].update(kubernetes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _pod(plan) -> dict:
    (pod,) = [m for m in render_manifests(plan, launch=LAUNCH, settings=Settings.from_env()) if m["kind"] == "Pod"]
    return pod


@pytest.mark.parametrize(("section", "key", "value"), RESERVED, ids=[f"{s}:{k}" for s, k, _ in RESERVED])
def test_a_key_in_a_reserved_domain_is_refused_at_the_key(tmp_path: Path, section: str, key: str, value: str) -> None:
    path = _write(tmp_path, {section: {"cost-center": "search-ml", key: value}})
    with pytest.raises(SpecError) as caught:
        compile_file(path, settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.field_path == f"training.kubernetes.{section}.{key}"
    assert "which the cluster's own controllers read" in problem.message
    # Refused, so no plan exists and no pod is built from it. The same spec without the key renders
    # a pod whose key, where trainpipe sets it itself (queue, pipeline, safe-to-evict), has trainpipe's value.
    pod = _pod(compile_file(_write(tmp_path, {section: {"cost-center": "search-ml"}}), settings=Settings.from_env()))
    assert pod["metadata"].get(section, {}).get(key) != value


def test_the_specs_own_keys_reach_the_pod_beside_trainpipes(tmp_path: Path) -> None:
    plan = compile_file(_write(tmp_path, {"labels": {"cost-center": "search-ml", "example.com/owner": "ranking"},
                                          "annotations": {"team": "search", "example.com/runbook": "https://x/y"}}),
                        settings=Settings.from_env())
    metadata = _pod(plan)["metadata"]
    assert metadata["labels"]["cost-center"] == "search-ml"
    assert metadata["labels"]["example.com/owner"] == "ranking"
    # The queue comes from `queue`, judged by the policy's kubernetes.queues, not from a label.
    assert metadata["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-training"
    assert metadata["annotations"]["example.com/runbook"] == "https://x/y"
    assert metadata["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


@pytest.mark.parametrize(("labels", "message"), [
    ({"Team A": "x"}, "is not a Kubernetes label key"),
    # Upper case is no DNS prefix: refused as a key before its domain is looked at.
    ({"Kubernetes.IO/anything": "x"}, "is not a Kubernetes label key"),
    ({"cost-center": "a b"}, "is not a Kubernetes label value"),
    ({"cost-center": "x" * 64}, "is not a Kubernetes label value"),
])
def test_label_keys_and_values_kubernetes_would_refuse_are_refused_at_the_key(
    tmp_path: Path, labels: dict, message: str
) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        compile_file(_write(tmp_path, {"labels": labels}), settings=Settings.from_env())
    assert caught.value.problems[0].field_path == f"training.kubernetes.labels.{next(iter(labels))}"


@pytest.mark.parametrize("name", ["cpu", "memory", "kubernetes.io/gpu", "gpu"])
def test_the_gpu_count_cannot_become_another_resource(tmp_path: Path, name: str) -> None:
    with pytest.raises(SpecError, match="is not an extended resource name") as caught:
        compile_file(_write(tmp_path, {"resources": {"gpus": 2, "gpu_resource": name, "cpu": "16", "memory": "64Gi"}}),
                     settings=Settings.from_env())
    assert caught.value.problems[0].field_path == "training.kubernetes.resources.gpu_resource"
