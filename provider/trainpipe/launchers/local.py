"""The local launcher (the embedded default): torchrun as a subprocess of the Airflow worker.

It runs the plan's launch (``trainpipe.launch``: argv and environment, resolved for the run) on top
of the worker's environment: the Kubernetes launcher puts the same command and variables in the pod.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from trainpipe.errors import TrainingFailedError
from trainpipe_trainer.config import PREEMPTION_GRACE_SECONDS

log = logging.getLogger(__name__)


def local_torchrun() -> str:
    """The torchrun of this interpreter's environment (the worker's venv), not whatever is on PATH."""
    candidate = Path(sys.executable).with_name("torchrun")
    if candidate.exists():
        return str(candidate)
    found = shutil.which("torchrun")
    if not found:
        raise TrainingFailedError(
            "torchrun not found next to the Python interpreter or on PATH; install torch on the worker "
            "(pip install torch) or use launcher: kubernetes"
        )
    return found


@dataclass(slots=True)
class _PreemptionNotice:
    """While torchrun runs: a SIGTERM to this process (a worker's or container's shutdown, ``kill -TERM``
    of the launcher's process group) is passed on to torchrun's process group once, so every rank
    finishes its step and commits it, instead of ending this process and orphaning the trainer.

    torchrun runs in its own session (so Airflow's process-group kills do not reach it directly);
    without this handler the default action ended the launcher and the trainer lost its output.
    A handler can only be installed from the main thread; elsewhere the caller's handling stays.
    """

    group: int
    received: bool = False
    announced: bool = False
    _previous: object = None
    _installed: bool = False

    def __enter__(self) -> _PreemptionNotice:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag and a kill here (no logging inside a signal handler); once: a second
        # SIGTERM (Airflow's supervisor forwards its own) must not cut torchrun's shutdown short.
        if not self.received:
            self.received = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group, signal.SIGTERM)

    def announce(self, emit: Callable[[str], None]) -> None:
        if self.received and not self.announced:
            self.announced = True
            emit("received SIGTERM: passed it on to the trainer, which finishes its step, commits a checkpoint "
                 "of it and exits (preemption)")


_SIGNAL_EXCEPTION = "torch.distributed.elastic.multiprocessing.api.SignalException: "


@dataclass(slots=True)
class _SignalTraceback:
    """Holds back a traceback until its last line: torchrun's own for the SIGTERM it was passed
    (``SignalException``) becomes one line, any other is emitted whole."""

    emit: Callable[[str], None]
    held: list[str] | None = None

    def line(self, text: str) -> None:
        if self.held is None:
            if text == "Traceback (most recent call last):":
                self.held = [text]
            else:
                self.emit(text)
            return
        self.held.append(text)
        if text.startswith((" ", "\t")):
            return
        held, self.held = self.held, None
        if text.startswith(_SIGNAL_EXCEPTION):
            self.emit(f"torchrun stopped on the signal ({text.removeprefix(_SIGNAL_EXCEPTION)}; its traceback left out)")
        else:
            for kept in held:
                self.emit(kept)

    def flush(self) -> None:
        held, self.held = self.held or [], None
        for kept in held:
            self.emit(kept)


def run_local(command: Sequence[str], *, env: Mapping[str, str], on_line: Callable[[str], None] | None = None,
              cwd: str | None = None, executable: str | None = None,
              grace_seconds: int = PREEMPTION_GRACE_SECONDS) -> None:
    """Run the trainer command, streaming every output line; raise ``TrainingFailedError`` on failure.

    ``executable`` runs ``command[0]`` from a known place (this venv's torchrun) while the argv
    stays exactly the planned one. A SIGTERM is passed on to the trainer (``_PreemptionNotice``);
    the caller recognises the preempted trainer by its message and may launch it again."""
    emit = on_line or (lambda line: log.info("%s", line))
    full_env = {**os.environ, **env}
    emit("launching: " + " ".join(command))
    process = subprocess.Popen(
        list(command), executable=executable, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True,
    )
    try:
        output = _SignalTraceback(emit)
        with _PreemptionNotice(group=process.pid) as notice:
            for line in process.stdout or ():
                notice.announce(emit)
                output.line(line.rstrip("\n"))
            output.flush()
            code = process.wait()
            notice.announce(emit)
    except BaseException:
        # The task was killed or timed out: take torchrun and its workers down with it (SIGTERM lets
        # the trainer commit a checkpoint first).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds + 10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        raise
    if code != 0:
        raise TrainingFailedError(f"trainer exited with code {code}: {' '.join(command)}")
