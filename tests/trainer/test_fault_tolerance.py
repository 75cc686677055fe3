"""Crashes, preemption, divergence and tracking outages, with real processes (no mocks).

The reference for "bit-identical" is ``binary_run`` (conftest): the same config, data and seed
trained without interruption. ``fault_injection.step_delay_seconds`` stretches the tiny runs so the
test can act mid-training; it changes no computation.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainpipe_trainer.__main__ import main

from .helpers import (
    BINARY_FEATURES,
    S3,
    Datasets,
    Launch,
    Tracking,
    committed_steps,
    file_digests,
    kill_a_rank_after_a_commit,
    launch,
    start,
    wait_until,
)

pytestmark = pytest.mark.integration


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.result()


def test_sigkill_of_one_rank_then_a_rerun_resumes_bit_identically(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    root = tmp_path / "checkpoints"
    config = make_config(
        tmp_path,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        fault_injection={"step_delay_seconds": 0.2},
    )
    killed = kill_a_rank_after_a_commit(config, tmp_path)
    # torchrun saw rank 1 die, stopped rank 0 and failed; nothing was committed after the kill.
    assert killed.returncode != 0
    assert "Signal 9 (SIGKILL) received by PID" in killed.stderr
    assert not (tmp_path / "output" / "result.json").exists()
    resume_from = committed_steps(root)[-1]
    assert 4 <= resume_from < 18

    # The rerun (an Airflow retry or a torchrun restart runs exactly this) resumes and ends identical.
    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["resumed_from_step"] == resume_from
    assert result["weights_sha256"] == _ok(binary_run)["weights_sha256"]


def test_sigkill_then_a_rerun_resumes_bit_identically_from_checkpoints_on_s3(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any], s3_bucket: S3
) -> None:
    """The same through S3: rank files uploaded in parts, restored by concurrent ranged reads (trainpipe-dcp/2)."""
    from trainpipe_trainer.checkpoint.manager import CheckpointStore

    uri = s3_bucket.uri("run/checkpoints")
    config = make_config(
        tmp_path,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        checkpoint={"root_uri": uri},
        storage_options=s3_bucket.storage_options,
        fault_injection={"step_delay_seconds": 0.2},
    )
    store = CheckpointStore(root_uri=uri, storage_options=s3_bucket.storage_options)
    running = start(config, tmp_path, nproc=2)
    try:
        wait_until(lambda: bool(store.committed_steps()), timeout=120, what="a commit", running=running)
        os.kill(running.rank_pid(1), signal.SIGKILL)
        killed = running.wait(timeout=120)
    finally:
        running.stop()
    assert killed.returncode != 0
    assert not (tmp_path / "output" / "result.json").exists()
    resume_from = store.committed_steps()[-1]
    assert 4 <= resume_from < 18
    assert store.read_manifest(resume_from)["format"] == "trainpipe-dcp/2"

    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["weights_sha256"] == _ok(binary_run)["weights_sha256"]


def test_sigterm_commits_a_checkpoint_of_the_current_step_before_exiting(
    tmp_path: Path, datasets: Datasets, tracking: Tracking, make_config: Callable[..., Any]
) -> None:
    from mlflow import MlflowClient

    run_id = MlflowClient(tracking.uri).create_run(tracking.experiment_id).info.run_id
    root = tmp_path / "checkpoints"
    config = make_config(
        tmp_path,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        tracking={"run_id": run_id},
        fault_injection={"step_delay_seconds": 0.2},
    )
    running = start(config, tmp_path, nproc=2)
    try:
        wait_until(lambda: bool(committed_steps(root)), timeout=120, what="a commit", running=running)
        # What Kubernetes and the local launcher do: SIGTERM to torchrun, which forwards it to every rank.
        running.process.send_signal(signal.SIGTERM)
        stopped = running.wait(timeout=120)
    finally:
        running.stop()
    assert stopped.returncode != 0
    line = next(line for line in stopped.stdout.splitlines() if line.startswith("received SIGTERM"))
    step = int(line.split("committed checkpoint step-")[1].split(";")[0])
    for rank in (0, 1):
        expected = f"trainpipe_trainer: [rank {rank}] stopped: received SIGTERM: committed checkpoint step-{step}"
        assert expected in stopped.stderr
    # The checkpoint of the step training stopped at is committed, and it is the newest one.
    assert step < 18
    assert committed_steps(root)[-1] == step
    assert json.loads((root / f"step-{step}" / "manifest.json").read_text())["step"] == step
    run = MlflowClient(tracking.uri).get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["trainpipe.failure_step"] == str(step)
    # (The retry that resumes from it is the SIGKILL test's rerun: the same code path.)


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process trainer runs: no torchrun variables."""
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def _run_in_process(config: dict[str, Any], workdir: Path) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    path.write_text(json.dumps(config))
    return main(["--config", str(path)])


def test_nan_loss_stops_training_fails_the_run_and_leaves_the_last_checkpoint_untouched(
    tmp_path: Path,
    datasets: Datasets,
    tracking: Tracking,
    use_tracking: str,
    single_process: None,
    capsys: pytest.CaptureFixture[str],
    make_config: Callable[..., Any],
) -> None:
    from mlflow import MlflowClient

    root = tmp_path / "checkpoints"
    run_id = MlflowClient(tracking.uri).create_run(tracking.experiment_id).info.run_id
    base = {"train_data": datasets.binary_train, "features": BINARY_FEATURES, "tracking": {"run_id": run_id}}
    # First attempt: crash right after committing step 5 (checkpoints every 4: step 5 is forced).
    crashed = launch(make_config(tmp_path, **base, fault_injection={"crash_after_step": 5}), tmp_path, nproc=None)
    assert crashed.returncode == 3, crashed.describe()
    assert "fault injection: checkpoint step-5 committed, exiting abruptly (os._exit(3))" in crashed.stdout
    assert committed_steps(root) == [4, 5]
    before = file_digests(root)

    # Second attempt resumes at 5 and gets a NaN loss at step 6.
    code = _run_in_process(make_config(tmp_path, **base, fault_injection={"nan_loss_at_step": 6}), tmp_path)
    err = capsys.readouterr().err
    assert code == 4
    assert (
        "trainpipe_trainer: error: non-finite loss (nan) at step 6: training stopped; the last checkpoint (step-5) "
        "is kept unchanged; lower learning_rate, set optimization.gradient_clip_norm or check the data"
    ) in err
    run = MlflowClient(tracking.uri).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["trainpipe.failure_reason"].startswith("non-finite loss (nan) at step 6")
    assert run.data.tags["trainpipe.failure_step"] == "6"
    # Byte-identical: nothing was written, pruned or re-committed after the NaN.
    assert file_digests(root) == before
    assert not (tmp_path / "output" / "result.json").exists()


def test_accumulation_clipping_bf16_and_schedule_resume_bit_identically(
    tmp_path: Path,
    datasets: Datasets,
    use_tracking: str,
    single_process: None,
    capsys: pytest.CaptureFixture[str],
    make_config: Callable[..., Any],
) -> None:
    """Accumulation 3 over 17 batches per epoch: short last groups; resume mid-epoch from them."""
    optimization = {
        "gradient_accumulation_steps": 3,
        "gradient_clip_norm": 0.5,
        "precision": "bf16",
        "lr_schedule": "cosine",
        "warmup_steps": 3,
        "weight_decay": 0.01,
    }
    common = {"train_data": datasets.binary_train, "features": BINARY_FEATURES, "optimization": optimization}
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_config = make_config(full_dir, **common, checkpoint={"every_n_steps": 2, "keep_last": 10})
    assert _run_in_process(full_config, full_dir) == 0
    full = json.loads((full_dir / "output" / "result.json").read_text())
    # 540 rows / 32 = 17 micro-batches per epoch -> 6 optimizer steps (3+3+3+3+3+2), 2 epochs.
    assert full["global_step"] == 12
    shutil.copytree(full_dir / "checkpoints" / "step-8", resumed_dir / "checkpoints" / "step-8")
    capsys.readouterr()
    assert _run_in_process(make_config(resumed_dir, **common, checkpoint={"every_n_steps": 5}), resumed_dir) == 0
    assert "resumed from step 8" in capsys.readouterr().out
    resumed = json.loads((resumed_dir / "output" / "result.json").read_text())
    assert resumed["weights_sha256"] == full["weights_sha256"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a sqlite store; stop() and start() again keep the same store and port."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, *, wait: bool = True) -> None:
        command = [
            str(Path(sys.executable).with_name("mlflow")), "server",
            "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root", (self.root / "artifacts").as_uri(),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.root / "server.log", "a")
        # Own process group: stop() takes the server and its workers down by the group's id.
        self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
        if wait:
            wait_until(self.healthy, timeout=120, what="the MLflow server to answer")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)
        self.process = None


def _has_run(server: MlflowServer, experiment_name: str) -> bool:
    from mlflow import MlflowClient

    if not server.healthy():
        return False
    experiment = MlflowClient(server.uri).get_experiment_by_name(experiment_name)
    return experiment is not None and bool(MlflowClient(server.uri).search_runs([experiment.experiment_id]))


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    # Not waited for: the trainer starts meanwhile and its MLflow client retries until the server answers.
    server.start(wait=False)
    yield server
    server.stop()


def test_every_metric_arrives_when_the_tracking_server_comes_back(
    mlflow_server: MlflowServer, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    from mlflow import MlflowClient

    workdir = tmp_path / "run"
    config = make_config(
        workdir,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        epochs=3,
        tracking={
            "tracking_uri": mlflow_server.uri,
            "experiment_name": "outage",
            "log_every_n_steps": 1,
            "system_metrics_every_seconds": 0.5,
            "max_buffered_metrics": 20,
        },
        # 51 steps of at least 0.25 s: the outage, once the run is open, falls inside the training.
        fault_injection={"step_delay_seconds": 0.25},
    )
    wait_until(mlflow_server.healthy, timeout=120, what="the MLflow server to answer")
    # Short client back-off, so the test does not wait minutes between retries.
    running = start(config, workdir, nproc=None, env={"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"})
    try:
        wait_until(lambda: "step 5/51" in running.stdout_so_far(), timeout=120, what="step 5", running=running)
        # The run opens beside training (it may not be open at step 5): an outage of an open run is what
        # is tested here, and a server stopped while it still creates its tables would not start again.
        wait_until(lambda: _has_run(mlflow_server, "outage"), timeout=120, what="the run to be open", running=running)
        mlflow_server.stop()
        down_at = time.monotonic()
        stopped_output = running.stdout_so_far()
        # Down until the trainer has noticed: a send the client retries for less than the trainer's
        # stall bound (5 s) would otherwise succeed once the server is back, and no outage be seen.
        wait_until(lambda: "tracking: cannot reach the tracking server" in running.stderr_so_far(), timeout=120,
                   what="the trainer noticed the outage", running=running)
        mlflow_server.start()
        outage = time.monotonic() - down_at
        during = running.stdout_so_far()[len(stopped_output) :]
        result = running.wait(timeout=300)
    finally:
        running.stop()
    assert result.returncode == 0, result.describe()
    # Training went on while the server was down, buffering (and spilling) metrics.
    assert outage > 1 and "step " in during
    assert "tracking: cannot reach the tracking server" in result.stderr
    assert "tracking: the tracking server is reachable again" in result.stderr

    client = MlflowClient(mlflow_server.uri)
    run_id = result.result()["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == list(range(1, 52))
    assert [m.step for m in client.get_metric_history(run_id, "learning_rate")] == list(range(1, 52))
    metrics = client.get_run(run_id).data.metrics
    assert metrics["trainer_cpu_hours"] > 0
    assert "system/samples_per_second" in metrics and "system/cpu_utilization_percent" in metrics


def test_the_run_opens_beside_training_and_keeps_what_was_logged_before(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the MLflow run costs the training thread nothing: with no server answering yet, params,
    tags and metrics are taken at once, the stall is said once, and all of it is in the run once the
    server answers."""
    from mlflow import MlflowClient
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils

    from trainpipe_trainer.config import TrackingConfig
    from trainpipe_trainer.tracking.tracker import OPEN_STALL_SECONDS, Tracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    # The tracker sets MLflow's process-wide tracking URI and experiment (the trainer owns its process):
    # this test's, undone after, so later tests in this process do not talk to its stopped server.
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.setattr(fluent, "_active_experiment_id", fluent._active_experiment_id)
    # set_tracking_uri also exports MLFLOW_TRACKING_URI (for subprocesses): put the variable back too.
    if "MLFLOW_TRACKING_URI" in os.environ:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", os.environ["MLFLOW_TRACKING_URI"])
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    said = ""
    try:
        with Tracker(config=TrackingConfig(tracking_uri=server.uri, experiment_name="late"), enabled=True) as tracker:
            started = time.monotonic()
            tracker.log_params({"learning_rate": "0.01"})
            tracker.set_tags({"team": "fraud"})
            for step in (1, 2, 3):
                tracker.log_metric("train_loss", 1.0 / step, step=step)
            assert time.monotonic() - started < 1.0, "a log call waited for the tracking server"
            assert tracker.run_id is None

            def stall_said() -> bool:
                nonlocal said
                said += capfd.readouterr().err
                return "cannot reach the tracking server" in said

            wait_until(stall_said, timeout=OPEN_STALL_SECONDS + 60, what="the stall to be reported")
            server.start()
            assert tracker.flush(timeout=120)
            run_id = tracker.run_id
        said += capfd.readouterr().err
        run = MlflowClient(server.uri).get_run(run_id)
        history = MlflowClient(server.uri).get_metric_history(run_id, "train_loss")
    finally:
        server.stop()
    assert said.count("cannot reach the tracking server") == 1
    assert "the tracking server is reachable again" in said
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.01" and run.data.tags["team"] == "fraud"
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]


def test_the_run_opening_test_leaves_mlflow_as_it_found_it() -> None:
    """Runs after the test above in this module: MLflow's process-wide URI is not its stopped server's
    (later tests of the process would wait minutes on it)."""
    import mlflow

    assert not mlflow.get_tracking_uri().startswith("http://127.0.0.1:")
    assert not os.environ.get("MLFLOW_TRACKING_URI", "").startswith("http://127.0.0.1:")
