"""The evaluate step on a manifest dataset version: the holdout's row groups read whole, the baseline fitted on
the first BASELINE_MAX_ROWS train rows only (a file past them is never opened), and the splits' MLflow dataset
source is the manifest, its profile counting the files. The MLflow hook is the in-memory stand-in."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.steps.evaluate.stand_ins import Hook
from trainpipe.errors import DatasetChangedError
from trainpipe.plan.model import DataPlan, EvaluationPlan, RegistrationPlan
from trainpipe.settings import Settings
from trainpipe.state.datasets import load_manifest, read_split, snapshot_datasets
from trainpipe.steps.evaluate import evaluate as evaluate_module
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import storage_access

CANDIDATE_URI = "runs:/candidate/model"
REGISTRATION = RegistrationPlan(model_name="m", alias="champion", challenger_alias="challenger",
                                previous_alias="previous_champion", description="")
PLAN = EvaluationPlan(task="binary_classification", features=("x",), label="y", group_column=None, metrics=("auc",),
                      decision_threshold=0.5, gates=())


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "storage"
    (root / "lake").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index in range(8):
        x = rng.normal(size=10)
        pq.write_table(pa.table({"x": x, "y": (x + rng.normal(0, 0.5, 10) > 0).astype("int64")}),
                       root / "lake" / f"part-{index}.parquet", row_group_size=5)
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    settings = Settings(home=tmp_path / "home", storage_root=root.as_uri(), storage_conn_id=None,
                        mlflow_tracking_uri="unused", mlflow_artifact_root=str(tmp_path / "artifacts"))
    data = DataPlan(uri="lake", conn_id=None, format="parquet", time_column=None, window=None, holdout_fraction=0.2,
                    holdout_key=None, snapshot="manifest")
    with storage_access(settings):
        info = take_snapshot("p", data, settings=settings, logical_date=datetime(2026, 11, 5, tzinfo=UTC))
    return info, settings, root


def test_the_holdout_is_read_whole_and_the_baseline_stops_at_its_bound(snapshot, monkeypatch):
    info, settings, root = snapshot
    with storage_access(settings):
        manifest, _ = load_manifest(info, settings=settings)
    first_train = manifest.units("train")[0]
    # A file past the bound that holds no holdout row group: a bounded read of the train split never opens it.
    untouched = [i for i, f in enumerate(manifest.files) if not f.holdout_row_groups and i != first_train.file]
    assert untouched, "the fixture needs a train-only file after the first train unit"
    pq.write_table(pa.table({"x": [0.0], "y": [1]}), root / "lake" / manifest.files[untouched[-1]].path)
    monkeypatch.setattr(evaluate_module, "BASELINE_MAX_ROWS", first_train.rows)
    hook = Hook({CANDIDATE_URI: np.linspace(0.01, 0.99, info.holdout_rows)}, champion_uri="models:/m@champion",
                champion_version="1")

    with storage_access(settings):
        result = evaluate_module.evaluate(PLAN, REGISTRATION, holdout_uri=info.holdout_uri, model_uri=CANDIDATE_URI,
                                          mlflow_run_id="run-1", hook=hook, settings=settings,  # type: ignore[arg-type]
                                          snapshot=info)
        # The whole train split would have met the changed file.
        with pytest.raises(DatasetChangedError, match=manifest.files[untouched[-1]].path):
            read_split(info, "train", settings=settings)

    assert result["baseline"] is not None and "auc" in result["candidate"]
    # The candidate was asked about every holdout row: its answer has exactly that many scores.
    assert hook.client.metrics["holdout_auc"] == result["candidate"]["auc"]
    assert len(hook.models[CANDIDATE_URI].calls) == 1


def test_the_mlflow_datasets_of_a_manifest_version_name_the_manifest_and_count_its_files(snapshot):
    info, settings, _ = snapshot
    with storage_access(settings):
        holdout = read_split(info, "holdout", settings=settings)
        datasets = snapshot_datasets("p", info, holdout, settings=settings)
    assert [context for _, context in datasets] == ["training", "evaluation"]
    for dataset, _ in datasets:
        profile = json.loads(dataset.profile)
        assert profile["num_files"] == 8 and profile["snapshot_kind"] == "manifest"
        assert json.loads(dataset.source)["uri"] == f"snapshots/p/{info.digest[:16]}/data_manifest.json"
