"""Model versions made the way the DAG's register task makes them, for the registry tests."""

from __future__ import annotations

from typing import Any

from trainpipe.hooks.mlflow import MlflowHook
from trainpipe.plan.model import RegistrationPlan

GATES = [
    {"gate": "auc >= 0.8", "metric": "auc", "value": 0.91, "baseline": None, "compared": 0.91, "threshold": 0.8,
     "passed": True, "note": "absolute"},
    {"gate": "auc >= +0.1% vs champion", "metric": "auc", "value": 0.91, "baseline": 0.90, "compared": 0.0111,
     "threshold": 0.001, "passed": True, "note": "+1.111% vs champion"},
]


def evaluation(auc: float = 0.91, **extra: Any) -> dict[str, Any]:
    return {"candidate": {"auc": auc, "ndcg@10": 0.5}, "champion": None, "champion_version": None,
            "gates": GATES, "gates_passed": True, **extra}


def hook_register(hook: MlflowHook, registration: RegistrationPlan, *, mlflow_run_id: str, dag_id: str, run: str,
                  evaluation_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    from trainpipe.steps.register.model_registry import register_candidate

    tags = {"dag_id": dag_id, "airflow_run_id": run, "spec_file": "team/x.yaml", "spec_file_sha256": "0" * 64}
    return register_candidate(registration, model_uri=f"runs:/{mlflow_run_id}/model", mlflow_run_id=mlflow_run_id,
                              tags=tags, evaluation=evaluation(**(evaluation_extra or {})), hook=hook)
