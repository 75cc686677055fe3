"""The cluster path runs the same trainer: the container command and environment taken from the
rendered manifests (a Pod; rank 0 and rank 1 of a Job) run here, with real torchrun, and train.

What the cluster would provide is provided the way the cluster would: ``$(VAR)`` in the command is
expanded from the container environment as the kubelet does, JOB_COMPLETION_INDEX is set as the
Job controller does, Secret references get stand-in values, and the Service's DNS name of pod 0 is
replaced by 127.0.0.1. The image's torchrun is this virtualenv's.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.demo.synthetic import generate_clicks, generate_transactions
from trainpipe.kubernetes.builders import TrainerLaunch
from trainpipe.operators.kubernetes_render import render_manifests
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import PipelinePlan
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.state.run_folder import read_training_result
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.train import RunContext, prepare_training_run

pytestmark = pytest.mark.integration

END = datetime(2026, 6, 30, tzinfo=UTC)
_VAR = re.compile(r"\$\((\w+)\)")


def _example(name: str, data_uri: str, epochs: int) -> PipelinePlan:
    """The example spec with this test's data and fewer epochs (neither appears in the manifests)."""
    path = REPO / "dag_configs" / name
    plan = compile_file(path, settings=Settings.from_env())
    text = (path.read_text().replace(plan.data.uri, data_uri)
            .replace(f"  epochs: {plan.trainer.epochs}\n", f"  epochs: {epochs}\n"))
    return build_plan(validate_loaded(load_yaml_text(text, name)), spec_file=name, spec_text=text)


def _launch(plan: PipelinePlan, settings: Settings, run_id: str) -> TrainerLaunch:
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END)
    run = RunContext(dag_id=plan.dag_id, airflow_run_id=run_id, try_number=1, spec_sha256=plan.spec_sha256,
                     git_commit="test")
    prepared = prepare_training_run(plan, snapshot, settings=settings, run=run)
    return TrainerLaunch(config_uri=prepared.config_uri, mlflow_tracking_uri=settings.mlflow_tracking_uri,
                         dag_id=plan.dag_id, airflow_run_id=run_id, try_number=1)


def _container(pod_spec: dict) -> dict:
    (container,) = pod_spec["containers"]
    return container


def _process(container: dict, *, extra_env: dict[str, str], replace: dict[str, str]) -> subprocess.Popen:
    env: dict[str, str] = {}
    for item in container["env"]:
        # A Secret reference: the cluster would inject the Secret's value.
        env[item["name"]] = item["value"] if "value" in item else f"stand-in-for-{item['name']}"
    env.update(extra_env)
    command = []
    for arg in container["command"] + container["args"]:
        arg = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), arg)
        for old, new in replace.items():
            arg = arg.replace(old, new)
        command.append(arg)
    assert command[:3] == ["python", "-m", "trainpipe_trainer.elastic"]
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env["HOME"] = os.environ.get("HOME", "/tmp")
    # The image holds this checkout's trainer: here, the trainer the test session imports.
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen, name: str) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, f"{name} exited {process.returncode}:\n{out[-4000:]}"
    return out


def test_single_node_pod_command_and_env_train_locally(state_dir):
    settings = Settings.from_env()
    data = Path(settings.storage_root.removeprefix("file://")) / "k8s_local" / "clicks.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_clicks(queries=240, days=20, end=END).to_parquet(data, index=False)
    plan = _example("search_ranker_gpu.yaml", "k8s_local/clicks.parquet", epochs=1)
    launch = _launch(plan, settings, "k8s_local_pod")

    (pod,) = render_manifests(plan, launch=launch, settings=Settings.from_env())
    out = _finish(_process(_container(pod["spec"]), extra_env={}, replace={}), "pod")

    result = read_training_result(_run_dir(plan, settings, "k8s_local_pod"))
    assert result.world_size == plan.launch.nproc_per_node == 2
    assert f"weights sha256: {result.weights_sha256}" in out


def test_multi_node_job_rank_0_and_rank_1_train_locally_through_the_rendezvous(state_dir):
    settings = Settings.from_env()
    data = Path(settings.storage_root.removeprefix("file://")) / "k8s_local" / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=3000, days=20, end=END).to_parquet(data, index=False)
    plan = _example("fraud_detector_multinode.yaml", "k8s_local/transactions.parquet", epochs=1)
    launch = _launch(plan, settings, "k8s_local_job")

    service, job = render_manifests(plan, launch=launch, settings=Settings.from_env())
    container = _container(job["spec"]["template"]["spec"])
    pod0_dns = f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    port = service["spec"]["ports"][0]["port"]
    with socket.socket() as sock:  # the cluster gives pod 0 its own port 29500; here it must be free
        sock.bind(("127.0.0.1", 0))
        free_port = sock.getsockname()[1]
    replace = {f"{pod0_dns}:{port}": f"127.0.0.1:{free_port}"}
    assert any(pod0_dns in arg for arg in container["command"])

    nodes = [_process(container, extra_env={"JOB_COMPLETION_INDEX": str(i)}, replace=replace)
             for i in range(job["spec"]["completions"])]
    outputs = [_finish(node, f"rank {i}") for i, node in enumerate(nodes)]

    result = read_training_result(_run_dir(plan, settings, "k8s_local_job"))
    assert result.world_size == 2  # 2 nodes x 1 process: both pods joined one process group
    assert any(f"weights sha256: {result.weights_sha256}" in out for out in outputs)


def _run_dir(plan: PipelinePlan, settings: Settings, run_id: str):
    from trainpipe.state.run_folder import run_dir_for

    return run_dir_for(plan.dag_id, settings, run_id)
