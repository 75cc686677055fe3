"""SIGTERM at a random step: every rank finishes that step, commits it, exits preempted; the resume is exact.

The reference is ``binary_run`` (conftest): the same config trained without interruption. The step
the signal lands on is drawn at random each time (printed on failure); the delay per step only
stretches the run so the test can act mid-training.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainpipe_trainer.outcomes import PREEMPTED_EXIT_CODE, preempted_message, preempted_step

from .helpers import BINARY_FEATURES, Datasets, Launch, Tracking, committed_steps, launch, start, wait_until

pytestmark = pytest.mark.integration


def _progress_step(text: str) -> int:
    steps = [int(m) for m in re.findall(r"^step (\d+)/", text, flags=re.MULTILINE)]
    return max(steps, default=0)


def test_sigterm_to_every_rank_at_a_random_step_commits_that_step_exits_preempted_and_resumes_bit_identically(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, tracking: Tracking, make_config: Callable[..., Any]
) -> None:
    from mlflow import MlflowClient

    run_id = MlflowClient(tracking.uri).create_run(tracking.experiment_id).info.run_id
    root = tmp_path / "checkpoints"
    # Checkpoints only every 100 steps: the step saved can only be the preempted one.
    config = make_config(
        tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES, tracking={"run_id": run_id},
        checkpoint={"every_n_steps": 100}, fault_injection={"step_delay_seconds": 0.2},
    )
    target = random.randint(1, 15)  # of 18 steps
    # As the launchers run it: torchrun through trainpipe_trainer.elastic, which reports the preempted exit code.
    running = start(config, tmp_path, nproc=2, runner="trainpipe_trainer.elastic")
    try:
        # At least the first progress line (step 2): before it the ranks may not exist yet (target 1 waited for
        # nothing and found no worker to signal).
        wait_until(lambda: _progress_step(running.stdout_so_far()) >= max(target - target % 2, 2), timeout=300,
                   what=f"step {target}", running=running)
        # What `kill -TERM` of the process group does to the ranks (torchrun itself is left alone here:
        # the exit code comes from the ranks' own).
        for rank in (0, 1):
            os.kill(running.rank_pid(rank), signal.SIGTERM)
        stopped = running.wait(timeout=300)
    finally:
        running.stop()
    note = f"(SIGTERM near step {target})\n{stopped.describe()}"
    saved = [preempted_step(line) for line in stopped.stdout.splitlines() if preempted_step(line) is not None]
    assert len(saved) == 1, note
    step = saved[0]
    # Both ranks agreed on one step, the one in progress or the next (the flags are exchanged once per step).
    for rank in (0, 1):
        assert f"trainpipe_trainer: [rank {rank}] stopped: {preempted_message('SIGTERM', step)}" in stopped.stderr, note
    assert stopped.returncode == PREEMPTED_EXIT_CODE, note
    assert committed_steps(root) == [step], note
    assert json.loads((root / f"step-{step}" / "manifest.json").read_text())["step"] == step
    assert not (tmp_path / "output" / "result.json").exists()
    history = MlflowClient(tracking.uri).get_metric_history(run_id, "preemptions")
    assert [(m.step, m.value) for m in history] == [(step, 1.0)]

    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    assert rerun.returncode == 0, rerun.describe()
    assert f"resumed from step {step}" in rerun.stdout
    assert rerun.result()["weights_sha256"] == binary_run.result()["weights_sha256"], note


def test_a_single_process_trainer_exits_with_the_preempted_code_after_committing(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                         fault_injection={"step_delay_seconds": 0.2})
    running = start(config, tmp_path, nproc=None)
    try:
        wait_until(lambda: _progress_step(running.stdout_so_far()) >= 2, timeout=300, what="step 2", running=running)
        running.process.send_signal(signal.SIGTERM)
        stopped = running.wait(timeout=300)
    finally:
        running.stop()
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.describe()
    step = next(s for s in map(preempted_step, stopped.stdout.splitlines()) if s is not None)
    assert committed_steps(tmp_path / "checkpoints")[-1] == step


def test_a_checkpoint_of_two_ranks_resumes_on_one_and_continues_the_epoch_where_it_stopped(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    import math

    root = tmp_path / "checkpoints"
    config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                         fault_injection={"crash_after_step": 5})
    crashed = launch(config, tmp_path, nproc=2)
    assert committed_steps(root) == [4, 5], crashed.describe()
    manifest = json.loads((root / "step-5" / "manifest.json").read_text())
    assert manifest["world_size"] == 2

    config["fault_injection"] = None
    resumed = launch(config, tmp_path, nproc=1)
    assert resumed.returncode == 0, resumed.describe()
    result = resumed.result()
    rows = int(re.search(r"of (\d+) \(nothing skipped or repeated\)", resumed.stdout)[1])
    batch = config["batch_size"]
    done = 5 * 2 * batch  # five steps of two ranks
    assert (f"resharded: checkpoint step-5 was written by 2 processes, this run has 1; model and optimizer state "
            f"loaded across them, and epoch 1 continues at its row {done} of {rows} (nothing skipped or repeated)"
            in resumed.stdout.splitlines())
    # The rest of epoch 1 at one rank, then epoch 2 whole: every row once per epoch.
    assert result["global_step"] == 5 + math.ceil((rows - done) / batch) + math.ceil(rows / batch)
    assert result["world_size_history"] == [[0, 2], [5, 1]]
    assert result["world_size"] == 1
