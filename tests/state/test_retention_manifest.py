"""trainpipe gc and a manifest dataset version: deleting it removes its folder only, never the files it lists."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.state.retention import DriftPins, collect, delete
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import storage_access

LATER = datetime.now(UTC) + timedelta(days=2)


def test_deleting_a_manifest_version_keeps_the_source_files_it_lists(tmp_path: Path) -> None:
    import mlflow

    root = tmp_path / "storage"
    for i in range(3):
        (root / "lake" / f"day={i}").mkdir(parents=True)
        pq.write_table(pa.table({"x": [float(i), 2.0, 3.0], "y": [0, 1, 0]}), root / "lake" / f"day={i}" / "p.parquet",
                       row_group_size=1)
    source = {p: p.read_bytes() for p in sorted((root / "lake").rglob("*.parquet"))}
    settings = Settings(home=tmp_path / "home", storage_root=root.as_uri(), storage_conn_id=None,
                        mlflow_tracking_uri="unused", mlflow_artifact_root=str(tmp_path / "artifacts"))
    data = DataPlan(uri="lake", conn_id=None, format="parquet", time_column=None, window=None, holdout_fraction=0.3,
                    holdout_key=None, snapshot="manifest")
    with storage_access(settings):
        info = take_snapshot("p", data, settings=settings, logical_date=datetime(2026, 11, 5, tzinfo=UTC))
    folder = root / "snapshots" / "p" / info.digest[:16]
    assert info.kind == "manifest" and folder.is_dir()

    plan = collect(settings, older_than=timedelta(days=1), keep_runs=0, client=mlflow.MlflowClient(), now=LATER,
                   pins=DriftPins(by_pipeline={}))
    [item] = [item for item in plan.items if item.kind == "snapshot"]
    assert item.label == f"snapshots/p/{info.digest[:16]}"
    # Its own files only (the two records), not the data it lists.
    assert item.size_bytes == sum(p.stat().st_size for p in folder.iterdir())
    assert item.size_bytes < sum(len(raw) for raw in source.values())

    delete(plan)
    assert not folder.exists()
    assert {p: p.read_bytes() for p in sorted((root / "lake").rglob("*.parquet"))} == source
