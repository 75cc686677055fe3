"""The trainer's error family, mirroring the provider's: bad input is also a ``ValueError``.

``__main__`` turns these into a one-line message and exit code 2; anything else is a bug and keeps
its traceback (exit code 1).
"""

from __future__ import annotations

from trainpipe_trainer.config import TrainerConfigError


class TrainerInputError(ValueError):
    """Input the trainer was given (data, checkpoint, config file) cannot be used; says why and how."""


class TrainerDataError(TrainerInputError):
    """The training data does not match the config; the message names the column and the file."""


class CheckpointMismatchError(TrainerInputError):
    """A committed checkpoint cannot be resumed by this run (other world size or batch size)."""


# Everything __main__ reports as bad input rather than as a crash.
USER_ERRORS: tuple[type[ValueError], ...] = (TrainerConfigError, TrainerInputError)
