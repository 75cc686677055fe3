"""The local launcher (the embedded default): torchrun as a subprocess of the Airflow worker.

It runs the plan's launch (``trainpipe.plan.launch``: argv and environment, resolved for the run) on top
of the worker's environment: the Kubernetes launcher puts the same command and variables in the pod.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

from trainpipe.errors import TrainingFailedError
from trainpipe_trainer.config import PREEMPTION_GRACE_SECONDS
from trainpipe_trainer.processes import die_with_parent

log = logging.getLogger(__name__)


class LauncherStoppedError(TrainingFailedError):
    """The launcher itself was sent SIGTERM (its task or host is going away) and the trainer stopped on it:
    the training must not be launched again in this process; the next try resumes from the committed step."""


def local_python() -> str:
    """This interpreter (the worker's venv, which has torch and the trainer): it runs the plan's
    ``python -m trainpipe_trainer.elastic ...`` rather than whatever ``python`` is on PATH."""
    return sys.executable


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


def _drain(process: subprocess.Popen, emit: Callable[[str], None]) -> None:
    with contextlib.suppress(OSError, ValueError):
        for line in process.stdout or ():
            emit(line.rstrip("\n"))


def run_local(command: Sequence[str], *, env: Mapping[str, str], on_line: Callable[[str], None] | None = None,
              cwd: str | None = None, executable: str | None = None,
              grace_seconds: int = PREEMPTION_GRACE_SECONDS) -> None:
    """Run the trainer command, streaming every output line; raise ``TrainingFailedError`` on failure.

    ``executable`` runs in place of ``command[0]`` (this venv's Python for the planned ``python``);
    the log shows the planned command. A SIGTERM is passed on to the trainer (``_PreemptionNotice``);
    if this process was sent it and the trainer did not finish, ``LauncherStoppedError``: the caller
    must not launch it again. A trainer preempted alone is a ``TrainingFailedError`` the caller
    recognises by its message and may launch again. torchrun gets SIGTERM if this process dies."""
    emit = on_line or (lambda line: log.info("%s", line))
    full_env = {**os.environ, **env}
    emit("launching: " + " ".join(command))
    # argv[0] too (not only Popen's executable): Python finds its environment (venv) from argv[0].
    argv = [executable, *command[1:]] if executable else list(command)
    # The kernel sends torchrun SIGTERM if the launcher dies (kill -9 included): torchrun passes it on to
    # its ranks, which commit and exit instead of running orphaned. This thread waits for the child, so
    # only the launcher's death sends it.
    process = subprocess.Popen(
        argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM),
    )
    try:
        with _PreemptionNotice(group=process.pid) as notice:
            for line in process.stdout or ():
                notice.announce(emit)
                emit(line.rstrip("\n"))
            code = process.wait()
            notice.announce(emit)
    except BaseException:
        # The task was killed or timed out (execution_timeout raises here, from SIGALRM): take torchrun and
        # its workers down with it (SIGTERM lets the trainer commit a checkpoint first).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        # Still read its output: a trainer blocked on a full pipe would never commit, and the log keeps
        # the line that says which step it committed.
        drain = threading.Thread(target=_drain, args=(process, emit), daemon=True)
        drain.start()
        try:
            process.wait(timeout=grace_seconds + 10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        drain.join(timeout=5)
        raise
    if code != 0 and notice.received:
        raise LauncherStoppedError(f"the launcher was sent SIGTERM and the trainer exited with code {code}: "
                                   f"{' '.join(command)}", exit_code=code)
    if code != 0:
        raise TrainingFailedError(f"trainer exited with code {code}: {' '.join(command)}", exit_code=code)
