"""Seeding and capture/restore of every random number generator a rank uses.

States are pickled to bytes (not uint8 tensors) so a checkpoint stores them as opaque per-rank
blobs and restores them exactly, which is what makes a resumed run bit-identical.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> bytes:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state().numpy().tobytes(),
        "cuda": [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def restore_rng_state(blob: bytes) -> None:
    # Only ever reads blobs this trainer wrote into its own checkpoint root (never user input).
    state = pickle.loads(blob)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state["cuda"]])
