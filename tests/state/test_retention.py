"""trainpipe gc on file:// and s3:// (moto) storage roots: what it lists, what it protects, what --apply deletes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from tests.moto_s3 import moto_s3_server
from tests.support import REPO
from trainpipe.settings import Settings
from trainpipe.state.checkpoint_state import TrainingStatus, write_training_status
from trainpipe.state.retention import DriftPins, collect, delete, format_plan

CONN_ID = "trainpipe_gc_s3"
BUCKET = "trainpipe-gc-tests"
LONG_AGO = datetime(2026, 1, 1, tzinfo=UTC)
# Storage files are written now; gc looks at them from two days on, with --older-than 1d.
LATER = datetime.now(UTC) + timedelta(days=2)
NO_PINS = DriftPins(by_pipeline={})


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["file", "s3"])
def settings(request, tmp_path, monkeypatch) -> Settings:
    root = (tmp_path / "storage").as_uri()
    conn_id = None
    if request.param == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
            "conn_type": "aws", "login": "testing", "password": "testing",
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}))
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
            s3.create_bucket(Bucket=BUCKET)
        root, conn_id = f"s3://{BUCKET}/{request.node.name.replace('[', '_').rstrip(']')}", CONN_ID
    return Settings(home=tmp_path / "home", storage_root=root, storage_conn_id=conn_id,
                    mlflow_tracking_uri="unused", mlflow_artifact_root=str(tmp_path / "artifacts"))


def _write(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _run(root, name: str, *, state: str, finished_at: datetime, digest: str, final: bool = False):
    folder = root / "runs" / "p" / name
    _write(folder / "trainer_config.json", json.dumps({"dataset_digest": digest}))
    _write(folder / "checkpoints" / "step-10" / "manifest.json", "{}")
    _write(folder / "checkpoints" / "step-10" / "weights.bin", "x" * 1000)
    _write(folder / "usage.json", "{}")
    write_training_status(folder, TrainingStatus(state=state, try_number=1, final=final, started_at=finished_at,
                                                 updated_at=finished_at))
    return folder


def _snapshot(root, digest: str) -> None:
    _write(root / "snapshots" / "p" / digest[:16] / "manifest.json", json.dumps({"digest": digest}))
    _write(root / "snapshots" / "p" / digest[:16] / "train.parquet", "y" * 500)


def _registry(registered_digest: str, tmp_path) -> object:
    """The test session's MLflow store with a version trained on ``registered_digest``."""
    import mlflow

    client = mlflow.MlflowClient()
    name = f"gc-{registered_digest[:8]}-{tmp_path.name}"
    client.create_registered_model(name)
    client.create_model_version(name, (tmp_path / "model").as_uri(), tags={"dataset_digest": registered_digest})
    return client


def test_gc_keeps_what_is_referenced_or_unfinished_and_deletes_the_rest(settings: Settings) -> None:
    from trainpipe import storage

    root = storage.storage_root(settings)
    old, recent, running = "a" * 64, "b" * 64, "c" * 64
    registered, baseline, orphan = "d" * 64, "e" * 64, "f" * 64
    for digest in (old, recent, running, registered, baseline, orphan):
        _snapshot(root, digest)
    _write(root / "snapshots" / "p" / "LATEST.json", json.dumps({"digest": baseline}))
    first = _run(root, "r1", state="succeeded", finished_at=LONG_AGO, digest=old)
    second = _run(root, "r2", state="failed", final=True, finished_at=LONG_AGO + timedelta(days=1), digest=recent)
    live = _run(root, "r3", state="running", finished_at=LONG_AGO, digest=running)
    retrying = _run(root, "r4", state="failed", final=False, finished_at=LONG_AGO, digest=running)

    plan = collect(settings, older_than=timedelta(days=1), keep_runs=1, client=_registry(registered, settings.home.parent),
                   now=LATER, pins=NO_PINS)
    listed = {(item.kind, item.label) for item in plan.items}
    assert listed == {("checkpoints", "runs/p/r1/checkpoints"),
                      ("snapshot", f"snapshots/p/{old[:16]}"), ("snapshot", f"snapshots/p/{recent[:16]}"),
                      ("snapshot", f"snapshots/p/{orphan[:16]}")}
    assert all(item.size_bytes >= 500 for item in plan.items)
    text = format_plan(plan, applying=False)
    assert "checkpoints of runs/p/r3: the run is not finished" in text
    assert f"snapshots/p/{registered[:16]}: a registered model version was trained on it" in text
    assert f"snapshots/p/{baseline[:16]}: it is the baseline (LATEST.json)" in text
    assert f"snapshots/p/{running[:16]}: an unfinished run trains on it" in text
    # Listing deleted nothing.
    assert (first / "checkpoints" / "step-10" / "weights.bin").exists()
    assert (root / "snapshots" / "p" / orphan[:16] / "manifest.json").exists()

    deleted = delete(plan)
    assert {(item.kind, item.label) for item in deleted} == listed
    assert not (first / "checkpoints").exists() and (first / "usage.json").exists()
    for folder in (second, live, retrying):  # newest finished run kept (--keep-runs 1), unfinished never touched
        assert (folder / "checkpoints" / "step-10" / "weights.bin").exists()
    for digest in (registered, baseline, running):
        assert (root / "snapshots" / "p" / digest[:16] / "train.parquet").exists()
    for digest in (old, recent, orphan):
        assert not (root / "snapshots" / "p" / digest[:16]).exists()


def test_gc_only_looks_at_what_is_older_than_asked(settings: Settings) -> None:
    from trainpipe import storage

    root = storage.storage_root(settings)
    _snapshot(root, "a" * 64)
    _run(root, "r1", state="succeeded", finished_at=datetime.now(UTC), digest="a" * 64)
    _run(root, "r2", state="succeeded", finished_at=datetime.now(UTC), digest="a" * 64)
    plan = collect(settings, older_than=timedelta(days=30), keep_runs=0, client=_registry("9" * 64, settings.home.parent),
                   pins=NO_PINS)
    assert plan.items == ()


def _pinning_spec(folder: Path, reference: str) -> None:
    """The shipped fraud spec as pipeline ``p``, its drift check pinned to ``reference``."""
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["pipeline_id"] = "p"
    spec["validation"]["drift"] = {"reference": reference}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "p.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_gc_keeps_the_snapshot_a_spec_pins_as_drift_reference(settings: Settings, tmp_path: Path) -> None:
    from trainpipe import storage
    from trainpipe.state.retention import drift_pins

    root = storage.storage_root(settings)
    pinned, orphan = "ab" * 32, "f" * 64
    for digest in (pinned, orphan):
        _snapshot(root, digest)
    configs = tmp_path / "dag_configs"
    _pinning_spec(configs, pinned[:16])

    plan = collect(settings, older_than=timedelta(days=1), keep_runs=1, client=_registry("9" * 64, tmp_path),
                   now=LATER, pins=drift_pins(configs, settings=Settings.from_env()))
    assert {item.label for item in plan.items} == {f"snapshots/p/{orphan[:16]}"}
    assert (f"snapshots/p/{pinned[:16]}: p.yaml pins it as drift reference (validation.drift.reference)"
            in format_plan(plan, applying=False))
    delete(plan)
    assert (root / "snapshots" / "p" / pinned[:16] / "train.parquet").exists()
    assert not (root / "snapshots" / "p" / orphan[:16]).exists()


def test_gc_deletes_no_snapshot_while_a_spec_cannot_be_read(settings: Settings, tmp_path: Path) -> None:
    from trainpipe import storage
    from trainpipe.state.retention import drift_pins

    root = storage.storage_root(settings)
    orphan = "f" * 64
    _snapshot(root, orphan)
    _run(root, "r1", state="succeeded", finished_at=LONG_AGO, digest=orphan)
    _run(root, "r2", state="succeeded", finished_at=LONG_AGO + timedelta(days=1), digest=orphan)
    client = _registry("9" * 64, tmp_path)
    configs = tmp_path / "dag_configs"
    _pinning_spec(configs, orphan[:16])
    # A second spec that may pin the orphan too, but cannot be read: gc cannot know.
    (configs / "broken.yaml").write_text("pipeline_id: q\nvalidation: {drift: {reference: [\n")

    plan = collect(settings, older_than=timedelta(days=1), keep_runs=1, client=client,
                   now=LATER, pins=drift_pins(configs, settings=Settings.from_env()))
    # Checkpoints are still collected; the snapshot is kept, and the listing says why.
    assert {item.label for item in plan.items} == {"runs/p/r1/checkpoints"}
    text = format_plan(plan, applying=False)
    assert "p.yaml pins it as drift reference" in text
    (configs / "p.yaml").unlink()
    plan = collect(settings, older_than=timedelta(days=1), keep_runs=1, client=client,
                   now=LATER, pins=drift_pins(configs, settings=Settings.from_env()))
    assert {item.label for item in plan.items} == {"runs/p/r1/checkpoints"}
    text = format_plan(plan, applying=False)
    assert (f"snapshots/p/{orphan[:16]}: no other reference, but the specs' pinned drift references are unknown: "
            "1 spec(s) do not compile (dag_configs/broken.yaml; `trainpipe validate` says why)") in text, text
    delete(plan)
    assert (root / "snapshots" / "p" / orphan[:16] / "train.parquet").exists()
    plan = collect(settings, older_than=timedelta(days=1), keep_runs=1, client=client,
                   now=LATER, pins=drift_pins(tmp_path / "absent", settings=Settings.from_env()))
    assert "the specs' pinned drift references are unknown: there is no spec folder" in format_plan(plan, applying=False)
