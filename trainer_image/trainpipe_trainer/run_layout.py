"""The run folder's layout: where the provider and the trainer put each file of one DAG run.

Part of the trainer contract (standard library only: the provider imports it without torch).
"""

from __future__ import annotations

import re

# One DAG run's folder, as the provider writes it and the trainer fills it:
#   <run_dir>/trainer_config.json                  the TrainingConfig (provider)
#   <run_dir>/checkpoints/step-<N>/manifest.json   a committed checkpoint (trainer; no manifest: torn)
#   <run_dir>/checkpoints/best.json                the best checkpoint by validation loss (trainer)
#   <run_dir>/output/result.json                   TrainingResult (trainer, rank 0)
#   <run_dir>/output/status.json                   the train task's state for the checkpoint sensor (provider)
TRAINER_CONFIG_FILE = "trainer_config.json"
CHECKPOINTS_DIR = "checkpoints"
OUTPUT_DIR = "output"
RESULT_FILE = "result.json"
STATUS_FILE = "status.json"
CHECKPOINT_MANIFEST = "manifest.json"
BEST_CHECKPOINT_POINTER = "best.json"
_CHECKPOINT_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_dir_name(step: int) -> str:
    """``step-<N>``: the folder of the checkpoint of optimizer step N (also DeepSpeed's tag)."""
    return f"step-{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name, None for anything else in the checkpoints folder."""
    match = _CHECKPOINT_DIR.match(name)
    return int(match.group(1)) if match else None
