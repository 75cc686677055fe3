"""CheckpointSensor's decisions on a real run folder: wait (reschedule), defer, succeed, fail."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException, TaskDeferred

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import TrainpipeError
from trainpipe.plan.model import STATUS_POLL_SECONDS, WAITING_POKE
from trainpipe.sensors.checkpoint import CheckpointSensor
from trainpipe.settings import Settings
from trainpipe.state.checkpoint_state import (
    TrainingStalledError,
    TrainingStatus,
    read_checkpoint_state,
    wait_for_training_status,
    write_training_status,
)
from trainpipe.state.run_folder import run_dir_for
from trainpipe.triggers.checkpoint import CheckpointTrigger


@pytest.fixture
def sensor_and_run(request):
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    run_id = f"sensor__{request.node.name}"
    return CheckpointSensor(task_id="watch_checkpoints", plan=plan), {"run_id": run_id}, \
        run_dir_for(plan.dag_id, Settings.from_env(), run_id)


def _status(run_dir, state: str, *, started_at: datetime, final: bool = False, clear_number: int = 0) -> None:
    write_training_status(run_dir, TrainingStatus(state=state, try_number=1, final=final, started_at=started_at,
                                                  updated_at=datetime.now(UTC), clear_number=clear_number))


@dataclass
class _DagRun:
    """The one field of the task SDK's DagRun the sensor reads."""

    clear_number: int


def test_sensor_reschedules_until_training_starts_and_holds_no_retries(sensor_and_run):
    sensor, context, _ = sensor_and_run

    assert sensor.mode == "reschedule" and sensor.retries == 0
    assert sensor.poke_interval == WAITING_POKE.total_seconds()
    # No sign from Airflow that train is starting (here: no task instance at all, as for a sensor
    # that dag.test() runs before train): no waiting on the worker, reschedule at once.
    assert sensor.poke(context) is False


@dataclass
class _TestDagRun:
    """What dag.test() (``airflow dags test``) leaves on its runs."""

    clear_number: int = 0
    triggering_user_name: str | None = "dag_test"


def test_under_dag_test_the_sensor_looks_again_as_soon_as_train_has_run(sensor_and_run):
    """dag.test() runs one task at a time: a sensor that waited its full reschedule interval after train ended made
    Airflow log "No tasks to run" every second, and made every `airflow dags test` 15 s longer."""
    sensor, context, run_dir = sensor_and_run
    before = datetime.now(UTC)
    with pytest.raises(AirflowRescheduleException) as rescheduled:
        sensor.poke({**context, "dag_run": _TestDagRun()})
    assert before <= rescheduled.value.reschedule_date <= datetime.now(UTC)

    # A run of the scheduler (any other user) waits the reschedule interval: poke says "not yet".
    assert sensor.poke({**context, "dag_run": _TestDagRun(triggering_user_name="admin")}) is False
    # A failed try waiting for its retry is not "not started": no busy loop of pokes under dag.test() either.
    _status(run_dir, "failed", started_at=datetime.now(UTC))
    assert sensor.poke({**context, "dag_run": _TestDagRun()}) is False


def test_waiting_for_train_to_write_its_status_ends_when_it_does(sensor_and_run):
    """What the sensor does while Airflow has queued train but train has not written its status yet."""
    _, _, run_dir = sensor_and_run
    state = read_checkpoint_state(run_dir)
    assert state.status is None

    # Nothing written: gives up after its timeout with no status.
    assert wait_for_training_status(run_dir, state, timeout=0.3, interval=0.05).status is None

    writer = threading.Timer(0.3, _status, args=(run_dir, "running"),
                             kwargs={"started_at": datetime.now(UTC)})
    writer.start()
    started = time.monotonic()
    seen = wait_for_training_status(run_dir, state, timeout=30, interval=0.05)
    writer.join()
    assert seen.status is not None and seen.status.state == "running"
    assert time.monotonic() - started < 15  # generous "cannot hang" bound: it stopped at the status


def test_sensor_defers_to_the_trigger_while_training_runs(sensor_and_run):
    sensor, context, run_dir = sensor_and_run
    _status(run_dir, "running", started_at=datetime.now(UTC))

    with pytest.raises(TaskDeferred) as deferred:
        sensor.poke(context)

    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    assert trigger.run_dir_uri == run_dir.as_uri()
    assert trigger.stall_timeout_seconds == 1800.0  # the spec's stall_timeout: 30m
    # Checkpoints listed once a minute for the stall check; the end of training noticed in seconds.
    assert (trigger.poll_interval, trigger.status_poll_interval) == (60.0, STATUS_POLL_SECONDS)
    assert deferred.value.method_name == "execute_complete"


def test_sensor_succeeds_when_training_ended_and_fails_on_a_stall(sensor_and_run):
    sensor, context, run_dir = sensor_and_run
    _status(run_dir, "running", started_at=datetime.now(UTC) - timedelta(hours=2))
    with pytest.raises(TrainingStalledError, match="training stalled: no checkpoint committed for 2h00m"):
        sensor.poke(context)

    _status(run_dir, "failed", started_at=datetime.now(UTC), final=True)
    assert sensor.poke(context) is True

    sensor.execute_complete(context, {"status": "success", "message": "training succeeded (try 1)"})
    with pytest.raises(TrainingStalledError, match="no checkpoint"):
        sensor.execute_complete(context, {"status": "stalled", "message": "training stalled: no checkpoint committed"})
    with pytest.raises(TrainpipeError, match="the checkpoint watch stopped: cannot read"):
        sensor.execute_complete(context, {"status": "error", "message": "cannot read s3://b/r"})


def test_a_status_from_before_the_run_was_cleared_does_not_end_the_watch(sensor_and_run):
    """Clearing a failed train re-runs it and the sensor; the old try's final status must not end the
    new watch at once (it would let evaluate run before the new training)."""
    sensor, context, run_dir = sensor_and_run
    _status(run_dir, "failed", started_at=datetime.now(UTC), final=True, clear_number=0)
    assert sensor.poke({**context, "dag_run": _DagRun(clear_number=0)}) is True

    cleared = {**context, "dag_run": _DagRun(clear_number=1)}
    assert sensor.poke(cleared) is False  # waiting for the new try's status
    assert read_checkpoint_state(run_dir, clear_number=1).status is None

    _status(run_dir, "running", started_at=datetime.now(UTC), clear_number=1)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.poke(cleared)
    assert deferred.value.trigger.clear_number == 1
    _status(run_dir, "succeeded", started_at=datetime.now(UTC), clear_number=1)
    assert sensor.poke(cleared) is True
