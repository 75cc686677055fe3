"""Optimizer and learning-rate schedule, both built from ``OptimizationConfig``.

The schedule is a pure function of the optimizer step (``lr_factor``), wrapped in a ``LambdaLR``
whose state (``last_epoch``) travels in the checkpoint, so a resumed run continues the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR

from trainpipe_trainer.config import OptimizationConfig


def lr_factor(step: int, *, config: OptimizationConfig, total_steps: int) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (the first step already trains at ``1/warmup_steps``), then
    constant, linear decay to 0 or half a cosine to 0 at ``total_steps``.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.lr_schedule == "constant":
        return 1.0
    decay_steps = max(total_steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / decay_steps, 1.0)
    if config.lr_schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(
    params: Iterable[torch.nn.Parameter], *, learning_rate: float, config: OptimizationConfig
) -> Optimizer:
    # AdamW with weight_decay 0 is Adam; one class keeps checkpoints of both settings interchangeable.
    params = list(params)
    # On CUDA the fused kernel: one launch for all parameters, elementwise (so deterministic), and
    # its step counters stay on the device, so a step reads nothing back. CPU keeps the foreach
    # kernels its checkpoints were written with.
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return AdamW(params, lr=learning_rate, weight_decay=config.weight_decay, fused=fused or None)


def apply_tf32(enabled: bool, device: torch.device) -> None:
    """``optimization.tf32``: float32 matmuls and convolutions on TF32 tensor cores (CUDA only)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def schedule(config: OptimizationConfig, total_steps: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        return lr_factor(step, config=config, total_steps=total_steps)

    return factor


def build_scheduler(optimizer: Optimizer, *, config: OptimizationConfig, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, schedule(config, total_steps))
