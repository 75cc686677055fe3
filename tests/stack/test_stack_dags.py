"""The watched folder on the running stack: examples listed, a dropped spec becomes a DAG, a broken one
becomes a located import error while every other DAG stays."""

from __future__ import annotations

import time

import pytest

from tests.support import REPO

from .helpers import SPECS, AirflowClient, RunningStack, spec_yaml, wait_for

pytestmark = pytest.mark.stack

EXAMPLES = {"digit_classifier", "fraud_detector", "fraud_detector_approval", "fraud_detector_multinode",
            "fraud_detector_tuned", "search_ranker_gpu", "search_ranker_nightly", "ticket_assistant", "ticket_intent",
            "ticket_router"}
# The dag-processor re-reads the DAG files every 10 s (AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL
# in tools/stack/trainpipe_stack.py); this bound only says "it cannot hang", docs/operations.md states the measured figure.
DROP_BOUND_SECONDS = 60


def test_the_example_dags_and_the_test_specs_are_listed(airflow: AirflowClient):
    assert {path.stem for path in (REPO / "dag_configs").glob("*.yaml")} == EXAMPLES

    listed = wait_for("the example DAGs", lambda: (ids := airflow.dag_ids()) >= EXAMPLES | set(SPECS) and ids,
                      timeout=120)

    assert listed >= EXAMPLES | set(SPECS)
    assert airflow.import_errors() == []
    # New DAGs start paused: nothing runs until someone unpauses it.
    assert all(airflow.dag(dag_id)["is_paused"] for dag_id in EXAMPLES)


def test_a_dropped_spec_becomes_a_dag_within_the_bound(airflow: AirflowClient, running_stack: RunningStack,
                                                       capsys: pytest.CaptureFixture[str]):
    assert airflow.dag("stack_dropped") is None

    dropped_at = time.monotonic()
    (running_stack.dag_configs / "stack_dropped.yaml").write_text(spec_yaml("stack_dropped"))
    dag = wait_for("stack_dropped to be listed", lambda: airflow.dag("stack_dropped"), timeout=DROP_BOUND_SECONDS,
                   interval=0.5)
    elapsed = time.monotonic() - dropped_at

    with capsys.disabled():
        print(f"\nstack tier: dropped spec listed as a DAG after {elapsed:.1f} s")
    assert dag["dag_id"] == "stack_dropped"
    assert dag["description"] == "stack tier test pipeline"
    tasks = {task["task_id"] for task in airflow.request("GET", "/dags/stack_dropped/tasks")["tasks"]}
    assert tasks == {"snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate", "register", "promote"}


def test_a_broken_spec_is_a_located_import_error_and_the_other_dags_stay(airflow: AirflowClient,
                                                                         running_stack: RunningStack,
                                                                         capsys: pytest.CaptureFixture[str]):
    before = wait_for("the initial DAGs", lambda: (ids := airflow.dag_ids()) >= EXAMPLES | set(SPECS) and ids,
                      timeout=120)
    broken = spec_yaml("stack_broken").replace("  epochs: 2\n", "  epochz: 2\n")
    line = broken.splitlines().index("  epochz: 2") + 1

    dropped_at = time.monotonic()
    (running_stack.dag_configs / "stack_broken.yaml").write_text(broken)

    def reported() -> list[dict]:
        return [error for error in airflow.import_errors() if error["filename"].endswith("stack_broken.yaml")]

    (error,) = wait_for("the import error of stack_broken.yaml", reported, timeout=DROP_BOUND_SECONDS, interval=0.5)
    with capsys.disabled():
        print(f"\nstack tier: broken spec listed as an import error after {time.monotonic() - dropped_at:.1f} s")
    assert f"stack_broken.yaml:{line}:3: training.epochz: unknown key; did you mean `epochs`?" in error["stack_trace"]
    # The broken file hides nothing: every DAG listed before is still there and not stale.
    after = airflow.dag_ids()
    assert after >= before
    assert not any(airflow.dag(dag_id)["is_stale"] for dag_id in before)
    assert airflow.dag("stack_broken") is None
