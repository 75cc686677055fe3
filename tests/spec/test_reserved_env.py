"""A spec's environment (training.kubernetes.env, secret_env) never sets what trainpipe or torchrun
set, nor what redirects code, credentials or outputs; tuning knobs stay allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.kubernetes.builders import TrainerLaunch, container_env
from trainpipe.plan.launch import plan_launch
from trainpipe.spec.environment import TORCHRUN_ENV, reserved_env_reason, trainer_environment
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

TEXT = """\
pipeline_id: p
data: {uri: demo/p/data.parquet}
training:
  task: binary_classification
  features: [amount]
  label: is_fraud
  launcher: kubernetes
  kubernetes:
    image: ghcr.io/trainpipe/trainer:0.1.0
    env:
      NCCL_DEBUG: WARN
evaluation: {metrics: [auc]}
registration: {model_name: m}
"""
ENV_LINE = 12  # the line after NCCL_DEBUG


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(text, "k.yaml"))
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                                  "TRAINPIPE_STORAGE_ROOT", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH",
                                  "PYTHONSTARTUP", "KUBERNETES_SERVICE_HOST", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                  "WORLD_SIZE", "LOCAL_RANK", "PATH", "HOME", "OMP_NUM_THREADS", "https_proxy",
                                  "AIRFLOW__CORE__FERNET_KEY", "FSSPEC_S3_ENDPOINT_URL", "TORCHELASTIC_RUN_ID"])
def test_reserved_name_in_env_is_a_located_error_with_the_fix(name: str):
    problems = _problems(TEXT.replace("      NCCL_DEBUG: WARN\n", f"      NCCL_DEBUG: WARN\n      {name}: x\n"))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"k.yaml:{ENV_LINE}:7: training.kubernetes.env.{name}: {name!r} is reserved (")
    assert "remove it; credentials and endpoints come from a Secret the platform owns" in problems[0]


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "CUDA_LAUNCH_BLOCKING",
                                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_IB_DISABLE"])
def test_tuning_knobs_stay_allowed(name: str):
    spec = validate_loaded(load_yaml_text(TEXT.replace("NCCL_DEBUG: WARN", f"{name}: '1'"), "k.yaml"))
    assert spec.training.kubernetes.env == {name: "1"}


def test_secret_env_may_carry_credentials_but_not_what_trainpipe_sets():
    text = TEXT.replace("    env:\n      NCCL_DEBUG: WARN\n",
                        "    secret_env:\n      MLFLOW_TRACKING_TOKEN: mlflow/token\n      AWS_ACCESS_KEY_ID: s3/id\n"
                        "      MLFLOW_TRACKING_URI: mlflow/uri\n      LD_PRELOAD: x/y\n")
    assert _problems(text) == [
        f"k.yaml:{ENV_LINE + 1}:7: training.kubernetes.secret_env.MLFLOW_TRACKING_URI: 'MLFLOW_TRACKING_URI' is "
        "reserved (trainpipe sets it for the trainer); remove it. Tuning variables such as NCCL_DEBUG are allowed",
        f"k.yaml:{ENV_LINE + 2}:7: training.kubernetes.secret_env.LD_PRELOAD: 'LD_PRELOAD' is reserved (it makes the "
        "dynamic loader run other code); remove it. Tuning variables such as NCCL_DEBUG are allowed",
    ]


def test_every_variable_the_launch_sets_is_reserved():
    for plan in (compile_file(p) for p in sorted((REPO / "dag_configs").glob("[!_]*.yaml"))):
        own = {name for name, _ in plan.launch.env} - set(plan.kubernetes.env if plan.kubernetes else {})
        assert own and all(reserved_env_reason(name) for name in own), own
    assert all(reserved_env_reason(name) for name, _ in trainer_environment())
    assert all(reserved_env_reason(name) for name in TORCHRUN_ENV)


def _rank_environment(script: Path, env: dict[str, str]) -> dict[str, str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run([str(torchrun), "--standalone", "--nnodes=1", "--nproc_per_node=1", str(script)],
                            capture_output=True, text=True, env=env, timeout=300, check=True)
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("ENV="))[4:])


@pytest.mark.integration
def test_every_variable_torchrun_sets_is_reserved(tmp_path: Path):
    """A real torchrun: the variables it sets in a rank's environment over the caller's value (rendezvous,
    ranks, elastic) are all reserved. Those it only defaults (a caller's value wins, such as
    TORCH_NCCL_ASYNC_ERROR_HANDLING) are tuning a spec may set."""
    script = tmp_path / "show_env.py"
    script.write_text("import json, os\nprint('ENV=' + json.dumps(dict(os.environ)))\n")
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    added = set(_rank_environment(script, base)) - set(base)
    assert {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"} <= added
    preset = _rank_environment(script, {**base, **{name: "from-the-spec" for name in added}})
    overridden = {name for name in added if preset[name] != "from-the-spec"}
    assert {"MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"} <= overridden
    assert {name for name in overridden if reserved_env_reason(name) is None} == set()


def test_a_plan_made_without_the_spec_stage_cannot_set_a_reserved_name():
    """Defence in depth: the launch refuses it, so no pod or local trainer gets it."""
    with pytest.raises(ValueError, match=r"environment variable 'MLFLOW_TRACKING_URI' is reserved: trainpipe sets it"):
        plan_launch(launcher="kubernetes", nproc_per_node=1, nnodes=1, strategy="ddp",
                    extra_env=(("MLFLOW_TRACKING_URI", "http://attacker.example"),))
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml")
    launch = TrainerLaunch(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000", dag_id="d",
                           airflow_run_id="r", try_number=1)
    env = {variable.name: variable.value for variable in container_env(plan, launch)}
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["NCCL_DEBUG"] == "WARN"
