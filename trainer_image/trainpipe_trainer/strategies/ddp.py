"""``strategy: ddp``: PyTorch DistributedDataParallel (the bare module in a single process)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from trainpipe_trainer.checkpoint.manager import CheckpointBackend, CheckpointStore, DcpBackend
from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.optim import build_optimizer, build_scheduler
from trainpipe_trainer.strategies.base import LossOf, poisoned


@dataclass(kw_only=True, slots=True)
class DdpStrategy:
    config: TrainingConfig
    env: DistEnv
    module: nn.Module
    total_steps: int
    name: str = field(init=False, default="ddp")
    # DistributedDataParallel, or the bare module in a single process (where DDP would only copy
    # every gradient into its buckets and all-reduce it with itself: ~15% of a step on CPU).
    model: nn.Module = field(init=False)
    optimizer: Optimizer = field(init=False)
    scheduler: LambdaLR = field(init=False)
    _params: list[nn.Parameter] = field(init=False)
    _stale_grads: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        module = self.module.to(self.env.device)
        if self.env.world_size > 1:
            device_ids = [self.env.local_rank] if self.env.device.type == "cuda" else None
            self.model = DistributedDataParallel(module, device_ids=device_ids)
        else:
            self.model = module
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(
            self._params, learning_rate=self.config.learning_rate, config=self.config.optimization
        )
        self.scheduler = build_scheduler(self.optimizer, config=self.config.optimization, total_steps=self.total_steps)

    @property
    def checkpoint_shape(self) -> dict[str, Any]:
        return {"strategy": "ddp"}

    @property
    def checkpoint_scheduler(self) -> LambdaLR | None:
        return self.scheduler

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def forward_module(self) -> nn.Module:
        return self.model

    def micro_step(self, loss_of: LossOf, *, scale: float, boundary: bool) -> torch.Tensor:
        if self._stale_grads:
            self.optimizer.zero_grad(set_to_none=True)
            self._stale_grads = False
        # Gradients accumulate locally; DDP all-reduces them on the boundary's backward only.
        local = not boundary and isinstance(self.model, DistributedDataParallel)
        with self.model.no_sync() if local else nullcontext():
            loss = loss_of(self.model)
            (poisoned(loss) * scale).backward()
        return loss.detach()

    def optimizer_step(self) -> torch.Tensor:
        clip = self.config.optimization.gradient_clip_norm
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(self._params, clip, foreach=True)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self._params if p.grad is not None], foreach=True)
        # Stepped whatever the norm (deciding would read it back every step); a non-finite norm is
        # the same on every rank (gradients are all-reduced), and the loop stops at its next sync
        # point before anything of that step is saved.
        self.optimizer.step()
        self.scheduler.step()
        # Cleared (freed) when the next step starts, where a plain PyTorch loop clears them: same
        # allocation pattern, and a NaN step keeps its gradients for inspection.
        self._stale_grads = True
        return norm

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_module(self) -> nn.Module:
        return self.module

    def checkpoint_backend(self, store: CheckpointStore, *, group: Any, async_save: bool) -> CheckpointBackend:
        return DcpBackend(
            store=store, env=self.env, model=self.model, optimizer=self.optimizer, async_save=async_save, group=group
        )
