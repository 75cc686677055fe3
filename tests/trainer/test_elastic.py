"""``python -m trainpipe_trainer.elastic``: a one-process, one-node launch runs its rank without torchrun's agent,
with torchrun's environment, signal passing, shutdown grace and exit codes; every other launch is torchrun's."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from trainpipe_trainer.elastic import single_process_command
from trainpipe_trainer.outcomes import PREEMPTED_EXIT_CODE, preempted_step

from .helpers import BINARY_FEATURES, Datasets, Running, committed_steps, launch, start, wait_until

PLAN_OPTIONS = ["--nnodes=1", "--nproc_per_node=1", "--standalone"]
TRAINER = ["-m", "trainpipe_trainer", "--config", "file:///runs/r/trainer_config.json"]


def test_only_a_one_process_one_node_launch_skips_torchrun() -> None:
    # The rank's command, unbuffered as torchrun starts its workers.
    assert single_process_command([*PLAN_OPTIONS, *TRAINER]) == [sys.executable, "-u", *TRAINER]
    assert single_process_command(["--standalone", "--nproc-per-node=1", *TRAINER]) is not None
    for options in (
        ["--nnodes=1", "--nproc_per_node=2", "--standalone"],  # two ranks: torchrun's agent runs them
        ["--nnodes=2", "--nproc_per_node=1", "--node_rank=0", "--rdzv_backend=c10d", "--rdzv_endpoint=j-0.j:29400"],
        [*PLAN_OPTIONS, "--max_restarts=2"],  # an option only the agent implements
        ["--nnodes=1", "--nproc_per_node=1"],  # no --standalone: a rendezvous somewhere
    ):
        assert single_process_command([*options, *TRAINER]) is None, options
    assert single_process_command(["--help"]) is None


def _config(make_config: Callable[..., Any], workdir: Path, datasets: Datasets, **overrides: Any) -> dict[str, Any]:
    return make_config(workdir, train_data=datasets.binary_train, features=BINARY_FEATURES,
                       checkpoint={"every_n_steps": 100}, **overrides)


def _slow(make_config: Callable[..., Any], workdir: Path, datasets: Datasets) -> Running:
    config = _config(make_config, workdir, datasets, fault_injection={"step_delay_seconds": 0.2})
    running = start(config, workdir, nproc=1, runner="trainpipe_trainer.elastic")
    wait_until(lambda: "step 2/" in running.stdout_so_far(), timeout=300, what="step 2", running=running)
    return running


def _imported_torch(pid: int) -> bool:
    return any("libtorch" in Path(region.path).name for region in psutil.Process(pid).memory_maps())


@pytest.mark.integration
def test_a_one_process_launch_runs_no_agent_and_trains_what_torchrun_trains(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    running = _slow(make_config, tmp_path / "elastic", datasets)
    try:
        rank = running.rank_pid(0)
        # The launcher process never loaded torch (torchrun's agent did: two seconds of every launch).
        assert not _imported_torch(running.process.pid)
        assert _imported_torch(rank)
        assert psutil.Process(rank).environ()["WORLD_SIZE"] == "1"
        finished = running.wait(timeout=300)
    finally:
        running.stop()
    assert finished.returncode == 0, finished.describe()
    torchrun = launch(_config(make_config, tmp_path / "torchrun", datasets), tmp_path / "torchrun", nproc=1)
    assert torchrun.returncode == 0, torchrun.describe()
    assert finished.result()["weights_sha256"] == torchrun.result()["weights_sha256"]


@pytest.mark.integration
def test_sigterm_to_the_launch_is_passed_on_and_exits_preempted_with_the_step_committed(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    running = _slow(make_config, tmp_path, datasets)
    try:
        os.kill(running.process.pid, signal.SIGTERM)  # the launch process alone, as a pod's deletion does
        stopped = running.wait(timeout=120)
    finally:
        running.stop()
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.describe()
    [step] = [s for s in map(preempted_step, stopped.stdout.splitlines()) if s is not None]
    assert committed_steps(tmp_path / "checkpoints") == [step]
    assert "torchrun: stopped on SIGTERM" in stopped.stderr


@pytest.mark.integration
def test_kill_9_of_the_launch_still_stops_the_rank_with_its_step_committed(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    running = _slow(make_config, tmp_path, datasets)
    rank = psutil.Process(running.rank_pid(0))
    try:
        running.process.kill()
        running.process.wait(timeout=60)
        # The kernel's parent-death signal is a SIGTERM: the rank commits its step and exits.
        rank.wait(timeout=60)
    finally:
        if rank.is_running():
            rank.kill()
    [step] = [s for s in map(preempted_step, running.stdout_so_far().splitlines()) if s is not None]
    assert committed_steps(tmp_path / "checkpoints") == [step]


@pytest.mark.integration
def test_a_failed_rank_exits_1_and_its_exit_code_is_reported(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    config = _config(make_config, tmp_path, datasets, fault_injection={"crash_after_step": 3})
    crashed = start(config, tmp_path, nproc=1, runner="trainpipe_trainer.elastic").wait(timeout=300)
    assert crashed.returncode == 1, crashed.describe()
    assert "trainpipe_trainer FAILED: rank 0 (local_rank: 0) exitcode: 3" in crashed.stderr
    assert committed_steps(tmp_path / "checkpoints") == [3]
