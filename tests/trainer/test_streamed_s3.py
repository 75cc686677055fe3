"""The streamed path on S3 (moto's server): the trainer reads a manifest's objects through the storage's options,
by VersionId in a versioned bucket (an overwrite of a key changes nothing it reads), by a checked ETag otherwise
(an overwrite stops it, naming the object)."""

from __future__ import annotations

import io
from pathlib import Path

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.trainer.helpers import S3
from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.data.manifest import DataManifest, ManifestFile, holdout_row_groups
from trainpipe_trainer.data.streamed import StreamedData, load_data
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import DataChangedError

FILES, GROUPS, GROUP_ROWS = 3, 4, 50


def _parquet(first_row: int) -> bytes:
    rows = GROUPS * GROUP_ROWS
    ids = np.arange(first_row, first_row + rows, dtype=np.float64)
    sink = io.BytesIO()
    pq.write_table(pa.table({"row_id": ids, "label": (ids % 2).astype(np.int64)}), sink, row_group_size=GROUP_ROWS)
    return sink.getvalue()


def _version(bucket: S3, client, *, versioned: bool) -> str:
    if versioned:
        client.put_bucket_versioning(Bucket=bucket.bucket, VersioningConfiguration={"Status": "Enabled"})
    names = [f"lake/part-{i}.parquet" for i in range(FILES)]
    for i, key in enumerate(names):
        client.put_object(Bucket=bucket.bucket, Key=key, Body=_parquet(i * GROUPS * GROUP_ROWS))
    held = holdout_row_groups([(key, GROUPS) for key in names], 0.25)
    files = []
    for key, holdout in zip(names, held, strict=True):
        head = client.head_object(Bucket=bucket.bucket, Key=key)
        files.append(ManifestFile(uri=bucket.uri(key), path=key, size=head["ContentLength"], rows=GROUPS * GROUP_ROWS,
                                  row_groups=(GROUP_ROWS,) * GROUPS, holdout_row_groups=holdout, schema_hash="s",
                                  etag=head["ETag"].strip('"'), version_id=head.get("VersionId") if versioned else None))
    manifest = DataManifest(source_uri=bucket.uri("lake"), files=tuple(files), holdout_fraction=0.25,
                            schema=(("row_id", "double"), ("label", "int64")))
    client.put_object(Bucket=bucket.bucket, Key="v/data_manifest.json", Body=manifest.dumps())
    return bucket.uri("v/data_manifest.json")


def _streamed(uri: str, bucket: S3, tmp_path: Path) -> StreamedData:
    config = TrainingConfig.from_dict({
        "pipeline_id": "s3", "task": "binary_classification", "train_data_uri": uri, "train_data_format": "manifest",
        "data_placement": "stream", "features": ["row_id"], "label": "label", "batch_size": 64,
        "output_uri": str(tmp_path / "output"), "storage_options": bucket.storage_options,
        "checkpoint": {"root_uri": (tmp_path / "checkpoints").as_uri(), "keep_best": False}})
    data = load_data(config)
    assert isinstance(data, StreamedData)
    return data


def _epoch_rows(data: StreamedData) -> list[int]:
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    loader = data.loader(batch_size=64, seed=0, env=env)
    encoder = data.transformer.encoders[0]
    try:
        return sorted(int(round(v * encoder.std + encoder.mean)) for batch in loader.epoch(0)
                      for v in batch[0][:, 0].double().tolist())
    finally:
        loader.close()


def _train_rows(data: StreamedData) -> list[int]:
    return sorted(unit.file * GROUPS * GROUP_ROWS + unit.row_group * GROUP_ROWS + r
                  for unit in data.manifest.units("train") for r in range(GROUP_ROWS))


def test_a_versioned_bucket_streams_the_snapshots_bytes_after_an_overwrite(s3_bucket: S3, s3_endpoint: str,
                                                                             tmp_path: Path) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    data = _streamed(_version(s3_bucket, client, versioned=True), s3_bucket, tmp_path)
    assert _epoch_rows(data) == _train_rows(data)
    client.put_object(Bucket=s3_bucket.bucket, Key="lake/part-1.parquet", Body=_parquet(10_000))
    # Read by VersionId: the same rows, none of the new object's.
    assert _epoch_rows(_streamed(data.config.train_data_uri, s3_bucket, tmp_path)) == _train_rows(data)


def test_an_unversioned_object_overwritten_after_the_snapshot_stops_the_stream_naming_it(
        s3_bucket: S3, s3_endpoint: str, tmp_path: Path) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    uri = _version(s3_bucket, client, versioned=False)
    data = _streamed(uri, s3_bucket, tmp_path)
    client.put_object(Bucket=s3_bucket.bucket, Key="lake/part-1.parquet", Body=_parquet(10_000))
    with pytest.raises(DataChangedError, match=rf"s3://{s3_bucket.bucket}/lake/part-1\.parquet: changed since "
                                               r"dataset version \w{16} listed it \(.*ETag"):
        _epoch_rows(data)
