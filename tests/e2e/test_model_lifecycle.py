"""The model lifecycle end to end (real dag.test(), torchrun, MLflow): the example pipeline run twice
promotes version 1, then version 2 with version 1 as previous_champion; re-running `register` and
`promote` of finished runs (`airflow tasks test`, as clearing them would) changes nothing;
`trainpipe rollback` puts version 1 back. The versions carry lineage that holds on any machine."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import REPO, load_dag, run_dag
from trainpipe.demo.synthetic import generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 6, 30, tzinfo=UTC)
MODEL = "fraud_lifecycle"


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fraud example under its own name, in a folder that is not a git checkout (as a deployed copy)."""
    data = state_dir / "storage" / "lifecycle_demo" / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=6000, days=25, end=END).to_parquet(data, index=False)
    spec = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    spec = (
        spec.replace("pipeline_id: fraud_detector", f"pipeline_id: {MODEL}")
        .replace("demo/transactions/transactions.parquet", "lifecycle_demo/transactions.parquet")
        .replace("model_name: fraud_detector", f"model_name: {MODEL}")
        .replace("retries: 1", "retries: 0")
        .replace("expect_table_row_count_to_be_between: {min_value: 1000}",
                 "expect_table_row_count_to_be_between: {min_value: 100}")
        # Absolute gates a short run passes: the second run on the same rows must be promoted too.
        .replace("    - auc >= 0.80\n    - f1 >= 0.30\n    - auc >= +0.1%", "    - auc >= 0.50\n    #")
        .replace("    - worst_slice(auc) >= 0.75", "    # (no slice gate)")
    )
    assert "    - auc >= 0.50\n    #" in spec and "- worst_slice(" not in spec
    folder = tmp_path_factory.mktemp("lifecycle_configs")
    (folder / f"{MODEL}.yaml").write_text(spec)
    assert subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True).returncode != 0
    return folder


def _run(configs: Path, monkeypatch: pytest.MonkeyPatch, logical_date: datetime, seed: int = 42):
    # Each run its own seed: a run on the same rows with the same inputs trains nothing (training.cache, issue 33).
    return run_dag(load_dag(configs, MODEL, monkeypatch), logical_date=logical_date,
                   run_conf={"epochs": 2, "seed": seed})


def _command(configs: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINPIPE_DAG_CONFIGS": str(configs)}
    return subprocess.run([str(Path(sys.executable).with_name(argv[0])), *argv[1:]], capture_output=True, text=True,
                          env=env, timeout=600, check=False)


def _aliases(client) -> dict[str, int]:
    return {alias: int(v) for alias, v in client.get_registered_model(MODEL).aliases.items()}


def test_two_runs_promote_rerun_changes_nothing_rollback_restores(configs, monkeypatch):
    import mlflow

    from trainpipe.plan import tracking
    from trainpipe.plan.model import run_key
    from trainpipe.settings import Settings

    client = mlflow.MlflowClient()

    first_run, states = _run(configs, monkeypatch, END)

    assert states == {t: "success" for t in ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate",
                                             "register", "promote")}
    assert _aliases(client) == {"challenger": 1, "champion": 1}
    v1 = client.get_model_version(MODEL, "1")
    assert v1.tags[tracking.REPLACED_VERSION_TAG] == "none"
    assert v1.tags[tracking.PROMOTED_BY_TAG] == f"airflow DAG {MODEL} (run {first_run.run_id})"

    # Lineage that reads the same on any machine: no made-up commit outside a git checkout, the spec
    # by its path in the configs folder and its hash, the spec's text on the run, the weights' hash.
    assert "git_commit" not in v1.tags
    assert v1.tags["spec_file"] == f"{MODEL}.yaml"
    spec_bytes = (configs / f"{MODEL}.yaml").read_bytes()
    assert v1.tags["spec_file_sha256"] == hashlib.sha256(spec_bytes).hexdigest()
    logged_spec = Path(mlflow.artifacts.download_artifacts(run_id=v1.run_id, artifact_path=f"spec/{MODEL}.yaml"))
    assert logged_spec.read_bytes() == spec_bytes
    assert "trainpipe.git_commit" not in client.get_run(v1.run_id).data.tags
    storage = Path(Settings.from_env().storage_root.removeprefix("file://"))
    result = json.loads((storage / "runs" / MODEL / run_key(first_run.run_id) / "output" / "result.json").read_text())
    assert v1.tags["weights_sha256"] == result["weights_sha256"] and len(result["weights_sha256"]) == 64

    second_run, states = _run(configs, monkeypatch, END + timedelta(hours=1), seed=43)

    assert states["register"] == "success" and states["promote"] == "success", states
    assert _aliases(client) == {"challenger": 2, "champion": 2, "previous_champion": 1}
    v2 = client.get_model_version(MODEL, "2").tags
    assert v2["airflow_run_id"] == second_run.run_id
    assert v2[tracking.REPLACED_VERSION_TAG] == "1"
    assert v2[tracking.PROMOTION_REASON_TAG].startswith("gates passed (1/1): auc >= 0.5: ")
    details = json.loads(v2[tracking.PROMOTION_DETAILS_TAG])
    assert details["airflow_run_id"] == second_run.run_id and details["gates_passed"] is True
    assert [g["gate"] for g in details["gates"]] == ["auc >= 0.5"]
    promoted_at = {n: client.get_model_version(MODEL, n).tags[tracking.PROMOTED_AT_TAG] for n in ("1", "2")}

    # Re-running register and promote of both finished runs, the older one first (its promote would
    # take champion back if promotion were not once per version).
    for run in (first_run, second_run):
        for task in ("register", "promote"):
            rerun = _command(configs, "airflow", "tasks", "test", MODEL, task, run.run_id)
            assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]

    assert sorted(int(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")) == [1, 2]
    assert _aliases(client) == {"challenger": 2, "champion": 2, "previous_champion": 1}
    assert {n: client.get_model_version(MODEL, n).tags[tracking.PROMOTED_AT_TAG] for n in ("1", "2")} == promoted_at

    rollback = _command(configs, "trainpipe", "rollback", MODEL, "--actor", "oncall", "--reason", "alerts on v2")

    assert rollback.returncode == 0, rollback.stderr
    assert rollback.stdout.splitlines()[0] == f"{MODEL} version 1 is now champion (previous_champion: version 2)"
    assert _aliases(client) == {"challenger": 2, "champion": 1, "previous_champion": 2}
    import mlflow.pyfunc

    assert mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").metadata.run_id == v1.run_id

    shown = _command(configs, "trainpipe", "model", MODEL)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"registered model: {MODEL}  (2 version(s))"
    assert any(line.startswith(f"  champion           version 1  (run {first_run.run_id}, ") for line in lines)
    promotions = lines[lines.index("last promotions (newest first):") + 1:][:3]
    assert promotions[0].endswith("version 1, replaced version 2  by oncall: rollback: alerts on v2")
    assert f"version 2, replaced version 1  by airflow DAG {MODEL} (run {second_run.run_id}): gates passed" in promotions[1]
    assert f"version 1  by airflow DAG {MODEL} (run {first_run.run_id}): gates passed" in promotions[2]
