"""The local launcher (the embedded default): torchrun as a subprocess of the Airflow worker.

It runs the plan's launch (``trainpipe.launch``: argv and environment, resolved for the run) on top
of the worker's environment: the Kubernetes launcher puts the same command and variables in the pod.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainpipe.errors import TrainingFailedError

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


def run_local(command: Sequence[str], *, env: Mapping[str, str], on_line: Callable[[str], None] | None = None,
              cwd: str | None = None, executable: str | None = None) -> None:
    """Run the trainer command, streaming every output line; raise ``TrainingFailedError`` on failure.

    ``executable`` runs ``command[0]`` from a known place (this venv's torchrun) while the argv
    stays exactly the planned one."""
    emit = on_line or (lambda line: log.info("%s", line))
    full_env = {**os.environ, **env}
    emit("launching: " + " ".join(command))
    process = subprocess.Popen(
        list(command), executable=executable, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, start_new_session=True,
    )
    try:
        for line in process.stdout or ():
            emit(line.rstrip("\n"))
        code = process.wait()
    except BaseException:
        # The task was killed or timed out: take torchrun and its workers down with it (SIGTERM lets
        # the trainer commit a checkpoint first).
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        raise
    if code != 0:
        raise TrainingFailedError(f"trainer exited with code {code}: {' '.join(command)}")
