"""What every served model shares: the weights hash, and where the trainer package is (it travels with each model)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

# The whole trainer package travels with a logged model (code_paths).
PACKAGE_DIR = Path(__file__).resolve().parent.parent


def weights_sha256(model: nn.Module) -> str:
    """sha256 over (key bytes, tensor bytes) of the state dict in sorted key order.

    Raw bytes of contiguous CPU tensors: equal hashes mean bit-identical weights, which is how
    reproducibility (same seed, resumed vs uninterrupted) is checked.
    """
    digest = hashlib.sha256()
    state = model.state_dict()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous().reshape(-1)
        digest.update(key.encode("utf-8"))
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
