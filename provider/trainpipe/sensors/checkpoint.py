"""The checkpoint sensor: runs beside the train task and fails when training stops making progress."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan import PipelinePlan


# Before training starts (or while a failed try waits for its retry) the sensor looks again after
# 2-3 s, then backs off exponentially up to a minute, holding no slot in between (reschedule mode):
# train usually starts in the same scheduler loop as the sensor, and a retry may be an hour away.
WAITING_POKE_INTERVAL = timedelta(seconds=5)
WAITING_MAX_WAIT = timedelta(minutes=1)


class CheckpointSensor(BaseSensorOperator):
    """Logs training progress and fails when no checkpoint is committed for ``stall_timeout``.

    - training not started, or a failed try waiting for its retry: look again soon (reschedule
      mode, no worker slot held, exponential backoff). Not deferred: ``dag.test()`` runs a trigger
      in line, one task at a time, and would wait on it for a train task that cannot start;
    - training running: defer to ``CheckpointTrigger`` on the triggerer, which reads the train
      task's status every few seconds (the sensor ends within seconds of ``train``) and lists the
      checkpoints at the stall check's own pace;
    - training ended (succeeded, or failed for good): succeed. The train task reports its own failure.

    It reads ``<run_dir>/output/status.json``, written by the train task's callbacks, and the
    committed checkpoints, through ``trainpipe.checkpoint_state`` like its trigger.
    """

    ui_color = "#efe6fb"

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", WAITING_POKE_INTERVAL)
        kwargs.setdefault("exponential_backoff", True)
        kwargs.setdefault("max_wait", WAITING_MAX_WAIT)
        # A stall is not transient: retrying the sensor would only report it again.
        kwargs["retries"] = 0
        super().__init__(**kwargs)
        self.plan = plan

    @property
    def stall_timeout(self) -> timedelta:
        return self.plan.spec.training.checkpoint.stall_timeout

    def _run_dir(self, context: Context):  # noqa: ANN202 - ObjectStoragePath
        from trainpipe.runtime.train import run_dir_for
        from trainpipe.settings import Settings

        return run_dir_for(self.plan.spec, Settings.from_env(), context["run_id"])

    def poke(self, context: Context) -> bool:
        from trainpipe.checkpoint_state import TrainingStalledError, assess, read_checkpoint_state
        from trainpipe.settings import Settings
        from trainpipe.storage import fsspec_uri
        from trainpipe.triggers.checkpoint import STATUS_POLL_INTERVAL, CheckpointTrigger, poll_interval_for

        run_dir = self._run_dir(context)
        progress = assess(read_checkpoint_state(run_dir), now=datetime.now(timezone.utc),
                          stall_timeout=self.stall_timeout)
        self.log.info("%s", progress.message)
        if progress.kind == "finished":
            return True
        if progress.kind == "stalled":
            raise TrainingStalledError(progress.message)
        if progress.kind == "running":
            self.defer(
                trigger=CheckpointTrigger(
                    run_dir_uri=fsspec_uri(run_dir),
                    conn_id=Settings.from_env().storage_conn_id,
                    stall_timeout_seconds=self.stall_timeout.total_seconds(),
                    poll_interval=poll_interval_for(self.stall_timeout),
                    status_poll_interval=STATUS_POLL_INTERVAL,
                ),
                method_name="execute_complete",
            )
        return False

    def execute_complete(self, context: Context, event: dict[str, Any]) -> None:
        from trainpipe.checkpoint_state import TrainingStalledError
        from trainpipe.errors import TrainpipeError

        if event["status"] == "success":
            self.log.info("%s", event["message"])
            return
        if event["status"] == "stalled":
            raise TrainingStalledError(event["message"])
        raise TrainpipeError(f"the checkpoint watch stopped: {event['message']}")
