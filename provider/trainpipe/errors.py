"""One error family for trainpipe.

``SpecError`` is bad user input: it is also a ``ValueError`` and its message names the file, line,
column, field path and, where one is known, the fix.
"""

from __future__ import annotations

from dataclasses import dataclass


class TrainpipeError(Exception):
    """Base of every error trainpipe raises on purpose."""


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One problem in one spec file, located as precisely as the loader could."""

    file: str
    line: int | None
    column: int | None
    field_path: str
    message: str

    def __str__(self) -> str:
        location = self.file
        if self.line is not None:
            location += f":{self.line}"
            if self.column is not None:
                location += f":{self.column}"
        field = f" {self.field_path}:" if self.field_path else ""
        return f"{location}:{field} {self.message}"


class SpecError(TrainpipeError, ValueError):
    """A spec (YAML) is invalid. Carries every problem found in the file, not just the first."""

    def __init__(self, problems: list[SpecProblem] | str) -> None:
        if isinstance(problems, str):
            problems = [SpecProblem(file="", line=None, column=None, field_path="", message=problems)]
        self.problems: list[SpecProblem] = problems
        super().__init__("\n".join(str(p).lstrip(": ") if not p.file else str(p) for p in problems))


class TrainingFailedError(TrainpipeError):
    """The trainer process (local torchrun or pod) exited non-zero."""

    def __init__(self, message: str, *, reasons: tuple[str, ...] = (), exit_code: int | None = None) -> None:
        super().__init__(message)
        # The trainer's own one-line reasons (torchrun exits 1 whatever its workers' exit codes were).
        self.reasons = reasons
        # The launch's exit code when it ran and ended (config.PREEMPTED_EXIT_CODE: preempted).
        self.exit_code = exit_code


class TuningFailedError(TrainpipeError):
    """A hyperparameter search ended without a trial to train with (none completed)."""


class ResumeRefusedError(TrainingFailedError):
    """The run folder holds checkpoints of another training (other snapshot or settings): a retry
    would be refused the same way, so the task fails without retrying."""


class ValidationFailedError(TrainpipeError):
    """The dataset snapshot failed its data-quality checks; training is not started."""


class GatesFailedError(TrainpipeError):
    """A candidate failed a gate and the spec says ``evaluation.on_gate_failure: fail``; the message is the table."""


class StorageConflictError(TrainpipeError):
    """Writing would overwrite something already stored with different content."""


class OutsideStorageRootError(TrainpipeError, ValueError):
    """A relative URI leads outside the storage root it is relative to (``../..``)."""


class ReproduceError(TrainpipeError):
    """A registered model version cannot be trained again: its lineage (tags, logged spec, snapshot)
    is incomplete or no longer matches what was recorded."""
