"""trainpipe_trainer.checkpoint.transfer: raw rank files (trainpipe-dcp/2) on disk and S3, and what they keep.

Real storage only: a local folder and moto's S3 server on 127.0.0.1. The managers come from
test_checkpoint's ``Run`` (a small model, optimizer, schedule and counters).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.trainer.checkpoint.test_manager import Run
from tests.trainer.helpers import S3
from trainpipe_trainer import storage
from trainpipe_trainer.checkpoint.manager import DcpBackend
from trainpipe_trainer.checkpoint.transfer import RawSlice, _MultipartSink, abort_interrupted_uploads
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import CheckpointSaveError
from trainpipe_trainer.serving.export import weights_sha256

MiB = 2**20


class DcpOwnWriterBackend(DcpBackend):
    """What the trainer wrote before trainpipe-dcp/2: DCP's own writer (torch.save archive per tensor)."""

    format = "trainpipe-dcp/1"

    def _writer(self, path: str) -> dcp.StorageWriter:
        return dcp.FileSystemWriter(path)


def _uploads(s3_bucket: S3) -> list[str]:
    fs, _ = storage.url_to_fs(s3_bucket.uri(""), s3_bucket.storage_options)
    listing = fs.call_s3("list_multipart_uploads", Bucket=s3_bucket.bucket)
    return [upload["Key"] for upload in listing.get("Uploads", [])]


def test_rank_file_holds_each_tensor_raw_where_the_metadata_says(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(2)
    run.manager(tmp_path, env, async_save=False).save(run.state, wait=True)
    step_dir = tmp_path / "step-2"
    assert json.loads((step_dir / "manifest.json").read_text())["format"] == "trainpipe-dcp/2"
    metadata = pickle.loads((step_dir / ".metadata").read_bytes())
    rank_file = (step_dir / "__0_0.distcp").read_bytes()
    weight = run.model.module[0].weight.detach()
    where = next(info for index, info in metadata.storage_data.items() if index.fqn == "model.0.weight")
    assert isinstance(where, RawSlice) and where.relative_path == "__0_0.distcp"
    # No archive around it: the bytes at the recorded offset are the tensor's own.
    assert rank_file[where.offset : where.offset + where.length] == weight.numpy().tobytes()
    assert len(rank_file) == sum(info.length for info in metadata.storage_data.values())


def test_checkpoint_written_by_dcps_own_writer_still_resumes_bit_identically(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(3)
    old = run.manager(tmp_path, env, async_save=False)
    old.backend = DcpOwnWriterBackend(store=old.store, env=env, model=run.model, optimizer=run.optimizer,
                                      async_save=False, group=old.backend.group)
    old.save(run.state, wait=True)
    assert json.loads((tmp_path / "step-3" / "manifest.json").read_text())["format"] == "trainpipe-dcp/1"
    metadata = pickle.loads((tmp_path / "step-3" / ".metadata").read_bytes())
    assert not isinstance(next(iter(metadata.storage_data.values())), RawSlice)
    run.train(1)
    continued = weights_sha256(run.model.module)

    fresh = Run(seed=7)
    restored = fresh.manager(tmp_path, env).restore()
    assert restored is not None and restored.global_step == 3
    fresh.state = restored
    fresh.train(1)
    assert weights_sha256(fresh.model.module) == continued


def test_a_rank_file_already_stored_is_never_overwritten_on_disk(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(1)
    # Another writer's file where this save's rank file goes (no manifest: DCP's checks do not see it).
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / "__0_0.distcp").write_bytes(b"someone else's bytes")
    manager = run.manager(tmp_path, env)
    manager.save(run.state)
    with pytest.raises(CheckpointSaveError, match=r"(?s)step-1 failed: .*FileExistsError"):
        manager.wait()
    assert (tmp_path / "step-1" / "__0_0.distcp").read_bytes() == b"someone else's bytes"
    assert manager.store.committed_steps() == []


def test_a_multipart_upload_appears_only_once_complete_and_an_abort_leaves_nothing(s3_bucket: S3) -> None:
    fs, _ = storage.url_to_fs(s3_bucket.uri(""), s3_bucket.storage_options)
    payload = torch.arange(3 * MiB, dtype=torch.int32)  # 12 MiB: two 5 MiB parts in flight, then the rest
    view = memoryview(payload.numpy()).cast("B")

    done = _MultipartSink(fs, f"{s3_bucket.bucket}/run/step-1/__0_0.distcp", expected_bytes=len(view),
                          part_bytes=5 * MiB, concurrency=2)
    done.write(view)
    fs.invalidate_cache()
    # Two parts sent, the object is not there: a reader (or a crash now) sees nothing under the key.
    assert done.sent == 2 and not fs.exists(f"{s3_bucket.bucket}/run/step-1/__0_0.distcp")
    done.close()
    fs.invalidate_cache()
    assert fs.cat_file(f"{s3_bucket.bucket}/run/step-1/__0_0.distcp") == view.tobytes()
    assert len(done.parts) == 3
    # The upload declared CRC32, so the store checked each part against it and keeps the object's checksum.
    stored = fs.call_s3("head_object", Bucket=s3_bucket.bucket, Key="run/step-1/__0_0.distcp", ChecksumMode="ENABLED")
    assert stored.get("ChecksumCRC32"), stored

    # A key already taken is refused before any part is sent.
    refused = _MultipartSink(fs, f"{s3_bucket.bucket}/run/step-1/__0_0.distcp", expected_bytes=len(view),
                             part_bytes=5 * MiB, concurrency=2)
    with pytest.raises(FileExistsError, match=r"run/step-1/__0_0.distcp already exists; a checkpoint file is never overwritten"):
        refused.write(view)
    assert refused.upload_id is None
    fs.invalidate_cache()
    assert fs.cat_file(f"{s3_bucket.bucket}/run/step-1/__0_0.distcp") == view.tobytes()

    abandoned = _MultipartSink(fs, f"{s3_bucket.bucket}/run/step-2/__0_0.distcp", expected_bytes=len(view),
                               part_bytes=5 * MiB, concurrency=2)
    abandoned.write(view)
    abandoned.abort()
    fs.invalidate_cache()
    assert not fs.exists(f"{s3_bucket.bucket}/run/step-2/__0_0.distcp")
    assert _uploads(s3_bucket) == []


def test_an_s3_object_already_stored_is_never_overwritten_and_the_upload_is_aborted(env: DistEnv, s3_bucket: S3) -> None:
    fs, _ = storage.url_to_fs(s3_bucket.uri(""), s3_bucket.storage_options)
    uri = s3_bucket.uri("run-1/checkpoints")
    fs.pipe_file(f"{s3_bucket.bucket}/run-1/checkpoints/step-1/__0_0.distcp", b"someone else's bytes")
    run = Run()
    run.train(1)
    manager = run.manager(uri, env, storage_options=s3_bucket.storage_options)
    manager.save(run.state)
    with pytest.raises(CheckpointSaveError, match=r"(?s)step-1 failed: .*FileExistsError"):
        manager.wait()
    fs.invalidate_cache()
    assert fs.cat_file(f"{s3_bucket.bucket}/run-1/checkpoints/step-1/__0_0.distcp") == b"someone else's bytes"
    assert manager.store.committed_steps() == []
    assert _uploads(s3_bucket) == []


def test_restore_aborts_the_uploads_a_killed_save_left_and_keeps_committed_checkpoints(env: DistEnv, s3_bucket: S3) -> None:
    fs, _ = storage.url_to_fs(s3_bucket.uri(""), s3_bucket.storage_options)
    uri = s3_bucket.uri("run-1/checkpoints")
    run = Run()
    run.train(2)
    run.manager(uri, env, storage_options=s3_bucket.storage_options).save(run.state, wait=True)
    # What a save killed mid-upload leaves: parts sent, never completed; not even a listing shows it.
    killed = _MultipartSink(fs, f"{s3_bucket.bucket}/run-1/checkpoints/step-4/__0_0.distcp", expected_bytes=12 * MiB,
                            part_bytes=5 * MiB, concurrency=2)
    killed.write(memoryview(bytes(11 * MiB)))
    while killed.in_flight:
        killed.in_flight.popleft().result()
    elsewhere = _MultipartSink(fs, f"{s3_bucket.bucket}/other/file", expected_bytes=12 * MiB, part_bytes=5 * MiB, concurrency=1)
    elsewhere.write(memoryview(bytes(6 * MiB)))
    elsewhere.in_flight.popleft().result()
    assert sorted(_uploads(s3_bucket)) == ["other/file", "run-1/checkpoints/step-4/__0_0.distcp"]

    fresh = Run(seed=3)
    restored = fresh.manager(uri, env, storage_options=s3_bucket.storage_options).restore()
    assert restored is not None and restored.global_step == 2
    assert weights_sha256(fresh.model.module) == weights_sha256(run.model.module)
    # Only the checkpoint root's interrupted upload is gone.
    assert _uploads(s3_bucket) == ["other/file"]
    assert abort_interrupted_uploads(fs, f"{s3_bucket.bucket}/run-1/checkpoints", keep=set()) == []


def test_s3_checkpoint_of_several_parts_resumes_bit_identically(env: DistEnv, s3_bucket: S3) -> None:
    from trainpipe_trainer.checkpoint.transfer import PART_BYTES

    uri = s3_bucket.uri("run-1/checkpoints")
    run = Run(features=1024, hidden=2048)  # 25 MB of weights and moments: parts and ranges cross tensors
    run.train(2)
    manager = run.manager(uri, env, storage_options=s3_bucket.storage_options)
    manager.save(run.state, wait=True)
    fs, _ = storage.url_to_fs(uri, s3_bucket.storage_options)
    assert fs.size(f"{s3_bucket.bucket}/run-1/checkpoints/step-2/__0_0.distcp") > PART_BYTES
    saved_state = run.state.to_dict()
    run.train(1)
    continued = weights_sha256(run.model.module)

    fresh = Run(seed=11, features=1024, hidden=2048)
    restored = fresh.manager(uri, env, storage_options=s3_bucket.storage_options).restore()
    assert restored is not None and restored.to_dict() == saved_state
    fresh.state = restored
    fresh.train(1)
    assert weights_sha256(fresh.model.module) == continued
