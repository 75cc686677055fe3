"""Checkpoints: layout and commit, storage transfer, the training state and RNG capture."""
