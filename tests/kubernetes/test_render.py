"""The Kubernetes manifests of the train task: rendered without a cluster by the operators the DAG
uses, valid against the Kubernetes OpenAPI schema, and what an ML platform team expects in them."""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import pytest
import yaml

from tests.support import REPO
from trainpipe.commands.main import main
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.kubernetes.builders import TrainerLaunch
from trainpipe.operators.kubernetes_render import render_manifests
from trainpipe.plan.launch import LaunchValues, resolve
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe_trainer.outcomes import PREEMPTED_EXIT_CODE

KUBERNETES_SPECS = sorted(
    p for p in (REPO / "dag_configs").glob("*.yaml") if compile_file(p,
                                                                     settings=Settings.from_env()).launch.launcher == "kubernetes"
)
# The oldest Kubernetes we support and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
LAUNCH = TrainerLaunch(config_uri="s3://bucket/trainpipe/runs/p/r/trainer_config.json",
                       mlflow_tracking_uri="http://mlflow.mlflow.svc:5000", dag_id="p",
                       airflow_run_id="scheduled__2026-06-30T00:00:00+00:00", try_number=2)


def _plan(name: str):
    return compile_file(REPO / "dag_configs" / name, settings=Settings.from_env())


def test_there_is_a_single_node_and_a_multi_node_kubernetes_example():
    nnodes = sorted(compile_file(p, settings=Settings.from_env()).launch.nnodes for p in KUBERNETES_SPECS)
    assert nnodes[0] == 1 and nnodes[-1] > 1, KUBERNETES_SPECS


@pytest.mark.parametrize("spec_file", KUBERNETES_SPECS, ids=lambda p: p.name)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_manifests_validate_against_the_kubernetes_schema(spec_file, version):
    manifests = render_manifests(compile_file(spec_file, settings=Settings.from_env()), launch=LAUNCH,
                                 settings=Settings.from_env())

    assert manifests
    for manifest in manifests:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_single_node_pod_runs_the_trainer_command_with_gpus_shm_and_no_root():
    plan = _plan("search_ranker_gpu.yaml")
    k = plan.kubernetes

    (pod,) = render_manifests(plan, launch=LAUNCH, settings=Settings.from_env())

    assert pod["kind"] == "Pod"
    assert pod["metadata"]["namespace"] == "ml-training"
    (container,) = pod["spec"]["containers"]
    # The plan's launch, resolved for the run: what the local launcher would run, byte for byte.
    assert container["command"] + container["args"] == [
        "python", "-m", "trainpipe_trainer.elastic", "--nnodes=1", f"--nproc_per_node={k.resources['gpus']}",
        "--standalone", "-m", "trainpipe_trainer", "--config", LAUNCH.config_uri]
    assert container["command"] == list(resolve(plan.launch, LaunchValues(
        config_uri=LAUNCH.config_uri, mlflow_tracking_uri=LAUNCH.mlflow_tracking_uri)).argv)
    assert container["image"] == k.image and container["imagePullPolicy"] == "IfNotPresent"
    assert container["resources"] == {"requests": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "2"},
                                      "limits": {"memory": "72Gi", "nvidia.com/gpu": "2"}}
    assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["spec"]["volumes"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "ghcr-pull"}]
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-training"
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"]["value"] == LAUNCH.mlflow_tracking_uri
    assert container["envFrom"] == [{"secretRef": {"name": "training-bucket-credentials"}}]


def test_multi_node_job_rendezvous_at_pod_zero_of_its_headless_service():
    plan = _plan("fraud_detector_multinode.yaml")

    service, job = render_manifests(plan, launch=LAUNCH, settings=Settings.from_env())

    assert (service["kind"], job["kind"]) == ("Service", "Job")
    name = job["metadata"]["name"]
    assert service["metadata"]["name"] == name and len(name) <= 56
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["backoffLimit"] == 0
    # A preempted or evicted pod, or a trainer that committed its step on SIGTERM, is not a failure.
    assert job["spec"]["podFailurePolicy"] == {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [PREEMPTED_EXIT_CODE]}},
    ]}
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # what podFailurePolicy requires
    template = job["spec"]["template"]
    assert template["spec"]["subdomain"] == name
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    command = container["command"] + container["args"]
    assert command[:4] == ["python", "-m", "trainpipe_trainer.elastic", "--nnodes=2"]
    assert "--node_rank=$(JOB_COMPLETION_INDEX)" in command
    assert "--rdzv_backend=c10d" in command
    assert f"--rdzv_endpoint={name}-0.{name}:29500" in command
    assert command[-4:] == ["-m", "trainpipe_trainer", "--config", LAUNCH.config_uri]
    # Secrets only by reference.
    token = next(e for e in container["env"] if e["name"] == "MLFLOW_TRACKING_TOKEN")
    secret_ref = {"secretKeyRef": {"name": "mlflow-credentials", "key": "token"}}
    assert token == {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": secret_ref}
    affinity = template["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert affinity[0]["preference"]["matchExpressions"][0]["key"] == "cloud.google.com/gke-spot"


def test_job_name_changes_with_the_try_and_the_run_but_not_otherwise():
    plan = _plan("fraud_detector_multinode.yaml")

    def name(**changes):
        return render_manifests(plan, launch=dataclasses.replace(LAUNCH, **changes),
                                settings=Settings.from_env())[1]["metadata"]["name"]

    assert name() == name()
    assert name(try_number=3) != name()
    assert name(airflow_run_id="manual__2026-07-01") != name()


def test_dag_train_task_is_deferrable_durable_and_follows_on_finish_action():
    from trainpipe.dags.builder import build_dag
    from trainpipe.operators.kubernetes import KubernetesTrainJobOperator, KubernetesTrainPodOperator

    pod_task = build_dag(_plan("search_ranker_gpu.yaml")).get_task("train")
    job_task = build_dag(_plan("fraud_detector_multinode.yaml")).get_task("train")

    assert isinstance(pod_task, KubernetesTrainPodOperator) and isinstance(job_task, KubernetesTrainJobOperator)
    assert pod_task.deferrable and pod_task.durable and pod_task.get_logs
    assert pod_task.on_finish_action.value == "delete_succeeded_pod"
    assert pod_task.logging_interval == 120
    assert job_task.deferrable and job_task.wait_until_job_complete
    assert pod_task.on_retry_callback and pod_task.on_failure_callback  # status.json for the sensor


def test_cli_render_k8s_prints_yaml_documents_only(capsys):
    assert main(["render", str(REPO / "dag_configs" / "fraud_detector_multinode.yaml"), "--k8s"]) == 0

    out = capsys.readouterr().out
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["Service", "Job"]


def test_render_of_a_local_spec_says_how_to_switch():
    with pytest.raises(SpecError, match="fraud_detector.yaml: training.launcher: is 'local'; only 'kubernetes' submits"):
        render_manifests(_plan("fraud_detector.yaml"), settings=Settings.from_env())


TEXT = (REPO / "dag_configs" / "fraud_detector_multinode.yaml").read_text()


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(text, "k.yaml"))
    return [str(p) for p in caught.value.problems]


def test_literal_secret_in_env_is_refused_with_the_fix():
    text = TEXT.replace("      NCCL_DEBUG: WARN", "      NCCL_DEBUG: WARN\n      AWS_SECRET_ACCESS_KEY: abc")
    (problem,) = _problems(text)
    line = TEXT.splitlines().index("    env:") + 1
    assert problem.startswith(f"k.yaml:{line}:5: training.kubernetes.env: 'AWS_SECRET_ACCESS_KEY' looks like a credential")
    assert "secret_env (AWS_SECRET_ACCESS_KEY: SECRET_NAME/KEY)" in problem


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("  launcher: kubernetes\n  kubernetes:", "  launcher: kubernetes\n  kubernetez:",
     "training.launcher: launcher 'kubernetes' needs a training.kubernetes section"),
    ("  launcher: kubernetes", "  launcher: local", "training.distributed.nnodes: nnodes 2 needs launcher 'kubernetes'"),
    ("      gpus: 1", "      gpus: 4",
     "training.kubernetes.resources.gpus: 4 GPU(s) per pod but training.distributed.nproc_per_node is 1"),
])
def test_launcher_cross_field_checks(old, new, expected):
    assert any(expected in p for p in _problems(TEXT.replace(old, new)))


ELASTIC = TEXT.replace("    nnodes: 2\n", "    elastic: {min_nodes: 2, max_nodes: 4}\n")


def test_elastic_training_starts_max_nodes_pods_and_lets_torchrun_go_on_with_min_nodes(tmp_path):
    from trainpipe.compile.compiler import compile_text

    assert ELASTIC != TEXT
    plan = compile_text(ELASTIC, "fraud_detector_multinode.yaml", configs_root=tmp_path, settings=Settings.from_env())

    service, job = render_manifests(plan, launch=LAUNCH, settings=Settings.from_env())

    for manifest in (service, job):
        kubernetes_validate.validate(manifest, K8S_VERSIONS[-1], strict=True)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["type"] == "DisruptionTarget"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--nnodes=2:4" in command
    # Survivors of a preempted node rejoin: one torchrun restart per preemption, on top of real failures.
    assert f"--max_restarts={plan.kubernetes.max_pod_restarts + plan.launch.preemption_restarts}" in command


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("  launcher: kubernetes", "  launcher: local", "training.distributed.elastic: elastic training needs launcher "
                                                    "'kubernetes'"),
    ("    strategy: ddp", "    strategy: deepspeed",
     "training.distributed.elastic: elastic training resumes at another world size, which strategy 'deepspeed' cannot"),
    ("    elastic:", "    nnodes: 3\n    elastic:", "training.distributed.nnodes: nnodes 3 but elastic.max_nodes 4"),
    ("max_nodes: 4", "max_nodes: 1", "max_nodes (1) must be >= min_nodes (2)"),
])
def test_elastic_cross_field_checks(old, new, expected):
    assert old in ELASTIC
    assert any(expected in p for p in _problems(ELASTIC.replace(old, new))), _problems(ELASTIC.replace(old, new))
