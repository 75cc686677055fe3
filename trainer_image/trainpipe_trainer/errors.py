"""The trainer's error family, mirroring the provider's: bad input is also a ``ValueError``.

``__main__`` turns these into a one-line message and an exit code (``EXIT_CODES``); anything else is
a bug or an infrastructure failure and keeps its traceback (exit code 1).
"""

from __future__ import annotations

from trainpipe_trainer.config import TrainerConfigError
from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE, PREEMPTED_EXIT_CODE


class TrainerInputError(ValueError):
    """Input the trainer was given (data, checkpoint, config file) cannot be used; says why and how."""


class TrainerDataError(TrainerInputError):
    """The training data does not match the config; the message names the column and the file."""


class DataChangedError(TrainerDataError):
    """A file of a manifest dataset version differs from what the manifest recorded, or is gone; names the file."""


class CheckpointMismatchError(TrainerInputError):
    """A committed checkpoint cannot be resumed by this run (other world size, batch size, strategy)."""


class ResumeMismatchError(CheckpointMismatchError):
    """The newest checkpoint was written with another dataset snapshot or other result-changing settings."""

    def __init__(self, message: str, *, changes: list[str]) -> None:
        super().__init__(message)
        # One readable item per differing field (config.ResumeIdentity.differences).
        self.changes = changes


class CheckpointSaveError(RuntimeError):
    """Writing or committing a checkpoint failed (storage error, or a rank died mid-save)."""


class TrainingStopped(Exception):
    """Training ended early on purpose; ``exit_code`` and the message say why."""

    exit_code = 1


class TrainingDivergedError(TrainingStopped):
    """The loss or the gradients became NaN/inf: training stopped, no checkpoint after the last valid one."""

    exit_code = 4

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class PreemptedError(TrainingStopped):
    """SIGTERM (a preemption notice): a checkpoint of the current step was committed, then training stopped."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class CudaOutOfMemoryError(TrainingStopped):
    """A step ran out of accelerator memory: nothing of that step is committed; a retry may shrink the batch."""

    exit_code = CUDA_OOM_EXIT_CODE

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class StoppedAtStepError(TrainingStopped):
    """``stop_after_step`` was reached: its checkpoint is committed; the next launch resumes there."""

    exit_code = 0

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


class TrialPrunedError(TrainingStopped):
    """A hyperparameter-search trial the study's pruner stopped: its last checkpoint is committed."""

    # Its own code for `python -m` runs; under torchrun the provider reads the message
    # (config.is_trial_pruned), since torchrun exits 1 for any failed worker.
    exit_code = 5

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step


# Everything __main__ reports as bad input rather than as a crash.
USER_ERRORS: tuple[type[ValueError], ...] = (TrainerConfigError, TrainerInputError)
EXIT_BAD_INPUT = 2


class TrackingProcessError(RuntimeError):
    """MLflow, in its process beside the trainer, failed a call (its message), or that process ended."""
