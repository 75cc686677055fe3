"""The progress line rank 0 prints to stdout, which streams into the Airflow task log."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def format_duration(seconds: float) -> str:
    seconds = max(round(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass(kw_only=True, slots=True)
class Progress:
    total_steps: int
    epochs: int
    enabled: bool
    _start_time: float = field(init=False, default_factory=time.monotonic)
    _start_step: int = field(init=False, default=0)
    _last_time: float = field(init=False, default_factory=time.monotonic)
    _samples: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.total_steps < 0 or self.epochs < 1:
            raise ValueError("Progress: total_steps must be >= 0 and epochs >= 1")

    def start(self, step: int) -> None:
        # Rates count only this process's work: a resumed run did not do the earlier steps.
        self._start_step = step
        self._start_time = self._last_time = time.monotonic()

    def add_samples(self, count: int) -> None:
        self._samples += count

    def report(self, *, step: int, epoch: int, loss: float) -> None:
        """``step 120/600 epoch 1/3 loss 0.2345 samples/s 5120 eta 12s``; epoch is 0-based here."""
        now = time.monotonic()
        rate = self._samples / max(now - self._last_time, 1e-9)
        steps_per_s = (step - self._start_step) / max(now - self._start_time, 1e-9)
        eta = (self.total_steps - step) / steps_per_s if steps_per_s > 0 else 0.0
        self._samples, self._last_time = 0, now
        if self.enabled:
            print(
                f"step {step}/{self.total_steps} epoch {min(epoch + 1, self.epochs)}/{self.epochs} "
                f"loss {loss:.4f} samples/s {rate:.0f} eta {format_duration(eta)}",
                flush=True,
            )
