"""A manifest dataset version of an S3 prefix (moto's server): ETags and, in a versioned bucket, VersionIds, so
a reader reads the snapshot's bytes after the key was overwritten; unversioned, the overwrite stops it."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.moto_s3 import moto_s3_server
from trainpipe.errors import DatasetChangedError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.state.datasets import load_manifest, read_split
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import storage_access

CONN_ID = "trainpipe_manifest_s3"
DAY = datetime(2026, 11, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3_server() as url:
        yield url


@pytest.fixture
def s3(endpoint, monkeypatch):
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}))
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _bucket(s3, name: str, *, versioned: bool) -> str:
    s3.create_bucket(Bucket=name)
    if versioned:
        s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def _parquet(start: int, rows: int = 4) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": pa.array([float(i) for i in range(start, start + rows)]),
                             "y": pa.array([i % 2 for i in range(start, start + rows)], pa.int64())}),
                   sink, row_group_size=2)
    return sink.getvalue()


def _settings(bucket: str, tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", storage_root=f"s3://{bucket}/storage", storage_conn_id=CONN_ID,
                    mlflow_tracking_uri="unused", mlflow_artifact_root=str(tmp_path / "artifacts"))


def _plan(uri: str, snapshot: str = "manifest") -> DataPlan:
    return DataPlan(uri=uri, conn_id=CONN_ID, format="parquet", time_column=None, window=None, holdout_fraction=0.3,
                    holdout_key=None, snapshot=snapshot, uri_declared_at=("dag_configs/p.yaml", 7, 8))


def test_a_versioned_bucket_is_read_by_version_after_an_overwrite(s3, tmp_path):
    bucket = _bucket(s3, "manifest-versioned", versioned=True)
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"lake/part-{i}.parquet", Body=_parquet(10 * i))
    settings = _settings(bucket, tmp_path)
    with storage_access(settings):
        info = take_snapshot("p", _plan(f"s3://{bucket}/lake"), settings=settings, logical_date=DAY)
        manifest, _ = load_manifest(info, settings=settings)
        before = read_split(info, "train", settings=settings)
        s3.put_object(Bucket=bucket, Key="lake/part-1.parquet", Body=_parquet(500, rows=6))
        after = read_split(info, "train", settings=settings)
        holdout = read_split(info, "holdout", settings=settings)
    assert all(f.version_id and f.version_id != "null" and f.etag for f in manifest.files)
    assert after.equals(before)  # the snapshot's bytes, by VersionId, not the key's new content
    assert 500.0 not in set(after["x"]) | set(holdout["x"])
    assert sorted([*after["x"], *holdout["x"]]) == [float(i) for r in (0, 10, 20) for i in range(r, r + 4)]


def test_auto_lists_an_s3_prefix_of_the_threshold_as_a_manifest_and_copies_a_smaller_one(s3, tmp_path, monkeypatch):
    from trainpipe.plan import model

    bucket = _bucket(s3, "manifest-auto", versioned=True)
    bodies = [_parquet(10 * i) for i in range(3)]
    for i, body in enumerate(bodies):
        s3.put_object(Bucket=bucket, Key=f"lake/part-{i}.parquet", Body=body)
    settings = _settings(bucket, tmp_path)
    # The threshold lowered to the prefix's size: auto decides by the listed object sizes alone.
    monkeypatch.setattr(model, "AUTO_MANIFEST_BYTES", sum(len(body) for body in bodies))
    with storage_access(settings):
        listed = take_snapshot("p", _plan(f"s3://{bucket}/lake", snapshot="auto"), settings=settings,
                               logical_date=DAY)
        manifest, _ = load_manifest(listed, settings=settings)
    assert listed.kind == "manifest" and listed.rows == 12
    assert [f.path for f in manifest.files] == [f"part-{i}.parquet" for i in range(3)]
    assert all(f.version_id and f.version_id != "null" for f in manifest.files)
    monkeypatch.setattr(model, "AUTO_MANIFEST_BYTES", sum(len(body) for body in bodies) + 1)
    with storage_access(settings):
        copied = take_snapshot("p", _plan(f"s3://{bucket}/lake", snapshot="auto"), settings=settings,
                               logical_date=DAY)
    assert copied.kind == "copy" and copied.rows == 12


def test_an_unversioned_bucket_overwritten_after_the_snapshot_stops_the_reader_naming_the_file(s3, tmp_path):
    bucket = _bucket(s3, "manifest-plain", versioned=False)
    for i in range(2):
        s3.put_object(Bucket=bucket, Key=f"lake/part-{i}.parquet", Body=_parquet(10 * i))
    settings = _settings(bucket, tmp_path)
    with storage_access(settings):
        info = take_snapshot("p", _plan(f"s3://{bucket}/lake"), settings=settings, logical_date=DAY)
        manifest, _ = load_manifest(info, settings=settings)
        assert all(f.version_id is None and f.etag for f in manifest.files)
        assert len(read_split(info, "train", settings=settings)) == info.train_rows
        s3.put_object(Bucket=bucket, Key="lake/part-0.parquet", Body=_parquet(500))
        with pytest.raises(DatasetChangedError, match=rf"s3://{bucket}/lake/part-0\.parquet: changed since dataset "
                                                      rf"version {info.digest[:16]} listed it \(ETag "):
            for split in ("train", "holdout"):  # part-0's units may be in either split
                read_split(info, split, settings=settings)


def test_a_thousand_tiny_objects_in_a_versioned_bucket_snapshot_in_about_the_listings_time(s3, tmp_path):
    bucket = _bucket(s3, "manifest-many", versioned=True)
    body = _parquet(0, rows=2)
    with ThreadPoolExecutor(8) as pool:  # within boto3's 10 pooled connections
        list(pool.map(lambda i: s3.put_object(Bucket=bucket, Key=f"many/d{i % 10}/f{i:04d}.parquet", Body=body),
                      range(1000)))
    settings = _settings(bucket, tmp_path)
    started = time.perf_counter()
    with storage_access(settings):
        info = take_snapshot("p", _plan(f"s3://{bucket}/many"), settings=settings, logical_date=DAY)
    seconds = time.perf_counter() - started
    print(f"manifest snapshot of 1,000 objects through moto S3 (versioned): {seconds:.2f} s")
    assert info.rows == 2000 and info.kind == "manifest"
    # Generous (the target is under 10 s): proves the footers are read in parallel, not a speed.
    assert seconds < 120
