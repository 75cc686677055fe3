"""trainpipe_trainer.strategies.deepspeed.deepspeed_config: the DeepSpeed JSON is derived from the training config."""

from __future__ import annotations

import pytest

from trainpipe_trainer.config import (
    CheckpointConfig,
    DeepSpeedConfig,
    FaultInjection,
    OptimizationConfig,
    TrainerConfigError,
    TrainingConfig,
)
from trainpipe_trainer.strategies.deepspeed import deepspeed_config


def _config(**overrides: object) -> TrainingConfig:
    fields: dict[str, object] = {"deepspeed": DeepSpeedConfig(zero_stage=2), **overrides}
    return TrainingConfig(
        pipeline_id="p",
        task="binary_classification",
        train_data_uri="/data/train.parquet",
        features=("a",),
        label="y",
        batch_size=32,
        strategy="deepspeed",
        checkpoint=CheckpointConfig(root_uri="/ckpt"),
        output_uri="/out",
        **fields,
    )


def test_batch_sizes_and_accumulation_match_ddp() -> None:
    config = _config(optimization=OptimizationConfig(gradient_accumulation_steps=4, gradient_clip_norm=1.5))
    ds = deepspeed_config(config, world_size=8)
    assert ds["train_micro_batch_size_per_gpu"] == 32
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 32 * 4 * 8
    assert ds["gradient_clipping"] == 1.5
    assert ds["zero_optimization"] == {"stage": 2}
    # The trainer's torch AdamW is the optimizer; precision is torch.autocast in the loop.
    assert "optimizer" not in ds and "scheduler" not in ds
    assert ds["zero_allow_untested_optimizer"] is True
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}


def test_offload_goes_to_cpu_and_pins_memory_only_on_gpu() -> None:
    config = _config(deepspeed=DeepSpeedConfig(zero_stage=3, offload_optimizer=True, offload_param=True))
    zero = deepspeed_config(config, world_size=2, cuda=True)["zero_optimization"]
    assert zero == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    }
    assert deepspeed_config(config, world_size=2)["zero_optimization"]["offload_param"]["pin_memory"] is False
    assert deepspeed_config(_config(), world_size=1)["gradient_clipping"] == 0.0


def test_offload_needs_a_zero_stage_that_partitions() -> None:
    with pytest.raises(TrainerConfigError, match="deepspeed.offload_param: needs zero_stage 3"):
        DeepSpeedConfig(zero_stage=2, offload_param=True)


def test_fault_injection_is_checked() -> None:
    with pytest.raises(TrainerConfigError, match="fault_injection.step_delay_seconds: must be >= 0"):
        FaultInjection(step_delay_seconds=-1)


def test_bf16_is_the_engines_own_autocast_with_fp32_gradient_reduction() -> None:
    """An autocast around the engine is switched off inside it on CUDA (DeepSpeed's autocast_if_enabled
    asks torch.is_autocast_enabled(), which sees CUDA autocast only); the config's own section is not."""
    ds = deepspeed_config(_config(optimization=OptimizationConfig(precision="bf16")), world_size=2, cuda=True)
    assert ds["torch_autocast"] == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    assert ds["bf16"] == {"enabled": False} and ds["fp16"] == {"enabled": False}
    fp32 = deepspeed_config(_config(), world_size=2, cuda=True)
    assert fp32["torch_autocast"]["enabled"] is False


def test_the_engine_runs_its_forward_in_bf16_with_no_autocast_around_it(deepspeed_env: object) -> None:
    import torch

    from trainpipe_trainer.models.mlp.network import build_mlp
    from trainpipe_trainer.strategies.deepspeed import DeepSpeedStrategy
    from trainpipe_trainer.trainer import bf16_autocast_applies

    env = deepspeed_env
    config = _config(optimization=OptimizationConfig(precision="bf16"))
    # The loop leaves precision to the engine: nothing of the trainer's wraps it.
    assert not bf16_autocast_applies(config, env)
    strategy = DeepSpeedStrategy(
        config=config, env=env, build_module=lambda: build_mlp(n_features=1, config=config.model), total_steps=4
    )
    # The engine kept the config's section (DeepSpeed parses it; a misspelt key would be dropped).
    assert strategy.engine.torch_autocast_enabled() and strategy.engine.torch_autocast_dtype() == torch.bfloat16
    seen = []
    first = next(m for m in strategy.engine.module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    assert not torch.is_autocast_enabled("cpu")
    # On the env's device: a GPU machine runs this on CUDA, where the wrapped autocast was lost.
    strategy.forward_module()(torch.randn(4, 1, device=env.device))
    assert seen == [torch.bfloat16]
    # Weights stay fp32 (the optimizer updates fp32 master values, as under DDP with autocast).
    assert first.weight.dtype == torch.float32
