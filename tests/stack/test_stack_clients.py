"""The stack as a user's shell meets it: `source .trainpipe/stack/cli.env`, the `trainpipe` CLI on the stack's
bucket, a REST trigger and the run's note."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from .helpers import AirflowClient, RunningStack, trainpipe_cli, wait_for

pytestmark = pytest.mark.stack

RUN_BOUND_SECONDS = 600  # "cannot hang" bound for one pipeline run on a loaded 2-core machine


def _ended(airflow: AirflowClient, dag_id: str, run_id: str) -> dict:
    return wait_for(f"{dag_id} run {run_id} to end",
                    lambda: (run := airflow.dag_run(dag_id, run_id))["state"] in ("success", "failed") and run or None,
                    timeout=RUN_BOUND_SECONDS, interval=2)


def test_cli_drift_on_the_stack_stops_the_next_run_at_validate_and_its_note_names_the_feature(
        airflow: AirflowClient, running_stack: RunningStack, in_flight):
    # The first data and run are started with the tier's overlapping runs (tests/stack/conftest.py: InFlight).
    in_flight.start()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    normal = in_flight.demo_data
    assert normal.returncode == 0, normal.stderr
    assert normal.stdout.startswith("transactions: s3://trainpipe/storage/demo/transactions/transactions.parquet "
                                    "(connection trainpipe_s3)")
    first = _ended(airflow, "stack_drift", in_flight.runs["stack_drift"])
    assert first["state"] == "success"

    drifted = trainpipe_cli(running_stack, "demo-data", "--drift", "amount", "--force", "--end", today)
    assert drifted.returncode == 0, drifted.stderr
    run_id = airflow.trigger("stack_drift")
    run = _ended(airflow, "stack_drift", run_id)

    assert run["state"] == "failed"
    assert airflow.task_instances("stack_drift", run_id)["validate"]["state"] == "failed"
    assert run["note"].startswith("validation failed: drift in amount (PSI "), run["note"]

    # Both versions are in the stack's bucket, and the CLI lists them.
    listed = trainpipe_cli(running_stack, "datasets", "stack_drift")
    assert listed.returncode == 0, listed.stderr
    stored = {key.split("/")[3] for key in running_stack.keys_under("storage/snapshots/stack_drift/")
              if key.endswith("/manifest.json")}
    shown = {line.split()[2] for line in listed.stdout.splitlines() if line.startswith("stack_drift version ")}
    assert len(stored) == 2 and shown == stored
