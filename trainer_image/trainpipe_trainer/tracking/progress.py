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


@dataclass(kw_only=True, slots=True, frozen=True)
class Rate:
    """What one progress line reports beside the loss (also logged to MLflow)."""

    samples_per_second: float
    # Share of the interval's wall time the loop waited for its next batch.
    data_wait_share: float
    peak_memory_gb: float | None = None


@dataclass(kw_only=True, slots=True)
class Progress:
    total_steps: int
    epochs: int
    enabled: bool
    _start_time: float = field(init=False, default_factory=time.monotonic)
    _start_step: int = field(init=False, default=0)
    _last_time: float = field(init=False, default_factory=time.monotonic)
    _samples: int = field(init=False, default=0)
    # The loader's wait total at the last report.
    _data_wait: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.total_steps < 0 or self.epochs < 1:
            raise ValueError("Progress: total_steps must be >= 0 and epochs >= 1")

    def start(self, step: int) -> None:
        # Rates count only this process's work: a resumed run did not do the earlier steps.
        self._start_step = step
        self._start_time = self._last_time = time.monotonic()

    def add_samples(self, count: int) -> None:
        self._samples += count

    def report(
        self, *, step: int, epoch: int, loss: float, data_wait_seconds: float = 0.0, peak_memory_gb: float | None = None
    ) -> Rate:
        """``step 120/600 epoch 1/3 loss 0.2345 samples/s 5120 data wait 3% eta 12s`` (``gpu peak 1.2 GiB``
        on CUDA); epoch is 0-based here. ``data_wait_seconds``: the loader's running total."""
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        rate = Rate(
            samples_per_second=self._samples / elapsed,
            data_wait_share=min(max(data_wait_seconds - self._data_wait, 0.0) / elapsed, 1.0),
            peak_memory_gb=peak_memory_gb,
        )
        steps_per_s = (step - self._start_step) / max(now - self._start_time, 1e-9)
        eta = (self.total_steps - step) / steps_per_s if steps_per_s > 0 else 0.0
        self._samples, self._last_time, self._data_wait = 0, now, data_wait_seconds
        if self.enabled:
            memory = f" gpu peak {peak_memory_gb:.1f} GiB" if peak_memory_gb is not None else ""
            print(
                f"step {step}/{self.total_steps} epoch {min(epoch + 1, self.epochs)}/{self.epochs} "
                f"loss {loss:.4f} samples/s {rate.samples_per_second:.0f} data wait {rate.data_wait_share:.0%}"
                f"{memory} eta {format_duration(eta)}",
                flush=True,
            )
        return rate
