"""Where training is: the counters a checkpoint must carry to continue exactly where it stopped."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(kw_only=True, slots=True)
class TrainState:
    # Optimizer steps; same on every rank.
    global_step: int = 0
    epoch: int = 0
    # Micro-batches of ``epoch`` already done (a multiple of the accumulation steps, or the whole
    # epoch); a resumed run skips them.
    batch_in_epoch: int = 0
    # Rows of ``epoch`` already trained on by all ranks together (its global position in the epoch's
    # order, data.GlobalOrderSampler): where a resumed run continues, whatever its world size.
    sample_in_epoch: int = 0
    last_epoch_loss: float | None = None
    # This rank's running loss sums, all-reduced when logged (so they differ between ranks).
    epoch_loss_sum: float = 0.0
    epoch_loss_count: int = 0
    interval_loss_sum: float = 0.0
    interval_loss_count: int = 0
    # CPU seconds (device seconds on GPU) this rank spent in earlier attempts, up to this checkpoint.
    compute_seconds: float = 0.0
    # SIGTERMs this training stopped for so far (each committed a checkpoint and ended an attempt).
    preemptions: int = 0
    # [first step, world size] each time the world size changed, from [0, size] on: what `trainpipe
    # reproduce` replays to train the same weights (lineage tag trainpipe.world_size_history).
    world_size_history: list[list[int]] = field(default_factory=list)
    # Early stopping (TrainingConfig.early_stopping), judged at epoch ends: the best value of its metric so
    # far, the epoch count and step it was reached at, the epoch ends since without an improvement, and
    # whether training stopped for it. In the checkpoint, so a resumed run stops where an uninterrupted one does.
    best_value: float | None = None
    best_epoch: int | None = None
    best_step: int | None = None
    epochs_without_improvement: int = 0
    stopped_early: bool = False

    def __post_init__(self) -> None:
        if min(self.global_step, self.epoch, self.batch_in_epoch, self.sample_in_epoch) < 0:
            raise ValueError("TrainState counters must be >= 0")

    def finish_step(self, *, micro_batches: int = 1, samples: int = 0) -> None:
        """One optimizer step over ``micro_batches`` micro-batches (``samples`` rows on all ranks).

        Its loss is written on the device (``Trainer._record_step``) and added to ``epoch_loss_sum`` /
        ``interval_loss_sum`` at the loop's sync points (``Trainer._sync``), so a step reads nothing back.
        """
        self.global_step += 1
        self.batch_in_epoch += micro_batches
        self.sample_in_epoch += samples
        self.epoch_loss_count += 1
        self.interval_loss_count += 1

    def record_world_size(self, world_size: int) -> bool:
        """Note the world size this attempt trains with from the current step; True if it changed."""
        if self.world_size_history and self.world_size_history[-1][1] == world_size:
            return False
        self.world_size_history.append([self.global_step, world_size])
        return len(self.world_size_history) > 1

    def next_epoch(self, epoch_loss: float) -> None:
        self.epoch += 1
        self.batch_in_epoch = 0
        self.sample_in_epoch = 0
        self.last_epoch_loss = epoch_loss
        self.epoch_loss_sum, self.epoch_loss_count = 0.0, 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainState:
        # Checkpoints of an older trainer lack newer counters: they start from their defaults.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})
