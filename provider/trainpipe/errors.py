"""One error family for trainpipe, and how spec text is shown where people read it.

``SpecError`` is bad user input: it is also a ``ValueError`` and its message names the file, line,
column, field path and, where one is known, the fix. The escapes at the end (``shown_value``,
``first_hidden_character``, ``markdown_text``) keep a spec's words from reading as something else:
in a message, in a log, in a UI that renders Markdown.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any


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


class MissingExtraError(TrainpipeError, ImportError):
    """A spec uses a part of trainpipe whose extra is not installed where it is compiled or run: the
    platform's install, not the spec, needs the fix (named in the message)."""

    def __init__(self, what: str, extra: str, *, field_path: tuple[str, ...] = ()) -> None:
        # The extra named in words too: consoles that read "[...]" as markup (rich) drop the bracket.
        super().__init__(f"{what} needs trainpipe's {extra!r} extra on every Airflow component that parses DAG files "
                         f"or runs tasks: pip install 'airflow-provider-trainpipe[{extra}]'")
        self.extra = extra
        self.field_path = field_path


class SpecFieldError(TrainpipeError, ValueError):
    """A spec value Airflow itself refuses when the DAG is built (an asset URI): reported located at its field."""

    def __init__(self, message: str, *, field_path: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.field_path = field_path


class DagFileError(TrainpipeError, ValueError):
    """A DAG file's ``load_dags`` call is wrong, or finds no specs folder (the platform's setup, not a spec)."""


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

    def __init__(self, message: str, *, note_parts: tuple[str, ...] = (), drift_mlflow_run_id: str | None = None) -> None:
        super().__init__(message)
        # Each failed check in a few words, for the run's note (``trainpipe.state.run_notes.validation_note``).
        self.note_parts = note_parts
        # The MLflow run holding the drift report, for the task's "Drift report" button.
        self.drift_mlflow_run_id = drift_mlflow_run_id


class GatesFailedError(TrainpipeError):
    """A candidate failed a gate and the spec says ``evaluation.on_gate_failure: fail``; the message is the table."""


class StorageConflictError(TrainpipeError):
    """Writing would overwrite something already stored with different content."""


class StorageAccessError(TrainpipeError):
    """The storage root cannot be reached or refuses the credentials; the message names the setting to fix."""


class OutsideStorageRootError(TrainpipeError, ValueError):
    """A relative URI leads outside the storage root it is relative to (``../..``), or, without a platform
    policy, a local data path (links followed) lies outside it."""


class UnsupportedUriError(TrainpipeError, ValueError):
    """A URI whose scheme trainpipe's storage does not read (``http://``, a chained ``a::b``)."""


class DataReadError(TrainpipeError):
    """A data file could not be read or parsed. The message names the path and the kind of problem,
    never the file's content (the parser's own message may quote it)."""


class DatasetChangedError(TrainpipeError):
    """A file that a manifest dataset version lists changed or is gone since the snapshot (trainpipe_trainer's
    ``DataChangedError``, re-raised in the provider's family); the message names the file and the fix."""


class ReproduceError(TrainpipeError):
    """A registered model version cannot be trained again: its lineage (tags, logged spec, snapshot)
    is incomplete or no longer matches what was recorded."""


class PolicyViolationError(TrainpipeError):
    """At run time, something the platform policy does not allow the pipeline's team (a data path
    outside its URIs): refused before any read or write (ADR 0014)."""


class TrialParamsError(TrainpipeError, ValueError):
    """Trial parameters the spec's search space could not have produced (a run tag edited in MLflow):
    refused before any of them reaches the trainer config."""


def shown_value(value: Any, limit: int = 80) -> str:
    """A value as an error message quotes it: a long one cut, with its length (a message is one line)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(value) if isinstance(value, str) else len(text)} characters)"


# Control, format (zero-width, direction overrides), private-use, surrogate and line/paragraph separators:
# characters a reader does not see as written, or that start a new line in a log.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp"})


def first_hidden_character(text: str) -> str | None:
    """The first character of ``text`` a reader would not see as written (``"\\n"``, U+200B), or None."""
    return next((c for c in text if unicodedata.category(c) in _HIDDEN_CATEGORIES), None)


# Every ASCII punctuation character CommonMark lets a backslash escape.
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def markdown_text(text: str) -> str:
    """``text`` escaped so that a Markdown renderer (the Airflow UI's DAG docs, MLflow's model descriptions) shows
    it as written: no heading, link or remote image (a tracking pixel, a phishing link "approved by the platform
    team") made of a spec's words."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)
