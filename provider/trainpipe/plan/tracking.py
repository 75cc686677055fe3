"""The names trainpipe gives things in MLflow, each written once: the steps and the hook write them, the fleet view,
``trainpipe cost`` and ``reproduce`` read them. (The trainer's own tags are its package's: ``trainpipe_trainer``.)"""

from __future__ import annotations

# On every registered version: the sha256 of its training's inputs (trainpipe.state.training_cache); a run with
# the same key trains nothing.
TRAINING_KEY_TAG = "trainpipe.training_key"
# The final training's run tag with the best trial's parameters (JSON, as Optuna stores them): reproduce applies them.
BEST_PARAMS_TAG = "trainpipe.tuning.best_params"
