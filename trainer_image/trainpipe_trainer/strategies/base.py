"""How one optimizer step is computed and applied: the contract of every strategy (`ddp`, `deepspeed`).

The loop (``trainer.Trainer``) owns batching, accumulation boundaries, guards and checkpoints;
a strategy owns the model wrapper, the optimizer and the scheduler. Both strategies:

- scale each micro-batch loss by ``1 / micro-batches in this optimizer step`` and reduce gradients
  only on the last micro-batch (DDP ``no_sync``, DeepSpeed's accumulation boundary);
- poison the gradients of a non-finite loss (``loss * nan``), so the all-reduced gradient norm is
  non-finite on every rank at once and all ranks stop at the same step with no extra collective;
- return that global gradient norm from ``optimizer_step`` as a tensor, never read on the host there:
  the loop checks it at its sync points (``Trainer._sync``) and stops before saving anything after
  a non-finite step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

if TYPE_CHECKING:
    from trainpipe_trainer.checkpoint.manager import CheckpointBackend, CheckpointStore

# The loss of one micro-batch, given the module to call (DDP wrapper or DeepSpeed engine).
LossOf = Callable[[nn.Module], torch.Tensor]


def poisoned(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` when finite, else a loss whose gradients are all NaN (no host sync needed)."""
    factor = torch.where(torch.isfinite(loss.detach()), 1.0, math.nan)
    return loss * factor


class Strategy(Protocol):
    name: str
    # Extra keys a checkpoint must match to be resumed by this strategy.
    checkpoint_shape: dict[str, Any]
    # Saved by the checkpoint manager in each rank's blob (None when the strategy saves it itself).
    checkpoint_scheduler: LambdaLR | None

    def train(self) -> None: ...

    def eval(self) -> None: ...

    def forward_module(self) -> nn.Module: ...

    def micro_step(self, loss_of: LossOf, *, scale: float, boundary: bool) -> torch.Tensor: ...

    def optimizer_step(self) -> torch.Tensor: ...

    def learning_rate(self) -> float: ...

    def full_module(self) -> nn.Module: ...

    def checkpoint_backend(self, store: CheckpointStore, *, group: Any, async_save: bool) -> CheckpointBackend: ...
