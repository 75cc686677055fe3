"""The train task's next try after an OOM kill or preemptions: the manifests rendered for it (by the
operators the DAG uses, from the run folder's ledger as a real try reads it) carry the grown memory
or the on-demand placement, valid against the Kubernetes schema; the spec refuses what cannot work."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes.client import models as k8s

from tests.kubernetes.fake_apiserver import FakeApiServer
from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.kubernetes.builders import TrainerLaunch
from trainpipe.kubernetes.tries import CUDA_OOM, OOM_KILLED, PREEMPTED, failed_try_end, try_resources
from trainpipe.operators.kubernetes import KubernetesTrainJobOperator
from trainpipe.operators.kubernetes_render import render_manifests
from trainpipe.settings import Settings
from trainpipe.state.run_folder import run_dir_for
from trainpipe.state.run_notes import retry_note
from trainpipe.state.usage import record_try
from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainpipe_trainer.resume import resume_identity

K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
RUN_ID = "scheduled__2026-06-30T00:00:00+00:00"
ON_OOM = {"memory_factor": 1.5, "max_memory": "128Gi"}
CAPACITY = {
    "spot": {"node_selector": {"karpenter.sh/capacity-type": "spot"},
             "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]},
    "on_demand": {"node_selector": {"karpenter.sh/capacity-type": "on-demand"}},
    "on_demand_after_preemptions": 2,
}


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{tmp_path / 'storage'}")
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    return tmp_path


def _spec(tmp_path: Path, example: str, **kubernetes: object) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / example).read_text())
    spec["training"]["kubernetes"].update(kubernetes)
    path = tmp_path / example
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _ended(plan, try_number: int, outcome: str, reason: str | None = None, capacity: str | None = None) -> None:
    """A try of the run as the operator records it when it ends (the run folder's usage.json)."""
    now = datetime.now(UTC)
    record_try(run_dir_for(plan.dag_id, Settings.from_env(), RUN_ID), try_number=try_number,
               started_at=now - timedelta(minutes=10), ended_at=now, resources=plan.resources, outcome=outcome,
               reason=reason, capacity=capacity)


def _render(plan, try_number: int) -> list[dict]:
    launch = TrainerLaunch(config_uri=f"s3://bucket/trainpipe/runs/{plan.dag_id}/r/trainer_config.json",
                           mlflow_tracking_uri="http://mlflow.mlflow.svc:5000", dag_id=plan.dag_id,
                           airflow_run_id=RUN_ID, try_number=try_number)
    manifests = render_manifests(plan, launch=launch, settings=Settings.from_env())
    for manifest in manifests:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)
    return manifests


def _pod_spec(manifests: list[dict]) -> dict:
    last = manifests[-1]
    return last["spec"] if last["kind"] == "Pod" else last["spec"]["template"]["spec"]


def test_the_try_after_an_oom_kill_asks_for_more_memory_up_to_the_max(storage):
    plan = compile_file(_spec(storage, "search_ranker_gpu.yaml", on_oom=ON_OOM), settings=Settings.from_env())  # 64Gi, limit 72Gi

    (first,) = _render(plan, 1)
    assert first["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Gi"
    _ended(plan, 1, "failed", OOM_KILLED)
    (second,) = _render(plan, 2)
    resources = second["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": "2"}
    assert resources["limits"] == {"memory": "108Gi", "nvidia.com/gpu": "2"}
    # A second OOM kill compounds, and the ceiling holds: 144Gi and 162Gi become 128Gi.
    _ended(plan, 2, "failed", OOM_KILLED)
    (third,) = _render(plan, 3)
    assert third["spec"]["containers"][0]["resources"]["requests"]["memory"] == "128Gi"
    assert third["spec"]["containers"][0]["resources"]["limits"]["memory"] == "128Gi"


def test_a_failure_that_was_no_oom_kill_keeps_the_memory(storage):
    plan = compile_file(_spec(storage, "search_ranker_gpu.yaml", on_oom=ON_OOM), settings=Settings.from_env())
    _ended(plan, 1, "failed")
    _ended(plan, 2, PREEMPTED)
    (pod,) = _render(plan, 3)
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Gi"


def test_without_on_oom_every_try_asks_for_the_same_memory(storage):
    plan = compile_file(_spec(storage, "search_ranker_gpu.yaml"), settings=Settings.from_env())
    _ended(plan, 1, "failed", OOM_KILLED)
    (pod,) = _render(plan, 2)
    assert pod["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Gi"


def test_the_multi_node_job_runs_on_demand_after_n_preemptions(storage):
    plan = compile_file(_spec(storage, "fraud_detector_multinode.yaml", capacity=CAPACITY, on_oom=ON_OOM),
                        settings=Settings.from_env())
    base_tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                         "effect": "NoSchedule"}]

    spec = _pod_spec(_render(plan, 1))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "karpenter.sh/capacity-type": "spot"}
    assert spec["tolerations"] == [*base_tolerations, {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    _ended(plan, 1, PREEMPTED, capacity="spot")
    assert _pod_spec(_render(plan, 2))["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    _ended(plan, 2, PREEMPTED, capacity="spot")

    manifests = _render(plan, 3)
    # A preempted pod ends the try (the Job fails) instead of being replaced on spot within it.
    assert manifests[-1]["spec"]["podFailurePolicy"]["rules"][0] == {
        "action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    spec = _pod_spec(manifests)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "karpenter.sh/capacity-type": "on-demand"}
    assert spec["tolerations"] == base_tolerations
    # The memory stays (no OOM kill); the Job's name is per try.
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "32Gi"
    assert manifests[-1]["metadata"]["name"].endswith("-t3")


def test_what_changed_is_worded_for_the_run_note(storage):
    plan = compile_file(_spec(storage, "fraud_detector_multinode.yaml", capacity=CAPACITY, on_oom=ON_OOM),
                        settings=Settings.from_env())
    first = try_resources(plan.kubernetes, try_number=1, earlier=[])
    assert first.changes == () and first.capacity == "spot"
    _ended(plan, 1, PREEMPTED, capacity="spot")
    _ended(plan, 2, "failed", OOM_KILLED, capacity="spot")
    from trainpipe.state.usage import read_tries

    third = try_resources(plan.kubernetes, try_number=3,
                          earlier=read_tries(run_dir_for(plan.dag_id, Settings.from_env(), RUN_ID)))
    assert third.capacity == "spot"  # one preemption of two
    assert retry_note(3, third.changes) == (
        "try 3 changed: memory 32Gi -> 48Gi, limit 32Gi -> 48Gi after 1 OOM kill (OOMKilled) "
        "(on_oom: x1.5 per OOM kill, max 128Gi)")
    # What it trained with, for the MLflow run and the registered version.
    assert third.tags(gpus=1) == {"trainpipe.resources.memory": "48Gi", "trainpipe.resources.memory_limit": "48Gi",
                                  "trainpipe.resources.gpus_per_pod": "1", "trainpipe.resources.try": "3",
                                  "trainpipe.resources.capacity": "spot"}
    _ended(plan, 3, PREEMPTED, capacity="spot")
    fourth = try_resources(plan.kubernetes, try_number=4,
                           earlier=read_tries(run_dir_for(plan.dag_id, Settings.from_env(), RUN_ID)))
    assert fourth.capacity == "on_demand"
    assert fourth.changes[-1] == "on-demand capacity after 2 preempted tries (capacity.on_demand_after_preemptions: 2)"


def test_a_template_in_a_capacity_label_is_refused_at_its_key_and_no_pod_is_built(storage):
    template = "{{ conn.aws_default.password }}"
    capacity = {**CAPACITY, "on_demand": {"node_selector": {"pool": template}}, "on_demand_after_preemptions": 1}
    with pytest.raises(SpecError) as caught:
        compile_file(_spec(storage, "search_ranker_gpu.yaml", capacity=capacity), settings=Settings.from_env())
    (problem,) = caught.value.problems
    assert problem.field_path == "training.kubernetes.capacity.on_demand.node_selector.pool"
    assert "is not a Kubernetes label value" in problem.message


def _pod(*, reason: str | None = None, exit_code: int = 1, condition: str | None = None) -> k8s.V1Pod:
    ended = k8s.V1ContainerStateTerminated(exit_code=exit_code, reason=reason)
    status = k8s.V1ContainerStatus(name="base", image="i", image_id="", ready=False, restart_count=0,
                                   state=k8s.V1ContainerState(terminated=ended))
    conditions = [k8s.V1PodCondition(type=condition, status="True")] if condition else None
    return k8s.V1Pod(status=k8s.V1PodStatus(phase="Failed", container_statuses=[status], conditions=conditions))


def test_how_a_failed_try_ended_is_read_from_its_pods():
    assert failed_try_end([_pod(reason=OOM_KILLED, exit_code=137)]) == ("failed", OOM_KILLED)
    assert failed_try_end([_pod(exit_code=PREEMPTED_EXIT_CODE)]) == (PREEMPTED, None)
    assert failed_try_end([_pod(condition="DisruptionTarget")]) == (PREEMPTED, None)
    # An OOM kill on any node of a Job wins: the next try needs the memory whatever else happened.
    assert failed_try_end([_pod(condition="DisruptionTarget"), _pod(reason=OOM_KILLED)]) == ("failed", OOM_KILLED)
    assert failed_try_end([_pod(reason="Error")]) == ("failed", None)
    assert failed_try_end([]) == ("failed", None)
    # The trainer's CUDA OOM (its exit code, passed on by trainpipe_trainer.elastic); an OOM kill still wins.
    assert failed_try_end([_pod(exit_code=CUDA_OOM_EXIT_CODE)]) == ("failed", CUDA_OOM)
    assert failed_try_end([_pod(exit_code=CUDA_OOM_EXIT_CODE), _pod(reason=OOM_KILLED)]) == ("failed", OOM_KILLED)


def _earlier(plan) -> list:
    from trainpipe.state.usage import tries_before

    return tries_before(run_dir_for(plan.dag_id, Settings.from_env(), RUN_ID), 99)


def _batch(plan) -> tuple[int, int]:
    return plan.trainer.batch_size, plan.trainer.optimization.gradient_accumulation_steps


def test_after_a_cuda_oom_reduce_batch_splits_the_batch_into_more_accumulation_steps(storage):
    plan = compile_file(_spec(storage, "fraud_detector_multinode.yaml", on_oom={**ON_OOM, "reduce_batch": True}),
                        settings=Settings.from_env())
    _ended(plan, 1, "failed", CUDA_OOM)
    second = try_resources(plan.kubernetes, try_number=2, earlier=_earlier(plan), batch=_batch(plan))
    assert retry_note(2, second.changes) == (
        "try 2 changed: batch_size 64 -> 32, accumulation 1 -> 2 after 1 CUDA OOM (CUDAOutOfMemory) "
        "(on_oom.reduce_batch: same 64 samples per step)")
    # A CUDA OOM is the GPU's memory: the pod's memory request stays.
    assert (second.memory, second.memory_limit) == ("32Gi", "32Gi")
    trainer = second.trainer(plan.trainer)
    assert (trainer.batch_size, trainer.optimization.gradient_accumulation_steps) == (32, 2)
    # The checkpoint of the try before resumes: the same samples per step is the same training.
    assert not resume_identity(plan.trainer, world_size=2).differences(resume_identity(trainer, world_size=2))
    # Recorded on the MLflow run, and so on the registered version.
    tags = second.tags(gpus=1)
    assert (tags["trainpipe.resources.batch_size"], tags["trainpipe.resources.gradient_accumulation_steps"]) == (
        "32", "2")
    _ended(plan, 2, "failed", CUDA_OOM)
    third = try_resources(plan.kubernetes, try_number=3, earlier=_earlier(plan), batch=_batch(plan))
    assert (third.batch_size, third.gradient_accumulation_steps) == (16, 4)


def test_with_reduce_batch_a_job_fails_on_a_cuda_oom_instead_of_replacing_the_pod(storage):
    """A replaced pod would run out again with the same batch: the try ends, and the next one splits it."""
    plan = compile_file(_spec(storage, "fraud_detector_multinode.yaml", max_pod_restarts=3,
                              on_oom={**ON_OOM, "reduce_batch": True}), settings=Settings.from_env())
    rules = _render(plan, 1)[-1]["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [CUDA_OOM_EXIT_CODE]}} in rules
    plain = compile_file(_spec(storage, "fraud_detector_multinode.yaml", max_pod_restarts=3, on_oom=ON_OOM),
                         settings=Settings.from_env())
    assert all(rule["action"] != "FailJob" for rule in _render(plain, 1)[-1]["spec"]["podFailurePolicy"]["rules"])


def test_without_reduce_batch_a_cuda_oom_retries_the_same_batch(storage):
    plan = compile_file(_spec(storage, "fraud_detector_multinode.yaml", on_oom=ON_OOM), settings=Settings.from_env())
    _ended(plan, 1, "failed", CUDA_OOM)
    second = try_resources(plan.kubernetes, try_number=2, earlier=_earlier(plan), batch=_batch(plan))
    assert second.changes == () and second.trainer(plan.trainer) is plan.trainer
    assert "trainpipe.resources.batch_size" not in second.tags(gpus=1)


def test_a_batch_that_cannot_be_halved_any_more_is_kept_and_the_note_says_so(storage):
    plan = compile_file(_spec(storage, "search_ranker_gpu.yaml", on_oom={"max_memory": "128Gi", "reduce_batch": True}),
                        settings=Settings.from_env())
    for try_number in range(1, 6):  # 16 -> 8 -> 4 -> 2 -> 1, then nothing left to split
        _ended(plan, try_number, "failed", CUDA_OOM)
    sixth = try_resources(plan.kubernetes, try_number=6, earlier=_earlier(plan), batch=_batch(plan))
    assert (sixth.batch_size, sixth.gradient_accumulation_steps) == (1, 16)
    assert sixth.changes == ("batch_size 16 -> 1, accumulation 1 -> 16 after 5 CUDA OOMs (CUDAOutOfMemory) "
                             "(on_oom.reduce_batch: same 16 samples per step)",)


def test_the_job_operator_reads_how_its_pods_ended_from_the_cluster(tmp_path, monkeypatch):
    """The failed Job's pods, listed by its label through the operator's own client: one node OOM-killed."""
    job = "job-fraud-detector-multinode-1736162b-t1"
    server = FakeApiServer(pods=[
        {"metadata": {"name": f"{job}-0-a"}, "status": {"phase": "Failed", "containerStatuses": [
            {"name": "base", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}},
        {"metadata": {"name": f"{job}-1-b"}, "status": {"phase": "Failed", "containerStatuses": [
            {"name": "base", "image": "i", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}},
    ])
    server.start()
    try:
        monkeypatch.setenv("AIRFLOW_CONN_K8S_TEST", json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(server.kubeconfig(tmp_path))}}))
        plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
        operator = KubernetesTrainJobOperator(task_id="train", plan=plan, kubernetes_conn_id="k8s_test")
        pods = operator._pods_of_job(None, job, "ml-training")
    finally:
        server.stop()
    assert failed_try_end(pods) == ("failed", OOM_KILLED)
    (listed,) = [query for method, path, query in server.requests if path.endswith("/pods")]
    assert listed["labelSelector"] == f"trainpipe.io/job={job}"


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as caught:
        compile_file(path, settings=Settings.from_env())
    return [str(p) for p in caught.value.problems]


def test_a_max_memory_below_the_request_is_refused_with_the_fix(storage):
    path = _spec(storage, "search_ranker_gpu.yaml", on_oom={"max_memory": "70Gi"})  # limit 72Gi
    (problem,) = _problems(path)
    assert re.search(r"search_ranker_gpu.yaml:\d+:\d+: training.kubernetes.on_oom.max_memory: max_memory 70Gi is "
                    r"below resources.limits.memory 72Gi: .*raise max_memory to at least 72Gi", problem), problem


def test_reduce_batch_with_an_odd_batch_size_is_refused_with_the_fix(storage):
    path = _spec(storage, "search_ranker_gpu.yaml", on_oom={"max_memory": "128Gi", "reduce_batch": True})
    spec = yaml.safe_load(path.read_text())
    spec["training"]["batch_size"] = 15
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    (problem,) = _problems(path)
    assert re.search(r"search_ranker_gpu.yaml:\d+:\d+: training.kubernetes.on_oom.reduce_batch: reduce_batch halves "
                     r"training.batch_size after a CUDA OOM, and batch_size 15 is odd: .*set batch_size to an even "
                     r"number such as 16 or leave reduce_batch out", problem), problem


def test_a_capacity_label_also_in_the_node_selector_is_refused(storage):
    capacity = {**CAPACITY, "on_demand": {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100"}}}
    (problem,) = _problems(_spec(storage, "search_ranker_gpu.yaml", capacity=capacity))
    assert "training.kubernetes.capacity.on_demand.node_selector.nvidia.com/gpu.product: nvidia.com/gpu.product is " \
           "also in training.kubernetes.node_selector ('NVIDIA-L4')" in problem
