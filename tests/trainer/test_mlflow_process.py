"""MLflow runs in a process of its own beside rank 0 (``tracking/mlflow_process.py``): the trainer's process
never imports it, what the tracker logs still reaches the run, MLflow's errors come back with MLflow's
message, and the MLflow process neither outlives a killed trainer nor stays dead when it died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from mlflow import MlflowClient

from trainpipe_trainer.errors import TrackingProcessError
from trainpipe_trainer.tracking.mlflow_process import MlflowProcess

from .helpers import wait_until

TRAINER_SIDE = textwrap.dedent("""
    import json, sys, time
    from trainpipe_trainer.config import TrackingConfig
    from trainpipe_trainer.tracking.mlflow_process import MlflowProcess
    from trainpipe_trainer.tracking.tracker import Tracker

    with Tracker(config=TrackingConfig(tracking_uri=sys.argv[1], experiment_name=sys.argv[2]), enabled=True) as tracker:
        tracker.log_params({"learning_rate": "0.01"})
        tracker.set_tags({"team": "fraud"})
        for step in (1, 2, 3):
            tracker.log_metric("train_loss", 1.0 / step, step=step)
        tracker.join()
        print(json.dumps({"run_id": tracker.run_id, "mlflow_process": MlflowProcess.shared().pid}), flush=True)
        if sys.argv[3] == "hang":
            time.sleep(600)
    print(json.dumps({"mlflow_imported": "mlflow" in sys.modules}), flush=True)
""")


def _trainer_side(tracking: Any, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", TRAINER_SIDE, tracking.uri, tracking.experiment_name, mode],
                            stdout=subprocess.PIPE, text=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) is gone for every purpose here.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_trainer_logs_without_importing_mlflow(tracking: Any) -> None:
    trainer = _trainer_side(tracking, "finish")
    out, _ = trainer.communicate(timeout=120)
    assert trainer.returncode == 0
    opened, ended = (json.loads(line) for line in out.splitlines())
    assert ended == {"mlflow_imported": False}
    client = MlflowClient(tracking.uri)
    run = client.get_run(opened["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["learning_rate"] == "0.01" and run.data.tags["team"] == "fraud"
    assert [m.value for m in client.get_metric_history(opened["run_id"], "train_loss")] == [1.0, 0.5, 1.0 / 3]
    # The trainer's command line is the run's source, as when MLflow ran in the trainer's process.
    assert run.data.tags["mlflow.source.name"] == "-c"
    wait_until(lambda: not _alive(opened["mlflow_process"]), timeout=30, what="the MLflow process to end")


def test_a_killed_trainer_leaves_no_mlflow_process_behind(tracking: Any) -> None:
    trainer = _trainer_side(tracking, "hang")
    assert trainer.stdout is not None
    opened = json.loads(trainer.stdout.readline())
    assert _alive(opened["mlflow_process"])
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(timeout=30)
    wait_until(lambda: not _alive(opened["mlflow_process"]), timeout=30, what="the MLflow process to end")
    # The run is left as a killed trainer leaves it (a retry of the task takes it up again).
    assert MlflowClient(tracking.uri).get_run(opened["run_id"]).info.status == "RUNNING"


def test_an_mlflow_error_comes_back_with_its_message_and_a_dead_process_is_replaced(
    tracking: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    process = MlflowProcess(tracking.uri)
    try:
        with pytest.raises(TrackingProcessError, match="no-such-run"):
            process.call("run_data", uri=tracking.uri, run_id="no-such-run")
        first = process.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: not _alive(first), timeout=30, what="the MLflow process to die")
        time.sleep(0.1)
        run_id = process.call("open_run", uri=tracking.uri, experiment_name=tracking.experiment_name, run_id=None,
                              argv=["trainer"])
        assert process.pid != first
        assert "the MLflow process ended (exit code -9); starting another" in capfd.readouterr().err
        process.call("finish_run", uri=tracking.uri, run_id=run_id, status="FINISHED")
        assert MlflowClient(tracking.uri).get_run(run_id).info.status == "FINISHED"
    finally:
        process.close()
