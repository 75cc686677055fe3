"""notify.deadline (issue 33): the spec's `within` becomes an Airflow Deadline Alert from the run's queued time, whose
callback (on the triggerer) tells every notify channel which step the late run is in. Real DAG objects and Airflow's
own serialization; the Airflow version check reads package metadata only."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support import REPO
from trainpipe.errors import SpecError
from trainpipe.plan.build import build_plan
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import airflow_without_deadlines, validate_loaded

FRAUD = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
NOTIFY = "notify:\n  email: {to: [oncall@example.com], events: [gate_failure]}\n  deadline: {within: 6h}\n"


def _plan(text: str):
    return build_plan(validate_loaded(load_yaml_text(text, "x.yaml")), spec_file="x.yaml", spec_text=text)


def test_the_dag_carries_a_deadline_alert_from_the_queued_time_with_the_channels():
    from airflow.sdk import AsyncCallback
    from airflow.sdk.definitions.deadline import DagRunQueuedAtDeadline

    from trainpipe.dags.builder import build_dag

    plan = _plan(FRAUD + NOTIFY)
    assert plan.notify.deadline_within == timedelta(hours=6)
    dag = build_dag(plan)
    [alert] = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert isinstance(alert.reference, DagRunQueuedAtDeadline) and alert.interval == timedelta(hours=6)
    assert isinstance(alert.callback, AsyncCallback)
    assert alert.callback.path == "trainpipe.notifications.channels.deadline_missed"
    [channel] = alert.callback.kwargs["channels"]
    # Every channel, whatever its events: a late run concerns them all.
    assert (channel["kind"], list(channel["to"]), alert.callback.kwargs["within_seconds"]) == (
        "email", ["oncall@example.com"], 6 * 3600)


def test_the_deadline_survives_airflow_s_serialization():
    from airflow.serialization.serialized_objects import DagSerialization

    from trainpipe.dags.builder import build_dag

    serialized = DagSerialization.to_dict(build_dag(_plan(FRAUD + NOTIFY)))
    assert "trainpipe.notifications.channels.deadline_missed" in str(serialized["dag"]["deadline"])


def test_without_a_deadline_the_dag_has_none():
    from trainpipe.dags.builder import build_dag

    assert not build_dag(_plan(FRAUD)).deadline


def test_the_message_names_the_steps_under_way():
    from trainpipe.notifications.channels import deadline_message

    message = deadline_message(dag_id="fraud_detector", run_id="scheduled__2026-11-27", within_seconds=6 * 3600,
                               states={"snapshot": "success", "validate": "success", "train": "running",
                                       "watch_checkpoints": "deferred", "evaluate": None})
    assert message.subject == "[trainpipe] fraud_detector: run scheduled__2026-11-27 is late (not done within 6h)"
    assert message.text == ("Run scheduled__2026-11-27 of fraud_detector has not ended within 6h of being queued "
                            "(notify.deadline): it is at train (running), watch_checkpoints (deferred).")
    idle = deadline_message(dag_id="d", run_id="r", within_seconds=90, states={"snapshot": "success"})
    assert idle.text.endswith("within 1m30s of being queued (notify.deadline): no step is under way (see the run in "
                              "Airflow).")


def test_only_an_airflow_with_deadline_alerts_is_accepted():
    assert airflow_without_deadlines() is None  # the Airflow installed here has them
    assert airflow_without_deadlines("3.3.2") is None and airflow_without_deadlines("3.1.0") is None
    assert airflow_without_deadlines("3.0.6") == "3.0.6" and airflow_without_deadlines("2.10.5") == "2.10.5"


def test_within_is_a_duration_and_needs_a_channel():
    with pytest.raises(SpecError, match=r"notify\.deadline\.within: .*expected a duration such as '30d'"):
        _plan(FRAUD + NOTIFY.replace("within: 6h", "within: '{{ macros.ds_add(ds, 1) }}'"))
    with pytest.raises(SpecError, match=r"notify: .*name at least one channel"):
        _plan(FRAUD + "notify:\n  deadline: {within: 6h}\n")
