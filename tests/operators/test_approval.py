"""The approve task as compiled from a spec, and the body a person reads before answering
(answering it for real: tests/stack/test_stack_approval.py)."""

from __future__ import annotations

from datetime import timedelta

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.dags.builder import build_dag
from trainpipe.operators.approval import ApproveOperator
from trainpipe.settings import Settings
from trainpipe.steps.approval import approval_body

PLAN = compile_file(REPO / "dag_configs" / "fraud_detector_approval.yaml", "dag_configs/fraud_detector_approval.yaml",
                    settings=Settings.from_env())
EVALUATION = {
    "candidate": {"auc": 0.93, "f1": 0.41}, "champion": {"auc": 0.92, "f1": 0.4}, "champion_version": 6,
    "gates": [{"gate": "auc >= 0.8", "metric": "auc", "value": 0.93, "baseline": None, "compared": 0.93,
               "threshold": 0.8, "passed": True, "note": "absolute"}],
    "gates_passed": True,
    "report": {"run_id": "abc123", "artifact_path": "evaluation/report.html", "artifact_uri": "file:///x/report.html"},
}


def test_the_approve_task_is_the_standard_approval_operator_with_the_timeout_answer():
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    dag = build_dag(PLAN)
    approve = dag.get_task("approve")

    assert isinstance(approve, ApproveOperator) and isinstance(approve, ApprovalOperator)
    assert approve.upstream_task_ids == {"register"} and approve.downstream_task_ids == {"promote"}
    assert approve.options == ["Approve", "Reject"]
    assert approve.defaults == ["Reject"]  # on_timeout: reject
    assert approve.response_timeout == timedelta(hours=24)
    assert approve.retries == 0


def test_body_shows_the_version_the_gate_table_the_report_and_what_each_answer_does():
    body = approval_body(PLAN, {"version": 7}, EVALUATION, mlflow_run_page="http://mlflow:5000/#/experiments/1/runs/abc123")

    assert body.splitlines() == [
        "**fraud_detector_approval** version **7** passed its gates and waits for your approval to become "
        "`champion` (now: version 6).",
        "",
        "| metric | candidate | champion v6 | change | gates |",
        "| --- | --- | --- | --- | --- |",
        "| auc | 0.930000 | 0.920000 | +0.010000 | PASS auc >= 0.8 |",
        "| f1 | 0.410000 | 0.400000 | +0.010000 | - |",
        "",
        "Evaluation report: `runs:/abc123/evaluation/report.html` ([MLflow run](http://mlflow:5000/#/experiments/1/"
        "runs/abc123), artifacts: evaluation/)",
        "",
        "- **Approve**: version 7 becomes `champion`, version 6 becomes `previous_champion`.",
        "- **Reject**: version 7 stays `challenger`, tagged `trainpipe.rejected`; nothing is promoted.",
        "- No answer within 24h: rejected (on_timeout: reject).",
    ]


def test_body_of_a_first_version_without_a_report():
    evaluation = {**EVALUATION, "champion": None, "champion_version": None, "report": None}

    body = approval_body(PLAN, {"version": 1}, evaluation)

    assert "become `champion` (now: no version yet)." in body
    assert "Evaluation report: none for this run." in body
    assert "- **Approve**: version 1 becomes `champion`." in body
