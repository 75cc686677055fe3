"""A morning after a night of retrains, written through the real APIs: trainpipe DAGs compiled and serialized by
``airflow dags reserialize``, their runs, notes and task states through Airflow's REST API (an in-process api-server
app), and the MLflow side through MLflow's client and trainpipe's registry functions.

The night: one pipeline promoted a new champion, one stopped on drift, one failed its gates, one waits for
approval (parked 3 h ago), one crashed in train after retries, one never ran.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from stack.helpers import FEATURES

BIN = Path(sys.executable).parent
USER, PASSWORD = "admin", "fleet-tests"
VIEWER, VIEWER_PASSWORD = "riskonly", "fleet-viewer"

PIPELINES = {
    # pipeline_id: (team tag or None, owner, approval)
    "fraud_nightly": ("risk", "risk-ml", False),
    "churn_drift": ("growth", "growth-ml", False),
    "ranker_gates": ("search", "search-relevance", False),
    "fraud_approval": ("risk", "risk-ml", True),
    "ltv_crash": (None, "finance-ml", False),
    "spare_never_run": ("growth", "growth-ml", False),
}
DRIFT_NOTE = None  # today's validate leaves no note: the reason comes from the drift tags on the MLflow run
GATES_NOTE = ("gates failed (1 of 3): auc >= +0.1% (got 0.8812, -0.08% vs champion); nothing registered")
PROMOTED_NOTE = "promoted version 6: auc 0.9310 vs 0.9204"


def spec(pipeline_id: str) -> str:
    team, owner, approval = PIPELINES[pipeline_id]
    tags = f"tags: [demo{', team:' + team if team else ''}]\n"
    return f"""\
pipeline_id: {pipeline_id}
owner: {owner}
{tags}schedule: "@daily"
data:
  uri: fleet/transactions.parquet
  time_column: event_time
  window: 30d
validation:
  drift:
    psi: {{warn: 0.1, fail: 0.25}}
training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [8]}}
  features: [{", ".join(FEATURES)}]
  label: is_fraud
  epochs: 1
  batch_size: 128
  learning_rate: 0.01
  distributed: {{nproc_per_node: 1}}
evaluation:
  metrics: [auc, f1]
  gates: ["auc >= 0.5", "auc >= +0.1%"]
registration:
  model_name: {pipeline_id}
  approval: {"required" if approval else "none"}
"""


def serialize_dags(configs: Path, env: dict[str, str]) -> None:
    configs.mkdir(parents=True, exist_ok=True)
    for pipeline_id in PIPELINES:
        (configs / f"{pipeline_id}.yaml").write_text(spec(pipeline_id))
    done = subprocess.run([str(BIN / "airflow"), "dags", "reserialize"], env={**env, "TRAINPIPE_DAG_CONFIGS": str(configs)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@dataclass
class Night:
    runs: dict[str, str]  # pipeline_id -> run_id of its last run
    versions: dict[str, int]  # pipeline_id -> champion version
    mlflow_runs: dict[str, str]  # pipeline_id -> the last run's MLflow run id


def _mlflow_run(client: Any, pipeline_id: str, airflow_run_id: str, *, started: datetime, metrics: dict[str, float],
                tags: dict[str, str]) -> str:
    from mlflow.entities import Metric, RunTag

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings

    hook = MlflowHook(Settings.from_env())
    experiment = hook.experiment_id(pipeline_id)
    run = client.create_run(experiment, start_time=int(started.timestamp() * 1000),
                            tags={"trainpipe.airflow_run_id": airflow_run_id, "trainpipe.dag_id": pipeline_id, **tags})
    stamp = int(started.timestamp() * 1000)
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, stamp, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    return run.info.run_id


def _versions(client: Any, pipeline_id: str, aucs: list[float], *, now: datetime) -> int:
    """Registered versions with their holdout tags, each promoted in turn (the promotion log is trainpipe's)."""
    from trainpipe.steps.register.model_registry import promote

    client.create_registered_model(pipeline_id)
    for number, auc in enumerate(aucs, start=1):
        day = now - timedelta(days=len(aucs) - number, hours=1)
        # Each version's run: its validation's drift (small, passing) and its cost.
        run_id = _mlflow_run(client, pipeline_id, f"scheduled__v{number}", started=day,
                             metrics={"gpu_hours": 0.5, "cpu_hours": 2.0, "cost": 1.25,
                                      "drift_psi.amount": 0.01 * number, "drift_psi.hour_of_day": 0.03},
                             tags={"trainpipe.drift_verdict": "pass", "trainpipe.drift_failed_features": "",
                                   "trainpipe.dataset_digest": f"{number:02d}" * 32})
        client.create_model_version(pipeline_id, f"runs:/{run_id}/model", run_id=run_id,
                                    tags={"dag_id": pipeline_id, "airflow_run_id": f"scheduled__v{number}",
                                          "holdout_auc": f"{auc:.6f}", "holdout_f1": f"{auc - 0.4:.6f}"})
        promote(client, pipeline_id, number, actor=f"airflow DAG {pipeline_id} (run scheduled__v{number})",
                reason=f"gates passed (2/2): auc >= 0.50: {auc:.4f}")
    return len(aucs)


def write_night(airflow: Any, headers: dict[str, str], *, now: datetime | None = None) -> Night:
    """``airflow``: a TestClient (or requests session wrapper) on Airflow's api-server app."""
    import mlflow

    now = now or datetime.now(UTC)
    client = mlflow.MlflowClient()
    night = Night(runs={}, versions={}, mlflow_runs={})
    logical = (now - timedelta(hours=6)).replace(microsecond=0)

    def trigger(dag_id: str, state: str, note: str | None, tasks: dict[str, str]) -> str:
        answer = airflow.post(f"/api/v2/dags/{dag_id}/dagRuns", headers=headers,
                              json={"logical_date": logical.isoformat(), "conf": {}})
        assert answer.status_code == 200, answer.text
        run_id = answer.json()["dag_run_id"]
        for task_id, task_state in tasks.items():
            done = airflow.patch(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", headers=headers,
                                 json={"new_state": task_state})
            assert done.status_code == 200, done.text
        body: dict[str, Any] = {"state": state} if state in ("success", "failed") else {}
        if body:
            done = airflow.patch(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", headers=headers, json=body)
            assert done.status_code == 200, done.text
        if note:
            done = airflow.patch(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", headers=headers, json={"note": note})
            assert done.status_code == 200, done.text
        night.runs[dag_id] = run_id
        return run_id

    # Promoted: six versions, auc rising; the last run's note says so.
    night.versions["fraud_nightly"] = _versions(client, "fraud_nightly", [0.90, 0.905, 0.91, 0.915, 0.9204, 0.931],
                                                now=now)
    run_id = trigger("fraud_nightly", "success", PROMOTED_NOTE, {t: "success" for t in (
        "snapshot", "validate", "train", "evaluate", "gate", "register", "promote")})
    night.mlflow_runs["fraud_nightly"] = _mlflow_run(
        client, "fraud_nightly", run_id, started=now - timedelta(hours=5),
        # The night's training ran 1 GPU-hour on spot, was preempted twice, then 0.5 on demand (capacity fallback).
        metrics={"gpu_hours": 1.5, "cpu_hours": 4.0, "cost": 3.75, "drift_psi.amount": 0.01, "spot_gpu_hours": 1.0,
                 "on_demand_gpu_hours": 0.5},
        tags={"trainpipe.drift_verdict": "pass", "trainpipe.drift_failed_features": "",
              "trainpipe.gates_passed": "true", "trainpipe.dataset_digest": "ab12" * 16})

    # Drift stop: validate failed, the drift record on the run's MLflow run.
    night.versions["churn_drift"] = _versions(client, "churn_drift", [0.81, 0.83, 0.82], now=now - timedelta(days=9))
    run_id = trigger("churn_drift", "failed", DRIFT_NOTE, {"snapshot": "success", "validate": "failed"})
    night.mlflow_runs["churn_drift"] = _mlflow_run(
        client, "churn_drift", run_id, started=now - timedelta(hours=5),
        metrics={"drift_psi.amount": 6.84, "drift_ks.amount": 0.71, "drift_psi.hour_of_day": 0.02,
                 "drift_psi_max": 6.84},
        tags={"trainpipe.drift_verdict": "fail", "trainpipe.drift_failed_features": "amount",
              "trainpipe.drift_reference": "cd34" * 16, "trainpipe.dataset_digest": "ef56" * 16})

    # Gates failed: the run succeeded, register and promote skipped, the gate's note.
    night.versions["ranker_gates"] = _versions(client, "ranker_gates", [0.87, 0.8819], now=now - timedelta(days=1))
    run_id = trigger("ranker_gates", "success", GATES_NOTE, {
        "snapshot": "success", "validate": "success", "train": "success", "evaluate": "success", "gate": "success",
        "register": "skipped", "promote": "skipped"})
    night.mlflow_runs["ranker_gates"] = _mlflow_run(
        client, "ranker_gates", run_id, started=now - timedelta(hours=5),
        metrics={"gpu_hours": 2.0, "cost": 5.0, "holdout_auc": 0.8812},
        tags={"trainpipe.gates_passed": "false", "trainpipe.dataset_digest": "9a9a" * 16})

    # Awaiting approval for 3 h: a version registered as challenger, the approve task parked.
    night.versions["fraud_approval"] = _versions(client, "fraud_approval", [0.88, 0.89], now=now - timedelta(days=3))
    run_id = trigger("fraud_approval", "running", None, {t: "success" for t in (
        "snapshot", "validate", "train", "evaluate", "gate", "register")})
    _park_approval("fraud_approval", run_id, since=now - timedelta(hours=3, minutes=5))

    # Crashed in train after two retries, no note.
    run_id = trigger("ltv_crash", "failed", None, {"snapshot": "success", "validate": "success", "train": "failed"})
    _set_try_number("ltv_crash", run_id, "train", 3)
    return night


def _park_approval(dag_id: str, run_id: str, *, since: datetime) -> None:
    """The approve task as Airflow leaves it while it waits: state awaiting_input and its HITL request."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalar(select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                                                       TaskInstance.task_id == "approve"))
        ti.state = "awaiting_input"
        session.add(HITLDetail(ti_id=ti.id, options=["Approve", "Reject"], subject=f"Promote {dag_id} version 3 to champion?",
                               body=f"**{dag_id}** version **3** passed its gates and waits for your approval.",
                               defaults=["Reject"], multiple=False, params={}, created_at=since))


def _set_try_number(dag_id: str, run_id: str, task_id: str, tries: int) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id,
                                                   TaskInstance.task_id == task_id).values(try_number=tries))
