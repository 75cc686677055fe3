"""A virtual clock for triggers: time moves only when the test says so, never by waiting.

The trigger still does its real work (reads of a real run folder, in threads); only its sleeps and
its sense of time are virtual. ``advance`` wakes the sleepers in time order and, before moving on,
waits until the trigger is asleep again or done, so a test reads as a timeline.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

# Real seconds the trigger may take between two of its sleeps (thread reads, s3 calls): a "cannot
# hang" bound, not a timing.
SETTLE_TIMEOUT = 30.0


class VirtualClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.start = start or datetime.now(UTC)
        self.elapsed = 0.0
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    # -- the trigger's side -------------------------------------------------------------------
    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        return self.elapsed

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.elapsed + seconds, wake))
        await wake

    # -- the test's side ----------------------------------------------------------------------
    async def advance(self, seconds: float, *, task: asyncio.Future) -> None:
        """Move ``seconds`` forward, waking every sleep that ends on the way; stops early if ``task`` ends."""
        end = self.elapsed + seconds
        while True:
            await self._settle(task)
            if task.done() or not self._sleepers:
                break
            self._sleepers.sort(key=lambda sleeper: sleeper[0])
            wake_at, wake = self._sleepers[0]
            if wake_at > end:
                break
            self._sleepers.pop(0)
            self.elapsed = max(self.elapsed, wake_at)
            wake.set_result(None)
        if not task.done():
            self.elapsed = end

    async def _settle(self, task: asyncio.Future) -> None:
        """Until the trigger sleeps again (its reads finished) or ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_TIMEOUT
        while not task.done() and not any(not wake.done() for _, wake in self._sleepers):
            if loop.time() > deadline:
                raise AssertionError(f"the trigger neither slept nor ended within {SETTLE_TIMEOUT} s")
            await asyncio.sleep(0.001)
