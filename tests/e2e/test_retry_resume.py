"""A retried train task resumes from the checkpoint of the try before it (real dag.test, real torchrun).

Try 1 exits abruptly after step 20's checkpoint is committed (training.testing.crash_first_try_after_step);
Airflow retries the task; try 2 resumes from step 20 in the same run folder and the same MLflow run,
which records the try and the resumed step. The checkpoint sensor beside train ends successfully.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.demo.synthetic import generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 6, 30, tzinfo=UTC)
CRASH_AFTER = 20


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = state_dir / "storage" / "retry_demo" / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=6000, days=25, end=END).to_parquet(data, index=False)
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    replacements = {
        "pipeline_id: fraud_detector": "pipeline_id: fraud_retry",
        "demo/transactions/transactions.parquet": "retry_demo/transactions.parquet",
        "model_name: fraud_detector": "model_name: fraud_retry",
        "retry_delay: 1m": "retry_delay: 1",  # dag.test() waits it out
        "  epochs: 8\n": "  epochs: 2\n",
        "{min_value: 1000}": "{min_value: 100}",
        "  checkpoint:\n": f"  testing:\n    crash_first_try_after_step: {CRASH_AFTER}\n  checkpoint:\n",
    }
    for old, new in replacements.items():
        assert spec.count(old) == 1, old
        spec = spec.replace(old, new)
    folder = tmp_path_factory.mktemp("retry_configs")
    (folder / "fraud_retry.yaml").write_text(spec)
    return folder


def test_retried_train_task_resumes_from_the_previous_try_checkpoint(configs, dag_from, monkeypatch):
    import mlflow

    from trainpipe.settings import Settings
    from trainpipe.state.checkpoint_state import read_checkpoint_state
    from trainpipe.state.run_folder import run_dir_for

    # training.testing is refused unless the platform allows fault injection (ADR 0014).
    monkeypatch.setenv("TRAINPIPE_ALLOW_FAULT_INJECTION", "1")
    dag = dag_from(configs, "fraud_retry")

    dag_run = dag.test(logical_date=END)

    tis = {ti.task_id: ti for ti in dag_run.get_task_instances()}
    assert tis["train"].state == "success"
    assert tis["train"].try_number == 2
    assert tis["watch_checkpoints"].state == "success"
    assert tis["evaluate"].state == "success"

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name("trainpipe/fraud_retry")
    (run,) = client.search_runs([experiment.experiment_id],
                                filter_string=f"tags.`trainpipe.airflow_run_id` = '{dag_run.run_id}'")
    assert run.data.tags["resumed_from_step"] == str(CRASH_AFTER)
    assert run.data.tags["trainpipe.try_number"] == "2"

    run_dir = run_dir_for(dag.dag_id, Settings.from_env(), dag_run.run_id)
    result = json.loads((run_dir / "output" / "result.json").read_text())
    assert result["resumed_from_step"] == CRASH_AFTER
    assert result["global_step"] > CRASH_AFTER
    state = read_checkpoint_state(run_dir)
    assert (state.status.state, state.status.try_number) == ("succeeded", 2)
    assert state.latest is not None and state.latest.step > CRASH_AFTER
