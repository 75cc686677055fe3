"""The train step on a manifest dataset version: the trainer is told to stream the manifest, the classes come
from the label column of every unit, the input checks read the first rows only, and a file changed since the
snapshot stops it naming the file. Also the spec's refusals of a manifest it cannot version, located."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.steps.kinds_spec import compiled_plan, kinds_spec, run_folder
from trainpipe.errors import DatasetChangedError, ReproduceError, SpecError
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.reproduce import snapshot_by_digest
from trainpipe.steps.train.train import RunContext, check_training_inputs, trainer_config_for_run
from trainpipe.storage import storage_access
from trainpipe_trainer.data.manifest import MANIFEST_FILE

DAY = datetime(2026, 11, 5, tzinfo=UTC)
RUN = RunContext(dag_id="kinds", airflow_run_id="manual__1", try_number=1, spec_sha256="0" * 64, git_commit=None)


def _spec(data: dict | None = None, **training: object) -> dict:
    return kinds_spec(data or {"uri": "lake", "snapshot": "manifest"}, **training)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "storage"
    # Each file holds one class: "owl" only in the last file, so only a read of every unit finds it.
    for index, kind in enumerate(["cat", "dog", "owl"]):
        (root / "lake").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x1": [float(i) for i in range(8)], "x2": [1.0] * 8, "kind": [kind] * 8}),
                       root / "lake" / f"part-{index}.parquet", row_group_size=2)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", root.as_uri())
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    return root


def test_the_trainer_streams_the_manifest_and_the_classes_come_from_every_unit(tmp_path, root):
    plan = compiled_plan(tmp_path, _spec())
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY,
                                 class_label=plan.class_label)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=run_folder(tmp_path))
        check_training_inputs(plan, config, snapshot, settings=settings)
    assert snapshot.kind == "manifest" and snapshot.label_classes is None
    assert config.train_data_format == "manifest"
    assert config.train_data_uri == snapshot.manifest_uri
    assert config.train_data_uri.endswith(f"/{snapshot.digest[:16]}/{MANIFEST_FILE}")
    assert config.label_classes == ("cat", "dog", "owl")


def test_the_input_check_reads_the_first_rows_and_locates_a_missing_feature(tmp_path, root):
    plan = compiled_plan(tmp_path, _spec(features=["x1", "x3"]))
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=run_folder(tmp_path))
        with pytest.raises(SpecError, match=r"kinds\.yaml:\d+:\d+: training\.features: the first 20,000 rows "
                                            r"of the snapshot's train split .*'x3'"):
            check_training_inputs(plan, config, snapshot, settings=settings)


def test_a_file_changed_since_the_snapshot_stops_the_train_step_naming_it(tmp_path, root):
    plan = compiled_plan(tmp_path, _spec(label_classes=["cat", "dog", "owl"]))
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=run_folder(tmp_path))
        pq.write_table(pa.table({"x1": [0.0], "x2": [0.0], "kind": ["cat"]}), root / "lake" / "part-0.parquet")
        with pytest.raises(DatasetChangedError, match=r"/lake/part-0\.parquet: changed since dataset version "):
            check_training_inputs(plan, config, snapshot, settings=settings)


def test_reproduce_refuses_a_manifest_version_naming_each_changed_or_missing_file(tmp_path, root):
    plan = compiled_plan(tmp_path, _spec())
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        found = snapshot_by_digest(plan.dag_id, snapshot.digest, settings=settings)
        assert (found.kind, found.manifest_uri, found.train_uri) == ("manifest", snapshot.manifest_uri,
                                                                      snapshot.manifest_uri)
        (root / "lake" / "part-0.parquet").unlink()
        pq.write_table(pa.table({"x1": [0.0], "x2": [0.0], "kind": ["cat"]}), root / "lake" / "part-2.parquet")
        with pytest.raises(ReproduceError) as caught:
            snapshot_by_digest(plan.dag_id, snapshot.digest, settings=settings)
    text = str(caught.value)
    assert "part-0.parquet: listed by dataset version" in text and "gone from the store" in text
    assert "part-2.parquet: changed since dataset version" in text
    assert "part-1.parquet" not in text


@pytest.mark.parametrize(("data", "refused"), [
    ({"uri": "lake", "snapshot": "manifest", "time_column": "t", "window": "30d"}, "data.window"),
    ({"uri": "lake", "snapshot": "manifest", "time_column": "t"}, "data.time_column"),
    ({"uri": "lake", "snapshot": "manifest", "format": "csv"}, "data.format is csv"),
    ({"uri": "events.csv", "snapshot": "manifest"}, "data.format is csv"),
])
def test_a_manifest_the_spec_cannot_version_is_refused_at_its_line(tmp_path, root, data, refused):
    with pytest.raises(SpecError) as caught:
        compiled_plan(tmp_path, _spec(data))
    text = str(caught.value)
    line = yaml.safe_dump(_spec(data), sort_keys=False).splitlines().index("  snapshot: manifest") + 1
    assert f"kinds.yaml:{line}:" in text and "data.snapshot: " in text, text
    assert refused in text and "use data.snapshot: copy" in text, text


def test_ranking_is_refused_a_manifest_at_its_line_and_auto_copies_it(tmp_path, root):
    ranking = {"task": "ranking", "features": ["x1"], "label": "x2", "group_column": "kind"}
    spec = {**_spec(), "training": ranking, "evaluation": {"metrics": ["ndcg@10"]}}
    with pytest.raises(SpecError) as caught:
        compiled_plan(tmp_path, spec)
    line = yaml.safe_dump(spec, sort_keys=False).splitlines().index("  snapshot: manifest") + 1
    assert f"kinds.yaml:{line}:" in str(caught.value) and "cut queries in two" in str(caught.value)
    # auto never takes a manifest for ranking, whatever the folder's size: the holdout stays by query id.
    plan = compiled_plan(tmp_path, {**spec, "data": {"uri": "lake", "snapshot": "auto"}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("trainpipe.plan.model.AUTO_MANIFEST_BYTES", 1)
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=Settings.from_env(), logical_date=DAY)
    assert snapshot.kind == "copy"


def test_a_manifest_read_through_another_connection_than_the_storage_is_refused(tmp_path, root):
    plan = compiled_plan(tmp_path, _spec({"uri": "lake", "snapshot": "manifest", "conn_id": "lake_reader"}))
    with pytest.raises(SpecError, match="not data.conn_id 'lake_reader'; drop data.conn_id"):
        take_snapshot(plan.dag_id, plan.data, settings=Settings.from_env(), logical_date=DAY)
    assert not (root / "snapshots").exists()
