"""The native stack (``make stack``): the docker-compose topology as local processes on loopback ports.

PostgreSQL (Airflow metadata, Celery results, MLflow backend store), Redis (Celery broker), an S3
endpoint (moto server, standing in for MinIO), the MLflow server (Postgres + S3 artifacts, served),
and Airflow's api-server, scheduler, dag-processor, triggerer and a Celery worker. All state lives
under ``TRAINPIPE_STACK_HOME`` (``.trainpipe/stack/``); each service logs to ``logs/<service>.log``
and is tracked by ``pids/<service>.pid``, so ``down`` stops exactly what ``up`` started.

    python tools/stack/trainpipe_stack.py up | down | status | restart SERVICE   (make stack, stack-down, stack-status)

A developer tool of this repository, not part of the provider package (the wheel does not ship it).

The service list and environment match ``docker-compose.yaml``; both follow
``docs/ARCHITECTURE.md`` ("The stack").
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainpipe.errors import TrainpipeError

HOST = "127.0.0.1"
ADMIN_USER = "admin"
S3_CONN_ID = "trainpipe_s3"
# The connection the example specs' `notify.email` names: the stack's mail sink.
SMTP_CONN_ID = "smtp_default"
S3_REGION = "us-east-1"
CELERY_APP = "airflow.providers.celery.executors.celery_executor.app"

# Start order (stores, MLflow, Airflow); ``down`` stops them the other way round.
BACKING = ("postgres", "redis", "s3", "mail")
AIRFLOW = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "airflow-worker")
SERVICES = (*BACKING, "mlflow", *AIRFLOW)

# How soon a written, edited or deleted spec is served, from 1 to 20,000 specs (docs/large-spec-folders.md,
# measured by benchmarks/spec_latency.py); docker-compose.yaml sets the same values.
DAG_PROCESSOR_SETTINGS = {
    # trainpipe's watcher in the dag-processor marks modified the DAG file whose specs were written,
    # edited or deleted (ADR 0022); sorted by modification time (the default mode, named because
    # trainpipe relies on it), that file is parsed next. The DAG files are listed and the queue
    # re-sorted every 10 s (default 300 s).
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
    "AIRFLOW__DAG_PROCESSOR__FILE_PARSING_SORT_MODE": "modified_time",
    # Unchanged DAG files are parsed again every 10 s (default 30 s). Large folders want 600 s with the
    # watcher (docs/large-spec-folders.md); on this stack, with 600 s, a dropped spec was not served
    # within the stack tier's 60 s (the watcher's mark did not reach its dag-processor; not yet
    # understood), so the stack keeps the interval that serves it in about 20 s.
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "10",
    # A deleted spec's DAG is marked stale when its file's next parse lacks it 10 s after the parse
    # that had it, looked for every 10 s (defaults 50 s and 60 s).
    "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "10",
    # A cold parse of a large folder (after an upgrade: the plan cache is keyed by the code) on a
    # busy machine: a DAG file's share may take longer than the default 30 s (ADR 0012).
    "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
    "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "180",
}

# Environment the stack's processes must not inherit: the Makefile exports the embedded (SQLite)
# configuration for `make demo`/`make test`, and a stray AWS or MLflow variable would point a service
# at another store.
_SCRUBBED_PREFIXES = ("AIRFLOW_", "AIRFLOW__", "MLFLOW_", "TRAINPIPE_", "AWS_", "FSSPEC_")


class StackError(TrainpipeError):
    """The stack could not be started, checked or stopped; the message names the log to read."""


# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True, slots=True, kw_only=True)
class Ports:
    airflow: int = 28080
    mlflow: int = 25000
    s3: int = 29000
    postgres: int = 25432
    redis: int = 26379
    worker_log: int = 28793
    triggerer_log: int = 28794
    smtp: int = 28025

    ENV = {
        "airflow": "TRAINPIPE_STACK_AIRFLOW_PORT",
        "mlflow": "TRAINPIPE_STACK_MLFLOW_PORT",
        "s3": "TRAINPIPE_STACK_S3_PORT",
        "postgres": "TRAINPIPE_STACK_POSTGRES_PORT",
        "redis": "TRAINPIPE_STACK_REDIS_PORT",
        "worker_log": "TRAINPIPE_STACK_WORKER_LOG_PORT",
        "triggerer_log": "TRAINPIPE_STACK_TRIGGERER_LOG_PORT",
        "smtp": "TRAINPIPE_STACK_SMTP_PORT",
    }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Ports:
        values = {}
        for name, variable in cls.ENV.items():
            raw = env.get(variable)
            if raw:
                if not raw.isdigit() or not 0 < int(raw) < 65536:
                    raise StackError(f"{variable}={raw!r}: expected a TCP port number (1-65535)")
                values[name] = int(raw)
        return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class StackConfig:
    """Where the stack keeps its state, which folder of specs it watches, and its ports."""

    repo: Path
    home: Path
    dag_configs: Path
    ports: Ports = field(default_factory=Ports)
    bucket: str = "trainpipe"
    worker_concurrency: int = 4
    env_file: Path | None = None
    # The platform policy (TRAINPIPE_POLICY): deploy/policy.yaml, or TRAINPIPE_STACK_POLICY ("none": no policy).
    policy: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StackConfig:
        env = os.environ if env is None else env
        repo = Path(__file__).resolve().parents[2]
        if not (repo / "dags" / "trainpipe_dags.py").is_file():
            raise StackError(f"the stack runs from a trainpipe source checkout; {repo} has no dags/trainpipe_dags.py")
        home = Path(env.get("TRAINPIPE_STACK_HOME") or repo / ".trainpipe" / "stack").resolve()
        dag_configs = Path(env.get("TRAINPIPE_DAG_CONFIGS") or repo / "dag_configs").resolve()
        concurrency = env.get("TRAINPIPE_STACK_WORKER_CONCURRENCY") or "4"
        if not concurrency.isdigit() or int(concurrency) < 1:
            raise StackError(f"TRAINPIPE_STACK_WORKER_CONCURRENCY={concurrency!r}: expected a whole number >= 1")
        env_file = Path(env["TRAINPIPE_STACK_ENV_FILE"]).resolve() if env.get("TRAINPIPE_STACK_ENV_FILE") else None
        return cls(repo=repo, home=home, dag_configs=dag_configs, ports=Ports.from_env(env),
                   bucket=env.get("TRAINPIPE_STACK_BUCKET") or "trainpipe", worker_concurrency=int(concurrency),
                   env_file=env_file, policy=_stack_policy(env, repo))

    # URLs -------------------------------------------------------------------------------------
    @property
    def airflow_url(self) -> str:
        return f"http://{HOST}:{self.ports.airflow}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.ports.mlflow}"

    @property
    def s3_url(self) -> str:
        return f"http://{HOST}:{self.ports.s3}"

    @property
    def storage_root(self) -> str:
        return f"s3://{self.bucket}/storage"

    # state ------------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def pids(self) -> Path:
        return self.home / "pids"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def pgdata(self) -> Path:
        return self.home / "postgres" / "data"

    @property
    def s3_dump(self) -> Path:
        return self.home / "s3"

    @property
    def urls_file(self) -> Path:
        return self.home / "urls.json"

    @property
    def mail(self) -> Path:
        """The mail sink's folder: one ``.eml`` file per message sent through ``smtp_default``."""
        return self.home / "mail"

    @property
    def cli_env_file(self) -> Path:
        """``export NAME=value`` lines pointing the trainpipe, airflow and MLflow clients at the stack."""
        return self.home / "cli.env"


def load_secrets(config: StackConfig) -> dict[str, str]:
    """Passwords and keys, generated on the first ``up`` and kept (the Fernet key encrypts what the DB holds)."""
    path = config.home / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    from cryptography.fernet import Fernet

    values = {
        "postgres_password": secrets.token_urlsafe(18),
        "airflow_db_password": secrets.token_urlsafe(18),
        "mlflow_db_password": secrets.token_urlsafe(18),
        "admin_password": secrets.token_urlsafe(12),
        "jwt_secret": secrets.token_urlsafe(32),
        "fernet_key": Fernet.generate_key().decode(),
        "s3_access_key": "trainpipe",
        "s3_secret_key": secrets.token_urlsafe(18),
    }
    config.home.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(values, handle, indent=2)
    return values


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}


def s3_env(config: StackConfig, keys: Mapping[str, str]) -> dict[str, str]:
    """What a process needs to reach the stack's bucket directly (boto3, s3fs, the MLflow server)."""
    return {
        "AWS_ACCESS_KEY_ID": keys["s3_access_key"],
        "AWS_SECRET_ACCESS_KEY": keys["s3_secret_key"],
        "AWS_DEFAULT_REGION": S3_REGION,
        # botocore (so s3fs, which the trainer uses) reads the endpoint from here.
        "AWS_ENDPOINT_URL": config.s3_url,
        "MLFLOW_S3_ENDPOINT_URL": config.s3_url,
    }


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments); ``KEY=`` with nothing after it removes the stack's value."""
    if not path.is_file():
        raise StackError(f"TRAINPIPE_STACK_ENV_FILE={path}: no such file")
    values = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.removeprefix("export ").strip()
        if not sep or not key.replace("_", "").isalnum():
            raise StackError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        values[key] = value.strip().strip("'\"")
    return values


def _stack_policy(env: Mapping[str, str], repo: Path) -> Path | None:
    configured = env.get("TRAINPIPE_STACK_POLICY")
    if configured is None:
        return repo / "deploy" / "policy.yaml"
    return None if configured.strip().lower() in ("", "none") else Path(configured).resolve()


def smtp_connection(host: str, port: int) -> str:
    """``smtp_default`` as an ``AIRFLOW_CONN_`` JSON value: a local sink that takes mail without TLS or login."""
    return json.dumps({"conn_type": "smtp", "host": host, "port": port,
                       # The sender when a spec's notify.email names none (the examples do not).
                       "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0, "timeout": 10,
                                 "from_email": "trainpipe@localhost"}})


def s3_connection(config: StackConfig, keys: Mapping[str, str]) -> dict[str, str]:
    """``trainpipe_s3``: the stack's S3 endpoint and keys (imported into the services' DB, exported to clients)."""
    return {
        "conn_type": "aws",
        "description": "trainpipe storage (the stack's S3 endpoint)",
        "login": keys["s3_access_key"],
        "password": keys["s3_secret_key"],
        "extra": json.dumps({"endpoint_url": config.s3_url, "region_name": S3_REGION}),
    }


def cli_env(config: StackConfig, keys: Mapping[str, str]) -> dict[str, str]:
    """What a shell needs for ``trainpipe``, ``airflow`` and MLflow clients to work on the stack: the same
    storage root, connection, tracking server, specs folder and metadata database as the services.
    S3 credentials travel only inside the Airflow connection (no ``AWS_*`` variables)."""
    services = airflow_env(config, keys)
    shared = ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__CORE__LOAD_EXAMPLES",
              "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__API__BASE_URL", "AIRFLOW__API_AUTH__JWT_SECRET",
              "TRAINPIPE_HOME", "TRAINPIPE_DAG_CONFIGS", "TRAINPIPE_STORAGE_ROOT", "TRAINPIPE_STORAGE_CONN_ID",
              "TRAINPIPE_OPTUNA_STORAGE", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT", "MLFLOW_TRACKING_URI",
              "MLFLOW_DISABLE_TELEMETRY", "GX_ANALYTICS_ENABLED", f"AIRFLOW_CONN_{SMTP_CONN_ID.upper()}",
              "TRAINPIPE_POLICY")
    values = {key: services[key] for key in shared if key in services}
    values[f"AIRFLOW_CONN_{S3_CONN_ID.upper()}"] = json.dumps(
        {**s3_connection(config, keys), "extra": json.loads(s3_connection(config, keys)["extra"])})
    return values


def cli_env_text(values: Mapping[str, str]) -> str:
    import shlex

    lines = ["# Written by `make stack`: point the trainpipe, airflow and MLflow clients at the stack.",
             "# Use: source .trainpipe/stack/cli.env   (holds the stack's keys: keep it private)"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def airflow_env(config: StackConfig, keys: Mapping[str, str]) -> dict[str, str]:
    """The environment of every Airflow service; docker-compose.yaml sets the same variables.

    ``TRAINPIPE_STACK_ENV_FILE`` adds to it or replaces any of it (a real bucket, a shared MLflow)."""
    ports = config.ports
    db = f"airflow:{keys['airflow_db_password']}@{HOST}:{ports.postgres}/airflow"
    env = {
        **_base_env(),
        **s3_env(config, keys),
        "AIRFLOW_HOME": str(config.airflow_home),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(config.repo / "dags"),
        "AIRFLOW__CORE__FERNET_KEY": keys["fernet_key"],
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(config.airflow_home / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
        # Hyperparameter-search studies (tuning:): a database of the airflow role, as in compose.
        "TRAINPIPE_OPTUNA_STORAGE": f"postgresql+psycopg2://{db.rsplit('/', 1)[0]}/optuna",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://{HOST}:{ports.redis}/0",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{db}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(config.worker_concurrency),
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(ports.airflow),
        "AIRFLOW__API__BASE_URL": config.airflow_url,
        # Every component reaches the task execution API here, and all of them sign and check its
        # tokens with one secret (without it: "Signature verification failed").
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.airflow_url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": keys["jwt_secret"],
        **DAG_PROCESSOR_SETTINGS,
        # A task whose worker died is failed, and so retried, after 60 s without a heartbeat (default 300).
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports.worker_log),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports.triggerer_log),
        # The connection the examples' notify.email names: the stack's mail sink (no TLS, no login).
        f"AIRFLOW_CONN_{SMTP_CONN_ID.upper()}": smtp_connection(HOST, ports.smtp),
        "TRAINPIPE_HOME": str(config.home / "trainpipe"),
        "TRAINPIPE_DAG_CONFIGS": str(config.dag_configs),
        "TRAINPIPE_STORAGE_ROOT": config.storage_root,
        "TRAINPIPE_STORAGE_CONN_ID": S3_CONN_ID,
        **({"TRAINPIPE_POLICY": str(config.policy)} if config.policy is not None else {}),
        "MLFLOW_TRACKING_URI": config.mlflow_url,
        # Experiments store artifacts through the MLflow server (workers need no bucket access for
        # models). No host in the URI: clients resolve it against MLFLOW_TRACKING_URI, and the server
        # refuses host-addressed artifact locations.
        "TRAINPIPE_MLFLOW_ARTIFACT_ROOT": "mlflow-artifacts:///experiments",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "GX_ANALYTICS_ENABLED": "false",
        "TORCH_EXTENSIONS_DIR": str(config.home / "torch_extensions"),
        "PYTHONUNBUFFERED": "1",
    }
    for key, value in (read_env_file(config.env_file) if config.env_file else {}).items():
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    return env


# ---------------------------------------------------------------------------------------------
# services


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int | None
    healthy: Callable[[], bool]
    user: str | None = None
    stop_signal: int = signal.SIGTERM
    start_timeout: float = 180.0


def _bin(name: str) -> str:
    """An executable of this interpreter's environment (the venv), then PATH."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found next to {sys.executable} or on PATH; run `make install`")
    return found


def postgres_bindir() -> Path:
    """The PostgreSQL server binaries (Debian keeps them out of PATH, in /usr/lib/postgresql/<version>/bin)."""
    if configured := os.environ.get("TRAINPIPE_STACK_PG_BINDIR"):
        return Path(configured)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("postgres")
    if found:
        return Path(found).resolve().parent
    raise StackError("PostgreSQL is not installed: `make stack` installs it on Debian when run as root "
                     "(apt-get install postgresql), or set TRAINPIPE_STACK_PG_BINDIR to its bin folder")


def _postgres_user() -> str | None:
    """PostgreSQL refuses to run as root: run it as the package's `postgres` user then."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise StackError("running as root, and there is no `postgres` user to run PostgreSQL as; "
                         "install the postgresql package (it creates the user)") from None
    return "postgres"


def _smtp_ready(port: int) -> bool:
    import smtplib

    try:
        with smtplib.SMTP(HOST, port, timeout=3) as smtp:
            return smtp.noop()[0] == 250
    except OSError:
        return False


class MailFolder:
    """aiosmtpd handler: each message becomes ``<UTC time>-<n>.eml`` in the folder (written whole, then renamed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0

    async def handle_DATA(self, server, session, envelope) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count += 1
        name = f"{datetime.now(UTC):%Y%m%dT%H%M%S.%fZ}-{self.count}.eml"
        partial = self.folder / f".{name}.partial"
        partial.write_bytes(envelope.original_content or envelope.content)
        os.replace(partial, self.folder / name)
        return "250 OK"


def run_mail_sink(port: int, folder: Path) -> None:
    """The stack's SMTP server on loopback until SIGTERM (aiosmtpd, from the dev extra)."""
    import threading

    from aiosmtpd.controller import Controller

    folder.mkdir(parents=True, exist_ok=True)
    controller = Controller(MailFolder(folder), hostname=HOST, port=port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    controller.start()
    try:
        stop.wait()
    finally:
        controller.stop()


def _http_ok(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_json(url: str, timeout: float = 3.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def airflow_component_healthy(config: StackConfig, component: str) -> bool:
    """``GET /api/v2/monitor/health``: the scheduler, triggerer and dag-processor heartbeats in the DB."""
    health = _http_json(f"{config.airflow_url}/api/v2/monitor/health")
    return bool(health) and (health.get(component) or {}).get("status") == "healthy"


def celery_worker_name() -> str:
    return f"trainpipe@{socket.gethostname()}"


def celery_ping(config: StackConfig, keys: Mapping[str, str]) -> bool:
    """``celery inspect ping`` against this stack's worker (the compose file's worker health check)."""
    result = subprocess.run(
        [_bin("celery"), "--app", CELERY_APP, "inspect", "ping", "--destination", celery_worker_name(), "--timeout", "5"],
        env=airflow_env(config, keys), capture_output=True, text=True, timeout=120, cwd=config.home,
    )
    return result.returncode == 0 and "pong" in result.stdout


def services(config: StackConfig, keys: Mapping[str, str]) -> dict[str, Service]:
    ports = config.ports
    bindir = postgres_bindir()
    afenv = airflow_env(config, keys)
    airflow = _bin("airflow")
    mlflow_db = f"mlflow:{keys['mlflow_db_password']}@{HOST}:{ports.postgres}/mlflow"
    pg_isready = bindir / "pg_isready"
    return {
        "postgres": Service(
            name="postgres",
            # No Unix socket: clients (and pg_isready) use TCP on loopback.
            argv=(str(bindir / "postgres"), "-D", str(config.pgdata), "-p", str(ports.postgres),
                  "-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=", "-c", "max_connections=200"),
            env={**_base_env(), "LC_ALL": "C.UTF-8"},
            port=ports.postgres,
            healthy=lambda: subprocess.run([str(pg_isready), "-q", "-h", HOST, "-p", str(ports.postgres)],
                                           timeout=10).returncode == 0,
            user=_postgres_user(),
            # SIGINT is Postgres' "fast" shutdown; SIGTERM would wait for every client to disconnect.
            stop_signal=signal.SIGINT,
            start_timeout=60,
        ),
        "redis": Service(
            name="redis",
            argv=(_redis_server(), "--bind", HOST, "--port", str(ports.redis), "--dir", str(config.home / "redis"),
                  "--daemonize", "no", "--protected-mode", "yes", "--appendonly", "yes", "--save", "60 1"),
            env=_base_env(),
            port=ports.redis,
            healthy=lambda: redis_ping(ports.redis),
            start_timeout=30,
        ),
        "s3": Service(
            name="s3",
            argv=(_bin("moto_server"), "-H", HOST, "-p", str(ports.s3)),
            env={**_base_env(), **s3_env(config, keys)},
            port=ports.s3,
            healthy=lambda: _http_ok(f"{config.s3_url}/moto-api/data.json"),
            start_timeout=60,
        ),
        "mail": Service(
            name="mail",
            # smtp_default's server: keeps every message as a file (the approval example's mails can be read).
            argv=(sys.executable, str(Path(__file__).resolve()), "mail-sink", "--port", str(ports.smtp),
                  "--folder", str(config.mail)),
            env=_base_env(),
            port=ports.smtp,
            healthy=lambda: _smtp_ready(ports.smtp),
            start_timeout=30,
        ),
        "mlflow": Service(
            name="mlflow",
            argv=(_bin("mlflow"), "server", "--backend-store-uri", f"postgresql+psycopg2://{mlflow_db}",
                  "--artifacts-destination", f"s3://{config.bucket}/mlflow", "--serve-artifacts",
                  "--host", HOST, "--port", str(ports.mlflow), "--workers", "1"),
            # No job runner: its seven worker processes serve GenAI features (scorers, trace rollups)
            # that training pipelines do not use.
            env={**_base_env(), **s3_env(config, keys), "MLFLOW_DISABLE_TELEMETRY": "true",
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            port=ports.mlflow,
            healthy=lambda: _http_ok(f"{config.mlflow_url}/health"),
        ),
        "airflow-apiserver": Service(
            name="airflow-apiserver",
            argv=(airflow, "api-server", "--host", HOST, "--port", str(ports.airflow), "--workers", "1"),
            env=afenv, port=ports.airflow,
            healthy=lambda: _http_ok(f"{config.airflow_url}/api/v2/version"),
        ),
        "airflow-scheduler": Service(
            name="airflow-scheduler", argv=(airflow, "scheduler"), env=afenv, port=None,
            healthy=lambda: airflow_component_healthy(config, "scheduler"),
        ),
        "airflow-dag-processor": Service(
            name="airflow-dag-processor", argv=(airflow, "dag-processor"), env=afenv, port=None,
            healthy=lambda: airflow_component_healthy(config, "dag_processor"),
        ),
        "airflow-triggerer": Service(
            name="airflow-triggerer", argv=(airflow, "triggerer"), env=afenv, port=ports.triggerer_log,
            healthy=lambda: airflow_component_healthy(config, "triggerer"),
        ),
        "airflow-worker": Service(
            name="airflow-worker",
            argv=(airflow, "celery", "worker", "--celery-hostname", celery_worker_name(),
                  "--concurrency", str(config.worker_concurrency), "--without-gossip", "--without-mingle"),
            env=afenv, port=ports.worker_log,
            healthy=lambda: celery_ping(config, keys),
        ),
    }


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise StackError("redis-server is not installed: `make stack` installs it on Debian when run as root "
                         "(apt-get install redis-server)")
    return found


# ---------------------------------------------------------------------------------------------
# processes: started in their own session, remembered by PID and start time


@dataclass(frozen=True, slots=True)
class Stack:
    config: StackConfig

    @property
    def keys(self) -> dict[str, str]:
        return load_secrets(self.config)

    def service(self, name: str) -> Service:
        return services(self.config, self.keys)[name]

    # pid files --------------------------------------------------------------------------------
    def _pidfile(self, name: str) -> Path:
        return self.config.pids / f"{name}.pid"

    def process(self, name: str):
        """The running process of a service, or None; a PID reused by another program is not ours."""
        import psutil

        path = self._pidfile(name)
        if not path.exists():
            return None
        record = json.loads(path.read_text())
        try:
            proc = psutil.Process(record["pid"])
            if abs(proc.create_time() - record["create_time"]) > 1 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return proc

    def running(self) -> dict[str, int]:
        return {name: proc.pid for name in SERVICES if (proc := self.process(name)) is not None}

    # start ------------------------------------------------------------------------------------
    def start(self, service: Service) -> None:
        import psutil

        if self.process(service.name) is not None:
            return
        if service.port is not None and not _port_free(service.port):
            variable = next((v for k, v in Ports.ENV.items() if getattr(self.config.ports, k) == service.port), "")
            raise StackError(f"{service.name}: port {HOST}:{service.port} is already in use by another program; "
                             f"stop it or choose another port with {variable}=<port>")
        self.config.logs.mkdir(parents=True, exist_ok=True)
        self.config.pids.mkdir(parents=True, exist_ok=True)
        log = self.config.logs / f"{service.name}.log"
        with log.open("ab") as handle:
            handle.write(f"\n--- {datetime.now(UTC).isoformat()} start: {' '.join(service.argv)}\n".encode())
            handle.flush()
            proc = subprocess.Popen(
                list(service.argv), env=dict(service.env), stdin=subprocess.DEVNULL, stdout=handle,
                stderr=subprocess.STDOUT, cwd=self.config.home, start_new_session=True, user=service.user,
            )
        record = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(), "argv": list(service.argv)}
        self._pidfile(service.name).write_text(json.dumps(record))

    def wait_healthy(self, service: Service) -> None:
        deadline = time.monotonic() + service.start_timeout
        while True:
            if self.process(service.name) is None:
                raise StackError(f"{service.name} exited during start-up:\n{self.log_tail(service.name)}")
            if service.healthy():
                return
            if time.monotonic() > deadline:
                raise StackError(f"{service.name} not healthy after {service.start_timeout:.0f} s:\n"
                                 f"{self.log_tail(service.name)}")
            time.sleep(1)

    def log_tail(self, name: str, lines: int = 30) -> str:
        log = self.config.logs / f"{name}.log"
        text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else ["(no log)"]
        return f"  (log: {log})\n" + "\n".join("  | " + line for line in text)

    # stop -------------------------------------------------------------------------------------
    def stop(self, name: str, *, timeout: float = 30.0, kill: bool = False) -> bool:
        """Stop a service and every process it started (its children may have left its session,
        like torchrun). ``kill`` sends SIGKILL at once: a crash, as the retry tests need."""
        import psutil

        proc = self.process(name)
        if proc is None:
            self._pidfile(name).unlink(missing_ok=True)  # stale: its process is gone
            return False
        try:
            tree = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            tree = [proc]
        if kill:
            for member in tree:
                _signal(member, signal.SIGKILL)
            psutil.wait_procs(tree, timeout=10)
        else:
            # The service's whole session (it was started with one of its own): server workers and
            # helpers stop together instead of each waiting for its parent to pass the signal on.
            try:
                os.killpg(proc.pid, self.service(name).stop_signal)
            except OSError:
                _signal(proc, self.service(name).stop_signal)
            _, alive = psutil.wait_procs(tree, timeout=timeout)
            for member in alive:
                _signal(member, signal.SIGTERM)
            _, alive = psutil.wait_procs(alive, timeout=10)
            for member in alive:
                _signal(member, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=10)
        self._pidfile(name).unlink(missing_ok=True)
        return True

    # the whole stack --------------------------------------------------------------------------
    def up(self, *, log: Callable[[str], None] = print) -> dict[str, str]:
        config = self.config
        started = time.monotonic()
        config.home.mkdir(parents=True, exist_ok=True)
        config.dag_configs.mkdir(parents=True, exist_ok=True)
        self._check_same_config()
        keys = self.keys
        svc = services(config, keys)
        _prepare_postgres(config, keys, svc["postgres"].user)
        (config.home / "redis").mkdir(parents=True, exist_ok=True)
        (config.home / "trainpipe").mkdir(parents=True, exist_ok=True)

        already = self.running()
        for name in BACKING:
            self.start(svc[name])
        self._wait_all([svc[name] for name in BACKING])
        log(f"postgres, redis, s3 healthy ({time.monotonic() - started:.0f} s)")
        _create_databases(config, keys)
        s3_restored = _prepare_bucket(config, keys) if "s3" not in already else 0
        if s3_restored:
            log(f"s3: restored {s3_restored} objects from {config.s3_dump}")
        self.start(svc["mlflow"])
        with ThreadPoolExecutor(max_workers=2) as pool:
            init = pool.submit(self._airflow_init, keys)
            pool.submit(_upload_demo_data, config, keys).result()
            init.result()
        log(f"airflow init done ({time.monotonic() - started:.0f} s)")
        for name in AIRFLOW:
            self.start(svc[name])
        self._wait_all([svc[name] for name in ("mlflow", *AIRFLOW)])
        urls = {
            "airflow": config.airflow_url,
            "mlflow": config.mlflow_url,
            "s3": config.s3_url,
            "username": ADMIN_USER,
            "password": keys["admin_password"],
            "dag_configs": str(config.dag_configs),
        }
        config.urls_file.write_text(json.dumps(urls, indent=2) + "\n")
        _write_private(config.cli_env_file, cli_env_text(cli_env(config, keys)))
        (config.home / "running.json").write_text(json.dumps(self._identity(), indent=2))
        log(f"stack healthy in {time.monotonic() - started:.0f} s")
        return urls

    def down(self, *, log: Callable[[str], None] = print) -> list[str]:
        """Stop every service this stack started: Airflow's together, then MLflow, then the stores
        (S3 objects saved first)."""
        stopped = []

        def stop(name: str) -> None:
            began = time.monotonic()
            if self.stop(name):
                stopped.append(name)
                log(f"stopped {name} ({time.monotonic() - began:.0f} s)")

        with ThreadPoolExecutor(max_workers=len(AIRFLOW)) as pool:
            list(pool.map(stop, AIRFLOW))
        stop("mlflow")
        if self.process("s3") is not None:
            count = _dump_buckets(self.config, self.keys)
            log(f"s3: saved {count} objects to {self.config.s3_dump}")
        with ThreadPoolExecutor(max_workers=len(BACKING)) as pool:
            list(pool.map(stop, BACKING))
        self.config.urls_file.unlink(missing_ok=True)
        (self.config.home / "running.json").unlink(missing_ok=True)
        return stopped

    def restart(self, name: str) -> None:
        service = self.service(name)
        self.stop(name)
        self.start(service)
        self.wait_healthy(service)

    def _wait_all(self, pending: Iterable[Service]) -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            for future in [pool.submit(self.wait_healthy, s) for s in pending]:
                future.result()

    def _identity(self) -> dict[str, Any]:
        return {"dag_configs": str(self.config.dag_configs), "ports": {k: getattr(self.config.ports, k) for k in Ports.ENV},
                "bucket": self.config.bucket, "env_file": str(self.config.env_file or "")}

    def _check_same_config(self) -> None:
        current = self.config.home / "running.json"
        if self.running() and current.exists() and json.loads(current.read_text()) != self._identity():
            raise StackError(f"the stack in {self.config.home} is running with other settings "
                             f"({current.read_text().strip()}); run `make stack-down` first")

    def _airflow_init(self, keys: Mapping[str, str]) -> None:
        """The compose file's airflow-init: migrate the DB, the admin password, the S3 connection."""
        config = self.config
        env = airflow_env(config, keys)
        config.airflow_home.mkdir(parents=True, exist_ok=True)
        # `airflow db migrate` costs half a minute even with nothing to do: skip it while the database
        # is at the revision this Airflow version migrated it to.
        marker = config.airflow_home / "migrated.json"
        current = {"airflow": importlib.metadata.version("apache-airflow-core"), "revision": _db_revision(config, keys)}
        if not marker.exists() or json.loads(marker.read_text()) != current or current["revision"] is None:
            _run([_bin("airflow"), "db", "migrate"], env=env, log=config.logs / "airflow-init.log", cwd=config.home)
            marker.write_text(json.dumps({**current, "revision": _db_revision(config, keys)}))
        passwords = config.airflow_home / "passwords.json"
        _write_private(passwords, json.dumps({ADMIN_USER: keys["admin_password"]}) + "\n")
        connections = {S3_CONN_ID: s3_connection(config, keys)}
        # Imported again (another Airflow start-up) only when it changed or is gone from the database.
        digest = hashlib.sha256(json.dumps(connections, sort_keys=True).encode()).hexdigest()
        imported = config.airflow_home / "connections.sha256"
        if imported.exists() and imported.read_text() == digest and _connection_exists(config, keys, S3_CONN_ID):
            return
        with tempfile.TemporaryDirectory(dir=config.home) as scratch:
            path = Path(scratch) / "connections.json"
            _write_private(path, json.dumps(connections))
            _run([_bin("airflow"), "connections", "import", str(path), "--overwrite"], env=env,
                 log=config.logs / "airflow-init.log", cwd=config.home)
        imported.write_text(digest)


def _signal(proc, signum: int) -> None:
    import psutil

    try:
        proc.send_signal(signum)
    except psutil.Error:
        pass


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _run(argv: list[str], *, env: Mapping[str, str], log: Path, cwd: Path, user: str | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"\n--- {datetime.now(UTC).isoformat()} {' '.join(argv)}\n".encode())
        handle.flush()
        result = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                cwd=cwd, user=user, timeout=600)
    if result.returncode != 0:
        tail = "\n".join("  | " + line for line in log.read_text(errors="replace").splitlines()[-30:])
        raise StackError(f"{argv[0]} {argv[1]} failed with exit code {result.returncode} (log: {log}):\n{tail}")


# ---------------------------------------------------------------------------------------------
# PostgreSQL


def _prepare_postgres(config: StackConfig, keys: Mapping[str, str], user: str | None) -> None:
    """A cluster of our own under the state folder, created on the first ``up``."""
    if (config.pgdata / "PG_VERSION").exists():
        return
    config.pgdata.mkdir(parents=True, exist_ok=True)
    os.chmod(config.pgdata, 0o700)
    if user is not None:
        shutil.chown(config.pgdata, user, user)
        shutil.chown(config.pgdata.parent, user, user)
        probe = subprocess.run(["test", "-w", str(config.pgdata)], user=user)
        if probe.returncode != 0:
            raise StackError(f"the `{user}` user cannot reach {config.pgdata}: PostgreSQL runs as that user when "
                             "started by root, so every folder above the checkout needs o+x "
                             "(e.g. chmod o+x on the home folder), or set TRAINPIPE_STACK_HOME to a folder it can reach")
    pwfile = config.pgdata.parent / "pwfile"
    _write_private(pwfile, keys["postgres_password"] + "\n")
    if user is not None:
        shutil.chown(pwfile, user, user)
    try:
        _run([str(postgres_bindir() / "initdb"), "-D", str(config.pgdata), "-U", "postgres", f"--pwfile={pwfile}",
              "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
             env={**_base_env(), "LC_ALL": "C.UTF-8"}, log=config.logs / "postgres-init.log", cwd=config.pgdata.parent,
             user=user)
    finally:
        pwfile.unlink(missing_ok=True)


def _db_revision(config: StackConfig, keys: Mapping[str, str]) -> str | None:
    """The Airflow database's Alembic revision, None before the first migration."""
    import psycopg2

    connection = psycopg2.connect(host=HOST, port=config.ports.postgres, user="airflow",
                                  password=keys["airflow_db_password"], dbname="airflow")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass('alembic_version') IS NOT NULL")
            if not cursor.fetchone()[0]:
                return None
            cursor.execute("SELECT version_num FROM alembic_version")
            row = cursor.fetchone()
            return row[0] if row else None
    finally:
        connection.close()


def _connection_exists(config: StackConfig, keys: Mapping[str, str], conn_id: str) -> bool:
    import psycopg2

    connection = psycopg2.connect(host=HOST, port=config.ports.postgres, user="airflow",
                                  password=keys["airflow_db_password"], dbname="airflow")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM connection WHERE conn_id = %s", (conn_id,))
            return cursor.fetchone() is not None
    finally:
        connection.close()


def _create_databases(config: StackConfig, keys: Mapping[str, str]) -> None:
    """Roles and databases for Airflow, MLflow and Optuna (idempotent; passwords follow secrets.json)."""
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(host=HOST, port=config.ports.postgres, user="postgres",
                                  password=keys["postgres_password"], dbname="postgres")
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            for name, password in (("airflow", keys["airflow_db_password"]), ("mlflow", keys["mlflow_db_password"])):
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
                verb = "ALTER" if cursor.fetchone() else "CREATE"
                cursor.execute(sql.SQL(verb + " ROLE {} WITH LOGIN PASSWORD %s").format(sql.Identifier(name)),
                               (password,))
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if not cursor.fetchone():
                    cursor.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name),
                                                                               sql.Identifier(name)))
            # Optuna's studies (TRAINPIPE_OPTUNA_STORAGE), owned by the role Airflow's tasks connect as.
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = 'optuna'")
            if not cursor.fetchone():
                cursor.execute("CREATE DATABASE optuna OWNER airflow")
    finally:
        connection.close()


# ---------------------------------------------------------------------------------------------
# S3 (moto keeps objects in memory: `down` saves them under s3/, `up` loads them back)


def s3_client(config: StackConfig, keys: Mapping[str, str]):
    import boto3

    return boto3.client("s3", endpoint_url=config.s3_url, region_name=S3_REGION,
                        aws_access_key_id=keys["s3_access_key"], aws_secret_access_key=keys["s3_secret_key"])


def _prepare_bucket(config: StackConfig, keys: Mapping[str, str]) -> int:
    """Create the bucket (the compose file's minio-init) and restore what the last ``down`` saved."""
    client = s3_client(config, keys)
    restored = 0
    manifest = config.s3_dump / "manifest.json"
    saved = json.loads(manifest.read_text()) if manifest.exists() else {}
    for bucket in sorted({config.bucket, *saved}):
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket)
        for key, blob in saved.get(bucket, {}).items():
            client.put_object(Bucket=bucket, Key=key, Body=(config.s3_dump / "objects" / blob).read_bytes())
            restored += 1
    return restored


def _dump_buckets(config: StackConfig, keys: Mapping[str, str]) -> int:
    client = s3_client(config, keys)
    staging = config.s3_dump.with_name("s3.saving")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "objects").mkdir(parents=True)
    manifest: dict[str, dict[str, str]] = {}
    count = 0
    for bucket in (b["Name"] for b in client.list_buckets()["Buckets"]):
        manifest[bucket] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                blob = hashlib.sha256(f"{bucket}/{item['Key']}".encode()).hexdigest()
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                (staging / "objects" / blob).write_bytes(body)
                manifest[bucket][item["Key"]] = blob
                count += 1
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    old = config.s3_dump.with_name("s3.old")
    shutil.rmtree(old, ignore_errors=True)
    if config.s3_dump.exists():
        config.s3_dump.rename(old)
    staging.rename(config.s3_dump)
    shutil.rmtree(old, ignore_errors=True)
    return count


def _upload_demo_data(config: StackConfig, keys: Mapping[str, str]) -> None:
    """The example specs' inputs (``demo/...`` under the storage root), written once, ending today."""
    from trainpipe.demo.synthetic import DEMO_FILES, write_demo_data

    client = s3_client(config, keys)
    prefix = "storage/demo/"
    present = client.list_objects_v2(Bucket=config.bucket, Prefix=prefix).get("KeyCount", 0)
    if present >= len(DEMO_FILES):
        return
    end = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    with tempfile.TemporaryDirectory(dir=config.home) as scratch:
        write_demo_data(scratch, end=end)
        for relative in DEMO_FILES.values():
            client.upload_file(str(Path(scratch) / relative), config.bucket, prefix + relative)


# ---------------------------------------------------------------------------------------------
# command line


def _shown_path(path: Path) -> str:
    """Relative to the working directory when inside it (no machine-specific absolute path in the output)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _print_urls(urls: Mapping[str, str], config: StackConfig) -> None:
    print()
    print(f"Airflow   {urls['airflow']}   (login: {urls['username']} / {urls['password']})")
    print(f"MLflow    {urls['mlflow']}")
    print(f"S3        {urls['s3']}   (bucket {config.bucket}; storage root {config.storage_root})")
    print(f"watching  {urls['dag_configs']}")
    print(f"written to {config.urls_file}; logs in {config.logs}/; stop with `make stack-down`")
    print(f"mail      {_shown_path(config.mail)}/   (smtp_default: one .eml file per message)")
    print(f"CLI       source {_shown_path(config.cli_env_file)}   (then trainpipe, airflow and MLflow clients use "
          "the stack's storage, connections and tracking server)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/stack/trainpipe_stack.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start every service (reusing the state) and wait until all are healthy")
    commands.add_parser("down", help="stop every process the stack started; keeps the state")
    commands.add_parser("status", help="which services run, and whether each is healthy")
    restart = commands.add_parser("restart", help="restart one service")
    restart.add_argument("service", choices=SERVICES)
    sink = commands.add_parser("mail-sink", help="(a service of the stack) the SMTP server that keeps mail as files")
    sink.add_argument("--port", type=int, required=True)
    sink.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "mail-sink":
        run_mail_sink(args.port, args.folder)
        return 0
    try:
        stack = Stack(StackConfig.from_env())
        if args.command == "up":
            try:
                urls = stack.up()
            except BaseException:
                print("start-up failed; stopping what was started (state kept)", file=sys.stderr)
                stack.down(log=lambda line: print(line, file=sys.stderr))
                raise
            _print_urls(urls, stack.config)
        elif args.command == "down":
            if not stack.down():
                print("nothing was running")
        elif args.command == "restart":
            stack.restart(args.service)
        else:
            svc = services(stack.config, stack.keys)
            for name in SERVICES:
                proc = stack.process(name)
                state = "stopped" if proc is None else f"pid {proc.pid}, {'healthy' if svc[name].healthy() else 'UNHEALTHY'}"
                print(f"{name:24} {state}")
    except StackError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
