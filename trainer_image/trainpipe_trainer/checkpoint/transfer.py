"""How a rank's checkpoint bytes reach storage and come back (``trainpipe-dcp/2``), at storage speed.

DCP plans what each rank saves and loads (and reshards); this module only moves the bytes. Each rank
writes one file, ``__<rank>_0.distcp``: its byte items, then every tensor's raw bytes back to back,
straight from the staged buffers (DCP's own writer wraps each tensor in a ``torch.save`` archive, and
its reader loads that into a new tensor before copying it into the live one). ``.metadata`` (DCP's,
written by rank 0) records where each item lies (``RawSlice``); the checkpoint's manifest commits it.

- Local disk: one unbuffered sequential write and an fsync; a restore reads the file in one
  sequential pass, each tensor's bytes straight into the live tensor.
- S3: a multipart upload of ``PART_BYTES`` parts, ``CONCURRENCY`` in flight (the object appears only
  when every part is in and the upload is completed; any error aborts it); a restore fetches
  ``PART_BYTES`` ranges, ``CONCURRENCY`` at once, into the live tensors. Other asynchronous fsspec
  stores read the same way and write one stream.

Nothing already stored is overwritten: a local file is created exclusively, an S3 object is put with
``If-None-Match: *`` or, when uploaded in parts, only after checking that its key is free, and DCP
refuses a step folder that holds a ``.metadata``. Checkpoints
written by DCP's own writer (``trainpipe-dcp/1``) are read by DCP's own reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from fsspec.asyn import AsyncFileSystem, sync
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, DEFAULT_SUFFIX
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from trainpipe_trainer import storage

# Measured against a local S3 endpoint (docs/benchmarks.md, "Checkpoint I/O"); S3 allows 10,000
# parts, so a larger rank file gets larger parts.
PART_BYTES = 16 * 2**20
CONCURRENCY = 8
MAX_PARTS = 10_000
# Declared when the upload is created, as boto3's own transfers do: the store checks every part against it,
# and moto's server (the stack's S3) completes such an upload in about half the time of one without (the
# 1 GB save went from 0.58 to 0.91 of boto3's upload: docs/benchmarks.md, Checkpoint I/O).
CHECKSUM = "CRC32"
# Ranges closer than this are fetched in one request (the small items between large tensors).
MERGE_GAP = 2**20
# DCP's index of a checkpoint (written by rank 0 last, before the manifest).
METADATA_NAME = ".metadata"


class StagingProgress:
    """Which snapshot buffers are filled: the writer waits for each one before writing it."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self._filled = {_storage_key(buffer): threading.Event() for buffer in buffers}
        # Buffers whose copy from the GPU was only queued: the writer waits for its CUDA event too.
        self._copied: dict[int, Any] = {}
        self.error: BaseException | None = None

    def filled(self, buffer: torch.Tensor, *, copied: Any = None) -> None:
        """``buffer`` is filled, or (``copied``: a CUDA event) will be once the device reaches that event."""
        key = _storage_key(buffer)
        if copied is not None:
            self._copied[key] = copied
        self._filled[key].set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        for event in self._filled.values():
            event.set()

    def wait(self, tensor: torch.Tensor, name: str) -> None:
        event = self._filled.get(_storage_key(tensor))
        if event is None:
            # Writing it unwaited could store a buffer the loop has not copied yet.
            raise RuntimeError(f"checkpoint item {name} is not one of the snapshot's buffers")
        event.wait()
        if self.error is not None:
            raise RuntimeError(f"the snapshot of checkpoint item {name} failed") from self.error
        copied = self._copied.get(_storage_key(tensor))
        if copied is not None:
            copied.synchronize()  # this thread waits for the device; the training loop does not

    def wait_all(self) -> None:
        """Every buffer filled (and copied from the GPU)."""
        for event in self._filled.values():
            event.wait()
        if self.error is not None:
            raise RuntimeError("the checkpoint's snapshot failed") from self.error
        for copied in {id(event): event for event in self._copied.values()}.values():
            copied.synchronize()


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


@dataclass(frozen=True)
class RawSlice:
    """Where one saved item lies: ``length`` bytes at ``offset`` of the rank file ``relative_path``."""

    relative_path: str
    offset: int
    length: int


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A tensor's bytes without a copy (it must be a contiguous CPU tensor)."""
    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


def _is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in fs.protocol if isinstance(fs.protocol, tuple) else fs.protocol == "s3"


# -- writing one rank file ---------------------------------------------------------------------


class _LocalSink:
    """An exclusively created local file, written unbuffered, fsynced on close."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def write(self, view: memoryview) -> None:
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        fd, self.fd = self.fd, None
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        os.unlink(self.path)


class _MultipartSink:
    """An S3 object written as a multipart upload with parts in flight while the next one fills.

    A part is joined from views of the staged tensors (one copy; the staged buffers stay untouched).
    Until ``close`` completes the upload, the object does not exist: a crash or ``abort`` leaves
    nothing under its key (an interrupted upload's parts are invisible and aborted on error).
    """

    def __init__(self, fs: Any, path: str, *, expected_bytes: int, part_bytes: int, concurrency: int) -> None:
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(path)
        self.part_bytes = max(part_bytes, math.ceil(expected_bytes / (MAX_PARTS - 1)))
        self.concurrency = concurrency
        self.pieces: list[memoryview] = []
        self.pending = 0
        self.upload_id: str | None = None
        self.parts: dict[int, dict[str, str]] = {}
        self.sent = 0
        self.in_flight: deque[ConcurrentFuture] = deque()

    def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        return sync(self.fs.loop, self.fs._call_s3, method, Bucket=self.bucket, Key=self.key, **kwargs)

    def write(self, view: memoryview) -> None:
        while view:
            take = min(len(view), self.part_bytes - self.pending)
            self.pieces.append(view[:take])
            self.pending += take
            view = view[take:]
            if self.pending == self.part_bytes:
                self._send_part()

    def _send_part(self) -> None:
        body = b"".join(self.pieces)
        self.pieces, self.pending = [], 0
        if self.upload_id is None:
            # Checked here, not by If-None-Match on the completion: moto's server (the stack's S3)
            # answers a conditional completion of a 1 GB upload with an internal error.
            if sync(self.fs.loop, self.fs._exists, f"{self.bucket}/{self.key}"):
                raise FileExistsError(f"s3://{self.bucket}/{self.key} already exists; a checkpoint file is never overwritten")
            self.upload_id = self._call("create_multipart_upload", ChecksumAlgorithm=CHECKSUM)["UploadId"]
        while len(self.in_flight) >= self.concurrency:
            self.in_flight.popleft().result()
        self.sent += 1
        self.in_flight.append(asyncio.run_coroutine_threadsafe(self._upload_part(self.sent, body), self.fs.loop))

    async def _upload_part(self, number: int, body: bytes) -> None:
        out = await self.fs._call_s3(
            "upload_part", Bucket=self.bucket, Key=self.key, PartNumber=number, UploadId=self.upload_id, Body=body,
            ChecksumAlgorithm=CHECKSUM,
        )
        part = {"PartNumber": number, "ETag": out["ETag"]}
        # An upload that declared its checksum algorithm is completed with each part's checksum; a store
        # that does not check checksums returns none, and its completion needs none.
        if f"Checksum{CHECKSUM}" in out:
            part[f"Checksum{CHECKSUM}"] = out[f"Checksum{CHECKSUM}"]
        self.parts[number] = part

    def close(self) -> None:
        if self.upload_id is None:
            # Smaller than one part: a single PUT, which S3 makes visible whole or not at all.
            self._call("put_object", Body=b"".join(self.pieces), IfNoneMatch="*")
            return
        if self.pending:
            self._send_part()
        while self.in_flight:
            self.in_flight.popleft().result()
        parts = [self.parts[number] for number in sorted(self.parts)]
        try:
            self._call("complete_multipart_upload", UploadId=self.upload_id, MultipartUpload={"Parts": parts})
        except OSError:
            # Completing is idempotent; moto's server (the stack's S3) failed the first completion of a
            # 1 GB upload with an internal error every time and accepted the same request again.
            self._call("complete_multipart_upload", UploadId=self.upload_id, MultipartUpload={"Parts": parts})

    def abort(self) -> None:
        for future in self.in_flight:
            future.cancel()
        for future in self.in_flight:
            try:
                future.result()
            except BaseException:
                pass
        if self.upload_id is not None:
            self._call("abort_multipart_upload", UploadId=self.upload_id)


class _StreamSink:
    """Any other fsspec store: one sequential stream (committed by the store on close)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        if fs.exists(path):
            raise FileExistsError(f"{fs.unstrip_protocol(path)} already exists; a checkpoint file is never overwritten")
        self.fs, self.path = fs, path
        self.handle = fs.open(path, "wb")

    def write(self, view: memoryview) -> None:
        self.handle.write(view)

    def close(self) -> None:
        self.handle.close()

    def abort(self) -> None:
        self.handle.discard() if hasattr(self.handle, "discard") else self.handle.close()
        if self.fs.exists(self.path):
            self.fs.rm(self.path)


class RawWriter(FsspecWriter):
    """DCP storage writer of ``trainpipe-dcp/2``: one raw rank file per rank, see the module doc."""

    def __init__(
        self, path: str, *, staged: StagingProgress | None = None, part_bytes: int = PART_BYTES,
        concurrency: int = CONCURRENCY, **storage_options: Any,
    ) -> None:
        # overwrite=False: DCP raises before writing into a step folder that already holds a .metadata.
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=False, **storage_options)
        self.staged, self.part_bytes, self.concurrency = staged, part_bytes, concurrency

    def _sink(self, path: str, expected_bytes: int) -> Any:
        fs = self.fs.fs
        if storage.is_local(fs):
            return _LocalSink(path)
        if _is_s3(fs):
            return _MultipartSink(
                fs, path, expected_bytes=expected_bytes, part_bytes=self.part_bytes, concurrency=self.concurrency
            )
        return _StreamSink(fs, path)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        items = sorted(plan.items, key=lambda item: item.type != WriteItemType.BYTE_IO)
        expected = sum(item.tensor_storage_size() or 0 for item in items)
        sink = self._sink(self.fs.fs._strip_protocol(str(self.fs.concat_path(self.path, name))), expected)
        results, offset = [], 0
        try:
            for item in items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    view = data.getbuffer()
                else:
                    if data.device.type != "cpu":
                        raise ValueError(f"checkpoint item {item.index.fqn} is on {data.device}, not staged to CPU")
                    if self.staged is not None:
                        self.staged.wait(data, item.index.fqn)
                    view = _bytes_of(data.contiguous())
                sink.write(view)
                results.append(WriteResult(index=item.index, size_in_bytes=len(view),
                                           storage_data=RawSlice(name, offset, len(view))))
                offset += len(view)
            sink.close()
        except BaseException:
            with contextlib.suppress(Exception):  # the write's own error is the one to report
                sink.abort()
            raise
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Rank 0 writes ``.metadata``: on an object store in one conditional PUT (DCP's own finish
        writes a temporary object, then copies and deletes it)."""
        if storage.is_local(self.fs.fs):
            super().finish(metadata, results)
            return
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {result.index: result.storage_data for written in results for result in written}
        metadata.storage_meta = self.storage_meta()
        path = self.fs.fs._strip_protocol(str(self.fs.concat_path(self.path, METADATA_NAME)))
        sink = self._sink(path, 0)
        try:
            sink.write(memoryview(pickle.dumps(metadata)))
            sink.close()
        except BaseException:
            with contextlib.suppress(Exception):
                sink.abort()
            raise


def abort_interrupted_uploads(fs: fsspec.AbstractFileSystem, root: str, *, keep: set[str]) -> list[str]:
    """Abort the multipart uploads a killed save left under ``root`` (S3), except under the step
    folders named in ``keep``; the keys they were for. Their parts are invisible but stored (and billed)."""
    if not _is_s3(fs):
        return []
    bucket, key, _ = fs.split_path(root)
    prefix = f"{key.rstrip('/')}/" if key else ""
    aborted, markers = [], {}
    while True:
        listing = sync(fs.loop, fs._call_s3, "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers)
        for upload in listing.get("Uploads", []):
            if upload["Key"][len(prefix) :].split("/", 1)[0] in keep:
                continue
            sync(fs.loop, fs._call_s3, "abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            aborted.append(upload["Key"])
        if not listing.get("IsTruncated"):
            return aborted
        markers = {"KeyMarker": listing["NextKeyMarker"], "UploadIdMarker": listing["NextUploadIdMarker"]}


# -- reading ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Target:
    """``length`` bytes at ``offset`` of one rank file, to land in ``view``; ``done`` runs after."""

    offset: int
    view: memoryview
    done: Callable[[], None]


def _read_local(path: str, targets: list[_Target]) -> None:
    # One sequential pass with read(2): measured cold, preadv(2) at explicit offsets got half the
    # kernel's readahead on the same file (docs/benchmarks.md, "Checkpoint I/O").
    with open(path, "rb", buffering=0) as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for target in sorted(targets, key=lambda t: t.offset):
            if handle.tell() != target.offset:
                handle.seek(target.offset)
            view = target.view
            while view:
                got = handle.readinto(view)
                if not got:
                    raise EOFError(f"{path} ends before byte {handle.tell()}: the checkpoint file is truncated")
                view = view[got:]


def _ranges(targets: list[_Target], part_bytes: int) -> list[tuple[int, int, list[_Target]]]:
    """Requests of at most ``part_bytes`` covering every target: (start, end, targets overlapping it)."""
    spans: list[list[Any]] = []
    for target in sorted(targets, key=lambda t: t.offset):
        end = target.offset + len(target.view)
        if spans and target.offset - spans[-1][1] <= MERGE_GAP:
            spans[-1][1] = max(spans[-1][1], end)
            spans[-1][2].append(target)
        else:
            spans.append([target.offset, end, [target]])
    ranges = []
    for start, end, members in spans:
        for begin in range(start, end, part_bytes):
            stop = min(begin + part_bytes, end)
            ranges.append((begin, stop, [t for t in members if t.offset < stop and t.offset + len(t.view) > begin]))
    return ranges


def _scatter(data: bytes, begin: int, members: list[_Target]) -> None:
    source = memoryview(data)
    for target in members:
        low, high = max(begin, target.offset), min(begin + len(data), target.offset + len(target.view))
        target.view[low - target.offset : high - target.offset] = source[low - begin : high - begin]


async def _read_async(fs: AsyncFileSystem, path: str, targets: list[_Target], part_bytes: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def fetch(begin: int, end: int, members: list[_Target]) -> None:
        async with gate:
            data = await fs._cat_file(path, start=begin, end=end)
        if len(data) != end - begin:
            raise EOFError(f"{fs.unstrip_protocol(path)} ends before byte {end}: the checkpoint file is truncated")
        _scatter(data, begin, members)

    await asyncio.gather(*(fetch(*request) for request in _ranges(targets, part_bytes)))


def _read_stream(fs: fsspec.AbstractFileSystem, path: str, targets: list[_Target], part_bytes: int) -> None:
    for begin, end, members in _ranges(targets, part_bytes):
        _scatter(fs.cat_file(path, start=begin, end=end), begin, members)


class RawReader(FsspecReader):
    """DCP storage reader: ``trainpipe-dcp/2`` rank files as above; DCP's own layout by DCP's reader."""

    def __init__(
        self, path: str, *, part_bytes: int = PART_BYTES, concurrency: int = CONCURRENCY, **storage_options: Any
    ) -> None:
        super().__init__(path, **storage_options)
        self.part_bytes, self.concurrency = part_bytes, concurrency
        self.metadata: Metadata | None = None

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self.metadata = metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if not any(isinstance(info, RawSlice) for info in self.storage_data.values()):
            return super().read_data(plan, planner)
        per_file: dict[str, list[_Target]] = {}
        for request in plan.items:
            where: RawSlice = self.storage_data[request.storage_index]
            per_file.setdefault(where.relative_path, []).append(self._target(request, where, planner))
        fs = self.fs.fs
        for relative_path, targets in per_file.items():
            path = fs._strip_protocol(str(self.fs.concat_path(self.path, relative_path)))
            if storage.is_local(fs):
                _read_local(path, targets)
            elif isinstance(fs, AsyncFileSystem):
                sync(fs.loop, _read_async, fs, path, targets, self.part_bytes, self.concurrency)
            else:
                _read_stream(fs, path, targets, self.part_bytes)
            # Handed to the planner on this thread, once every byte is in.
            for target in targets:
                target.done()
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _target(self, request: ReadItem, where: RawSlice, planner: LoadPlanner) -> _Target:
        if request.type == LoadItemType.BYTE_IO:
            buffer = bytearray(where.length)
            return _Target(where.offset, memoryview(buffer), lambda: planner.load_bytes(request, io.BytesIO(buffer)))
        stored: TensorStorageMetadata = self.metadata.state_dict_metadata[request.storage_index.fqn]
        chunk = next(c for c in stored.chunks if tuple(c.offsets) == tuple(request.storage_index.offset))
        live = planner.resolve_tensor(request).detach()
        whole = not any(request.storage_offsets) and tuple(request.lengths) == tuple(chunk.sizes)
        if whole and live.dtype == stored.properties.dtype and live.is_contiguous() and live.device.type == "cpu":
            # The common case (a replicated model and optimizer): the bytes land in the live tensor.
            view = _bytes_of(live)
            if len(view) != where.length:
                raise ValueError(
                    f"checkpoint item {request.storage_index.fqn}: {where.length} bytes stored, {len(view)} expected")
            return _Target(where.offset, view, lambda: planner.commit_tensor(request, live))
        saved = torch.empty(tuple(chunk.sizes), dtype=stored.properties.dtype)

        def load() -> None:
            live.copy_(narrow_tensor_by_index(saved, request.storage_offsets, request.lengths))
            planner.commit_tensor(request, live)

        return _Target(where.offset, _bytes_of(saved), load)
