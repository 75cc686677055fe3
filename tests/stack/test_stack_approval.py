"""Human approval and late runs on the running stack: `approve` tasks wait in `awaiting_input` (deferred, no worker
slot held); the tests answer through the public REST API as a person's client would, read the registry on the MLflow
server, and read mail in the stack's sink. A run past its `notify.deadline` is told by the triggerer.

`dag.test()` cannot stand in: nothing there answers a parked task, sweeps its timeout or checks deadlines. The
four pipelines start with the stack tier's other overlapping runs (tests/stack/conftest.py: InFlight).
"""

from __future__ import annotations

import json
import re

import pytest

from .helpers import AirflowClient, RunningStack, trainpipe_cli, wait_for

pytestmark = pytest.mark.stack

RUN_BOUND_SECONDS = 600  # "cannot hang" bound for one pipeline run on a loaded 2-core machine
USER = "admin"  # the stack's Airflow user (tools/stack/trainpipe_stack.py)
# Every task of an approval pipeline: the late-run mail names one of them, with its state.
TASKS = ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate", "register", "approve", "promote")


@pytest.fixture(scope="module")
def approval_runs(in_flight):
    """The tier's overlapping runs (tests/stack/conftest.py: InFlight), these four among them."""
    in_flight.start()
    return in_flight


def _states(airflow: AirflowClient, dag_id: str, run_id: str) -> dict[str, str]:
    return {task: ti["state"] for task, ti in airflow.task_instances(dag_id, run_id).items()}


def _aliases(client, model_name: str) -> dict[str, int]:
    return {alias: int(version) for alias, version in client.get_registered_model(model_name).aliases.items()}


def _approve_run(airflow: AirflowClient, dag_id: str, run_id: str) -> dict:
    request = airflow.awaiting_input(dag_id, run_id, timeout=RUN_BOUND_SECONDS)
    answer = airflow.answer(dag_id, run_id, "Approve")
    assert answer["chosen_options"] == ["Approve"] and answer["responded_by"]["name"] == USER
    airflow.wait_for_run(dag_id, run_id, timeout=RUN_BOUND_SECONDS)
    return request


def test_a_run_past_its_deadline_mails_the_step_it_is_in(approval_runs, running_stack: RunningStack):
    airflow, dag_id = approval_runs.airflow, "stack_deadline"
    run_id = approval_runs.runs[dag_id]

    [mail, *_] = wait_for("the late run's mail", lambda: running_stack.mails(f"[trainpipe] {dag_id}: "),
                          timeout=RUN_BOUND_SECONDS, interval=2)

    assert mail["Subject"] == f"[trainpipe] {dag_id}: run {run_id} is late (not done within 20s)"
    [html] = [part for part in mail.walk() if part.get_content_type() == "text/html"]
    text = html.get_payload(decode=True).decode()
    assert f"Run {run_id} of {dag_id} has not ended within 20s of being queued (notify.deadline): it is at " in text
    steps = re.findall(r"(\w+) \((\w+)\)", text.split("it is at ", 1)[1])
    assert steps and all(task in TASKS for task, _ in steps), text
    assert airflow.dag_run(dag_id, run_id)["state"] == "running"  # late, not failed: the message says so
    # Ends the run (its approval would wait an hour), so that it holds nothing for the tests after this one.
    airflow.awaiting_input(dag_id, run_id, timeout=RUN_BOUND_SECONDS)
    airflow.answer(dag_id, run_id, "Reject")


def test_approved_versions_become_champion_in_turn_and_rollback_restores_the_first(
        approval_runs, running_stack: RunningStack, mlflow_client):
    airflow, dag_id = approval_runs.airflow, "stack_approval_flow"
    first_run = approval_runs.runs[dag_id]

    request = _approve_run(airflow, dag_id, first_run)

    # What the person read: the version, the gate table, the report line and what each answer does.
    assert request["subject"] == f"Promote {dag_id} version 1 to champion?"
    assert request["options"] == ["Approve", "Reject"] and request["defaults"] == ["Reject"]
    body = request["body"]
    # The baseline model's column (issue 34) sits before the gates.
    assert "| metric | candidate | champion (none) | change | baseline (logistic regression) | gates |" in body
    assert "| auc | 0." in body and "PASS auc >= 0.5" in body
    assert "Evaluation report:" in body and "**Reject**: version 1 stays `challenger`" in body
    assert _states(airflow, dag_id, first_run)["promote"] == "success"
    assert int(mlflow_client.get_model_version_by_alias(dag_id, "champion").version) == 1
    promoted = mlflow_client.get_model_version(dag_id, "1")
    assert promoted.tags["trainpipe.promoted_by"].startswith(f"{USER} (approved in airflow DAG {dag_id}")
    assert json.loads(promoted.tags["trainpipe.promotion_details"])["approval"]["by"] == USER
    note, *rest = airflow.dag_run(dag_id, first_run)["note"].splitlines()
    cost = [line for line in rest if line.startswith("training used ")]
    assert [line.split(" GPU-hours")[0] for line in cost] == ["training used 0"], rest
    # A candidate worse than the baseline model on this small data set is said on its own line (issue 34); whether
    # it is depends on the training, so the line may or may not be there.
    assert all(line.startswith("below baseline (logistic regression): ") for line in rest if line not in cost), rest
    # The first line is the promotion's: the version, its main metric, who approved.
    assert re.fullmatch(rf"promoted: {dag_id} version 1 is champion; auc 0\.\d{{6}} \(no previous champion\); "
                        rf"approved by {USER}", note), note
    # The mail's connection is defined nowhere: the approval message is logged as not sent, and nothing failed for it.
    approve_log = airflow.task_log_tail(dag_id, first_run, "approve", 1, lines=1000)
    assert "notify.email (smtp_undefined): could not send the approval message" in approve_log, approve_log

    # Another number of epochs: the same rows train another model (the same inputs would train nothing, issue 33).
    second_run = airflow.trigger(dag_id, conf={"epochs": 2})
    request = _approve_run(airflow, dag_id, second_run)

    assert "champion v1" in request["body"]
    assert "version 1 becomes `previous_champion`" in request["body"]
    assert _aliases(mlflow_client, dag_id) == {"champion": 2, "previous_champion": 1, "challenger": 2}

    # The stack has a platform policy: who moves a model's aliases says which team acts.
    rollback = trainpipe_cli(running_stack, "rollback", dag_id, "--team", "stack")

    assert rollback.returncode == 0, rollback.stdout + rollback.stderr
    assert _aliases(mlflow_client, dag_id) == {"champion": 1, "previous_champion": 2, "challenger": 2}
    assert len(mlflow_client.search_model_versions(f"name='{dag_id}'")) == 2


def test_the_approval_request_lands_in_the_mail_sink(approval_runs, running_stack: RunningStack):
    dag_id = "stack_approval"

    [message, *_] = wait_for("the approval mail in the sink",
                             lambda: running_stack.mails(f"[trainpipe] Promote {dag_id} version "),
                             timeout=RUN_BOUND_SECONDS, interval=2)

    assert message["To"] == "ml-oncall@example.com"


def test_a_rejected_approval_promotes_nothing(approval_runs, mlflow_client):
    airflow, dag_id = approval_runs.airflow, "stack_approval"
    run_id = approval_runs.runs[dag_id]
    airflow.awaiting_input(dag_id, run_id, timeout=RUN_BOUND_SECONDS)

    answer = airflow.answer(dag_id, run_id, "Reject")

    assert answer["chosen_options"] == ["Reject"]
    run = airflow.wait_for_run(dag_id, run_id, timeout=RUN_BOUND_SECONDS)
    states = _states(airflow, dag_id, run_id)
    assert states["approve"] == "success" and states["promote"] == "skipped"
    assert _aliases(mlflow_client, dag_id) == {"challenger": 1}  # no champion: nothing was promoted
    version = mlflow_client.get_model_version(dag_id, "1")
    assert version.tags["trainpipe.rejected"] == "true"
    assert version.tags["trainpipe.rejected_by"] == USER
    assert "trainpipe.promoted_at" not in version.tags
    assert re.fullmatch(rf"approval rejected: {dag_id} version 1 by {USER} at \d{{4}}-\d\d-\d\dT\S+; "
                        "it stays challenger", run["note"].splitlines()[0]), run["note"]


def test_an_unanswered_approval_times_out_to_reject_and_promotes_nothing(approval_runs, mlflow_client):
    airflow, dag_id = approval_runs.airflow, "stack_approval_timeout"
    run_id = approval_runs.runs[dag_id]

    # Nobody answers: the scheduler applies the default (Reject) 5 s after the task began to wait.
    run = airflow.wait_for_run(dag_id, run_id, timeout=RUN_BOUND_SECONDS)

    states = _states(airflow, dag_id, run_id)
    assert states["approve"] == "success" and states["promote"] == "skipped"
    details = airflow.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails")
    assert details["chosen_options"] == ["Reject"] and details["responded_by_user"] is None
    assert _aliases(mlflow_client, dag_id) == {"challenger": 1}
    version = mlflow_client.get_model_version(dag_id, "1")
    assert version.tags["trainpipe.rejected"] == "true"
    assert version.tags["trainpipe.rejected_by"] == "timeout (5s, on_timeout: reject)"
    assert re.fullmatch(rf"approval timed out: {dag_id} version 1: no answer within 5s( at \S+)? "
                        r"\(on_timeout: reject\); it stays challenger", run["note"].splitlines()[0]), run["note"]
