"""The MLP family's network: a feature vector to one score (one logit per class for multiclass)."""

from __future__ import annotations

from torch import nn

from trainpipe_trainer.config import ModelConfig


def build_mlp(*, n_features: int, config: ModelConfig, n_outputs: int = 1) -> nn.Sequential:
    """Linear -> ReLU (-> Dropout) per hidden layer, then Linear to ``n_outputs`` outputs (1 but for
    multiclass: a single-output model draws the same initial weights as before multiclass existed).

    Works on ``[..., n_features]`` so the same model scores rows and padded query lists; the
    serving module's numpy forward assumes exactly this layout (Linear layers in order).
    """
    layers: list[nn.Module] = []
    width = n_features
    for size in config.hidden_layers:
        layers += [nn.Linear(width, size), nn.ReLU()]
        if config.dropout > 0:
            layers.append(nn.Dropout(config.dropout))
        width = size
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


def linear_layers(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear)]
