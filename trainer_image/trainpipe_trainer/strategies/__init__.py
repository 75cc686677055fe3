"""How one optimizer step is computed and applied; see ``base`` for the contract.

``ddp`` is always available; ``deepspeed`` is imported only for DeepSpeed runs (an optional extra).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.strategies.base import Strategy

__all__ = ["Strategy", "build_strategy"]


def build_strategy(
    config: TrainingConfig, *, env: DistEnv, build_module: Callable[[], nn.Module], total_steps: int
) -> Strategy:
    if config.strategy == "deepspeed":
        # Imported only for DeepSpeed runs: DeepSpeed itself is an optional extra.
        from trainpipe_trainer.strategies.deepspeed import DeepSpeedStrategy

        return DeepSpeedStrategy(config=config, env=env, build_module=build_module, total_steps=total_steps)
    from trainpipe_trainer.strategies.ddp import DdpStrategy

    return DdpStrategy(config=config, env=env, module=build_module(), total_steps=total_steps)
