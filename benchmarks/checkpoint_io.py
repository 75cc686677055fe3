"""Checkpoint I/O: save and restore through the trainer's checkpoint path, beside the raw storage.

    python benchmarks/checkpoint_io.py [--sizes 100mb,1gb] [--targets disk,s3] [--repeats 3]

About 2 minutes for 100 MB, 10 for 1 GB, on 2 cores. For each size, an MLP whose weights plus both
AdamW moments (3 x 4 bytes per parameter) make about 100 MB or 1 GB, after one optimizer step (so
the optimizer state exists), in one process (a one-rank gloo group, as under torchrun).

Targets: (a) local disk (``--dir``, default the system's temporary folder), (b) S3: moto's server on
127.0.0.1 (the endpoint the tests and ``tools/stack`` run), or ``--s3-endpoint URL`` with the AWS_*
variables of that endpoint. On each target, in the same run and interleaved with the measured path:

- checkpoint save: ``CheckpointManager.save(wait=True)`` with the trainer's backend (DCP, asynchronous
  as configured by default): the snapshot the loop waits for, the background write and rank 0's
  commit (manifest, prune). Loop-blocked time is reported beside it.
- checkpoint restore: a fresh ``CheckpointManager.restore()`` into the live model, optimizer and
  schedule (listing, manifest, resume guard, DCP load, RNG streams); the weights are checked
  bit-identical to the saved ones.
- raw baseline, the same bytes (every tensor of the model and optimizer state):
  disk: one sequential write of every tensor's bytes to one file + fsync; one sequential read
  into preallocated tensors. S3: boto3's managed transfer (``upload_fileobj`` / ``download_fileobj``,
  multipart with ``--s3-chunk-mb`` parts and ``--s3-concurrency`` threads; ``--tune`` picks them).

On disk, every written file's pages are dropped from the page cache after its fsync
(``posix_fadvise DONTNEED``), so reads come from the device, for the checkpoint as for the baseline;
``--warm`` keeps them cached. Targets: save and restore throughput at least 80% of the raw baseline
on each target, restore time at most the save time; the loop-blocked time is reported (the target
for it is ``benchmarks/trainer_overhead.py``'s). Figures are medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "trainer_image"))
sys.path.insert(0, str(REPO / "tests"))

# name: (inputs, hidden layers); weights + two AdamW moments = 12 bytes per parameter.
SIZES = {
    "100mb": (256, (2048, 2048, 2048)),  # 8.9M parameters, 107 MB
    "1gb": (256, (8192, 8192, 2048)),  # 86.0M parameters, 1032 MB
}
TARGETS = ("disk", "s3")
THROUGHPUT_TARGET = 0.80
BUCKET = "checkpoint-io-bench"
MB = 1e6


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


# -- the state ---------------------------------------------------------------------------------


@dataclass
class State:
    model: Any
    optimizer: Any
    scheduler: Any
    tensors: list[Any]
    nbytes: int
    parameters: int


def build_state(size: str) -> State:
    import torch

    from trainpipe_trainer.config import ModelConfig, OptimizationConfig
    from trainpipe_trainer.models.mlp.network import build_mlp
    from trainpipe_trainer.optim import build_optimizer, build_scheduler

    inputs, hidden = SIZES[size]
    torch.manual_seed(0)
    model = build_mlp(n_features=inputs, config=ModelConfig(hidden_layers=hidden))
    optimization = OptimizationConfig(lr_schedule="cosine", warmup_steps=10)
    optimizer = build_optimizer(model.parameters(), learning_rate=1e-4, config=optimization)
    scheduler = build_scheduler(optimizer, config=optimization, total_steps=1000)
    loss = model(torch.randn(4, inputs)).pow(2).mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    tensors = [p.detach() for p in model.parameters()]
    tensors += [value for state in optimizer.state.values() for value in state.values() if value.dim() > 0]
    parameters = sum(p.numel() for p in model.parameters())
    return State(model, optimizer, scheduler, tensors, sum(t.numel() * t.element_size() for t in tensors), parameters)


def _byte_view(tensor: Any) -> memoryview:
    return memoryview(tensor.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy())


# -- raw baselines -----------------------------------------------------------------------------


def _drop_cache(path: Path) -> None:
    """Drop a written, fsynced file's pages from the page cache, so the next read hits the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def raw_disk_write(path: Path, state: State, *, drop_cache: bool) -> float:
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        for tensor in state.tensors:
            view = _byte_view(tensor)
            while view:
                view = view[handle.write(view) :]
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    if drop_cache:
        _drop_cache(path)
    return seconds


def raw_disk_read(path: Path, buffers: list[Any]) -> float:
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        for buffer in buffers:
            view = _byte_view(buffer)
            while view:
                got = handle.readinto(view)
                if not got:
                    raise RuntimeError(f"{path} is shorter than the state it holds")
                view = view[got:]
    return time.perf_counter() - started


class _MemorySink(io.RawIOBase):
    """A seekable, writable view of a preallocated buffer: where boto3's download lands."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)
        self.position = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self.position = offset
        elif whence == io.SEEK_CUR:
            self.position += offset
        else:
            self.position = len(self.buffer) + offset
        return self.position

    def write(self, data: Any) -> int:
        size = len(data)
        self.buffer[self.position : self.position + size] = data
        self.position += size
        return size


@dataclass
class S3Target:
    endpoint: str
    client: Any
    transfer: Any
    chunk_mb: int
    concurrency: int

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"client_kwargs": {"endpoint_url": self.endpoint}}

    def transfer_config(self, chunk_mb: int, concurrency: int) -> Any:
        from boto3.s3.transfer import TransferConfig

        chunk = chunk_mb * 2**20
        return TransferConfig(multipart_threshold=chunk, multipart_chunksize=chunk, max_concurrency=concurrency)

    def upload(self, key: str, blob: bytes, config: Any | None = None) -> float:
        started = time.perf_counter()
        self.client.upload_fileobj(io.BytesIO(blob), BUCKET, key, Config=config or self.transfer)
        return time.perf_counter() - started

    def download(self, key: str, expected: bytes, config: Any | None = None) -> float:
        sink = _MemorySink(len(expected))
        started = time.perf_counter()
        self.client.download_fileobj(BUCKET, key, sink, Config=config or self.transfer)
        seconds = time.perf_counter() - started
        if sink.buffer != expected:
            raise RuntimeError(f"s3://{BUCKET}/{key} did not download the bytes uploaded")
        return seconds

    def clear(self, prefix: str) -> None:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for page in pages:
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


@contextmanager
def s3_target(endpoint: str | None, *, chunk_mb: int, concurrency: int) -> Iterator[S3Target]:
    import boto3
    from botocore.config import Config

    with _endpoint(endpoint) as url:
        client = boto3.client("s3", endpoint_url=url, config=Config(max_pool_connections=64))
        if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=BUCKET)
        target = S3Target(url, client, None, chunk_mb, concurrency)
        target.transfer = target.transfer_config(chunk_mb, concurrency)
        yield target


@contextmanager
def _endpoint(endpoint: str | None) -> Iterator[str]:
    if endpoint is not None:
        yield endpoint
        return
    from moto_s3 import moto_s3_server

    # moto takes any keys; set them only for the server this benchmark starts.
    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in credentials.items():
        os.environ.setdefault(name, value)
    with moto_s3_server() as url:
        yield url


# -- the trainer's checkpoint path ---------------------------------------------------------------


@dataclass
class CheckpointPath:
    """One checkpoint root, saved and restored through the trainer's own manager and backend."""

    root_uri: str
    storage_options: dict[str, Any]
    state: State
    env: Any
    manager: Any = None
    step: int = 0
    blocked: list[float] = field(default_factory=list)
    committed: list[float] = field(default_factory=list)

    def _manager(self, *, async_save: bool = True) -> Any:
        import torch.distributed as dist

        from trainpipe_trainer.checkpoint.manager import CheckpointManager, CheckpointStore, DcpBackend
        from trainpipe_trainer.config import CheckpointConfig
        from trainpipe_trainer.resume import ResumeIdentity

        config = CheckpointConfig(root_uri=self.root_uri, every_n_steps=1, keep_last=1, keep_best=False, async_save=async_save)
        store = CheckpointStore(root_uri=self.root_uri, storage_options=self.storage_options)
        backend = DcpBackend(
            store=store, env=self.env, model=self.state.model, optimizer=self.state.optimizer,
            async_save=async_save, group=dist.new_group(backend="gloo"),
        )
        shape = {"world_size": 1, "batch_size": 4, "strategy": "ddp"}
        return CheckpointManager(
            config=config, env=self.env, store=store, backend=backend, scheduler=self.state.scheduler,
            identity=ResumeIdentity(snapshot="0" * 64, settings=shape), shape=shape,
        )

    def save(self) -> float:
        """Seconds from the call until the checkpoint is committed (its manifest written)."""
        from trainpipe_trainer.checkpoint.state import TrainState

        if self.manager is None:
            # One manager for every save, as in training: the snapshot buffers are reused after the first.
            self.manager = self._manager()
            self.manager.on_commit = lambda step: self.committed.append(time.perf_counter())
        self.step += 1
        started = time.perf_counter()
        # wait=True also waits for the pruning of the previous checkpoint, which runs after the commit.
        self.manager.save(TrainState(global_step=self.step), wait=True)
        self.blocked.append(self.manager.blocked_seconds[-1])
        return self.committed[-1] - started

    def restore(self) -> float:
        import torch

        from trainpipe_trainer.serving.export import weights_sha256

        saved = weights_sha256(self.state.model)
        with torch.no_grad():
            for parameter in self.state.model.parameters():
                parameter.zero_()
        manager = self._manager()
        started = time.perf_counter()
        restored = manager.restore()
        seconds = time.perf_counter() - started
        manager.close()
        if restored is None or restored.global_step != self.step or weights_sha256(self.state.model) != saved:
            raise RuntimeError(f"restore of step-{self.step} from {self.root_uri} did not bring back the saved weights")
        return seconds

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close()


# -- one size on one target ------------------------------------------------------------------------


@dataclass
class Figures:
    raw_write: list[float] = field(default_factory=list)
    raw_read: list[float] = field(default_factory=list)
    save: list[float] = field(default_factory=list)
    restore: list[float] = field(default_factory=list)
    blocked: list[float] = field(default_factory=list)
    load_before: str = ""
    load_after: str = ""
    stored_bytes: int = 0


def _interleaved(repeats: int, first: Callable[[], None], second: Callable[[], None]) -> None:
    # Alternate which goes first: on a shared machine the throughput drifts during a run.
    for index in range(repeats):
        for run in (first, second) if index % 2 == 0 else (second, first):
            run()


def measure_disk(state: State, env: Any, work: Path, *, repeats: int, drop_cache: bool) -> Figures:
    import torch

    figures = Figures(load_before=_load())
    raw_file = work / "raw.bin"
    buffers = [torch.zeros_like(t) for t in state.tensors]
    root = work / "checkpoints"
    path = CheckpointPath(root_uri=root.as_uri(), storage_options={}, state=state, env=env)

    def raw() -> None:
        figures.raw_write.append(raw_disk_write(raw_file, state, drop_cache=drop_cache))
        figures.raw_read.append(raw_disk_read(raw_file, buffers))
        if any(not torch.equal(a, b) for a, b in zip(buffers, state.tensors, strict=True)):
            raise RuntimeError("the raw read did not return the bytes written")
        raw_file.unlink()

    def checkpoint() -> None:
        figures.save.append(path.save())
        step_dir = root / f"step-{path.step}"
        figures.stored_bytes = sum(f.stat().st_size for f in step_dir.iterdir())
        if drop_cache:
            for file in step_dir.iterdir():
                _drop_cache(file)
        figures.restore.append(path.restore())

    try:
        _interleaved(repeats, raw, checkpoint)
    finally:
        path.close()
        shutil.rmtree(root, ignore_errors=True)
    figures.blocked = path.blocked
    figures.load_after = _load()
    return figures


def measure_s3(state: State, env: Any, target: S3Target, *, repeats: int) -> Figures:
    figures = Figures(load_before=_load())
    run = uuid.uuid4().hex[:8]
    blob = b"".join(_byte_view(t) for t in state.tensors)
    path = CheckpointPath(
        root_uri=f"s3://{BUCKET}/{run}/checkpoints", storage_options=target.storage_options, state=state, env=env
    )

    def raw() -> None:
        key = f"{run}/raw.bin"
        figures.raw_write.append(target.upload(key, blob))
        figures.raw_read.append(target.download(key, blob))
        target.clear(key)

    def checkpoint() -> None:
        figures.save.append(path.save())
        listing = target.client.list_objects_v2(Bucket=BUCKET, Prefix=f"{run}/checkpoints/step-{path.step}/")
        figures.stored_bytes = sum(item["Size"] for item in listing.get("Contents", []))
        figures.restore.append(path.restore())

    try:
        _interleaved(repeats, raw, checkpoint)
    finally:
        path.close()
        target.clear(f"{run}/")
    figures.blocked = path.blocked
    figures.load_after = _load()
    return figures


def tune_s3(state: State, target: S3Target) -> tuple[int, int]:
    """The boto3 part size and concurrency that move this size fastest (upload + download), printed as a grid."""
    blob = b"".join(_byte_view(t) for t in state.tensors)
    best: tuple[float, int, int] | None = None
    print(f"  tuning boto3's transfer on {len(blob) / MB:.0f} MB ({_load()}): part MiB x threads -> upload / download MB/s")
    for chunk_mb in (8, 16, 32, 64):
        for concurrency in (2, 4, 8, 16):
            config = target.transfer_config(chunk_mb, concurrency)
            up = target.upload("tune.bin", blob, config)
            down = target.download("tune.bin", blob, config)
            target.clear("tune.bin")
            print(f"    {chunk_mb:3d} x {concurrency:2d}: {len(blob) / MB / up:7.1f} / {len(blob) / MB / down:7.1f}")
            if best is None or up + down < best[0]:
                best = (up + down, chunk_mb, concurrency)
    assert best is not None
    return best[1], best[2]


# -- report ------------------------------------------------------------------------------------------


def report(size: str, target: str, state: State, figures: Figures, baseline: str) -> bool:
    median = statistics.median
    nbytes = state.nbytes
    raw_write, raw_read = median(figures.raw_write), median(figures.raw_read)
    save, restore = median(figures.save), median(figures.restore)

    def rate(seconds: float) -> float:
        return nbytes / MB / seconds

    def each(values: list[float]) -> str:
        return ", ".join(f"{v:.2f}" for v in values)

    save_ratio, restore_ratio = raw_write / save, raw_read / restore
    met = save_ratio >= THROUGHPUT_TARGET and restore_ratio >= THROUGHPUT_TARGET and restore <= save
    print(f"{size} on {target} ({nbytes / MB:.0f} MB of tensors, {figures.stored_bytes / MB:.0f} MB stored; "
          f"{figures.load_before} before, {figures.load_after} after)")
    print(f"  save     {rate(save):8.1f} MB/s  {save:6.2f} s  [{each(figures.save)}]  | raw {baseline} write "
          f"{rate(raw_write):8.1f} MB/s {raw_write:6.2f} s [{each(figures.raw_write)}] | ratio {save_ratio:.2f} "
          f"(target >= {THROUGHPUT_TARGET:.2f})")
    print(f"  restore  {rate(restore):8.1f} MB/s  {restore:6.2f} s  [{each(figures.restore)}]  | raw {baseline} read  "
          f"{rate(raw_read):8.1f} MB/s {raw_read:6.2f} s [{each(figures.raw_read)}] | ratio {restore_ratio:.2f} "
          f"(target >= {THROUGHPUT_TARGET:.2f})")
    print(f"  restore / save time {restore / save:.2f} (target <= 1.00); loop blocked per save "
          f"{median(figures.blocked) * 1e3:.0f} ms [{', '.join(f'{b * 1e3:.0f}' for b in figures.blocked)}] = "
          f"{median(figures.blocked) / save:.3f} of the save  -> {'met' if met else 'NOT met'}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--repeats", type=int, default=3, help="saves and restores per size and target (and raw runs)")
    parser.add_argument("--dir", type=Path, default=None, help="where the disk target writes (default: a temporary folder)")
    parser.add_argument("--warm", action="store_true", help="leave written files in the page cache (reads from memory)")
    parser.add_argument("--s3-endpoint", default=None, help="an S3 endpoint to use instead of starting moto's server")
    parser.add_argument("--s3-chunk-mb", type=int, default=16, help="boto3 baseline: multipart part size, MiB")
    parser.add_argument("--s3-concurrency", type=int, default=8, help="boto3 baseline: transfer threads")
    parser.add_argument("--tune", action="store_true",
                        help="first measure boto3 over a grid of part sizes and threads, use the best")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = sorted(set(sizes) - set(SIZES)) + sorted(set(targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown size or target: {', '.join(unknown)}")

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from trainpipe_trainer.distributed import destroy_distributed, init_distributed

    print(f"checkpoint I/O: {subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()}")
    env = init_distributed()
    work = Path(tempfile.mkdtemp(prefix="trainpipe-ckpt-io-", dir=args.dir))
    results = []
    quiet = open(os.devnull, "w")
    try:
        s3_or_none = (s3_target(args.s3_endpoint, chunk_mb=args.s3_chunk_mb, concurrency=args.s3_concurrency)
                      if "s3" in targets else _none())
        with s3_or_none as s3:
            for size in sizes:
                state = build_state(size)
                print(f"{size}: MLP {SIZES[size][0]}-{'-'.join(map(str, SIZES[size][1]))}-1, "
                      f"{state.parameters / 1e6:.1f}M parameters, AdamW")
                if "s3" in targets and args.tune:
                    s3.chunk_mb, s3.concurrency = tune_s3(state, s3)
                    s3.transfer = s3.transfer_config(s3.chunk_mb, s3.concurrency)
                for target in targets:
                    stdout, sys.stdout = sys.stdout, quiet
                    try:
                        if target == "disk":
                            figures = measure_disk(state, env, work, repeats=args.repeats, drop_cache=not args.warm)
                        else:
                            figures = measure_s3(state, env, s3, repeats=args.repeats)
                    finally:
                        sys.stdout = stdout
                    baseline = (f"sequential{' (page cache)' if args.warm else ''}" if target == "disk"
                                else f"boto3 {s3.chunk_mb} MiB x {s3.concurrency}")
                    results.append(report(size, target, state, figures, baseline))
                del state
    finally:
        quiet.close()
        destroy_distributed()
        shutil.rmtree(work, ignore_errors=True)
    print(f"checkpoint I/O: {subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()}; "
          f"{sum(results)} of {len(results)} size x target met every target")
    return 0


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
