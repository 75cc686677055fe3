"""The multi-node train Job's lifecycle against an API server on 127.0.0.1, through the real clients:
the trigger waits for the Job and reports its outcome, and the operator (sync client) and the
trigger (asyncio client) delete the Job and its Service by the same rules (``kubernetes.cleanup``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.kubernetes.fake_apiserver import FakeApiServer, job_status
from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.kubernetes.cleanup import Deletion, delete_job_on_finish, deletions
from trainpipe.operators.kubernetes import KubernetesTrainJobOperator
from trainpipe.settings import Settings
from trainpipe.triggers.kubernetes import TrainJobTrigger

JOB = "job-fraud-detector-multinode-1736162b-t1"
NAMESPACE = "ml-training"


@pytest.fixture
def apiserver(tmp_path, monkeypatch):
    server = FakeApiServer()
    server.start()
    # A connection by conn_id, as users configure it; the env var is Airflow's own secrets backend.
    monkeypatch.setenv("AIRFLOW_CONN_K8S_TEST", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(server.kubeconfig(tmp_path))}}))
    yield server
    server.stop()


def _trigger(**overrides) -> TrainJobTrigger:
    kwargs = {"job_name": JOB, "job_namespace": NAMESPACE, "pod_names": [f"{JOB}-0-a", f"{JOB}-1-b"],
              "pod_namespace": NAMESPACE, "base_container_name": "base", "kubernetes_conn_id": "k8s_test",
              "poll_interval": 0.0, "get_logs": False, "do_xcom_push": False, "service_name": JOB}
    return TrainJobTrigger(**{**kwargs, **overrides})


async def _first_event(trigger: TrainJobTrigger):
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")


def test_run_polls_until_the_job_completes_and_reports_success(apiserver):
    apiserver.job_statuses = [job_status(active=2), job_status(active=2), job_status(succeeded=2, complete=True)]

    event = asyncio.run(_first_event(_trigger()))

    assert (event["status"], event["name"], event["namespace"]) == ("success", JOB, NAMESPACE)
    reads = [path for method, path, _ in apiserver.requests if method == "GET"]
    assert reads == [f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{JOB}/status"] * 3


def test_run_reports_a_failed_job_with_its_reason(apiserver):
    apiserver.job_statuses = [job_status(active=1), job_status(failed_reason="BackoffLimitExceeded")]

    event = asyncio.run(_first_event(_trigger()))

    assert event["status"] == "error"
    assert event["message"] == "Job failed with error: BackoffLimitExceeded"


def test_on_kill_deletes_the_job_with_its_pods_then_the_service(apiserver):
    asyncio.run(_trigger().on_kill())

    assert apiserver.deleted() == [("Job", JOB, "Foreground"), ("Service", JOB, "")]


def test_on_kill_still_deletes_the_service_when_the_job_is_already_gone(apiserver, capsys):
    apiserver.missing = {("Job", JOB)}

    asyncio.run(_trigger().on_kill())

    assert apiserver.deleted() == [("Job", JOB, "Foreground"), ("Service", JOB, "")]
    out = capsys.readouterr().out
    assert f"deleted Service {NAMESPACE}/{JOB}" in out
    assert "could not delete" not in out  # 404: already gone is what we wanted


def _operator(on_finish_action: str) -> KubernetesTrainJobOperator:
    plan = compile_file(REPO / "dag_configs" / "fraud_detector_multinode.yaml", settings=Settings.from_env())
    return KubernetesTrainJobOperator(task_id="train", plan=plan, kubernetes_conn_id="k8s_test",
                                      on_finish_action=on_finish_action)


@pytest.mark.parametrize(("action", "succeeded", "expected"), [
    ("delete_pod", True, [("Job", JOB, "Foreground"), ("Service", JOB, "")]),
    ("delete_succeeded_pod", True, [("Job", JOB, "Foreground"), ("Service", JOB, "")]),
    ("delete_succeeded_pod", False, [("Service", JOB, "")]),  # failed pods are kept for debugging
    ("keep_pod", True, [("Service", JOB, "")]),
])
def test_operator_deletes_by_on_finish_action_through_the_sync_client(apiserver, action, succeeded, expected):
    _operator(action).delete_job_and_service(succeeded=succeeded, name=JOB, namespace=NAMESPACE)

    assert apiserver.deleted() == expected


def test_operator_reports_a_failed_delete_and_still_deletes_the_service(apiserver, capsys):
    apiserver.failing = {("Job", JOB)}

    _operator("delete_pod").delete_job_and_service(succeeded=True, name=JOB, namespace=NAMESPACE)

    assert apiserver.deleted() == [("Job", JOB, "Foreground"), ("Service", JOB, "")]
    assert f"could not delete Job {NAMESPACE}/{JOB}: Internal Server Error" in capsys.readouterr().out


def test_one_decision_for_both_transports():
    assert deletions(job_name="j", namespace="n", service_name="j", delete_job=True) == [
        Deletion("Job", "j", "n"), Deletion("Service", "j", "n")]
    assert deletions(job_name="j", namespace="n", service_name=None, delete_job=False) == []
    assert [delete_job_on_finish(a, succeeded=s) for a in ("delete_pod", "delete_succeeded_pod", "keep_pod")
            for s in (True, False)] == [True, True, True, False, False, False]
