"""The step loop feeds the device and never waits for it: batches by index, no host reads between sync points."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.preemption import PreemptionWatcher
from trainpipe_trainer.tracking.tracker import Tracker
from trainpipe_trainer.trainer import Trainer

from .helpers import BINARY_FEATURES, Datasets, untracked_trainer


class HostReads(TorchDispatchMode):
    """Records every read of a tensor's value by the host (``.item()``, ``float(t)``, ``bool(t)``,
    ``.tolist()`` all come down to ``aten._local_scalar_dense``), except of the tensors in ``allowed``."""

    def __init__(self, allowed: Callable[[torch.Tensor], bool]) -> None:
        super().__init__()
        self.allowed, self.count = allowed, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and not self.allowed(args[0]):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _logging_every_3_steps(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> Trainer:
    """A trainer (no tracking) that syncs every 3 steps, accumulating 2 micro-batches and clipping per step."""
    raw = make_config(
        tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 1000, "keep_best": False}, tracking={"log_every_n_steps": 3},
        optimization={"gradient_clip_norm": 1.0, "gradient_accumulation_steps": 2},
    )
    config = TrainingConfig.from_dict(raw)
    return untracked_trainer(config, env)


def test_no_step_reads_a_tensor_value_between_log_intervals(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> None:
    trainer = _logging_every_3_steps(tmp_path, datasets, env, make_config)
    steps = trainer.step_groups(trainer.batches.epoch(0))
    optimizer = trainer.strategy.optimizer

    def step_counter(tensor: torch.Tensor) -> bool:
        # torch's CPU AdamW keeps its step counters on the host and reads them there (on CUDA the fused
        # kernel keeps them on the device): host memory, no device to wait for.
        return any(tensor is state["step"] for state in optimizer.state.values())

    reads_per_step, synced_at = {}, set()
    with PreemptionWatcher() as watcher:
        for step in range(1, trainer.steps_per_epoch):  # the epoch's last step syncs (epoch end)
            with HostReads(allowed=step_counter) as reads:
                trainer.train_step(next(steps), watcher)
            reads_per_step[step] = reads.count
            if trainer.unsynced_steps == 0:
                synced_at.add(step)

    assert trainer.steps_per_epoch >= 10
    log_steps = {s for s in reads_per_step if s % 3 == 0}
    assert all(reads_per_step[s] == 0 for s in reads_per_step if s not in log_steps), reads_per_step
    # The steps' values were read at the log steps and only there (one .tolist() of a host tensor here,
    # which the detector does not see on CPU).
    assert synced_at == log_steps, synced_at
    # The zeros prove something only if the detector sees a read: one float() of a computed value.
    with HostReads(allowed=step_counter) as probe:
        float(torch.ones(()) * 2)
    assert probe.count == 1
    assert trainer.state.interval_loss_count == (trainer.steps_per_epoch - 1) % 3


class DeviceWaits(HostReads):
    """``HostReads``, and ``copies``: tensors made from host numbers (``torch.tensor(x, device=...)``), on a
    GPU a blocking copy that waits for the device as a read does."""

    def __init__(self, allowed: Callable[[torch.Tensor], bool]) -> None:
        super().__init__(allowed)
        self.copies = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.lift_fresh.default:
            self.copies += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("zero_stage", [1, 2, 3])
def test_a_zero_step_between_log_intervals_neither_reads_nor_synchronizes(
    tmp_path: Path, datasets: Datasets, deepspeed_env: DistEnv, make_config: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch, zero_stage: int,
) -> None:
    """DeepSpeed's ZeRO step read the gradient norm on the host (twice in stages 1-2), built a tensor from
    a number each step, and its throughput timer synchronized the accelerator around every micro-step:
    on a GPU each made the host wait for the device. On CPU the same calls are seen here. Stage 3 still
    builds one masking value from a number inside its own norm method (one copy a step, left as is)."""
    raw = make_config(
        tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 1000, "keep_best": False}, tracking={"log_every_n_steps": 3},
        optimization={"gradient_clip_norm": 1.0, "gradient_accumulation_steps": 2, "precision": "bf16"},
        strategy="deepspeed", deepspeed={"zero_stage": zero_stage},
    )
    config = TrainingConfig.from_dict(raw)
    trainer = untracked_trainer(config, deepspeed_env)
    steps = trainer.step_groups(trainer.batches.epoch(0))
    optimizer = trainer.strategy.engine.optimizer.optimizer  # torch's AdamW inside ZeRO's
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import is_invalid_grad_norm

    synchronized = []
    monkeypatch.setattr(get_accelerator(), "synchronize", lambda *args: synchronized.append(args))

    def step_counter(tensor: torch.Tensor) -> bool:
        return any(tensor is state["step"] for state in optimizer.state.values())

    waits_per_step = {}
    with PreemptionWatcher() as watcher:
        trainer.train_step(next(steps), watcher)  # the first step: allocations and the optimizer's state
        for step in range(2, trainer.steps_per_epoch):
            synchronized.clear()
            with DeviceWaits(allowed=step_counter) as waits:
                trainer.train_step(next(steps), watcher)
            waits_per_step[step] = (waits.count, waits.copies, len(synchronized))
    assert trainer.steps_per_epoch >= 10
    expected = (0, 1 if zero_stage == 3 else 0, 0)
    assert all(waits_per_step[s] == expected for s in waits_per_step if s % 3), waits_per_step
    # The detector sees DeepSpeed's own check when it runs: one read of a computed value.
    with DeviceWaits(allowed=step_counter) as probe:
        is_invalid_grad_norm(torch.ones(()) * 2)
    assert probe.count == 1


def test_a_non_finite_zero_step_is_caught_at_the_next_sync_point(
    tmp_path: Path, datasets: Datasets, deepspeed_env: DistEnv, make_config: Callable[..., Any]
) -> None:
    """ZeRO applies the step (it no longer checks its norm on the host); the trainer stops at its sync."""
    from trainpipe_trainer.errors import TrainingDivergedError

    raw = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                      checkpoint={"every_n_steps": 1000, "keep_best": False}, tracking={"log_every_n_steps": 4},
                      optimization={"gradient_clip_norm": 1.0}, strategy="deepspeed", deepspeed={"zero_stage": 2},
                      fault_injection={"nan_loss_at_step": 2})
    config = TrainingConfig.from_dict(raw)
    trainer = untracked_trainer(config, deepspeed_env)
    steps = trainer.step_groups(trainer.batches.epoch(0))
    with PreemptionWatcher() as watcher:
        for _ in range(3):
            trainer.train_step(next(steps), watcher)
        with pytest.raises(TrainingDivergedError, match=r"non-finite loss \(nan\) at step 2: training stopped"):
            trainer.train_step(next(steps), watcher)
    # The gradient norm of the poisoned step reached the trainer as non-finite, not as ZeRO's -1.
    assert not torch.isfinite(trainer.step_values[1, 1])


def test_the_running_sums_are_the_losses_summed_in_step_order(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> None:
    """What the host reads at a sync point equals a float64 running sum of each step's loss, in order
    (what TrainState kept before: checkpoints of both carry the same numbers)."""
    raw = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                      checkpoint={"every_n_steps": 1000, "keep_best": False}, tracking={"log_every_n_steps": 1000})
    config = TrainingConfig.from_dict(raw)
    losses: list[float] = []

    class Recording(Trainer):
        def _record_step(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
            losses.append(float(loss))
            super()._record_step(loss, grad_norm)

    trainer = Recording(config=config, env=env, tracker=Tracker(config=config.tracking, enabled=False))
    steps = trainer.step_groups(trainer.batches.epoch(0))
    with PreemptionWatcher() as watcher:
        for _ in range(6):
            trainer.train_step(next(steps), watcher)
    trainer._sync()
    expected = 0.0
    for value in losses:
        expected += value
    assert trainer.state.epoch_loss_sum == expected
    assert trainer.state.interval_loss_sum == expected


def test_a_non_finite_step_is_caught_at_the_next_sync_point_and_named(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> None:
    from trainpipe_trainer.errors import TrainingDivergedError

    raw = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                      checkpoint={"every_n_steps": 1000, "keep_best": False}, tracking={"log_every_n_steps": 4},
                      fault_injection={"nan_loss_at_step": 2})
    config = TrainingConfig.from_dict(raw)
    trainer = untracked_trainer(config, env)
    steps = trainer.step_groups(trainer.batches.epoch(0))
    with PreemptionWatcher() as watcher:
        for _ in range(3):  # steps 1-3: no sync point yet, so no stop
            trainer.train_step(next(steps), watcher)
        with pytest.raises(TrainingDivergedError, match=r"non-finite loss \(nan\) at step 2: training stopped"):
            trainer.train_step(next(steps), watcher)
    assert trainer.state.global_step == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_on_cuda_no_step_between_sync_points_waits_for_the_device(
    tmp_path: Path, datasets: Datasets, env: DistEnv, make_config: Callable[..., Any]
) -> None:
    """On a GPU, CUDA's own sync check: any operation that makes the host wait for the device (a read
    back, a blocking copy, a data-dependent shape) raises in the steps between log intervals."""
    trainer = _logging_every_3_steps(tmp_path, datasets, env, make_config)
    assert trainer.batches.device.type == "cuda"  # data_placement auto: the small split is resident
    steps = trainer.step_groups(trainer.batches.epoch(0))
    with PreemptionWatcher() as watcher:
        trainer.train_step(next(steps), watcher)  # the first step: allocations and the optimizer's state
        for step in range(2, trainer.steps_per_epoch):
            if step % 3 == 0:
                trainer.train_step(next(steps), watcher)
                continue
            torch.cuda.set_sync_debug_mode("error")
            try:
                trainer.train_step(next(steps), watcher)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert trainer.state.global_step == trainer.steps_per_epoch - 1
