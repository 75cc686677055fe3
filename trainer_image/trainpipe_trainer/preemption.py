"""SIGTERM is a preemption notice: note it, let the loop commit a checkpoint, then exit.

The handler only sets a flag (nothing else is safe inside a signal handler); the training loop
reads it once per optimizer step and all ranks agree on the step through ``distributed.StepFlags``.
Kubernetes and torchrun both send SIGTERM and wait (30 s by default) before SIGKILL.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any


@dataclass(kw_only=True, slots=True)
class PreemptionWatcher:
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    received: signal.Signals | None = field(init=False, default=None)
    _previous: dict[signal.Signals, Any] = field(init=False, default_factory=dict)

    def __enter__(self) -> PreemptionWatcher:
        # Handlers can only be installed from the main thread (an in-process test may run elsewhere).
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)

    @property
    def requested(self) -> bool:
        return self.received is not None
