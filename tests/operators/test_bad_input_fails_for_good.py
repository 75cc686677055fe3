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
