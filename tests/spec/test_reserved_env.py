"""A spec's environment (training.kubernetes.env, secret_env) never sets what trainpipe or torchrun
set, nor what redirects code, credentials or outputs; tuning knobs stay allowed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.commands.main import main
from trainpipe.compile.compiler import compile_file, compile_text
from trainpipe.errors import SpecError, TrainpipeError
from trainpipe.kubernetes.builders import TrainerLaunch, container_env
from trainpipe.plan.launch import plan_launch
from trainpipe.settings import Settings
from trainpipe.spec import environment
from trainpipe.spec.environment import TORCHRUN_ENV, looks_like_credential, reserved_env_reason, trainer_environment
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
# What loads code or files, or redirects endpoints, caches or outputs, by group (trainpipe.spec.environment):
# each name a red-team run got into a pod's environment, and its neighbours.
NEWLY_RESERVED = [
    # glibc (its own list of variables unsafe in setuid programs) and Python's other temp variables
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "NIS_PATH", "TZDIR", "MALLOC_TRACE",
    "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "RESOLV_HOST_CONF", "TMP", "TEMP",
    # shells, programs started by name, other interpreters
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "BASH_FUNC_id", "BASH_LOADABLES_PATH", "EDITOR", "PAGER",
    "BROWSER", "PERL5OPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS",
    # TLS and credentials' endpoints
    "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES", "SSLKEYLOGFILE", "NETRC", "KUBECONFIG", "STORAGE_EMULATOR_HOST",
    "GCE_METADATA_HOST", "IDENTITY_ENDPOINT", "IMDS_ENDPOINT", "MSI_ENDPOINT", "KRB5CCNAME", "SSH_AUTH_SOCK",
    # NCCL's plugins, files and rendezvous
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_DEBUG_FILE",
    "NCCL_TOPO_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE", "NCCL_CONF_FILE", "NCCL_COMM_ID",
    "NCCL_RAS_ADDR",
    # GPUs, compiler caches and code paths, profiler
    "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_CACHE_PATH", "CUDA_INJECTION64_PATH", "CUDA_HOME",
    "TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER",
    "TRITON_PTXAS_PATH", "TORCH_HOME", "TORCH_LOGS_OUT", "TORCH_TRACE", "TORCH_COMPILE_DEBUG_DIR",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "PYTORCH_KERNEL_CACHE_PATH", "PYTORCH_TUNABLEOP_FILENAME", "KINETO_CONFIG",
    "OMP_TOOL_LIBRARIES", "MPLCONFIGDIR",
    # model hubs, user folders, git and package indexes
    "HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_MODULES_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "GIT_SSH_COMMAND",
    "GIT_CONFIG_GLOBAL", "GIT_PYTHON_GIT_EXECUTABLE", "PIP_INDEX_URL", "UV_INDEX_URL", "CONDA_PKGS_DIRS",
    # compared in upper case, as the proxies are
    "gconv_path", "Nccl_Net_Plugin", "hf_endpoint",
]
# From a platform-owned Secret these stay allowed: credentials and endpoints, and paths the Secret chose.
FROM_SECRETS = ["HF_TOKEN", "HF_ENDPOINT", "HUGGING_FACE_HUB_TOKEN", "AWS_SHARED_CREDENTIALS_FILE",
                "MLFLOW_TRACKING_CLIENT_CERT_PATH", "GOOGLE_APPLICATION_CREDENTIALS"]
# Tuning a spec may still set (none of them allowed today is refused now).
TUNING = ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_P2P_LEVEL",
          "NCCL_NET_GDR_LEVEL", "CUDA_LAUNCH_BLOCKING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DISTRIBUTED_DEBUG",
          "PYTORCH_CUDA_ALLOC_CONF", "OMP_PROC_BIND", "MALLOC_ARENA_MAX", "TZ", "LANG"]


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(text, "k.yaml"))
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                                  "TRAINPIPE_STORAGE_ROOT", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH",
                                  "PYTHONSTARTUP", "KUBERNETES_SERVICE_HOST", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                  "WORLD_SIZE", "LOCAL_RANK", "PATH", "HOME", "OMP_NUM_THREADS", "https_proxy",
                                  "AIRFLOW__CORE__FERNET_KEY", "FSSPEC_S3_ENDPOINT_URL", "TORCHELASTIC_RUN_ID",
                                  # gRPC's and curl's proxies; torch.load that unpickles anything (red team, round 3).
                                  "grpc_proxy", "ftp_proxy", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"])
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
        "reserved (trainpipe sets it for the trainer); remove it, or name the variable the credential's program reads",
        f"k.yaml:{ENV_LINE + 2}:7: training.kubernetes.secret_env.LD_PRELOAD: 'LD_PRELOAD' is reserved (it makes the "
        "dynamic loader run other code); remove it, or name the variable the credential's program reads",
    ]


def test_every_variable_the_launch_sets_is_reserved():
    for plan in (compile_file(p, settings=Settings.from_env()) for p in sorted((REPO / "dag_configs").glob("[!_]*.yaml"))):
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
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    launch = TrainerLaunch(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000", dag_id="d",
                           airflow_run_id="r", try_number=1)
    env = {variable.name: variable.value for variable in container_env(plan, launch)}
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000" and env["NCCL_DEBUG"] == "WARN"


@pytest.mark.parametrize("name", ["LD_PRELOAD", "MLFLOW_TRACKING_URI", "PATH\u200b"])
def test_a_plan_made_without_the_spec_stage_cannot_give_a_reserved_name_a_secret(name: str):
    """Defence in depth for secret_env too: the pod's environment is never built with such a name."""
    import dataclasses

    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    assert plan.kubernetes is not None
    forged = dataclasses.replace(plan, kubernetes=dataclasses.replace(
        plan.kubernetes, secret_env={name: {"secret": "attacker-secret", "key": "payload"}}))
    launch = TrainerLaunch(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000", dag_id="d",
                           airflow_run_id="r", try_number=1)
    with pytest.raises(TrainpipeError, match=f"secret_env variable {re.escape(repr(name))} is refused"):
        container_env(forged, launch)
    # The spec's own Secret variable still reaches the pod, from its Secret.
    honest = {v.name: v.value_from for v in container_env(plan, launch) if v.value_from is not None}
    assert {n: (r.secret_key_ref.name, r.secret_key_ref.key) for n, r in honest.items()} == {
        "MLFLOW_TRACKING_TOKEN": ("mlflow-credentials", "token")}


def _payload(name: str) -> str:
    return f"/dev/shm/payload-{name.lower().replace('%', '')}"


def _with_env(name: str, value: str) -> str:
    return TEXT.replace("      NCCL_DEBUG: WARN\n", f"      NCCL_DEBUG: WARN\n      {name}: '{value}'\n")


@pytest.mark.parametrize("name", NEWLY_RESERVED)
def test_what_loads_code_or_redirects_never_reaches_a_plan_or_a_launch(name: str, tmp_path: Path):
    text = _with_env(name, _payload(name))
    problems = _problems(text)
    assert len(problems) == 1, problems
    if looks_like_credential(name):  # reported by the section: move it to a Secret, where it is judged again
        assert f"training.kubernetes.env: {name!r} looks like a credential" in problems[0]
    else:
        assert problems[0].startswith(f"k.yaml:{ENV_LINE}:7: training.kubernetes.env.{name}: {name!r} is reserved (")
    # No plan is compiled from it, and a plan made another way gets no launch.
    with pytest.raises(SpecError):
        compile_text(text, "k.yaml", configs_root=tmp_path, settings=Settings.from_env())
    with pytest.raises(ValueError, match=rf"environment variable {re.escape(repr(name))} is reserved: "):
        plan_launch(launcher="kubernetes", nproc_per_node=1, nnodes=1, strategy="ddp",
                    extra_env=((name, _payload(name)),))


@pytest.mark.parametrize("name", ["BASH_FUNC_id%%", "PATH\u200b", "\uff30\uff21\uff34\uff28", "LD-PRELOAD", "1PATH"])
def test_a_name_that_is_no_identifier_is_refused_not_judged_as_another(name: str, tmp_path: Path):
    """Look-alikes of reserved names (an exported bash function, a zero-width space, full-width letters)
    are refused as names, so no such variable reaches a plan."""
    text = _with_env(name, "x")
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"k.yaml:{ENV_LINE}:7: training.kubernetes.env.{name}: {name!r} is not an "
                                  "environment variable name")
    with pytest.raises(SpecError):
        compile_text(text, "k.yaml", configs_root=tmp_path, settings=Settings.from_env())


def test_render_k8s_refuses_them_all_and_prints_no_payload(tmp_path: Path, capsys, monkeypatch):
    """`trainpipe render --k8s`, where the red-team run found them in the container's env: every name
    is a located error and no manifest (so no payload) is printed."""
    variables = "".join(f"      {name}: '{_payload(name)}'\n" for name in NEWLY_RESERVED)
    spec = tmp_path / "k.yaml"
    spec.write_text(TEXT.replace("      NCCL_DEBUG: WARN\n", f"      NCCL_DEBUG: WARN\n{variables}"))
    monkeypatch.chdir(tmp_path)

    assert main(["render", "k.yaml", "--k8s"]) == 1

    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "kind:" not in out and "/dev/shm/payload-" not in out
    for name in NEWLY_RESERVED:
        if not looks_like_credential(name):
            assert f"training.kubernetes.env.{name}: {name!r} is reserved (" in out, name


def test_secret_env_refuses_them_too_but_credentials_and_endpoints_stay():
    refused = [name for name in NEWLY_RESERVED if reserved_env_reason(name, from_secret=True)]
    assert set(NEWLY_RESERVED) - set(refused) == {"HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_MODULES_CACHE",
                                                  "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "hf_endpoint"}
    refs = "".join(f"      {name}: s/k\n" for name in [*refused, *FROM_SECRETS])
    text = TEXT.replace("    env:\n      NCCL_DEBUG: WARN\n", f"    secret_env:\n{refs}")
    problems = _problems(text)
    assert [p.split(": ", 2)[1] for p in problems] == [f"training.kubernetes.secret_env.{name}" for name in refused]
    assert all(p.endswith("; remove it, or name the variable the credential's program reads") for p in problems)


def test_tuning_reaches_the_pod_env(tmp_path: Path):
    variables = "".join(f"      {name}: '1'\n" for name in TUNING if name != "NCCL_DEBUG")
    plan = compile_text(TEXT.replace("      NCCL_DEBUG: WARN\n", f"      NCCL_DEBUG: WARN\n{variables}"), "k.yaml",
                        configs_root=tmp_path, settings=Settings.from_env())
    launch = TrainerLaunch(config_uri="s3://b/c.json", mlflow_tracking_uri="http://mlflow:5000", dag_id="d",
                           airflow_run_id="r", try_number=1)
    env = {variable.name: variable.value for variable in container_env(plan, launch)}
    assert {name: env.get(name) for name in TUNING} == {name: "WARN" if name == "NCCL_DEBUG" else "1" for name in TUNING}


def test_the_kubernetes_guide_lists_every_reserved_name():
    """docs/kubernetes.md keeps the list by hand: each exact name (beyond what trainpipe, torchrun and
    the proxies are), prefix and suffix of trainpipe.spec.environment is in it."""
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    own = {name for name, _ in trainer_environment()} | set(TORCHRUN_ENV) | {environment.SHUTDOWN_TIMEOUT_ENV}
    proxies = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}
    missing = [f"`{name}`" for name in environment._RESERVED_NAMES
               if name not in own | proxies and f"`{name}`" not in guide]
    missing += [f"`{prefix}*`" for prefix in environment._RESERVED_PREFIXES if f"`{prefix}*`" not in guide]
    missing += [f"`{suffix}`" for suffix in environment._RESERVED_SUFFIXES if f"`{suffix}`" not in guide]
    assert missing == []


def _kubelet_expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container variable's value (third_party/forked/golang/expansion): $(NAME)
    becomes the value of an earlier variable, $$ becomes $, anything else stays."""
    out, i = [], 0
    while i < len(value):
        if value[i] == "$" and i + 1 < len(value):
            if value[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if value[i + 1] == "(" and ")" in value[i + 2:]:
                end = value.index(")", i + 2)
                name = value[i + 2:end]
                out.append(env.get(name, value[i:end + 1]))
                i = end + 1
                continue
        out.append(value[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("written", ["$(MLFLOW_TRACKING_URI)", "{mlflow_tracking_uri}", "$$(MLFLOW_TRACKING_URI)",
                                     "a$b $(MLFLOW_TRACKING_TOKEN)"])
def test_a_spec_value_reaches_the_trainer_as_written_never_expanded_to_another_variable(written: str):
    """A value that names another variable (the kubelet's $(NAME), trainpipe's own {placeholder}) would
    put the tracking server's address, credentials included, into a variable the trainer prints
    (TORCH_LOGS echoes a bad value into the pod log). Escaped, the trainer sees the text itself."""
    server = "https://admin:S3CRET@mlflow.internal"
    plan = compile_text(TEXT.replace("      NCCL_DEBUG: WARN\n", f"      NCCL_DEBUG: WARN\n      TORCH_LOGS: '{written}'\n"),
                        "k.yaml", configs_root=REPO / "dag_configs", settings=Settings.from_env())
    launch = TrainerLaunch(config_uri="s3://b/c.json", mlflow_tracking_uri=server, dag_id="d", airflow_run_id="r",
                           try_number=1)
    variables = container_env(plan, launch)
    # What the kubelet hands the process: every plain variable expanded in order, as the kubelet does.
    seen: dict[str, str] = {}
    for variable in variables:
        if variable.value is not None:
            seen[variable.name] = _kubelet_expand(variable.value, seen)
    assert seen["TORCH_LOGS"] == written
    assert seen["MLFLOW_TRACKING_URI"] == server  # trainpipe's own placeholder is still filled


@pytest.mark.parametrize("name", ["TORCH_LOGS", "NCCL_DEBUG_SUBSYS", "TORCH_DISTRIBUTED_DEBUG", "RUN_NOTE"])
def test_a_secret_goes_only_into_a_credential_variable_never_one_a_program_prints(name: str):
    text = TEXT.replace("    env:\n      NCCL_DEBUG: WARN\n", f"    secret_env:\n      {name}: mlflow-credentials/password\n")
    (problem,) = _problems(text)
    assert f"training.kubernetes.secret_env.{name}: {name!r} is reserved (" in problem
    assert "a Secret's value goes only into a credential's variable" in problem
    # Plain, the same name is a tuning knob the spec may set.
    assert reserved_env_reason(name) is None
