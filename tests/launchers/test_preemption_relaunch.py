"""``kill -TERM`` of torchrun alone (its pod or node went away while the launcher was not told to stop) is a
preemption: the trainer commits the step it is in, and the launcher starts it again within the same run, which
resumes there and ends with the weights of an uninterrupted run. The same code runs the DAG's train task
(``steps.train.train.run_training``). A SIGTERM to the launcher itself ends the try instead (test_launcher_signals.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe_trainer.outcomes import preempted_message

LOGICAL_DATE = "2026-11-22"

pytestmark = pytest.mark.integration


def _env(home: Path) -> dict[str, str]:
    # The spec injects a delay per step (training.testing): the platform allows it here (ADR 0014).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINPIPE_HOME": str(home), "TRAINPIPE_ALLOW_FAULT_INJECTION": "1",
           "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}"}
    for name in ("MLFLOW_TRACKING_URI", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT"):
        env.pop(name, None)
    return env


def _trainpipe() -> str:
    return str(Path(sys.executable).with_name("trainpipe"))


def _spec(path: Path, **testing: object) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["data"]["window"] = "7d"
    spec["training"].update({"epochs": 2, "testing": testing})
    spec["training"]["checkpoint"] = {"every_n_steps": 1000, "keep_last": 5}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _sha(stdout: str) -> str:
    match = re.fullmatch(r"weights sha256: ([0-9a-f]{64})", stdout.strip().splitlines()[-1])
    assert match, stdout[-3000:]
    return match.group(1)


def test_kill_term_of_torchrun_alone_relaunches_within_the_run_and_loses_no_step(tmp_path: Path) -> None:
    import psutil
    from mlflow import MlflowClient

    home = tmp_path / "home"
    demo = subprocess.run([_trainpipe(), "demo-data", "--end", LOGICAL_DATE], env=_env(home), capture_output=True,
                          text=True, timeout=600, check=False)
    assert demo.returncode == 0, demo.stderr
    common = ("--logical-date", LOGICAL_DATE)
    reference = subprocess.run([_trainpipe(), "train", str(_spec(tmp_path / "a.yaml")), "--run-dir",
                                str(tmp_path / "a"), *common], env=_env(home), capture_output=True, text=True,
                               timeout=600, check=False)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]

    run_dir = tmp_path / "b"
    log = tmp_path / "b.log"
    spec = _spec(tmp_path / "b.yaml", step_delay_seconds=0.1)
    edited = yaml.safe_load(spec.read_text())
    edited["training"]["preemption"] = {"max_restarts": 1}
    spec.write_text(yaml.safe_dump(edited, sort_keys=False))
    with log.open("w") as out:
        # Its own process group, as a shell job or a worker's task process has.
        process = subprocess.Popen([_trainpipe(), "train", str(spec), "--run-dir", str(run_dir), *common],
                                   env=_env(home), stdout=out, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while not re.search(r"^step \d+/", log.read_text(), flags=re.MULTILINE):
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no training step within 600 s"
                time.sleep(0.1)
            torchrun = next(child for child in psutil.Process(process.pid).children()
                            if "trainpipe_trainer.elastic" in " ".join(child.cmdline()))
            torchrun.send_signal(signal.SIGTERM)
            code = process.wait(timeout=600)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 0, text[-4000:]
    step = int(re.search(r"^preempted: the trainer committed checkpoint step-(\d+) and stopped; launching it again "
                         r"to resume there \(preemption restart 1 of 1", text, flags=re.MULTILINE)[1])
    lines = text.splitlines()
    # The launcher itself was not signalled.
    assert "received SIGTERM: passed it on to the trainer" not in text
    assert preempted_message("SIGTERM", step) in lines
    assert f"resumed from step {step}" in lines
    # torchrun's traceback for the signal it was passed is one line, not thirty.
    assert "Traceback (most recent call last):" not in text
    assert _sha(text) == _sha(reference.stdout)
    result = json.loads((run_dir / "output" / "result.json").read_text())
    assert result["resumed_from_step"] == step
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    history = client.get_metric_history(result["mlflow_run_id"], "preemptions")
    assert [(m.step, m.value) for m in history] == [(step, 1.0)]
    assert client.get_run(result["mlflow_run_id"]).info.status == "FINISHED"


def test_a_run_dir_of_two_processes_resumes_on_one_and_reproduce_replays_that_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service import utils

    home = tmp_path / "home"
    env = _env(home)
    demo = subprocess.run([_trainpipe(), "demo-data", "--end", LOGICAL_DATE], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert demo.returncode == 0, demo.stderr
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    # The first (and, from the command line, every) try exits abruptly after committing step 20.
    spec = _spec(configs / "fraud_detector.yaml", crash_first_try_after_step=20)
    run_dir = tmp_path / "run"

    def train(nproc: int) -> subprocess.CompletedProcess:
        return subprocess.run([_trainpipe(), "train", str(spec), "--run-dir", str(run_dir), "--nproc-per-node",
                               str(nproc), "--logical-date", LOGICAL_DATE], env=env, capture_output=True, text=True,
                              timeout=900, check=False)

    crashed = train(2)
    assert crashed.returncode == 1 and "checkpoint step-20 committed" in crashed.stdout, crashed.stdout[-3000:]
    resumed = train(1)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resharded: checkpoint step-20 was written by 2 processes, this run has 1" in resumed.stdout
    assert "(nothing skipped or repeated)" in resumed.stdout
    result = json.loads((run_dir / "output" / "result.json").read_text())
    assert result["world_size_history"] == [[0, 2], [20, 1]]

    # Register it as the DAG's register task would (lineage tags), then rebuild it from that lineage.
    store = f"sqlite:///{home / 'mlflow.db'}"
    # MLflow looks the logged model up through the process-wide tracking URI: this test's store, undone after.
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    mlflow.set_tracking_uri(store)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    run = client.get_run(result["mlflow_run_id"])
    assert json.loads(run.data.tags["trainpipe.world_size_history"]) == [[0, 2], [20, 1]]
    client.create_registered_model("fraud_detector")
    client.create_model_version("fraud_detector", result["model_uri"], run_id=result["mlflow_run_id"], tags={
        "dag_id": "fraud_detector", "dataset_digest": run.data.tags["trainpipe.dataset_digest"],
        "spec_file": "fraud_detector.yaml", "spec_file_sha256": run.data.tags["trainpipe.spec_sha256"],
        "seed": "42", "weights_sha256": result["weights_sha256"]})
    again = subprocess.run([_trainpipe(), "reproduce", "fraud_detector/1", "--configs", str(configs)], env=env,
                           capture_output=True, text=True, timeout=1200, check=False)
    assert "replaying the world-size history: 2 processes up to step 20" in again.stdout, again.stdout[-4000:]
    assert "stopped after step 20 as asked (stop_after_step): committed checkpoint step-20" in again.stdout
    assert "resharded: checkpoint step-20 was written by 2 processes, this run has 1" in again.stdout
    assert again.stdout.strip().splitlines()[-1] == "weights match: yes", again.stdout[-4000:] + again.stderr[-3000:]


def _exited(process) -> bool:
    import psutil

    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _command_line(process: object) -> str:  # a psutil.Process
    """A process's command line; empty for one that exited but is not reaped yet (a short-lived helper of the
    launch, a rank that already ended), whose command line can no longer be read."""
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.ZombieProcess:
        return ""


def test_a_sigterm_that_reaches_torchrun_after_the_trainer_wrote_its_result_does_not_retrain(tmp_path: Path) -> None:
    """Found on the stack: torchrun was sent SIGTERM as the training ended (its workers had written the result
    and exited); the launch exited non-zero and the try failed, so the retry trained again. Here torchrun is held
    (SIGSTOP) the moment the trainer prints its weights, its workers exit, then it gets SIGTERM and goes on."""
    home = tmp_path / "home"
    demo = subprocess.run([_trainpipe(), "demo-data", "--end", LOGICAL_DATE], env=_env(home), capture_output=True,
                          text=True, timeout=600, check=False)
    assert demo.returncode == 0, demo.stderr
    # The window between the trainer's weights line and torchrun's exit is short: on a loaded machine the line can
    # reach the log after torchrun ended. Such an attempt exercised nothing, so it is made again (a few times).
    for attempt in range(3):
        held = _hold_torchrun_at_the_end(tmp_path / f"attempt-{attempt}", home)
        if held is not None:
            break
    else:
        pytest.fail("torchrun ended before it could be held, 3 times: the case was not exercised")
    code, log = held
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert "after the trainer had written its result: the training is complete" in text
    # One launch, one training: the trainer's own "result:" line once (the CLI repeats only the weights).
    assert text.count("launching: ") == 1 and text.count("\nresult: ") == 1, text[-4000:]


def _hold_torchrun_at_the_end(folder: Path, home: Path) -> tuple[int, Path] | None:
    """Train, hold torchrun once the trainer printed its weights, let its workers exit, SIGTERM it, resume it:
    the launch's exit code and log; None when torchrun had already ended (the case was not exercised)."""
    import psutil

    folder.mkdir(parents=True)
    run_dir = folder / "run"
    log = folder / "run.log"
    with log.open("w") as out:
        process = subprocess.Popen([_trainpipe(), "train", str(_spec(folder / "spec.yaml")), "--run-dir",
                                    str(run_dir), "--logical-date", LOGICAL_DATE], env=_env(home), stdout=out,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            torchrun = None
            while "weights sha256:" not in log.read_text():
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no result within 600 s"
                torchrun = torchrun or next((child for child in psutil.Process(process.pid).children(recursive=True)
                                             if "trainpipe_trainer.elastic" in _command_line(child)), None)
                time.sleep(0.005)
            assert torchrun is not None
            torchrun.suspend()
            try:
                workers = [child for child in torchrun.children() if child.is_running()]
                # Held before it noticed its workers ended: they exit (zombies until torchrun reaps them). Not
                # psutil.wait_procs: a zombie that is not our child counts as running, so it waited its timeout.
                exited = time.monotonic() + 120
                while not all(_exited(worker) for worker in workers):
                    assert time.monotonic() < exited, "the workers did not exit within 120 s"
                    time.sleep(0.05)
                torchrun.send_signal(signal.SIGTERM)
            finally:
                torchrun.resume()
            return process.wait(timeout=600), log
        except psutil.NoSuchProcess:
            return None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
