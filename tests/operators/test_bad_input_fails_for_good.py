"""The train task on data the spec cannot train on: one located message, no retry, no chained traceback."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from trainpipe.errors import SpecError, SpecProblem
from trainpipe.operators.context import failed_for_good_on_refused_resume


def test_a_located_input_error_fails_the_task_for_good_with_its_message_alone():
    problem = SpecProblem("dag_configs/diabetes.yaml", 3, 3, "data.uri",
                          "diabetes/diabetess.parquet does not exist (read as file:///x); fix data.uri: ...")

    with pytest.raises(AirflowFailException) as raised:
        with failed_for_good_on_refused_resume():
            raise SpecError([problem])

    assert str(raised.value) == ("dag_configs/diabetes.yaml:3:3: data.uri: diabetes/diabetess.parquet does not exist "
                                 "(read as file:///x); fix data.uri: ...")
    # AirflowFailException: no retry; from None: the log shows no second traceback under the message.
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


class _NotedTry:
    """The part of a task instance a note is left through (XCom under the run-note key)."""

    try_number = 1

    def __init__(self) -> None:
        self.pushed: list[tuple[str, str]] = []

    def xcom_push(self, key: str, value: str) -> None:
        self.pushed.append((key, value))


def test_a_file_changed_since_the_snapshot_fails_the_train_task_for_good_with_a_note_naming_it():
    from trainpipe.errors import DatasetChangedError
    from trainpipe.operators.context import training_failure_noted
    from trainpipe.state.run_notes import RUN_NOTE_KEY

    ti = _NotedTry()
    message = ("s3://lake/clicks/part-00007.parquet: changed since dataset version 0123456789abcdef listed it "
               "(ETag 1a -> 2b); the version is immutable, so its data cannot be read as it was: restore the file, or "
               "run the DAG again for a new snapshot of the folder as it is now")
    with pytest.raises(AirflowFailException) as raised:
        with failed_for_good_on_refused_resume(), training_failure_noted({"ti": ti}, retries=2):
            raise DatasetChangedError(message)
    assert str(raised.value) == message and raised.value.__cause__ is None
    assert ti.pushed == [(RUN_NOTE_KEY, f"training failed: {message}")]
