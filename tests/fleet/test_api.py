"""The fleet API (``/trainpipe/api/...``) on Airflow's api-server app, with a night of runs written through
Airflow's REST API and MLflow's client (``night``): Airflow's authentication and DAG permissions, and what each
pipeline's row says."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import quote

import pytest

from .night import GATES_NOTE, PIPELINES, PROMOTED_NOTE, VIEWER, VIEWER_PASSWORD

pytestmark = pytest.mark.integration


def _rows(fleet, **params) -> dict[str, dict]:
    answer = fleet.client.get("/trainpipe/api/pipelines", headers=fleet.headers(), params=params)
    assert answer.status_code == 200, answer.text
    # The night's pipelines only: earlier tests of the session leave DAGs of their own in its Airflow DB.
    return {row["pipeline_id"]: row for row in answer.json()["pipelines"] if row["pipeline_id"] in PIPELINES}


@pytest.mark.parametrize("path", ["/trainpipe/api/pipelines", "/trainpipe/api/pipelines/fraud_nightly", "/trainpipe/",
                                  "/trainpipe/pipelines/fraud_nightly"])
def test_without_a_token_nothing_is_shown(fleet, path: str) -> None:
    answer = fleet.client.get(path)
    assert answer.status_code == 401
    assert "fraud_nightly" not in answer.text


@pytest.mark.parametrize("path", ["/trainpipe/api/pipelines", "/trainpipe/api/pipelines/fraud_nightly"])
def test_a_forged_token_is_refused(fleet, path: str) -> None:
    token = fleet.token()
    header, payload, _signature = token.split(".")
    answer = fleet.client.get(path, headers={"Authorization": f"Bearer {header}.{payload}.AAAA"})
    assert answer.status_code == 403
    assert "fraud_nightly" not in answer.text


def test_a_user_sees_only_the_dags_they_may_read(fleet) -> None:
    headers = fleet.headers(VIEWER, VIEWER_PASSWORD)
    listed = fleet.client.get("/trainpipe/api/pipelines", headers=headers).json()["pipelines"]
    assert sorted(row["pipeline_id"] for row in listed if row["pipeline_id"] in PIPELINES) == ["fraud_approval",
                                                                                                 "fraud_nightly"]
    refused = fleet.client.get("/trainpipe/api/pipelines/churn_drift", headers=headers)
    assert refused.status_code == 403
    assert "drift" not in refused.text.replace("churn_drift", "")
    page = fleet.client.get("/trainpipe/", headers=headers)
    assert "fraud_nightly" in page.text and "churn_drift" not in page.text and "ranker_gates" not in page.text


def test_the_list_says_each_outcome_in_words(fleet) -> None:
    rows = _rows(fleet)
    assert set(rows) == {"fraud_nightly", "churn_drift", "ranker_gates", "fraud_approval", "ltv_crash", "spare_never_run"}
    assert (rows["churn_drift"]["outcome"], rows["churn_drift"]["last_run"]["reason"]) == (
        "validation_failed", "validation failed: drift in amount (PSI 6.84, KS 0.71)")
    assert (rows["ranker_gates"]["outcome"], rows["ranker_gates"]["last_run"]["reason"]) == ("gates_failed", GATES_NOTE)
    assert rows["fraud_approval"]["outcome"] == "awaiting_approval"
    assert rows["fraud_approval"]["last_run"]["reason"] == "awaiting approval for 3 h"
    assert (rows["ltv_crash"]["outcome"], rows["ltv_crash"]["last_run"]["reason"]) == (
        "failed", "train retried 2 times, then failed in train")
    assert (rows["fraud_nightly"]["outcome"], rows["fraud_nightly"]["last_run"]["reason"]) == ("promoted", PROMOTED_NOTE)
    assert rows["spare_never_run"]["outcome"] == "never_run" and rows["spare_never_run"]["last_run"] is None


def test_needs_attention_first(fleet) -> None:
    order = list(_rows(fleet))
    attention = ["ltv_crash", "churn_drift", "ranker_gates", "fraud_approval"]
    assert order[:4] == attention
    assert set(order[4:]) == {"fraud_nightly", "spare_never_run"}
    filtered = _rows(fleet, outcome="needs_attention")
    assert list(filtered) == attention


def test_team_from_the_team_tag_else_the_owner(fleet) -> None:
    rows = _rows(fleet)
    assert (rows["fraud_nightly"]["team"], rows["fraud_nightly"]["owner"]) == ("risk", "risk-ml")
    assert rows["ltv_crash"]["team"] == "finance-ml"  # no team: tag
    assert sorted(_rows(fleet, team="risk")) == ["fraud_approval", "fraud_nightly"]


def test_champion_sparkline_cost_and_links(fleet) -> None:
    row = _rows(fleet)["fraud_nightly"]
    champion = row["champion"]
    assert (champion["version"], champion["main_metric"], champion["metrics"]["auc"]) == (6, "auc", 0.931)
    assert [p["value"] for p in row["sparkline"]] == [0.9, 0.905, 0.91, 0.915, 0.9204, 0.931]
    # Six version runs of 0.5 GPU-hours and the night's 1.5, all within 30 days.
    assert row["cost_30d"]["gpu_hours"] == pytest.approx(6 * 0.5 + 1.5)
    assert row["cost_30d"]["cost"] == pytest.approx(6 * 1.25 + 3.75)
    # Spot and on-demand GPU-hours apart (the versions' runs logged no split), in the list page too.
    assert (row["cost_30d"]["spot_gpu_hours"], row["cost_30d"]["on_demand_gpu_hours"]) == (1.0, 0.5)
    page = fleet.client.get("/trainpipe/", headers=fleet.headers()).text
    assert "of which 1.0 spot, 0.5 on demand" in page
    mlflow_run = fleet.night.mlflow_runs["fraud_nightly"]
    assert row["last_run"]["mlflow_run_id"] == mlflow_run
    assert row["links"]["DAG"] == f"/dags/fraud_nightly/runs/{quote(fleet.night.runs['fraud_nightly'], safe='')}"
    assert row["links"]["Evaluation report"] == f"/trainpipe/runs/{mlflow_run}/artifacts/evaluation/report.html"
    assert row["links"]["Drift report"] == f"/trainpipe/runs/{mlflow_run}/artifacts/drift/drift_report.html"
    # No cost metric logged by any run: shown as missing, not as 0.
    assert _rows(fleet)["ltv_crash"]["cost_30d"] == {"gpu_hours": None, "cpu_hours": None, "cost": None,
                                                     "spot_gpu_hours": None, "on_demand_gpu_hours": None}


def test_detail_history_log_drift_and_pending_approval(fleet) -> None:
    headers = fleet.headers()
    detail = fleet.client.get("/trainpipe/api/pipelines/fraud_nightly", headers=headers).json()
    assert [p["version"] for p in detail["metric_history"]] == [1, 2, 3, 4, 5, 6]
    assert [e["version"] for e in detail["promotion_log"]] == [6, 5, 4, 3, 2, 1]
    assert detail["promotion_log"][0]["by"] == "airflow DAG fraud_nightly (run scheduled__v6)"
    assert detail["pending_approval"] is None
    drift = fleet.client.get("/trainpipe/api/pipelines/churn_drift", headers=headers).json()
    assert drift["drift_history"][0]["psi"] == {"amount": 6.84, "hour_of_day": 0.02}
    assert [r["verdict"] for r in drift["drift_history"]] == ["fail", "pass", "pass", "pass"]
    waiting = fleet.client.get("/trainpipe/api/pipelines/fraud_approval", headers=headers).json()["pending_approval"]
    assert (waiting["run_id"], waiting["task_id"], waiting["map_index"], waiting["options"]) == (
        fleet.night.runs["fraud_approval"], "approve", -1, ["Approve", "Reject"])
    # The body is Markdown (Airflow's HITL view renders it): its bold shows as bold, not as asterisks.
    page = fleet.client.get("/trainpipe/pipelines/fraud_approval", headers=headers).text
    assert "<b>fraud_approval</b> version <b>3</b> passed its gates" in page and "**" not in page
    # Times as a reader wants them: to the minute, in UTC (the registry stores milliseconds and an offset).
    promoted = datetime.fromisoformat(detail["promotion_log"][0]["at"]).astimezone(UTC)
    nightly = fleet.client.get("/trainpipe/pipelines/fraud_nightly", headers=headers).text
    log = nightly.split("id='promotion-log'")[1].split("</table>")[0]
    assert f"<td>{promoted:%Y-%m-%d %H:%M} UTC</td>" in log
    assert not re.search(r"\d\d:\d\d:\d\d", log)
    drift_page = fleet.client.get("/trainpipe/pipelines/churn_drift", headers=headers).text
    heat = drift_page.split("id='drift-heatmap'")[1].split("</table>")[0]
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", heat) and "+00:00" not in heat


def test_an_approval_body_s_markup_is_escaped_and_only_bold_and_code_are_shown():
    from trainpipe.fleet.render import markdown_emphasis

    body = "**m<img src=x onerror=alert(1)>** becomes `champion` {{ x }} <b>not bold</b> 2 * 3 ** 4"
    assert markdown_emphasis(body) == ("<b>m&lt;img src=x onerror=alert(1)&gt;</b> becomes <code>champion</code> "
                                       "{{ x }} &lt;b&gt;not bold&lt;/b&gt; 2 * 3 ** 4")


def test_unknown_pipeline_is_404(fleet) -> None:
    answer = fleet.client.get("/trainpipe/api/pipelines/no_such_pipeline", headers=fleet.headers())
    assert answer.status_code == 404


def test_a_new_dag_run_state_is_seen_at_once(fleet) -> None:
    """The cache is per DAG-run change: a run marked failed is shown failed on the next request."""
    headers = fleet.headers()
    assert _rows(fleet)["fraud_nightly"]["outcome"] == "promoted"
    run_id = fleet.night.runs["fraud_nightly"]
    try:
        fleet.client.patch(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}", headers=headers,
                           json={"note": "marked failed by a person"})
        fleet.client.patch(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}/taskInstances/promote", headers=headers,
                           json={"new_state": "failed"})
        fleet.client.patch(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}", headers=headers, json={"state": "failed"})
        row = _rows(fleet)["fraud_nightly"]
        assert (row["outcome"], row["last_run"]["reason"]) == ("failed", "marked failed by a person")
    finally:
        fleet.client.patch(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}/taskInstances/promote", headers=headers,
                           json={"new_state": "success"})
        fleet.client.patch(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}", headers=headers,
                           json={"state": "success", "note": PROMOTED_NOTE})


def test_trainpipe_tasks_carry_the_fleet_buttons(fleet) -> None:
    """Airflow lists the operators' extra links on each task instance (their URLs are computed when the task ends)."""
    headers = fleet.headers()
    run_id = quote(fleet.night.runs["fraud_nightly"], safe="")
    expected = {"validate": {"MLflow run", "Drift report"}, "train": {"MLflow run"},
                "evaluate": {"MLflow run", "Evaluation report"}, "register": {"Model version", "Evaluation report"},
                "promote": {"Model version", "Evaluation report"}}
    for task_id, names in expected.items():
        answer = fleet.client.get(f"/api/v2/dags/fraud_nightly/dagRuns/{run_id}/taskInstances/{task_id}/links",
                                  headers=headers)
        assert answer.status_code == 200, answer.text
        assert set(answer.json()["extra_links"]) == names, task_id


def test_reports_are_served_sandboxed_to_readers_of_the_dag_only(fleet, tmp_path) -> None:
    import mlflow

    page = tmp_path / "drift" / "drift_report.html"
    page.parent.mkdir()
    page.write_text("<html><script>document.title='ran'</script>drift of amount</html>")
    secret = tmp_path / "model" / "MLmodel"
    secret.parent.mkdir()
    secret.write_text("not a report")
    client = mlflow.MlflowClient()
    for run in ("churn_drift", "fraud_nightly"):
        client.log_artifacts(fleet.night.mlflow_runs[run], str(tmp_path))
    churn = fleet.night.mlflow_runs["churn_drift"]
    url = f"/trainpipe/runs/{churn}/artifacts/drift/drift_report.html"
    answer = fleet.client.get(url, headers=fleet.headers())
    assert answer.status_code == 200 and "drift of amount" in answer.text
    assert answer.headers["content-security-policy"] == "sandbox"  # the report's script never runs
    # Another run's file, a reader of other DAGs only, no token: nothing of it is served.
    assert fleet.client.get(f"/trainpipe/runs/{churn}/artifacts/model/MLmodel", headers=fleet.headers()).status_code == 404
    refused = fleet.client.get(url, headers=fleet.headers(VIEWER, VIEWER_PASSWORD))
    assert refused.status_code == 404 and "drift of amount" not in refused.text
    allowed = f"/trainpipe/runs/{fleet.night.mlflow_runs['fraud_nightly']}/artifacts/drift/drift_report.html"
    assert fleet.client.get(allowed, headers=fleet.headers(VIEWER, VIEWER_PASSWORD)).status_code == 200
    assert fleet.client.get(url).status_code == 401
