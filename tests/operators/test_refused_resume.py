"""A refused resume fails the train task for good; any other training failure is left to retries."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from trainpipe.errors import ResumeRefusedError, TrainingFailedError
from trainpipe.operators.context import failed_for_good_on_refused_resume


def test_a_refused_resume_is_not_retried():
    with pytest.raises(AirflowFailException, match="cannot resume this checkpoint"):
        with failed_for_good_on_refused_resume():
            raise ResumeRefusedError("file:///runs/p/r/checkpoints/step-20: cannot resume this checkpoint: ...")


def test_another_training_failure_keeps_its_retries():
    with pytest.raises(TrainingFailedError, match="trainer exited with code 1"):
        with failed_for_good_on_refused_resume():
            raise TrainingFailedError("trainer exited with code 1")
