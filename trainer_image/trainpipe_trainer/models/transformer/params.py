"""``model.params`` of the ``transformer`` family, checked without torch (the provider checks a spec with it).

Every value is data: numbers, a fixed choice, or module names matched against a name pattern (LoRA's
``target_modules``); nothing here is a path, a URI or code (the weights' folder is ``model.pretrained``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainpipe_trainer.models.family import FamilyParamsError

TRAINABLE: tuple[str, ...] = ("all", "head", "lora")
DEFAULT_MAX_LENGTH = 128
MAX_MAX_LENGTH = 8192
MAX_LORA_RANK = 1024
MAX_NEW_TOKENS = 1024
# A module name as PyTorch spells it (``q_proj``, ``attn.c_attn``): letters, digits, _ and dots.
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z0-9_]{1,64}){0,7}$")
LORA_DEFAULTS: dict[str, Any] = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": None}
DEFAULTS: dict[str, Any] = {"max_length": DEFAULT_MAX_LENGTH, "trainable": "all", "lora": None,
                            "gradient_checkpointing": False, "max_new_tokens": 32}


def _shown(value: Any) -> str:
    # A message stays one short line whatever a spec wrote there.
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def _whole(path: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise FamilyParamsError(path, f"a whole number from {low} to {high}, got {_shown(value)}")
    return value


def validate_transformer_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``max_length`` (tokens per text, longer texts are cut), ``trainable`` (``all`` weights, only the
    ``head``, or ``lora`` adapters), ``lora`` (``r``, ``alpha``, ``dropout``, ``target_modules``; only with
    ``trainable: lora``), ``gradient_checkpointing`` and ``max_new_tokens`` (what a served causal LM generates)."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise FamilyParamsError(unknown[0], f"not a transformer parameter; the parameters are {', '.join(DEFAULTS)}")
    checked = {**DEFAULTS, **params}
    max_length = _whole("max_length", checked["max_length"], 8, MAX_MAX_LENGTH)
    trainable = checked["trainable"]
    if trainable not in TRAINABLE:
        raise FamilyParamsError("trainable", f"one of {', '.join(TRAINABLE)}, got {_shown(trainable)}")
    checkpointing = checked["gradient_checkpointing"]
    if not isinstance(checkpointing, bool):
        raise FamilyParamsError("gradient_checkpointing", f"true or false, got {_shown(checkpointing)}")
    max_new_tokens = _whole("max_new_tokens", checked["max_new_tokens"], 1, MAX_NEW_TOKENS)
    lora = checked["lora"]
    if lora is not None and trainable != "lora":
        raise FamilyParamsError("lora", "LoRA settings need trainable: lora; set it, or remove lora")
    if trainable == "lora":
        lora = _lora(lora if lora is not None else {})
    return {"max_length": max_length, "trainable": trainable, "lora": lora,
            "gradient_checkpointing": checkpointing, "max_new_tokens": max_new_tokens}


def _lora(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise FamilyParamsError("lora", f"a mapping of r, alpha, dropout, target_modules, got {_shown(raw)}")
    unknown = sorted(set(raw) - set(LORA_DEFAULTS))
    if unknown:
        raise FamilyParamsError(f"lora.{unknown[0]}", f"not a LoRA setting; the settings are {', '.join(LORA_DEFAULTS)}")
    checked = {**LORA_DEFAULTS, **raw}
    rank = _whole("lora.r", checked["r"], 1, MAX_LORA_RANK)
    alpha = checked["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 4 * MAX_LORA_RANK:
        raise FamilyParamsError("lora.alpha", f"a number above 0 and at most {4 * MAX_LORA_RANK}, got {_shown(alpha)}")
    dropout = checked["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise FamilyParamsError("lora.dropout", f"a fraction in [0, 1), got {_shown(dropout)}")
    modules = checked["target_modules"]
    if modules is not None:
        if not isinstance(modules, list | tuple) or not 1 <= len(modules) <= 64:
            raise FamilyParamsError("lora.target_modules",
                                    f"a list of 1 to 64 module names (such as q_proj), got {_shown(modules)}")
        for index, name in enumerate(modules):
            if not isinstance(name, str) or not MODULE_NAME.match(name):
                raise FamilyParamsError(f"lora.target_modules.{index}",
                                        f"a module name (letters, digits, _ and dots), got {_shown(name)}")
        modules = [str(name) for name in modules]
    return {"r": rank, "alpha": float(alpha), "dropout": float(dropout), "target_modules": modules}
