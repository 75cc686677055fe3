"""``model.params`` of the ``text_bag`` family, checked without torch (the provider checks a spec with it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainpipe_trainer.models.family import FamilyParamsError

# fastText's default dimension is 100; 64 keeps a 2**18-bucket table at 64 MiB of fp32 on each rank.
DEFAULT_EMBEDDING_DIM = 64
MAX_EMBEDDING_DIM = 1024
MAX_HIDDEN_WIDTH = 16_384
MAX_HIDDEN_LAYERS = 8
DEFAULTS: dict[str, Any] = {"embedding_dim": DEFAULT_EMBEDDING_DIM, "hidden_layers": [], "dropout": 0.0}


def _shown(value: Any) -> str:
    # A message stays one short line whatever a spec wrote there.
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def validate_text_bag_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``embedding_dim`` (ids -> this many numbers, averaged per text column), ``hidden_layers`` (the head's
    widths; empty: a linear head, as fastText) and ``dropout`` (after each hidden layer)."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise FamilyParamsError(unknown[0], f"not a text_bag parameter; the parameters are {', '.join(DEFAULTS)}")
    checked = {**DEFAULTS, **params}
    dim = checked["embedding_dim"]
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_EMBEDDING_DIM:
        raise FamilyParamsError("embedding_dim", f"a whole number from 1 to {MAX_EMBEDDING_DIM}, got {_shown(dim)}")
    layers = checked["hidden_layers"]
    if not isinstance(layers, list | tuple) or len(layers) > MAX_HIDDEN_LAYERS:
        raise FamilyParamsError("hidden_layers", f"a list of at most {MAX_HIDDEN_LAYERS} widths, got {_shown(layers)}")
    for index, width in enumerate(layers):
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_HIDDEN_WIDTH:
            raise FamilyParamsError(f"hidden_layers.{index}", f"a width from 1 to {MAX_HIDDEN_WIDTH}, got {_shown(width)}")
    dropout = checked["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise FamilyParamsError("dropout", f"a fraction in [0, 1), got {_shown(dropout)}")
    return {"embedding_dim": dim, "hidden_layers": [int(w) for w in layers], "dropout": float(dropout)}
