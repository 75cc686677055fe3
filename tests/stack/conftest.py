"""The `stack` tier: one real stack for this package's tests (``tools/stack/trainpipe_stack.py``, the code behind
``make stack``), stopped after its last test so that it does not load the machine for the rest of the suite.

It runs on free loopback ports with its state in a temporary folder, so it never touches a developer's
``make stack`` state, and it watches a temporary configs folder: the repository's example specs plus the
small specs of ``helpers.SPECS``. Tests talk to it as a client would: Airflow's public REST API v2 (token from
``POST /auth/token``), the MLflow server, and the S3 endpoint with boto3.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from trainpipe_stack import Ports, Stack, StackConfig, s3_client

from tests.support import REPO

from .helpers import APPROVAL_SPECS, DATA_KEY, SPECS, AirflowClient, RunningStack, trainpipe_cli, wait_for


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="package")
def running_stack(request: pytest.FixtureRequest) -> Iterator[RunningStack]:
    # Not pytest's tmp_path: that folder is private to this user, and PostgreSQL runs as `postgres`
    # when the tests run as root.
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if terminal is not None:
            terminal.write_line("\n" + line)

    root = Path(tempfile.mkdtemp(prefix="trainpipe-stack-tests-"))
    root.chmod(0o755)
    configs = root / "dag_configs"
    configs.mkdir()
    for example in sorted((REPO / "dag_configs").glob("*.yaml")):
        shutil.copy(example, configs / example.name)
    for name, text in SPECS.items():
        (configs / f"{name}.yaml").write_text(text)
    # The stack's policy (deploy/policy.yaml) with one more team for the specs of these tests.
    policy = yaml.safe_load((REPO / "deploy" / "policy.yaml").read_text())
    # One run of a DAG at a time: the every-minute DAG queues no second run while its first one trains.
    policy["teams"]["stack"] = {"folders": ["stack_*.yaml"], "pipeline_id_prefix": "stack_",
                                "model_name_prefix": "stack_", "airflow": {"max_active_runs": 1}}
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    # The scheduler sweeps awaiting-input timeouts every 2 s (default 15 s): the approval timeout test waits less.
    (root / "stack.env").write_text("AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL=2\n")
    env = {"TRAINPIPE_STACK_HOME": str(root / "state"), "TRAINPIPE_DAG_CONFIGS": str(configs),
           "TRAINPIPE_STACK_POLICY": str(root / "policy.yaml"), "TRAINPIPE_STACK_ENV_FILE": str(root / "stack.env")}
    env.update({variable: str(port) for variable, port in zip(Ports.ENV.values(), _free_ports(len(Ports.ENV)), strict=True)})
    stack = Stack(StackConfig.from_env(env))
    started = time.monotonic()
    try:
        urls = stack.up(log=lambda line: None)
        _upload_test_data(stack)
        report(f"stack tier: stack up in {time.monotonic() - started:.0f} s")
        yield RunningStack(stack=stack, urls=urls, dag_configs=configs)
    finally:
        stack.down(log=lambda line: None)
        leftovers = stack.running()
        if request.session.testsfailed:
            # Service and task logs for the failure: logs/<service>.log, airflow/logs/dag_id=...
            report(f"stack tier: state and logs kept in {root / 'state'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        assert leftovers == {}, f"stack processes still running after down: {leftovers}"


def _upload_test_data(stack: Stack) -> None:
    import io

    from trainpipe.demo.synthetic import generate_transactions

    # Ends a few minutes ago: every run of the tests (manual or scheduled) cuts its 30-day window
    # at a later logical date, so all rows are in it and every snapshot has the same content.
    end = datetime.now(UTC) - timedelta(minutes=5)
    buffer = io.BytesIO()
    generate_transactions(rows=4000, days=20, end=end).to_parquet(buffer, index=False)
    s3_client(stack.config, stack.keys).put_object(Bucket=stack.config.bucket, Key=f"storage/{DATA_KEY}",
                                                   Body=buffer.getvalue())


@pytest.fixture(scope="package")
def airflow(running_stack: RunningStack) -> AirflowClient:
    urls = running_stack.urls
    return AirflowClient(urls["airflow"], urls["username"], urls["password"])


@pytest.fixture(scope="package")
def mlflow_client(running_stack: RunningStack):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=running_stack.urls["mlflow"])


@pytest.fixture
def mlflow_server_uri(running_stack: RunningStack, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fluent MLflow calls (``load_model("models:/...")``) in this test go to the stack's server."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    uri = running_stack.urls["mlflow"]
    # Undone at teardown: the process-wide URI would otherwise stay on the stack for later tests.
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    return uri


@dataclass
class InFlight:
    """The stack tier's runs that overlap: started together (``start``), each test then waits for its own.

    The pipelines mostly wait (for an approval, a deadline, the next minute, the scheduler), so their waits overlap
    instead of adding up. A watcher thread records what must be seen while it happens: the checkpoint sensor
    deferred while ``train`` runs, and the every-minute DAG's runs (paused again once a run came due after
    unpausing, so that it does not keep training for the rest of the tier)."""

    running_stack: RunningStack
    airflow: AirflowClient
    runs: dict[str, str] = field(default_factory=dict)  # dag_id -> the run started here
    demo_data: object = None  # the `trainpipe demo-data` run that wrote the drift pipeline's first data
    scheduled_before: list | None = None  # the every-minute DAG's runs before it was unpaused
    scheduled_unpaused_at: datetime | None = None
    scheduled_runs: list[dict] = field(default_factory=list)  # its first run, then the one that came due later
    manual_states_seen: set = field(default_factory=set)  # (train, watch_checkpoints) states while it ran
    watch_error: str | None = None  # the watcher's last failed look, shown if a wait times out
    _watcher: threading.Thread | None = None

    def start(self) -> None:
        """Start every overlapping run once (later calls do nothing)."""
        if self._watcher is not None:
            return
        airflow = self.airflow
        wait_for("the stack tier's DAGs", lambda: airflow.dag_ids() >= set(SPECS), timeout=120, interval=2)
        today = datetime.now(UTC).strftime("%Y-%m-%d")
        self.demo_data = trainpipe_cli(self.running_stack, "demo-data", "--force", "--end", today)
        for dag_id in (*APPROVAL_SPECS, "stack_drift", "stack_manual"):
            airflow.unpause(dag_id)  # schedule none: unpausing starts nothing by itself
        for dag_id in APPROVAL_SPECS:
            self.runs[dag_id] = airflow.trigger(dag_id)
        self.runs["stack_drift"] = airflow.trigger("stack_drift")
        self.runs["stack_manual"] = airflow.trigger("stack_manual", conf={"epochs": 3})
        self.scheduled_before = airflow.dag_runs("stack_scheduled")
        self.scheduled_unpaused_at = datetime.now(UTC)
        airflow.unpause("stack_scheduled")
        self._watcher = threading.Thread(target=self._watch, name="stack-in-flight", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        urls = self.running_stack.urls
        airflow = AirflowClient(urls["airflow"], urls["username"], urls["password"])  # a session of its own
        manual, manual_done, scheduled_done = self.runs["stack_manual"], False, False
        deadline = time.monotonic() + 900  # "cannot hang": the tests' own waits fail first
        while not (manual_done and scheduled_done) and time.monotonic() < deadline:
            try:
                manual_done, scheduled_done = self._look(airflow, manual, manual_done, scheduled_done)
            except Exception as error:  # a slow read is looked at again; the tests' own waits bound it
                self.watch_error = repr(error)
            time.sleep(1)

    def _look(self, airflow: AirflowClient, manual: str, manual_done: bool, scheduled_done: bool) -> tuple[bool, bool]:
        """One look at the manual run and the every-minute DAG; what is done now."""
        if not manual_done:
            tis = airflow.task_instances("stack_manual", manual)
            if "train" in tis:
                self.manual_states_seen.add((tis["train"]["state"], tis["watch_checkpoints"]["state"]))
            manual_done = airflow.dag_run("stack_manual", manual)["state"] in ("success", "failed")
        if not scheduled_done:
            assert self.scheduled_unpaused_at is not None
            runs = airflow.dag_runs("stack_scheduled")
            later = [run for run in runs if datetime.fromisoformat(run["logical_date"]) > self.scheduled_unpaused_at]
            if runs and later:
                airflow.unpause("stack_scheduled", paused=True)  # no more runs for the rest of the session
                self.scheduled_runs = [runs[0], later[0]]
                scheduled_done = True
        return manual_done, scheduled_done

    def scheduled(self, timeout: float) -> list[dict]:
        """The every-minute DAG's first run and the one that came due after unpausing, once both exist."""
        return wait_for(f"a scheduled run that came due after unpausing (watcher: {self.watch_error})",
                        lambda: self.scheduled_runs, timeout=timeout)


@pytest.fixture(scope="package")
def in_flight(running_stack: RunningStack, airflow: AirflowClient) -> InFlight:
    return InFlight(running_stack=running_stack, airflow=airflow)
