"""A multiclass run's classes: recorded by the dataset version, pinned by the spec, and checked before launch.

The classes come from the snapshot (every label value of the window, numbers in numeric order); a spec
may pin them (`training.label_classes`), and then a row with another class stops the run at that line.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.steps.kinds_spec import compiled_plan, kinds_spec, run_folder
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.train import RunContext, check_training_inputs, trainer_config_for_run
from trainpipe.storage import storage_access

DAY = datetime(2026, 11, 5, tzinfo=UTC)
RUN = RunContext(dag_id="kinds", airflow_run_id="manual__1", try_number=1, spec_sha256="0" * 64, git_commit=None)


def _spec(**training: object) -> dict:
    return kinds_spec({"uri": "kinds.parquet", "time_column": "event_time", "window": "30d"}, **training)


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "storage"
    root.mkdir()
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", root.as_uri())
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    return root


def _table(root: Path, labels: list[object]) -> None:
    rng = np.random.default_rng(0)
    n = len(labels)
    pd.DataFrame({"event_time": [DAY - timedelta(hours=h + 1) for h in range(n)], "x1": rng.normal(size=n),
                  "x2": rng.normal(size=n), "kind": labels}).to_parquet(root / "kinds.parquet")


def _snapshot_and_config(tmp_path: Path, plan):
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY,
                                 class_label=plan.class_label)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=run_folder(tmp_path))
        return snapshot, config, settings


def test_the_dataset_version_records_the_classes_and_the_run_trains_on_them(tmp_path, storage):
    _table(storage, [10, 2, 3] * 20)
    snapshot, config, settings = _snapshot_and_config(tmp_path, compiled_plan(tmp_path, _spec()))
    # Whole numbers in numeric order: 2 before 10.
    assert snapshot.label_classes == ["2", "3", "10"]
    [manifest] = storage.glob("snapshots/kinds/*/manifest.json")
    assert json.loads(manifest.read_text())["label_classes"] == ["2", "3", "10"]
    assert config.label_classes == ("2", "3", "10")
    assert json.loads(config.to_json())["label_classes"] == ["2", "3", "10"]


def test_a_version_recorded_without_classes_gives_them_from_its_splits(tmp_path, storage):
    _table(storage, ["b", "a", "c"] * 20)
    plan = compiled_plan(tmp_path, _spec())
    settings = Settings.from_env()
    with storage_access(settings):
        # As a binary or regression spec over the same table (or trainpipe before multiclass) recorded it.
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        assert snapshot.label_classes is None
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=run_folder(tmp_path))
    assert config.label_classes == ("a", "b", "c")


def test_pinned_classes_keep_their_order_and_a_class_outside_them_stops_at_their_line(tmp_path, storage):
    _table(storage, ["cat", "dog", "eel"] * 20)
    plan = compiled_plan(tmp_path, _spec(label_classes=["dog", "cat"]))
    snapshot, config, settings = _snapshot_and_config(tmp_path, plan)
    assert config.label_classes == ("dog", "cat")
    with storage_access(settings), pytest.raises(SpecError) as raised:
        check_training_inputs(plan, config, snapshot, settings=settings)
    [problem] = raised.value.problems
    text = (tmp_path / "kinds.yaml").read_text().splitlines()
    assert problem.field_path == "training.label_classes"
    assert text[problem.line - 1].strip().startswith("label_classes:")
    assert "'eel'" in problem.message and "add them to training.label_classes" in problem.message


def test_a_label_with_one_class_stops_at_the_label_line(tmp_path, storage):
    _table(storage, ["only"] * 30)
    plan = compiled_plan(tmp_path, _spec())
    with pytest.raises(SpecError) as raised:
        _snapshot_and_config(tmp_path, plan)
    [problem] = raised.value.problems
    assert problem.field_path == "training.label"
    assert (tmp_path / "kinds.yaml").read_text().splitlines()[problem.line - 1].strip() == "label: kind"
    assert "holds one class ('only')" in problem.message and "pin training.label_classes" in problem.message


def test_missing_labels_are_named_at_the_label_line(tmp_path, storage):
    _table(storage, ["a", "b", None] * 20)
    plan = compiled_plan(tmp_path, _spec())
    snapshot, config, settings = _snapshot_and_config(tmp_path, plan)
    assert snapshot.label_classes is None and config.label_classes == ()
    with storage_access(settings), pytest.raises(SpecError) as raised:
        check_training_inputs(plan, config, snapshot, settings=settings)
    [problem] = raised.value.problems
    assert problem.field_path == "training.label"
    assert "has missing values" in problem.message
