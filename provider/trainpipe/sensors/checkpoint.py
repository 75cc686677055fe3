"""The checkpoint sensor: runs beside the train task and fails when training stops making progress."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan.model import PipelinePlan
    from trainpipe.settings import Settings

class CheckpointSensor(BaseSensorOperator):
    """Logs training progress and fails when no checkpoint is committed for ``stall_timeout``.

    - train queued or started by Airflow but no status written yet: look again every half second
      for up to the plan's ``train_start_grace`` (train and this sensor start in the same scheduler loop);
    - training not started, or a failed try waiting for its retry: check again later (reschedule
      mode, no worker slot held). Not deferred: ``dag.test()`` runs a trigger in line, one task at
      a time, and would wait on it for a train task that cannot start;
    - training running: defer to ``CheckpointTrigger`` on the triggerer, which reads the train
      task's status every few seconds (the sensor ends within seconds of ``train``) and lists the
      checkpoints at the stall check's own pace;
    - training ended (succeeded, or failed for good): succeed. The train task reports its own failure.

    It reads ``<run_dir>/output/status.json``, written by the train task's callbacks, and the
    committed checkpoints, through ``trainpipe.state.checkpoint_state`` like its trigger.
    """

    ui_color = "#efe6fb"

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", plan.sensor.waiting_poke)
        # A stall is not transient: retrying the sensor would only report it again.
        kwargs["retries"] = 0
        super().__init__(**kwargs)
        self.plan = plan

    @property
    def stall_timeout(self) -> timedelta:
        return self.plan.sensor.stall_timeout

    @functools.cached_property
    def settings(self) -> Settings:
        """The platform's settings, read where the task enters trainpipe, once (the operators' ``TaskSettings``;
        a sensor does not import the operators, an earlier stage)."""
        from trainpipe.settings import Settings

        return Settings.from_env()

    def _run_dir(self, context: Context):
        from trainpipe.state.run_folder import run_dir_for

        return run_dir_for(self.plan.dag_id, self.settings, context["run_id"])

    def _train_is_starting(self, context: Context) -> bool:
        """Whether Airflow has queued or started this run's train task. Under ``dag.test()`` it is
        still "scheduled" while this sensor runs: there the sensor reschedules at once."""
        from trainpipe.plan.steps import TRAIN_TASK

        ti = context.get("ti")
        if ti is None:
            return False
        try:
            states = ti.get_task_states(dag_id=self.dag_id, task_ids=[TRAIN_TASK], run_ids=[context["run_id"]])
        except Exception as err:
            self.log.warning("could not read the state of %s: %s", TRAIN_TASK, err)
            return False
        return states.get(context["run_id"], {}).get(TRAIN_TASK) in ("queued", "running")

    @staticmethod
    def _under_dag_test(context: Context) -> bool:
        """``dag.test()`` (and ``airflow dags test``) names its runs' user "dag_test". It runs one task at a
        time: a sensor that pokes before train waits out its whole reschedule interval after train ended,
        while Airflow warns "No tasks to run" every second."""
        dag_run = context.get("dag_run")
        return getattr(dag_run, "triggering_user_name", None) == "dag_test"

    def poke(self, context: Context) -> bool:
        from airflow.sdk.exceptions import AirflowRescheduleException

        from trainpipe.state.checkpoint_state import (
            TrainingStalledError,
            assess,
            dag_run_clear_number,
            read_checkpoint_state,
            wait_for_training_status,
        )
        from trainpipe.storage import fsspec_uri
        from trainpipe.triggers.checkpoint import CheckpointTrigger

        run_dir = self._run_dir(context)
        # After a clear, train's status from before it is ignored until the new try writes one.
        clear_number = dag_run_clear_number(context)
        state = read_checkpoint_state(run_dir, clear_number=clear_number)
        if state.status is None and self._train_is_starting(context):
            grace = self.plan.sensor.train_start_grace
            self.log.info("train is starting: waiting up to %s for its status", grace)
            state = wait_for_training_status(run_dir, state, timeout=grace.total_seconds(), clear_number=clear_number)
        now = datetime.now(UTC)
        progress = assess(state, now=now, stall_timeout=self.stall_timeout)
        self.log.info("%s", progress.message)
        if state.status is None and progress.kind == "waiting" and self._under_dag_test(context):
            # Train has not started: dag.test() runs it next, in line; look again as soon as it has ended.
            raise AirflowRescheduleException(now)
        if progress.skipped:
            _skip_with_train(progress.message)
        if progress.kind == "finished":
            return True
        if progress.kind == "stalled":
            self._leave_stall_note(context, progress.message)
            raise TrainingStalledError(progress.message)
        if progress.kind == "running":
            self.defer(
                trigger=CheckpointTrigger(
                    run_dir_uri=fsspec_uri(run_dir),
                    conn_id=self.settings.storage_conn_id,
                    stall_timeout_seconds=self.stall_timeout.total_seconds(),
                    poll_interval=self.plan.sensor.checkpoint_poll_seconds,
                    status_poll_interval=self.plan.sensor.status_poll_seconds,
                    clear_number=clear_number,
                ),
                method_name="execute_complete",
            )
        return False

    @staticmethod
    def _leave_stall_note(context: Context, message: str) -> None:
        from trainpipe.state.run_notes import leave_note, stall_note

        if context.get("ti") is not None:  # absent only when the sensor is called outside a task
            leave_note(context["ti"], stall_note(message))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        from trainpipe.errors import TrainpipeError
        from trainpipe.state.checkpoint_state import TrainingStalledError

        if event["status"] == "success":
            self.log.info("%s", event["message"])
            if event.get("skipped"):
                _skip_with_train(event["message"])
            return
        if event["status"] == "stalled":
            self._leave_stall_note(context, event["message"])
            raise TrainingStalledError(event["message"])
        raise TrainpipeError(f"the checkpoint watch stopped: {event['message']}")


def _skip_with_train(message: str) -> None:
    """Train skipped itself (its inputs unchanged, ``training.cache``): so does its watch, as the grid shows."""
    from airflow.sdk.exceptions import AirflowSkipException

    raise AirflowSkipException(message)
