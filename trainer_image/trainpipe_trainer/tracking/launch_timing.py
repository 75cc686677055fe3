"""Where a launch's fixed time goes: named phases from the process's start to its end.

The trainer marks each phase as it ends (``LaunchPhases.mark``); rank 0 prints the breakdown once,
at the end, and logs it to MLflow (``launch_seconds/<phase>``). The step loop (every optimizer step
after the first) is not a phase: it is what the launch's fixed time is compared with.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


def process_age_seconds() -> float:
    """Seconds since this process started (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            # Field 22 (starttime, clock ticks after boot); the command name (field 2) may hold spaces.
            started_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0.0
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    return max(age, 0.0)


@dataclass(kw_only=True, slots=True)
class LaunchPhases:
    phases: list[tuple[str, float]] = field(default_factory=list)
    # perf_counter of the end of the last phase; set back to the process's start by since_process_start.
    _last: float = field(default_factory=time.perf_counter)
    # perf_counter when the step loop started (None before the first step ends).
    loop_started: float | None = None

    @classmethod
    def since_process_start(cls) -> LaunchPhases:
        return cls(_last=time.perf_counter() - process_age_seconds())

    def mark(self, phase: str) -> None:
        """The phase ``phase`` ended now (it began where the previous one ended)."""
        now = time.perf_counter()
        self.phases.append((phase, now - self._last))
        self._last = now

    def skip(self) -> None:
        """Time from the last mark to now belongs to no phase (the step loop)."""
        self._last = time.perf_counter()

    @property
    def fixed_seconds(self) -> float:
        return sum(seconds for _, seconds in self.phases)

    def metrics(self) -> dict[str, float]:
        return {f"launch_seconds/{name.replace(' ', '_')}": seconds for name, seconds in self.phases} | {
            "launch_seconds/outside_step_loop": self.fixed_seconds
        }

    def summary(self, *, loop_steps: int, loop_seconds: float, samples_per_second: float) -> str:
        parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.phases)
        return (
            f"launch: {self.fixed_seconds:.1f} s outside the step loop ({parts}); step loop: {loop_steps} steps in "
            f"{loop_seconds:.1f} s, {samples_per_second:,.0f} samples/s"
        )
