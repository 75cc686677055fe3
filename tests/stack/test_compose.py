"""docker-compose.yaml, docker-compose.gpu.yaml, the Dockerfile and .env.example, checked without a
Docker engine (there is none on the CI machine).

The unit tests read the files as Docker Compose would (``yaml.safe_load`` with merge keys, then
``${VAR}`` interpolation) and hold them to the rules of the stack: services, health checks,
dependencies, volumes, the shared Airflow environment, pinned images, no inline secret, every
variable documented in ``.env.example``, and the same topology and settings as the native stack
(``tools/stack/trainpipe_stack.py``, what ``make stack`` runs). The integration tests run the two programs of the
compose file that can run here, with the arguments and environment the compose file gives them:
the airflow-init script (``deploy/airflow/init.py``) and the MLflow server command.
"""

from __future__ import annotations

import base64
import graphlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.moto_s3 import moto_s3_server
from tests.support import REPO

COMPOSE = REPO / "docker-compose.yaml"
GPU_OVERRIDE = REPO / "docker-compose.gpu.yaml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"

# One-shot services: they exit 0 and others wait for `service_completed_successfully`.
INIT_SERVICES = {"minio-init", "airflow-init"}
AIRFLOW_SERVICES = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
                    "airflow-worker"}
# Native service name -> compose service name: the native stack's moto server stands in for MinIO.
NATIVE_NAMES = {"s3": "minio"}

# Settings of the shared Airflow environment that the two stacks set differently on purpose.
# Native only: the api-server's bind address and port (compose keeps the image's 0.0.0.0:8080), the
# log servers' ports (the defaults could clash with other processes on one host), MinIO's endpoint
# for the MLflow client (in compose only the MLflow server reads the bucket for MLflow), and
# AIRFLOW_HOME (the base image sets /opt/airflow).
NATIVE_ONLY = {"AIRFLOW__API__HOST", "AIRFLOW__API__PORT", "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
               "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", "MLFLOW_S3_ENDPOINT_URL", "AIRFLOW_HOME"}
# Compose only: each container would otherwise sign log-server requests with its own random
# [api] secret_key (native processes share one airflow.cfg), and the scheduler's /health server
# backs the compose health check.
COMPOSE_ONLY = {"AIRFLOW__API__SECRET_KEY", "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"}
# Values that are the same in both stacks (the others name hosts, ports or paths).
SAME_VALUE = ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
              "AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW__CELERY__WORKER_CONCURRENCY",
              "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL", "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL",
              "AIRFLOW__DAG_PROCESSOR__FILE_PARSING_SORT_MODE", "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD",
              "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL", "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT",
              "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT",
              "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT",
              "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL",
              "TRAINPIPE_STORAGE_CONN_ID", "TRAINPIPE_STORAGE_ROOT", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT",
              "AWS_DEFAULT_REGION",
              "MLFLOW_DISABLE_TELEMETRY", "GX_ANALYTICS_ENABLED")

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")
_SECRET_KEY = re.compile(r"password|secret|key|token", re.IGNORECASE)
_REQUIRED_REFERENCE = re.compile(r"\$\{[A-Z0-9_]+:\?[^}]+\}")


# ---------------------------------------------------------------------------------------------
# reading the files as Docker Compose does


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's interpolation of every string in a loaded file: ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR:+alternative}``; ``$$`` is a literal ``$``."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        current = env.get(name)
        if op in (":?", "?") and (current is None or (op == ":?" and not current)):
            raise KeyError(f"{name}: {arg}")
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op == ":+":
            return arg if current else ""
        return current or ""

    return "$".join(_VARIABLE.sub(one, part) for part in value.split("$$"))


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for item in node.values():
            yield from strings(item)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, str):
        yield node


def env_mappings(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of every ``environment`` mapping and build ``args`` in a compose file."""
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("environment", "args") and isinstance(item, dict):
                yield from item.items()
            else:
                yield from env_mappings(item)
    elif isinstance(node, list):
        for item in node:
            yield from env_mappings(item)


def example_env() -> dict[str, str]:
    """``.env.example``'s assignments, commented-out optional ones included (with their defaults)."""
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"#?\s*([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            values[match[1]] = match[2]
    return values


def filled_env() -> dict[str, str]:
    """What a user's ``.env`` holds: ``.env.example``'s required values, each placeholder replaced."""
    required = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if match := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(.*)", line.strip()):
            required[match[1]] = f"{match[1].lower().replace('_', '')}0123" if match[2] == "change-me" else match[2]
    # A Fernet key has a format (32 bytes, urlsafe base64): Airflow refuses anything else.
    required["AIRFLOW_FERNET_KEY"] = base64.urlsafe_b64encode(b"compose-test-fernet-key-32-bytes").decode()
    return required


def image_tag(image: str) -> str:
    name = image.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else ""


def volume_source(entry: str | dict) -> str:
    return entry["source"] if isinstance(entry, dict) else entry.split(":", 1)[0]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "")
            for line in joined.splitlines() if (parts := line.strip().split(None, 1))]


def dockerfile_args(text: str) -> dict[str, str]:
    args = {}
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "ARG" and "=" in rest:
            name, default = rest.split("=", 1)
            args.setdefault(name.strip(), default.strip().strip('"'))
    return args


def dockerfile_env(text: str) -> dict[str, str]:
    env = {}
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "ENV":
            env.update(dict(pair.split("=", 1) for pair in rest.split()))
    return env


def locked_version(package: str) -> str:
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.lower().startswith(f"{package}=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"{package} is not pinned in requirements.lock")


@pytest.fixture(scope="module")
def raw() -> dict:
    """The compose file as loaded, before interpolation."""
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(raw: dict) -> dict[str, dict]:
    """Services after interpolation with a filled-in ``.env``."""
    return interpolate(raw, filled_env())["services"]


# ---------------------------------------------------------------------------------------------
# topology


def test_services_are_the_native_stack_plus_init_steps(raw: dict) -> None:
    from trainpipe_stack import SERVICES

    expected = {NATIVE_NAMES.get(name, name) for name in SERVICES} | INIT_SERVICES
    assert set(raw["services"]) == expected
    assert AIRFLOW_SERVICES <= expected


def test_service_keys_are_compose_keys(services: dict) -> None:
    # Keys of the Compose Specification's service object that a file like this one may use: a typo
    # (`healtcheck`, `depends-on`) is otherwise ignored by a YAML load and only fails on a Docker host.
    known = {"build", "command", "container_name", "depends_on", "deploy", "entrypoint", "environment", "env_file",
             "expose", "healthcheck", "image", "labels", "logging", "networks", "ports", "profiles", "restart",
             "shm_size", "stop_grace_period", "stop_signal", "user", "volumes", "working_dir"}
    for name, service in services.items():
        assert set(service) <= known, f"{name}: unknown keys {set(service) - known}"
        assert set(service.get("healthcheck", {})) <= {"test", "interval", "timeout", "retries", "start_period",
                                                       "start_interval", "disable"}, name
        for target, spec in service.get("depends_on", {}).items():
            assert set(spec) <= {"condition", "required", "restart"}, f"{name} -> {target}"


def test_long_running_services_have_health_checks_and_restart(services: dict) -> None:
    for name, service in services.items():
        if name in INIT_SERVICES:
            # A restart policy would re-run a finished init step forever.
            assert service.get("restart", "no") == "no", name
            continue
        check = service.get("healthcheck")
        assert check and not check.get("disable") and check.get("test"), f"{name}: no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert service.get("restart") in ("always", "unless-stopped"), name


def test_health_checks_probe_the_documented_endpoints(services: dict) -> None:
    assert "http://localhost:8080/api/v2/version" in services["airflow-apiserver"]["healthcheck"]["test"]
    assert "http://localhost:5000/health" in services["mlflow"]["healthcheck"]["test"]
    worker_probe = " ".join(services["airflow-worker"]["healthcheck"]["test"])
    from trainpipe_stack import CELERY_APP

    assert f"celery --app {CELERY_APP} inspect ping" in worker_probe


def test_every_dependency_exists_and_waits_for_a_condition(services: dict) -> None:
    for name, service in services.items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: depends_on must map each service to a condition"
        for target, spec in depends_on.items():
            assert target in services, f"{name} depends on unknown service {target}"
            expected = "service_completed_successfully" if target in INIT_SERVICES else "service_healthy"
            assert spec.get("condition") == expected, f"{name} -> {target}: condition {spec.get('condition')}"
            if expected == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}, which has no health check"
            # A service that a profile can leave out (while the dependent runs) must not be required,
            # and only such a one.
            optional = set(services[target].get("profiles", [])) - set(service.get("profiles", []))
            assert spec.get("required", True) is not bool(optional), f"{name} -> {target}"


def test_only_minio_is_optional_and_env_example_enables_it(services: dict) -> None:
    profiled = {name: service["profiles"] for name, service in services.items() if "profiles" in service}
    assert profiled == {"minio": ["minio"], "minio-init": ["minio"]}
    # Every other service must not need them: the real-bucket setup runs without the profile.
    for name, service in services.items():
        if name not in profiled:
            for target in service.get("depends_on", {}):
                assert target == "minio-init" or target not in profiled, f"{name} needs {target}"
    assert example_env()["COMPOSE_PROFILES"].split(",") == ["minio"]


def test_start_order_has_no_cycle_and_airflow_waits_for_init(services: dict) -> None:
    graph = {name: set(service.get("depends_on", {})) for name, service in services.items()}
    order = list(graphlib.TopologicalSorter(graph).static_order())
    assert order.index("airflow-init") < min(order.index(name) for name in AIRFLOW_SERVICES)
    for name in AIRFLOW_SERVICES:
        assert {"airflow-init", "postgres", "redis", "minio-init"} <= graph[name], name
    assert {"airflow-apiserver", "mlflow"} <= graph["airflow-worker"]
    assert {"postgres", "minio-init"} <= graph["mlflow"]


def test_volumes_are_declared_and_bind_mounts_exist(raw: dict, services: dict) -> None:
    declared = set(raw.get("volumes") or {})
    used = set()
    for name, service in services.items():
        for entry in service.get("volumes", []):
            source = volume_source(entry)
            if source.startswith(("./", "../", "/", "~")):
                assert source.startswith("./"), f"{name}: {source}: bind mounts are relative to the repository"
                assert (REPO / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared under volumes:"
                used.add(source)
    assert used == declared, f"declared but unused: {declared - used}"


def test_every_airflow_service_watches_the_mounted_dag_configs(services: dict) -> None:
    for name in AIRFLOW_SERVICES:
        service = services[name]
        target = service["environment"]["TRAINPIPE_DAG_CONFIGS"]
        mounts = {entry.split(":")[1]: entry for entry in service["volumes"] if entry.startswith("./dag_configs:")}
        assert target in mounts, f"{name}: ./dag_configs is not mounted at {target}"
    assert "TRAINPIPE_DAG_CONFIGS" in (REPO / "dags" / "trainpipe_dags.py").read_text()


def test_worker_can_be_scaled(services: dict) -> None:
    worker = services["airflow-worker"]
    assert "container_name" not in worker
    assert "ports" not in worker
    assert worker["command"] == "celery worker"


# ---------------------------------------------------------------------------------------------
# environment


def test_shared_airflow_environment(raw: dict, services: dict) -> None:
    common = raw["x-airflow-common"]["environment"]
    assert common["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert _REQUIRED_REFERENCE.fullmatch(common["AIRFLOW__API_AUTH__JWT_SECRET"])
    assert _REQUIRED_REFERENCE.fullmatch(common["AIRFLOW__CORE__FERNET_KEY"])
    api = urlparse(common["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    published = [entry.rsplit(":", 1)[1] for entry in services["airflow-apiserver"]["ports"]]
    assert (api.scheme, api.hostname, api.path) == ("http", "airflow-apiserver", "/execution/")
    assert [str(api.port)] == published
    assert services["airflow-apiserver"]["command"] == "api-server"
    storage = urlparse(services["airflow-worker"]["environment"]["TRAINPIPE_STORAGE_ROOT"])
    assert storage.scheme == "s3"
    mlflow_url = urlparse(common["MLFLOW_TRACKING_URI"])
    mlflow_args = services["mlflow"]["command"]
    assert (mlflow_url.hostname, str(mlflow_url.port)) == ("mlflow", mlflow_args[mlflow_args.index("--port") + 1])
    # Every Airflow service (and the init step) runs with the whole shared environment.
    for name in AIRFLOW_SERVICES | {"airflow-init"}:
        env = services[name]["environment"]
        shared = services["airflow-scheduler"]["environment"]
        assert {key: env.get(key) for key in shared} == shared, name


def test_airflow_environment_matches_the_native_stack(raw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainpipe_stack as stack

    class AnyKey(dict):
        def __missing__(self, key: str) -> str:
            return f"<{key}>"

    # The native environment starts from the caller's: start from nothing to see only the stack's own.
    for key in list(os.environ):
        monkeypatch.delenv(key)
    config = stack.StackConfig.from_env({})
    native = stack.airflow_env(config, AnyKey())
    # The image's own ENV (Dockerfile) plus the shared block, runtime settings only (not PIP_*).
    shared = interpolate(raw["x-airflow-common"]["environment"], filled_env())
    image = {key: value for key, value in dockerfile_env(DOCKERFILE.read_text()).items() if not key.startswith("PIP_")}
    compose = {**image, **shared}
    assert set(native) - NATIVE_ONLY == set(compose) - COMPOSE_ONLY
    for key in SAME_VALUE:
        assert compose[key] == native[key], key
    assert compose["TRAINPIPE_STORAGE_CONN_ID"] == stack.S3_CONN_ID
    # Same URL shapes, different hosts.
    for key in ("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                "AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND", "TRAINPIPE_OPTUNA_STORAGE"):
        ours, theirs = urlparse(compose[key]), urlparse(native[key])
        assert (ours.scheme, ours.username, ours.path) == (theirs.scheme, theirs.username, theirs.path), key


def test_every_postgres_url_names_an_installed_driver(services: dict) -> None:
    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which neither stack installs: the MLflow
    # server then fails at start with "No module named 'psycopg'".
    import importlib.util

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    stack_extra = " ".join(pyproject["optional-dependencies"]["stack"])
    urls = {text for text in strings(services) if "postgresql" in text and "://" in text}
    assert len(urls) == 4, urls  # Airflow metadata, Celery results, MLflow backend store, Optuna studies
    for url in urls:
        scheme = urlparse(url).scheme
        assert scheme.endswith("postgresql+psycopg2"), url
        assert importlib.util.find_spec("psycopg2") is not None
    assert "psycopg2" in stack_extra


def test_init_script_creates_the_connection_the_services_use(raw: dict) -> None:
    text = (REPO / "deploy" / "airflow" / "init.py").read_text()
    conn_id = re.search(r'^CONN_ID = "([^"]+)"', text, re.MULTILINE)[1]
    assert conn_id == raw["x-airflow-common"]["environment"]["TRAINPIPE_STORAGE_CONN_ID"]


# ---------------------------------------------------------------------------------------------
# images and secrets


def test_images_are_pinned() -> None:
    for path in (COMPOSE, GPU_OVERRIDE):
        for name, service in yaml.safe_load(path.read_text())["services"].items():
            image = service.get("image")
            assert image, f"{path.name}: {name}: no image (a built service needs a tagged image name too)"
            tag = image_tag(image)
            assert tag and tag != "latest" and re.search(r"\d", tag), f"{path.name}: {name}: {image} is not pinned"
            assert "$" not in image, f"{path.name}: {name}: image {image} depends on the environment"


def test_no_secret_is_written_in_the_compose_files() -> None:
    for path in (COMPOSE, GPU_OVERRIDE):
        loaded = yaml.safe_load(path.read_text())
        for key, value in env_mappings(loaded):
            # *_FILE variables hold a path to a secret, not the secret.
            if _SECRET_KEY.search(key) and not key.endswith("_FILE"):
                assert isinstance(value, str) and _REQUIRED_REFERENCE.fullmatch(value), \
                    f"{path.name}: {key}: {value!r} must be a ${{VAR:?...}} reference to .env"
        for text in strings(loaded):
            for match in re.finditer(r"://([^/@\s:]+):(.+?)@", text):
                assert _REQUIRED_REFERENCE.fullmatch(match[2]), f"{path.name}: password written in {text!r}"


def test_every_variable_is_in_env_example() -> None:
    documented = example_env()
    required = set(filled_env())
    used = set()
    for path in (COMPOSE, GPU_OVERRIDE):
        for text in strings(yaml.safe_load(path.read_text())):
            for match in _VARIABLE.finditer(text.replace("$$", "")):
                used.add(match["name"])
                assert match["name"] in documented, f"{path.name}: ${{{match['name']}}} is not in .env.example"
                if match["op"] == ":?":
                    assert match["name"] in required, f"{match['name']} is required: uncomment it in .env.example"
    # COMPOSE_* variables configure Docker Compose itself (COMPOSE_PROFILES), not the file.
    unused = {name for name in set(documented) - used if not name.startswith("COMPOSE_")}
    assert not unused, f".env.example lists unused variables: {unused}"
    # Placeholders only: a real secret never goes into the committed example.
    for name in required:
        if _SECRET_KEY.search(name) or name.endswith(("_USER", "_ID")):
            assert documented[name] == "change-me", name


def test_every_dollar_is_an_interpolation_or_escaped() -> None:
    # A bare $NAME would be filled from the shell running `docker compose`, not inside the container.
    for path in (COMPOSE, GPU_OVERRIDE):
        for text in strings(yaml.safe_load(path.read_text())):
            rest = _VARIABLE.sub("", text.replace("$$", ""))
            assert "$" not in rest, f"{path.name}: unescaped $ in {text!r} (write $$ for the container's shell)"


def test_env_file_is_ignored_by_git_and_docker() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "check-ignore", "--quiet", ".env"], cwd=REPO)
    assert probe.returncode == 0, ".env is not gitignored"
    assert ".env" in (REPO / ".dockerignore").read_text().split()


def test_every_secret_is_required_from_env() -> None:
    text = COMPOSE.read_text()
    for name in ("AIRFLOW_JWT_SECRET", "AIRFLOW_FERNET_KEY", "AIRFLOW_API_SECRET_KEY", "AIRFLOW_ADMIN_PASSWORD",
                 "POSTGRES_PASSWORD", "AIRFLOW_DB_PASSWORD", "MLFLOW_DB_PASSWORD", "MINIO_ROOT_PASSWORD",
                 "TRAINPIPE_S3_SECRET_ACCESS_KEY"):
        assert f"${{{name}:?set it in .env}}" in text, name
    with pytest.raises(KeyError, match="AIRFLOW_JWT_SECRET: set it in .env"):
        interpolate(yaml.safe_load(text), {key: value for key, value in filled_env().items()
                                           if key != "AIRFLOW_JWT_SECRET"})


# ---------------------------------------------------------------------------------------------
# GPU override and Dockerfile


def test_gpu_override_reserves_gpus_for_workers_only() -> None:
    override = yaml.safe_load(GPU_OVERRIDE.read_text())["services"]
    assert set(override) == {"airflow-worker"}
    devices = override["airflow-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    # The CUDA torch of the trainer image, so the worker trains on the same build as the pods.
    trainer_args = dockerfile_args((REPO / "trainer_image" / "Dockerfile").read_text())
    assert override["airflow-worker"]["build"]["args"]["TORCH_INDEX_URL"] == trainer_args["TORCH_INDEX_URL"]
    assert image_tag(override["airflow-worker"]["image"]) != image_tag(
        yaml.safe_load(COMPOSE.read_text())["x-airflow-image"]["image"])


def test_dockerfile_is_pinned_non_root_and_locked(raw: dict) -> None:
    text = DOCKERFILE.read_text()
    instructions = dockerfile_instructions(text)
    args = dockerfile_args(text)
    froms = [rest for keyword, rest in instructions if keyword == "FROM"]
    resolved = interpolate(froms[-1].split()[0], args)
    assert resolved == f"apache/airflow:{locked_version('apache-airflow')}-python3.11"
    # The torch CI tests with (the Makefile's pin) and the trainer image's.
    assert f'"torch=={args["TORCH_VERSION"]}"' in (REPO / "Makefile").read_text()
    trainer_image_args = dockerfile_args((REPO / "trainer_image" / "Dockerfile").read_text())
    assert args["TORCH_VERSION"] == trainer_image_args["TORCH_VERSION"]
    users = [rest.split(":")[0] for keyword, rest in instructions if keyword == "USER"]
    assert users[-1] not in ("root", "0"), "the image must end as a non-root user"
    assert re.search(r"pip install -c \S*requirements\.lock", text)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert set(args["PROVIDER_EXTRAS"].split(",")) <= set(pyproject["optional-dependencies"])
    trainer = tomllib.loads((REPO / "trainer_image" / "pyproject.toml").read_text())["project"]
    extras = re.search(r'"/src/trainer_image\[([a-z0-9,]+)\]"', text)[1]
    assert set(extras.split(",")) <= set(trainer["optional-dependencies"])
    shared = raw["x-airflow-common"]["environment"]
    assert dockerfile_env(text)["TRAINPIPE_DAG_CONFIGS"] == shared["TRAINPIPE_DAG_CONFIGS"]
    assert any(keyword == "COPY" and "dags/" in rest for keyword, rest in instructions)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".trainpipe", ".git", ".env"} <= set(ignored)


def _compose_cli() -> list[str] | None:
    if shutil.which("docker") is None:
        return None
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return ["docker", "compose"] if probe.returncode == 0 else None


@pytest.mark.skipif(_compose_cli() is None, reason="docker CLI with the compose plugin not installed")
@pytest.mark.parametrize("files", [["docker-compose.yaml"], ["docker-compose.yaml", "docker-compose.gpu.yaml"]])
def test_docker_compose_config_accepts_the_files(files: list[str], tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{key}={value}\n" for key, value in filled_env().items()))
    argv = [*_compose_cli(), "--project-directory", str(REPO), "--env-file", str(env_file)]
    for name in files:
        argv += ["-f", str(REPO / name)]
    result = subprocess.run([*argv, "config", "--quiet"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------
# the programs of the compose file that run here (integration)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} not up after {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 standing in for MinIO, with the bucket minio-init creates."""
    import boto3

    with moto_s3_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x").create_bucket(Bucket="trainpipe")
        yield endpoint


def _on_loopback(env: Mapping[str, str], moto: str) -> dict[str, str]:
    """A service's environment with the compose host names replaced by this machine's servers."""
    return {key: value.replace("http://minio:9000", moto) for key, value in env.items()}


@pytest.mark.integration
def test_airflow_init_migrates_writes_login_connection_and_demo_data(
    services: dict, moto_s3: str, airflow_db: Path, tmp_path: Path
) -> None:
    import boto3

    service = services["airflow-init"]
    assert service["command"] == ["python", "/opt/trainpipe/airflow-init.py"]
    mount = next(entry for entry in service["volumes"] if entry.endswith(":/opt/trainpipe/airflow-init.py:ro"))
    script = REPO / mount.split(":")[0]
    env = _on_loopback(service["environment"], moto_s3)
    passwords = tmp_path / "auth" / "passwords.json"
    env.update({
        # This session's SQLite metadata DB stands in for the postgres service.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
        "AIRFLOW_HOME": os.environ["AIRFLOW_HOME"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
    })

    def run(environment: dict[str, str]) -> str:
        done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done.stdout

    first = run(env)
    assert "demo data written to s3://trainpipe/storage/demo/" in first
    assert json.loads(passwords.read_text()) == {"admin": env["AIRFLOW_ADMIN_PASSWORD"]}
    assert passwords.stat().st_mode & 0o777 == 0o600
    assert env["AWS_SECRET_ACCESS_KEY"] not in first
    s3 = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1", aws_access_key_id="x",
                      aws_secret_access_key="x")
    listed = {item["Key"]: item["ETag"] for item in
              s3.list_objects_v2(Bucket="trainpipe", Prefix="storage/demo/")["Contents"]}
    assert set(listed) == {"storage/demo/transactions/transactions.parquet", "storage/demo/clicks/clicks.parquet",
                           "storage/demo/digits/digits.parquet", "storage/demo/tickets/tickets.parquet",
                           "storage/demo/instructions/instructions.parquet",
                           *(f"storage/demo/models/tiny-lm/{name}" for name in (
                               "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                               "tokenizer_config.json"))}

    # Again, with another key in .env: the connection follows .env; the demo data is left alone.
    second = run({**env, "AWS_SECRET_ACCESS_KEY": "rotated-secret-0123"})
    assert "demo data" not in second
    assert {item["Key"]: item["ETag"] for item in
            s3.list_objects_v2(Bucket="trainpipe", Prefix="storage/demo/")["Contents"]} == listed

    airflow = [str(Path(sys.executable).with_name("airflow")), "connections"]
    try:
        shown = subprocess.run([*airflow, "get", "trainpipe_s3", "--output", "json"], env=env, capture_output=True,
                               text=True, timeout=300, check=True)
        connection = json.loads(shown.stdout)[0]
        assert (connection["conn_type"], connection["login"], connection["password"]) == (
            "aws", env["AWS_ACCESS_KEY_ID"], "rotated-secret-0123")
        assert connection["extra_dejson"] == {"endpoint_url": moto_s3, "region_name": "us-east-1"}
        # Stored encrypted with the Fernet key from .env.
        assert str(connection["is_encrypted"]) == "True"  # the CLI prints every value as text
    finally:
        subprocess.run([*airflow, "delete", "trainpipe_s3"], env=env, capture_output=True, timeout=300, check=True)


@pytest.mark.integration
def test_mlflow_command_serves_artifacts_from_the_bucket_and_checks_hosts(
    raw: dict, services: dict, moto_s3: str, tmp_path: Path
) -> None:
    import boto3

    # Where trainpipe's MLflow hook puts each pipeline's experiment: <root>/<pipeline_id>.
    artifact_root = raw["x-airflow-common"]["environment"]["TRAINPIPE_MLFLOW_ARTIFACT_ROOT"]
    service = services["mlflow"]
    argv = list(service["command"])
    port = _free_port()
    argv[argv.index("--host") + 1] = "127.0.0.1"
    argv[argv.index("--port") + 1] = str(port)
    env = _on_loopback(service["environment"], moto_s3)
    assert env["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg2://mlflow:")
    # SQLite stands in for the postgres service; everything else is the compose file's.
    env["MLFLOW_BACKEND_STORE_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env["HOME"] = str(tmp_path)
    log = tmp_path / "mlflow.log"
    with log.open("w") as sink:
        server = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
                                  start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/health", server, log)

        def status(host: str) -> int:
            request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1",
                                             headers={"Host": host})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as error:
                return error.code

        # The names the workers and a browser on the host use are accepted, others refused.
        assert status("mlflow:5000") == 200
        assert status("localhost:5000") == 200
        assert status("attacker.example") == 403

        # A client with no bucket credentials at all logs an artifact; it lands in the bucket.
        client_env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "MLFLOW_"))}
        code = (
            "import mlflow\n"
            f"client = mlflow.MlflowClient(tracking_uri='{base}')\n"
            f"experiment = client.create_experiment('compose', artifact_location='{artifact_root}/compose')\n"
            "run = client.create_run(experiment)\n"
            "client.log_text(run.info.run_id, 'served', 'probe.txt')\n"
            "print(run.info.run_id)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], env=client_env, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        run_id = done.stdout.split()[-1]
        destination = urlparse(argv[argv.index("--artifacts-destination") + 1])
        s3 = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
        prefix = f"{destination.path.strip('/')}/{urlparse(artifact_root).path.strip('/')}"
        key = f"{prefix}/compose/{run_id}/artifacts/probe.txt"
        assert s3.get_object(Bucket=destination.netloc, Key=key)["Body"].read() == b"served"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
