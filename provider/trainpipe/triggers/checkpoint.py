"""Watch a run folder's checkpoints from the triggerer: no worker slot is held while training runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from trainpipe.plan.model import STATUS_POLL_SECONDS
from trainpipe.state.checkpoint_state import CheckpointState, Progress, assess, read_checkpoint_state, refresh_status

# Consecutive failed reads of the run folder before the trigger gives up (a storage outage).
MAX_READ_ERRORS = 5
class Clock:
    """Wall time and waiting, as the trigger sees them. Tests replace it with a virtual clock and
    drive minutes of a trigger's life in milliseconds, with no wall-clock sleeps."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class CheckpointTrigger(BaseTrigger):
    """Poll ``<run_dir>`` until training ends (``success``) or stops committing checkpoints (``stalled``).

    Two paces: the train task's status every ``status_poll_interval`` seconds (one small read; the
    end of training is noticed within seconds) and the committed checkpoints every ``poll_interval``
    seconds (a listing; logs one progress line: latest committed step, its age, steps per hour).
    A verdict is always taken on a fresh listing. It comes from
    ``trainpipe.state.checkpoint_state.assess``, the same function the sensor uses before it defers.
    """

    # Not serialized: a trigger always runs on the triggerer's real clock.
    clock: Clock = Clock()

    def __init__(self, *, run_dir_uri: str, conn_id: str | None, stall_timeout_seconds: float,
                 poll_interval: float, status_poll_interval: float = STATUS_POLL_SECONDS,
                 clear_number: int = 0) -> None:
        super().__init__()
        self.run_dir_uri = run_dir_uri
        self.conn_id = conn_id
        self.stall_timeout_seconds = float(stall_timeout_seconds)
        self.poll_interval = float(poll_interval)
        # Never slower than the listing (a short stall_timeout lists often).
        self.status_poll_interval = min(float(status_poll_interval), self.poll_interval)
        # The DAG run's clear_number: older statuses describe a training from before a clear.
        self.clear_number = int(clear_number)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "trainpipe.triggers.checkpoint.CheckpointTrigger",
            {
                "run_dir_uri": self.run_dir_uri,
                "conn_id": self.conn_id,
                "stall_timeout_seconds": self.stall_timeout_seconds,
                "poll_interval": self.poll_interval,
                "status_poll_interval": self.status_poll_interval,
                "clear_number": self.clear_number,
            },
        )

    def _run_dir(self):
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(self.run_dir_uri, conn_id=self.conn_id)

    def _read(self) -> CheckpointState:
        return read_checkpoint_state(self._run_dir(), clear_number=self.clear_number)

    def _refresh(self, state: CheckpointState) -> CheckpointState:
        return refresh_status(state, self._run_dir(), clear_number=self.clear_number)

    def _assess(self, state: CheckpointState) -> Progress:
        return assess(state, now=self.clock.now(),
                      stall_timeout=timedelta(seconds=self.stall_timeout_seconds))

    async def _observe(self, state: CheckpointState | None, *, list_checkpoints: bool,
                       ) -> tuple[CheckpointState, Progress, bool]:
        """A fresh status over the last listing, or a fresh listing; a verdict always on a fresh listing.
        Returns the state, its verdict and whether the checkpoints were listed."""
        # fsspec is synchronous: read in a thread so the triggerer's loop never blocks.
        if state is not None and not list_checkpoints:
            state = await asyncio.to_thread(self._refresh, state)
            progress = self._assess(state)
            if progress.kind not in ("finished", "stalled"):
                return state, progress, False
            # The listing may be up to poll_interval old: a newer checkpoint may end the stall, and
            # the final event reports the latest step.
        state = await asyncio.to_thread(self._read)
        return state, self._assess(state), True

    async def run(self) -> AsyncIterator[TriggerEvent]:
        errors = 0
        state: CheckpointState | None = None
        listed_at = 0.0
        while True:
            try:
                observed, progress, listed = await self._observe(
                    state, list_checkpoints=self.clock.monotonic() - listed_at >= self.poll_interval)
            except Exception as err:
                errors += 1
                self.log.warning("reading %s failed (%d/%d): %s", self.run_dir_uri, errors, MAX_READ_ERRORS, err)
                if errors >= MAX_READ_ERRORS:
                    yield TriggerEvent({"status": "error", "message": f"cannot read {self.run_dir_uri}: {err}"})
                    return
                await self.clock.sleep(self.status_poll_interval)
                continue
            errors = 0
            if listed:
                listed_at = self.clock.monotonic()
            # One progress line per listing, and whenever the train task's status changes.
            if listed or state is None or observed.status != state.status:
                self.log.info("%s", progress.message)
            state = observed
            if progress.kind == "finished":
                yield TriggerEvent({"status": "success", **progress.to_event()})
                return
            if progress.kind == "stalled":
                yield TriggerEvent({"status": "stalled", **progress.to_event()})
                return
            await self.clock.sleep(self.status_poll_interval)
