"""trainpipe_trainer.optim: warmup and decay of the learning rate, optimizer from the config."""

from __future__ import annotations

import math

import pytest
import torch

from trainpipe_trainer.config import OptimizationConfig, TrainerConfigError
from trainpipe_trainer.optim import build_optimizer, build_scheduler, lr_factor


def _factors(config: OptimizationConfig, total: int) -> list[float]:
    return [round(lr_factor(step, config=config, total_steps=total), 6) for step in range(total)]


def test_linear_warmup_then_constant() -> None:
    assert _factors(OptimizationConfig(warmup_steps=4), 6) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_then_linear_decay_to_zero() -> None:
    config = OptimizationConfig(warmup_steps=2, lr_schedule="linear")
    assert _factors(config, 6) == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert lr_factor(6, config=config, total_steps=6) == 0.0


def test_cosine_decay_without_warmup() -> None:
    config = OptimizationConfig(lr_schedule="cosine")
    factors = _factors(config, 5)
    assert factors[0] == 1.0
    assert factors[2] == round(0.5 * (1 + math.cos(math.pi * 0.4)), 6)
    assert factors == sorted(factors, reverse=True)


def test_scheduler_and_weight_decay_drive_the_optimizer() -> None:
    parameter = torch.nn.Parameter(torch.ones(2))
    config = OptimizationConfig(warmup_steps=2, weight_decay=0.1)
    optimizer = build_optimizer([parameter], learning_rate=0.01, config=config)
    scheduler = build_scheduler(optimizer, config=config, total_steps=4)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.param_groups[0]["weight_decay"] == 0.1
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_optimization_config_is_checked() -> None:
    with pytest.raises(TrainerConfigError, match="optimization.gradient_accumulation_steps: must be >= 1"):
        OptimizationConfig(gradient_accumulation_steps=0)
