"""CheckpointSensor's decisions on a real run folder: wait (reschedule, backing off), defer, succeed, fail."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from airflow.sdk.exceptions import TaskDeferred

from trainpipe.checkpoint_state import TrainingStalledError, TrainingStatus, write_training_status
from trainpipe.errors import TrainpipeError
from trainpipe.factory import compile_file
from trainpipe.runtime.train import run_dir_for
from trainpipe.sensors.checkpoint import CheckpointSensor
from trainpipe.settings import Settings
from trainpipe.triggers.checkpoint import STATUS_POLL_INTERVAL, CheckpointTrigger

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sensor_and_run(request):  # noqa: ANN001, ANN201
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml")
    run_id = f"sensor__{request.node.name}"
    return CheckpointSensor(task_id="watch_checkpoints", plan=plan), {"run_id": run_id}, \
        run_dir_for(plan.spec, Settings.from_env(), run_id)


def _status(run_dir, state: str, *, started_at: datetime, final: bool = False) -> None:  # noqa: ANN001
    write_training_status(run_dir, TrainingStatus(state=state, try_number=1, final=final, started_at=started_at,
                                                  updated_at=datetime.now(timezone.utc)))


def test_sensor_reschedules_until_training_starts_and_holds_no_retries(sensor_and_run):
    sensor, context, _ = sensor_and_run

    assert sensor.mode == "reschedule" and sensor.retries == 0
    assert sensor.poke(context) is False


def test_sensor_looks_again_within_seconds_then_backs_off_to_a_minute(sensor_and_run):
    sensor, _, _ = sensor_and_run
    started = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def next_look(waited_seconds: float) -> float:  # Airflow's own reschedule interval, on a fixed clock
        return sensor._get_next_poke_interval(started, lambda: waited_seconds, 1)

    # train starts in the same scheduler loop as the sensor: the second look comes seconds later.
    assert 2 <= next_look(0) <= 3
    # A failed try waiting for a long retry_delay costs one look a minute, not one every few seconds.
    assert next_look(3600) == 60


def test_sensor_defers_to_the_trigger_while_training_runs(sensor_and_run):
    sensor, context, run_dir = sensor_and_run
    _status(run_dir, "running", started_at=datetime.now(timezone.utc))

    with pytest.raises(TaskDeferred) as deferred:
        sensor.poke(context)

    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    assert trigger.run_dir_uri == run_dir.as_uri()
    assert trigger.stall_timeout_seconds == 1800.0  # the spec's stall_timeout: 30m
    # Checkpoints listed once a minute for the stall check; the end of training noticed in seconds.
    assert (trigger.poll_interval, trigger.status_poll_interval) == (60.0, STATUS_POLL_INTERVAL)
    assert deferred.value.method_name == "execute_complete"


def test_sensor_succeeds_when_training_ended_and_fails_on_a_stall(sensor_and_run):
    sensor, context, run_dir = sensor_and_run
    _status(run_dir, "running", started_at=datetime.now(timezone.utc) - timedelta(hours=2))
    with pytest.raises(TrainingStalledError, match="training stalled: no checkpoint committed for 2h00m"):
        sensor.poke(context)

    _status(run_dir, "failed", started_at=datetime.now(timezone.utc), final=True)
    assert sensor.poke(context) is True

    sensor.execute_complete(context, {"status": "success", "message": "training succeeded (try 1)"})
    with pytest.raises(TrainingStalledError, match="no checkpoint"):
        sensor.execute_complete(context, {"status": "stalled", "message": "training stalled: no checkpoint committed"})
    with pytest.raises(TrainpipeError, match="the checkpoint watch stopped: cannot read"):
        sensor.execute_complete(context, {"status": "error", "message": "cannot read s3://b/r"})
