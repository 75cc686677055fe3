"""A SIGTERM to the local launcher itself (``trainpipe train``; the train task's process: a worker's shutdown,
Airflow stopping the task) means "leave": the trainer commits its step, the launcher ends the try as preempted
without launching it again, and nothing it started outlives it, not even after a ``kill -9`` of the launcher
(torchrun gets SIGTERM from the kernel: a parent-death signal). Real processes throughout; a trainer preempted
alone is relaunched in place (tests/launchers/test_preemption_relaunch.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.launchers.test_preemption_relaunch import LOGICAL_DATE, _command_line, _env, _exited, _spec, _trainpipe
from tests.trainer.helpers import committed_steps
from trainpipe_trainer.config import PREEMPTION_GRACE_SECONDS
from trainpipe_trainer.outcomes import preempted_message
from trainpipe_trainer.run_layout import CHECKPOINTS_DIR

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One demo dataset for the module's trainings (each has its own run folder)."""
    home = tmp_path_factory.mktemp("launcher-signals") / "home"
    demo = subprocess.run([_trainpipe(), "demo-data", "--end", LOGICAL_DATE], env=_env(home), capture_output=True,
                          text=True, timeout=600, check=False)
    assert demo.returncode == 0, demo.stderr
    return home


class _Training:
    """``trainpipe train`` in a process group of its own (as a worker's task process), stopped mid-training."""

    def __init__(self, home: Path, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "run"
        self.log = tmp_path / "run.log"
        spec = _spec(tmp_path / "spec.yaml", step_delay_seconds=0.1)
        with self.log.open("w") as out:
            self.process = subprocess.Popen([_trainpipe(), "train", str(spec), "--run-dir", str(self.run_dir),
                                             "--logical-date", LOGICAL_DATE], env=_env(home), stdout=out,
                                            stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def started(self) -> list[psutil.Process]:
        """Once the trainer is stepping: what the launcher started (torchrun and its ranks)."""
        deadline = time.monotonic() + 600
        while not re.search(r"^step \d+/", self.text(), flags=re.MULTILINE):
            assert self.process.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, "no training step within 600 s"
            time.sleep(0.1)
        started = psutil.Process(self.process.pid).children(recursive=True)
        assert any("trainpipe_trainer.elastic" in _command_line(child) for child in started), started
        assert sum(child.environ().get("RANK") is not None for child in started) >= 1, started
        return started

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)


@pytest.fixture
def training(home: Path, tmp_path: Path) -> Iterator[_Training]:
    running = _Training(home, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _left_running(processes: list[psutil.Process], *, within: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while (left := [process for process in processes if not _exited(process)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("target", ["pid", "process group"])
def test_sigterm_to_the_launcher_commits_the_step_and_ends_the_try_preempted_without_relaunching(
    training: _Training, target: str
) -> None:
    started = training.started()
    signalled = time.monotonic()
    if target == "pid":
        os.kill(training.process.pid, signal.SIGTERM)
    else:
        os.killpg(training.process.pid, signal.SIGTERM)
    code = training.process.wait(timeout=PREEMPTION_GRACE_SECONDS + 60)
    took = time.monotonic() - signalled
    text = training.text()
    assert took < PREEMPTION_GRACE_SECONDS, f"{took:.1f} s\n{text[-4000:]}"
    # The CLI's failure: the try ends preempted, for the next try to resume.
    assert code == 1, text[-4000:]
    step = int(re.search(r"^received SIGTERM: committed checkpoint step-(\d+);", text, flags=re.MULTILINE)[1])
    lines = text.splitlines()
    assert preempted_message("SIGTERM", step) in lines
    assert step in committed_steps(training.run_dir / CHECKPOINTS_DIR)
    assert (f"preempted at step {step}; the next try resumes there (the launcher was sent SIGTERM: not launching "
            "the trainer again in this try)") in lines, text[-4000:]
    assert f"trainpipe train: preempted at step {step}; the next try resumes there" in lines
    assert text.count("launching: ") == 1 and "launching it again" not in text, text[-4000:]
    assert not (training.run_dir / "output" / "result.json").exists()
    assert _left_running(started, within=5) == [], [process.cmdline() for process in started]


def test_kill_9_of_the_launcher_takes_torchrun_and_its_ranks_down(training: _Training) -> None:
    started = training.started()
    os.kill(training.process.pid, signal.SIGKILL)
    training.process.wait(timeout=60)
    killed = time.monotonic()
    # The parent-death signal is a SIGTERM: torchrun passes it on, the ranks stop within a few seconds.
    left = _left_running(started, within=30)
    took = time.monotonic() - killed
    assert left == [], [process.cmdline() for process in left]
    print(f"the launcher's processes ended {took:.1f} s after its kill -9")
    # Only a SIGTERM commits here (every_n_steps 1000): without the parent-death signal the ranks went too, but
    # on their output pipe breaking, with no checkpoint.
    assert committed_steps(training.run_dir / CHECKPOINTS_DIR), training.text()[-3000:]


def test_mark_failed_the_supervisors_sigterm_then_sigkill_still_commits_the_step(training: _Training) -> None:
    """Airflow 3's "mark failed" (and a task deleted or cleared while running): the supervisor's next heartbeat
    is refused and it calls ``ActivitySubprocess.kill(SIGTERM, force=True)`` on the task process: SIGTERM, then
    SIGKILL ``escalation_delay`` seconds later. No API server runs here: the test sends the same two signals
    with the installed supervisor's delay to the launcher, which is what the task process runs."""
    import inspect

    from airflow.sdk.execution_time.supervisor import ActivitySubprocess

    escalation_delay = inspect.signature(ActivitySubprocess.kill).parameters["escalation_delay"].default
    started = training.started()
    os.kill(training.process.pid, signal.SIGTERM)
    try:
        training.process.wait(timeout=escalation_delay)
    except subprocess.TimeoutExpired:
        os.kill(training.process.pid, signal.SIGKILL)
        training.process.wait(timeout=60)
    # torchrun got the SIGTERM passed on, and again from the kernel when the launcher was killed: the ranks still
    # commit their step and exit within the grace period, and nothing is left.
    left = _left_running(started, within=PREEMPTION_GRACE_SECONDS)
    assert left == [], [process.cmdline() for process in left]
    assert committed_steps(training.run_dir / CHECKPOINTS_DIR), training.text()[-3000:]
    assert not (training.run_dir / "output" / "result.json").exists()


def test_execution_timeout_commits_the_step_and_leaves_nothing_running(home: Path, tmp_path: Path) -> None:
    """A task's execution_timeout: Airflow 3's task runner wraps ``execute`` in its ``timeout`` (SIGALRM raises
    AirflowTaskTimeout wherever the task process is, here inside the launcher's loop), then calls ``on_kill``.
    The train task's launcher runs here inside that same ``timeout``, in a process of its own."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    # 28 steps of 5 s: the timeout (60 s) falls inside the step loop even on a slow start.
    spec = _spec(tmp_path / "spec.yaml", step_delay_seconds=5)
    driver = (
        "import sys\n"
        "from airflow.sdk.execution_time.timeout import timeout\n"
        "from airflow.sdk.exceptions import AirflowTaskTimeout\n"
        "from trainpipe.commands.main import main\n"
        "try:\n"
        "    with timeout(int(sys.argv[1])):\n"
        "        main(sys.argv[2:])\n"
        "except AirflowTaskTimeout:\n"
        "    print('AirflowTaskTimeout raised', flush=True)\n"
        "    sys.exit(7)\n"
    )
    python = str(Path(_trainpipe()).with_name("python"))
    with log.open("w") as out:
        process = subprocess.Popen([python, "-c", driver, "60", "train", str(spec), "--run-dir", str(run_dir),
                                    "--logical-date", LOGICAL_DATE], env=_env(home), stdout=out,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        started: list[psutil.Process] = []
        while not started and process.poll() is None:
            started = [child for child in psutil.Process(process.pid).children(recursive=True)
                       if child.environ().get("RANK") is not None]
            time.sleep(0.2)
        code = process.wait(timeout=60 + PREEMPTION_GRACE_SECONDS + 30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 7, text[-4000:]
    # The launcher's SIGTERM reached the ranks, which committed the step they were in (read from the trainer's
    # output, which the launcher kept reading while it waited).
    step = int(re.search(r"^received SIGTERM: committed checkpoint step-(\d+);", text, flags=re.MULTILINE)[1])
    assert step >= 1
    assert step in committed_steps(run_dir / CHECKPOINTS_DIR)
    assert text.count("launching: ") == 1 and "launching it again" not in text, text[-4000:]
    assert _left_running(started, within=5) == [], [p.cmdline() for p in started]
