"""Params, data-aware schedules and emitted Assets as compiled into the Airflow DAG."""

from __future__ import annotations

from pathlib import Path

from trainpipe.dag_builder import build_dag
from trainpipe.factory import compile_file
from trainpipe.plan import apply_param_overrides, model_asset_uri, snapshot_asset_uri

REPO = Path(__file__).resolve().parent.parent


def _spec_with(tmp_path: Path, old: str, new: str, name: str = "variant.yaml") -> Path:
    text = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def test_asset_scheduled_spec_runs_on_that_asset(tmp_path):
    from airflow.sdk import Asset

    spec = _spec_with(tmp_path, 'schedule: "@daily"', "schedule:\n  assets: [trainpipe://transactions_ingest/snapshot]")
    dag = build_dag(compile_file(spec))

    assert list(dag.timetable.asset_condition.objects) == [Asset("trainpipe://transactions_ingest/snapshot")]


def test_pipeline_emits_snapshot_and_model_assets():
    from airflow.sdk import Asset

    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml"))

    assert dag.get_task("snapshot").outlets == [Asset(snapshot_asset_uri("fraud_detector"))]
    assert dag.get_task("register").outlets == [Asset(model_asset_uri("fraud_detector"))]


def test_spec_params_become_airflow_params_with_spec_defaults():
    dag = build_dag(compile_file(REPO / "dag_configs" / "fraud_detector.yaml"))

    params = dag.params
    assert set(params.keys()) == {"learning_rate", "epochs", "seed"}
    assert params["learning_rate"] == 0.003 and params["epochs"] == 8 and params["seed"] == 42
    schema = params.get_param("learning_rate").schema
    assert schema["type"] == "number" and schema["minimum"] == 0.00001 and schema["maximum"] == 0.1


def test_param_override_changes_only_that_run():
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml")
    spec, changed = apply_param_overrides(plan, {"learning_rate": 0.01, "epochs": 8})
    assert changed == {"learning_rate": 0.01}
    assert spec.training.learning_rate == 0.01
    assert plan.spec.training.learning_rate == 0.003
