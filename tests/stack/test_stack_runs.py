"""Pipelines run by the stack: a manual trigger with conf, a worker killed during train, a scheduled run.

Every run goes through the scheduler and the Celery worker; snapshots and checkpoints land in the S3
bucket, metrics and models on the MLflow server. The worker-killing test runs first in the tier
(``stack_exclusive``); the others were started together with the tier's overlapping runs (InFlight).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import psutil
import pytest

from trainpipe.plan.model import run_key

from .helpers import FEATURES, AirflowClient, RunningStack, wait_for

pytestmark = pytest.mark.stack

TASKS = ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate", "register", "promote")
RUN_BOUND_SECONDS = 600  # "cannot hang" bound for one pipeline run on a loaded 2-core machine
_STEP = re.compile(r"/checkpoints/step-(\d+)/manifest\.json$")


def committed_steps(running_stack: RunningStack, pipeline_id: str, run_id: str) -> list[int]:
    """Checkpoint steps with a manifest (the trainer's commit marker) in the bucket."""
    keys = running_stack.keys_under(f"storage/runs/{pipeline_id}/{run_key(run_id)}/checkpoints/")
    return sorted(int(match.group(1)) for key in keys if (match := _STEP.search(key)))


def mlflow_run_of(mlflow_client, pipeline_id: str, run_id: str):
    experiment = mlflow_client.get_experiment_by_name(f"trainpipe/{pipeline_id}")
    return mlflow_client.search_runs([experiment.experiment_id],
                                     filter_string=f"tags.`trainpipe.airflow_run_id` = '{run_id}'")


def test_manual_trigger_with_conf_runs_through_celery_with_s3_and_the_mlflow_server(
        airflow: AirflowClient, running_stack: RunningStack, in_flight, mlflow_client, mlflow_server_uri: str):
    import mlflow

    from trainpipe.demo.synthetic import generate_transactions

    # Triggered with conf {"epochs": 3} among the tier's overlapping runs; the watcher polled the task states while
    # it ran: the checkpoint sensor must be seen deferred (on the triggerer, no worker slot) while train runs.
    in_flight.start()
    run_id = in_flight.runs["stack_manual"]
    run = airflow.wait_for_run("stack_manual", run_id, timeout=RUN_BOUND_SECONDS)
    seen = in_flight.manual_states_seen
    tis = airflow.task_instances("stack_manual", run_id)
    assert run["run_type"] == "manual" and run["conf"] == {"epochs": 3}
    assert {task: tis[task]["state"] for task in TASKS} == dict.fromkeys(TASKS, "success")
    assert tis["train"]["try_number"] == 1
    assert ("running", "deferred") in seen, sorted(seen, key=str)
    # The Celery worker ran the tasks (the scheduler only queued them).
    assert f"run_id={run_id}/task_id=train/attempt=1.log" in running_stack.worker_log()

    # Storage: the snapshot and the run's checkpoints are in the bucket.
    snapshot = running_stack.keys_under("storage/snapshots/stack_manual/")
    for name in ("train.parquet", "holdout.parquet", "manifest.json"):
        assert any(key.endswith(f"/{name}") for key in snapshot), (name, snapshot)
    assert committed_steps(running_stack, "stack_manual", run_id)

    # MLflow: the override reached the trainer (three epochs), metrics are on the server.
    (tracked,) = mlflow_run_of(mlflow_client, "stack_manual", run_id)
    assert json.loads(tracked.data.tags["trainpipe.param_overrides"]) == {"epochs": 3}
    assert tracked.data.params["epochs"] == "3"
    assert len(mlflow_client.get_metric_history(tracked.info.run_id, "epoch_loss")) == 3
    assert {"train_loss", "holdout_auc"} <= set(tracked.data.metrics)
    version = mlflow_client.get_model_version_by_alias("stack_manual", "champion")
    assert version.run_id == tracked.info.run_id
    # The server stored the model in the bucket (served artifacts: no bucket access on this side) ...
    assert any(key.endswith("/MLmodel") for key in running_stack.keys_under("mlflow/"))
    # ... and serves it back: the registered model loads and predicts through the server.
    model = mlflow.pyfunc.load_model("models:/stack_manual@champion")
    rows = generate_transactions(rows=50, days=3, end=datetime.now(UTC))[FEATURES]
    predictions = np.asarray(model.predict(rows), dtype=float).ravel()
    assert predictions.shape == (50,)
    assert ((predictions >= 0) & (predictions <= 1)).all()


@pytest.mark.stack_exclusive  # it kills the worker: it runs before the overlapping runs start, then starts them
def test_killing_the_worker_during_train_retries_and_resumes_from_the_last_checkpoint(
        airflow: AirflowClient, running_stack: RunningStack, in_flight, mlflow_client):
    stack = running_stack.stack
    # The tier's first test: the dag-processor may not have served the DAG yet.
    wait_for("stack_retry to be listed", lambda: airflow.dag("stack_retry"), timeout=120)
    airflow.unpause("stack_retry")
    run_id = airflow.trigger("stack_retry")

    def training_with_a_checkpoint() -> list[int] | None:
        if airflow.task_instances("stack_retry", run_id)["train"]["state"] != "running":
            return None
        return committed_steps(running_stack, "stack_retry", run_id) or None

    wait_for("train running with a committed checkpoint", training_with_a_checkpoint, timeout=RUN_BOUND_SECONDS,
             interval=0.5)
    assert stack.stop("airflow-worker", kill=True)  # SIGKILL: the worker, its task processes, torchrun
    # torchrun runs in a session of its own (trainpipe.launchers.local): it went down with the worker.
    assert not [proc.pid for proc in psutil.process_iter(["cmdline"])
                if run_key(run_id) in " ".join(proc.info["cmdline"] or ())]
    # Nothing writes any more: this is the checkpoint the retry must resume from.
    time.sleep(2)
    last_committed = committed_steps(running_stack, "stack_retry", run_id)[-1]

    # While no worker exists the sensor keeps waiting on the triggerer.
    assert airflow.task_instances("stack_retry", run_id)["watch_checkpoints"]["state"] == "deferred"
    worker = stack.service("airflow-worker")
    stack.start(worker)
    stack.wait_healthy(worker)
    # No kill follows: the tier's other runs start now and overlap this retry's wait for the lost heartbeat.
    in_flight.start()

    # The scheduler finds train's heartbeat gone (60 s in the stack), fails the try, and retries it; the tier's
    # overlapping runs share the machine with the retry meanwhile, hence twice the one-run bound.
    airflow.wait_for_run("stack_retry", run_id, timeout=2 * RUN_BOUND_SECONDS)
    tis = airflow.task_instances("stack_retry", run_id)
    assert (tis["train"]["state"], tis["train"]["try_number"]) == ("success", 2)
    assert tis["register"]["state"] == "success" and tis["promote"]["state"] == "success"
    assert f"run_id={run_id}/task_id=train/attempt=2.log" in running_stack.worker_log()

    (tracked,) = mlflow_run_of(mlflow_client, "stack_retry", run_id)  # one MLflow run for both tries
    assert tracked.data.tags["resumed_from_step"] == str(last_committed)
    assert tracked.data.tags["trainpipe.try_number"] == "2"
    resumed = mlflow_client.get_metric_history(tracked.info.run_id, "resumed_from_step")
    assert [(point.value, point.step) for point in resumed] == [(float(last_committed), last_committed)]
    assert committed_steps(running_stack, "stack_retry", run_id)[-1] > last_committed
    # One model version, from this run: the killed try registered nothing.
    versions = mlflow_client.search_model_versions("name = 'stack_retry'")
    assert [(v.version, v.run_id) for v in versions] == [("1", tracked.info.run_id)]


def test_a_scheduled_run_fires_on_its_own(airflow: AirflowClient, in_flight):
    """``* * * * *`` with catchup off: unpausing starts the latest due run at once, then one comes due
    and the scheduler starts it without any trigger (the watcher pauses the DAG again once it has)."""
    in_flight.start()
    assert in_flight.scheduled_before == []
    unpaused_at = in_flight.scheduled_unpaused_at

    first, later = in_flight.scheduled(timeout=RUN_BOUND_SECONDS + 180)

    assert (first["run_type"], first["triggered_by"]) == ("scheduled", "timetable")
    assert datetime.fromisoformat(first["logical_date"]) <= unpaused_at
    ended = airflow.wait_for_run("stack_scheduled", first["dag_run_id"], timeout=RUN_BOUND_SECONDS)
    assert (later["run_type"], later["triggered_by"]) == ("scheduled", "timetable")
    # One run at a time (the stack team's max_active_runs): the next one is the minute that was due when the first
    # ended, created without any trigger.
    due = datetime.fromisoformat(later["logical_date"])
    assert due.second == 0 and unpaused_at < due <= datetime.fromisoformat(ended["end_date"]) + timedelta(minutes=1)
