"""System metrics from rank 0: CPU/GPU utilisation and memory, samples/s; and compute hours.

A daemon thread samples every ``tracking.system_metrics_every_seconds`` and queues the values like
any metric (so they cost the loop nothing and survive a tracking outage). CPU figures are rank 0's
process and the whole machine; GPU figures are rank 0's device. psutil is used when installed
(it comes with the ``tracking`` extra); without it the process figures come from ``resource``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

LogFn = Callable[[str, float, int], None]


@dataclass(kw_only=True, slots=True)
class ComputeClock:
    """What this rank used since it started: CPU seconds of the process (all threads) on CPU, or
    device-seconds (wall time, one device per rank) on GPU. Summed over ranks for ``trainer_cpu_hours`` /
    ``trainer_gpu_hours`` (the trainer's own count; ``cpu_hours``/``gpu_hours`` are the platform's: devices held x
    wall time of every try, logged by the train task)."""

    device: torch.device
    _start_wall: float = field(init=False, default_factory=time.monotonic)
    _start_cpu: float = field(init=False, default_factory=time.process_time)

    @property
    def metric_name(self) -> str:
        return "trainer_gpu_hours" if self.device.type == "cuda" else "trainer_cpu_hours"

    def seconds(self) -> float:
        if self.device.type == "cuda":
            return time.monotonic() - self._start_wall
        return time.process_time() - self._start_cpu


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        return None
    return psutil


@dataclass(kw_only=True, slots=True)
class LoopCounters:
    """Written by the training loop (plain int stores), read by the monitor thread."""

    step: int = 0
    samples: int = 0


@dataclass(kw_only=True, slots=True)
class SystemMonitor:
    log: LogFn
    every_seconds: float
    counters: LoopCounters
    device: torch.device
    _thread: threading.Thread | None = field(init=False, default=None)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _last: tuple[float, int, float] = field(init=False, default=(0.0, 0, 0.0))

    def __post_init__(self) -> None:
        if self.every_seconds <= 0:
            raise ValueError("SystemMonitor: every_seconds must be > 0")

    def start(self) -> SystemMonitor:
        self._last = (time.monotonic(), self.counters.samples, time.process_time())
        psutil = _psutil()
        if psutil is not None:
            # The first cpu_percent call only sets the reference point.
            psutil.cpu_percent(interval=None)
        self._thread = threading.Thread(target=self._run, name="trainpipe-system-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_seconds):
            self.sample()

    def sample(self) -> dict[str, float]:
        now, cpu_now = time.monotonic(), time.process_time()
        last_time, last_samples, last_cpu = self._last
        samples = self.counters.samples
        elapsed = max(now - last_time, 1e-9)
        values = {
            "system/samples_per_second": (samples - last_samples) / elapsed,
            # 100 = one core busy; threads of the process (loaders, checkpoint writer) count too.
            "system/process_cpu_percent": 100.0 * (cpu_now - last_cpu) / elapsed,
        }
        self._last = (now, samples, cpu_now)
        psutil = _psutil()
        if psutil is not None:
            memory = psutil.virtual_memory()
            values["system/cpu_utilization_percent"] = psutil.cpu_percent(interval=None)
            values["system/memory_used_percent"] = memory.percent
            values["system/memory_used_mb"] = (memory.total - memory.available) / 2**20
            values["system/process_rss_mb"] = psutil.Process(os.getpid()).memory_info().rss / 2**20
        else:
            import resource

            values["system/process_max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if self.device.type == "cuda":
            values["system/gpu_memory_allocated_mb"] = torch.cuda.memory_allocated(self.device) / 2**20
            values["system/gpu_memory_reserved_mb"] = torch.cuda.memory_reserved(self.device) / 2**20
            try:
                values["system/gpu_utilization_percent"] = float(torch.cuda.utilization(self.device))
            except Exception:
                pass
        step = self.counters.step
        for name, value in values.items():
            self.log(name, float(value), step)
        return values
