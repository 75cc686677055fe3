"""Test helpers for the trainer: synthetic learnable data and a real launcher (no mocks)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

BINARY_FEATURES = ("f_small", "f_large", "f_offset", "f_noise")
RANKING_FEATURES = ("r_a", "r_b", "r_c")


@dataclass(frozen=True)
class Datasets:
    binary_train: Path
    binary_holdout: Path
    ranking_train: Path
    ranking_holdout: Path
    regression_train: Path


def binary_frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    # Very different scales and offsets, so standardisation matters; f_noise carries no signal.
    z = rng.normal(size=(n, 4))
    frame = pd.DataFrame(
        {
            "f_small": 0.01 * z[:, 0],
            "f_large": 1000.0 * z[:, 1],
            "f_offset": 50.0 + z[:, 2],
            "f_noise": z[:, 3],
        }
    )
    logit = 2.0 * z[:, 0] - 1.5 * z[:, 1] + 1.0 * z[:, 2] + 0.5 * rng.normal(size=n)
    frame["label"] = (1.0 / (1.0 + np.exp(-logit)) > 0.5).astype(np.int64)
    return frame


def ranking_frame(rng: np.random.Generator, n_queries: int, docs: int, first_qid: int) -> pd.DataFrame:
    z = rng.normal(size=(n_queries * docs, 3))
    utility = 1.2 * z[:, 0] - 0.8 * z[:, 1] + 0.3 * rng.normal(size=len(z))
    relevance = np.clip(np.round(2.0 + utility), 0, 4).astype(np.int64)
    return pd.DataFrame(
        {
            "qid": np.repeat(np.arange(first_qid, first_qid + n_queries), docs),
            "r_a": z[:, 0],
            "r_b": 10.0 * z[:, 1],
            "r_c": z[:, 2],
            "label": relevance,
        }
    )


@dataclass(frozen=True)
class S3:
    bucket: str
    storage_options: dict[str, Any]

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


@dataclass(frozen=True)
class Tracking:
    uri: str
    experiment_name: str
    experiment_id: str


@dataclass(frozen=True)
class Launch:
    returncode: int
    stdout: str
    stderr: str
    workdir: Path

    def result(self) -> dict[str, Any]:
        return json.loads((self.workdir / "output" / "result.json").read_text())

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-6000:]}"


def _command(config: dict[str, Any], workdir: Path, nproc: int | None,
             runner: str = "torch.distributed.run") -> tuple[list[str], dict[str, str]]:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    trainer = ["-m", "trainpipe_trainer", "--config", config_path.as_uri()]
    if nproc is None:
        command = [sys.executable, *trainer]
    else:
        command = [sys.executable, "-m", runner, "--standalone", f"--nproc_per_node={nproc}", *trainer]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return command, env


def launch(config: dict[str, Any], workdir: Path, *, nproc: int | None) -> Launch:
    """Run the trainer the way launchers do: torchrun (via this interpreter) or a plain process."""
    command, env = _command(config, workdir, nproc)
    # cwd in tmp: nothing the trainer or MLflow might write relative to cwd lands in the repo.
    proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False)
    return Launch(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, workdir=workdir)


@dataclass
class Running:
    """A trainer launched in the background, its output going to files (read them after ``wait``)."""

    process: subprocess.Popen
    workdir: Path

    def wait(self, timeout: float = 600) -> Launch:
        returncode = self.process.wait(timeout=timeout)
        return Launch(
            returncode=returncode,
            stdout=(self.workdir / "stdout.txt").read_text(),
            stderr=(self.workdir / "stderr.txt").read_text(),
            workdir=self.workdir,
        )

    def stdout_so_far(self) -> str:
        return (self.workdir / "stdout.txt").read_text()

    def stderr_so_far(self) -> str:
        return (self.workdir / "stderr.txt").read_text()

    def rank_pid(self, rank: int) -> int:
        """The pid of one torchrun worker (found by its RANK variable)."""
        import psutil

        for child in psutil.Process(self.process.pid).children(recursive=True):
            if child.environ().get("RANK") == str(rank):
                return child.pid
        raise LookupError(f"no worker with RANK={rank} under pid {self.process.pid}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=60)


def start(config: dict[str, Any], workdir: Path, *, nproc: int | None, env: dict[str, str] | None = None,
          runner: str = "torch.distributed.run") -> Running:
    """``runner``: torchrun's module, or ``trainpipe_trainer.elastic`` (what the launchers run)."""
    command, base_env = _command(config, workdir, nproc, runner)
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env={**base_env, **(env or {})},
        stdout=open(workdir / "stdout.txt", "w"),
        stderr=open(workdir / "stderr.txt", "w"),
    )
    return Running(process=process, workdir=workdir)


def wait_until(predicate: Callable[[], bool], *, timeout: float, what: str, running: Running | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if running is not None and running.process.poll() is not None:
            code = running.process.returncode
            raise AssertionError(f"the trainer exited ({code}) before {what}:\n{running.wait().describe()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def committed_steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "manifest.json").exists())


def kill_a_rank_after_a_commit(config: dict[str, Any], workdir: Path, *, commit_timeout: float = 120) -> Launch:
    """Two ranks started, rank 1 SIGKILLed once a checkpoint under ``workdir/checkpoints`` is committed; the
    launch as it ended (torchrun stops the other rank and fails)."""
    running = start(config, workdir, nproc=2)
    try:
        wait_until(lambda: bool(committed_steps(workdir / "checkpoints")), timeout=commit_timeout, what="a commit",
                   running=running)
        os.kill(running.rank_pid(1), signal.SIGKILL)
        return running.wait(timeout=120)
    finally:
        running.stop()


def resumes_to(reference: Launch, config: dict[str, Any], workdir: Path, *, checkpoint_every: int,
               step_delay_seconds: float) -> None:
    """Rank 1 SIGKILLed after a commit; the rerun resumes from the last commit and ends on ``reference``'s
    weights, bit for bit."""
    killed = kill_a_rank_after_a_commit({**config, "fault_injection": {"step_delay_seconds": step_delay_seconds}},
                                        workdir)
    assert killed.returncode != 0
    assert not (workdir / "output" / "result.json").exists()
    resume_from = committed_steps(workdir / "checkpoints")[-1]
    assert reference.returncode == 0, reference.describe()
    expected = reference.result()
    assert checkpoint_every <= resume_from < expected["global_step"]

    rerun = launch(config, workdir, nproc=2)
    assert rerun.returncode == 0, rerun.describe()
    result = rerun.result()
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["global_step"] == expected["global_step"]
    assert result["weights_sha256"] == expected["weights_sha256"]


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative path -> digest)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def untracked_trainer(config: Any, env: Any) -> Any:
    """A ``Trainer`` of ``config`` (a ``TrainingConfig``) on ``env`` with tracking off: the step loop alone."""
    from trainpipe_trainer.tracking.tracker import Tracker
    from trainpipe_trainer.trainer import Trainer

    return Trainer(config=config, env=env, tracker=Tracker(config=config.tracking, enabled=False))
