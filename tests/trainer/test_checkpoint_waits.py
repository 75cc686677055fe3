"""The step loop says when it waited for checkpoint writes: storage slower than the saves are due."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.preemption import PreemptionWatcher
from trainpipe_trainer.trainer import LoopStats

from .helpers import BINARY_FEATURES, Datasets, untracked_trainer


def test_a_loop_whose_saves_outrun_the_storage_counts_the_wait_and_says_so(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> None:
    raw = make_config(
        tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 2, "keep_best": False}, tracking={"log_every_n_steps": 2},
    )
    config = TrainingConfig.from_dict(raw)
    trainer = untracked_trainer(config, env)
    # Every commit takes 1 s (slow storage): each save after the first waits for the previous one. Far longer
    # than two steps even on a loaded machine, so the wait is there however slow the steps are.
    trainer.checkpoints.on_commit = lambda step: time.sleep(1.0)
    steps = trainer.step_groups(trainer.batches.epoch(0))
    started = time.perf_counter()
    with PreemptionWatcher() as watcher:
        for _ in range(8):
            trainer.train_step(next(steps), watcher)
    trainer.stats.loop_seconds = time.perf_counter() - started
    trainer.checkpoints.close()

    stats = trainer.stats
    assert stats.checkpoint_saves == 4
    # Saves 2-4 each waited for most of the previous commit's 1 s.
    assert stats.checkpoint_wait_seconds >= 1.5
    assert stats.checkpoint_held_seconds >= stats.checkpoint_wait_seconds
    assert trainer.checkpoints.store.committed_steps()[-2:] == [6, 8]
    summary = stats.checkpoint_summary()
    assert summary.startswith("; checkpoints in the loop: 4, holding it ")
    assert f"({stats.checkpoint_wait_seconds:.2f} s of it waiting for the previous write)" in summary
    longest = max(trainer.checkpoints.write_seconds)
    warning = stats.checkpoint_wait_warning(longest_write=longest)
    assert warning is not None
    assert "checkpoint.every_n_steps or checkpoint.every_seconds" in warning
    # The slowest commit, at least the 1 s sleep (more on a loaded machine), is the one named.
    assert longest >= 1.0 and f"up to {longest:.2f} s" in warning


@pytest.mark.parametrize(("waited", "warned"), [(0.04, False), (0.06, True)])
def test_the_wait_is_reported_above_five_percent_of_the_loop(waited: float, warned: bool) -> None:
    stats = LoopStats(loop_seconds=1.0)
    stats.count_checkpoint(blocked=0.01, waited=waited)
    warning = stats.checkpoint_wait_warning(longest_write=0.5)
    assert (warning is not None) is warned
    if warned:
        assert warning.startswith(f"warning: the step loop waited {waited:.1f} s (6% of its time)")


def test_a_loop_without_checkpoints_adds_nothing_to_the_launch_line() -> None:
    assert LoopStats(loop_seconds=3.0).checkpoint_summary() == ""
    assert LoopStats(loop_seconds=3.0).checkpoint_wait_warning(longest_write=0.0) is None
