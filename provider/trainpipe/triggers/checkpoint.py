"""Watch a run folder's checkpoints from the triggerer: no worker slot is held while training runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from trainpipe.checkpoint_state import assess, read_checkpoint_state

# Consecutive failed reads of the run folder before the trigger gives up (a storage outage).
MAX_READ_ERRORS = 5


def poll_interval_for(stall_timeout: timedelta) -> float:
    """Often enough to notice a stall within a quarter of its timeout, never more than once a minute."""
    return max(0.5, min(60.0, stall_timeout.total_seconds() / 4))


class CheckpointTrigger(BaseTrigger):
    """Poll ``<run_dir>`` until training ends (``success``) or stops committing checkpoints (``stalled``).

    Logs one progress line per poll: latest committed step, its age, steps per hour. The verdict
    comes from ``trainpipe.checkpoint_state.assess``, the same function the sensor uses before it
    defers.
    """

    def __init__(self, *, run_dir_uri: str, conn_id: str | None, stall_timeout_seconds: float,
                 poll_interval: float) -> None:
        super().__init__()
        self.run_dir_uri = run_dir_uri
        self.conn_id = conn_id
        self.stall_timeout_seconds = float(stall_timeout_seconds)
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "trainpipe.triggers.checkpoint.CheckpointTrigger",
            {
                "run_dir_uri": self.run_dir_uri,
                "conn_id": self.conn_id,
                "stall_timeout_seconds": self.stall_timeout_seconds,
                "poll_interval": self.poll_interval,
            },
        )

    def _read(self):  # noqa: ANN202 - CheckpointState
        from airflow.sdk import ObjectStoragePath

        return read_checkpoint_state(ObjectStoragePath(self.run_dir_uri, conn_id=self.conn_id))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        stall_timeout = timedelta(seconds=self.stall_timeout_seconds)
        errors = 0
        while True:
            try:
                # fsspec is synchronous: read in a thread so the triggerer's loop never blocks.
                state = await asyncio.to_thread(self._read)
            except Exception as err:  # noqa: BLE001 - storage outages are retried, then reported
                errors += 1
                self.log.warning("reading %s failed (%d/%d): %s", self.run_dir_uri, errors, MAX_READ_ERRORS, err)
                if errors >= MAX_READ_ERRORS:
                    yield TriggerEvent({"status": "error", "message": f"cannot read {self.run_dir_uri}: {err}"})
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            errors = 0
            progress = assess(state, now=datetime.now(timezone.utc), stall_timeout=stall_timeout)
            self.log.info("%s", progress.message)
            if progress.kind == "finished":
                yield TriggerEvent({"status": "success", **progress.to_event()})
                return
            if progress.kind == "stalled":
                yield TriggerEvent({"status": "stalled", **progress.to_event()})
                return
            await asyncio.sleep(self.poll_interval)
