"""Hugging Face ``transformers``, imported where it is used, and quiet while it loads a folder."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType

from trainpipe_trainer.errors import TrainerInputError

INSTALL_HINT = "pip install 'trainpipe-trainer[transformers]'"


def import_transformers() -> ModuleType:
    """``transformers``, or a TrainerInputError saying how to install it."""
    try:
        import torch

        if not torch.cuda.is_available():
            # transformers imports DeepSpeed when it is installed; skip its accelerator detection (and its
            # warning) where there is no GPU, as strategies.deepspeed does.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import transformers
    except ImportError as err:
        raise TrainerInputError(f"model.type: transformer needs Hugging Face transformers in the trainer's "
                                f"environment: {INSTALL_HINT}") from err
    return transformers


@contextlib.contextmanager
def quiet_transformers() -> Iterator[ModuleType]:
    """transformers with its load report (the "newly initialized" head), its progress bars and its warnings off:
    the head is new by design, and a task log carries no foreign warnings. Restored afterwards."""
    transformers = import_transformers()
    logging = transformers.utils.logging
    level = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield transformers
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()
