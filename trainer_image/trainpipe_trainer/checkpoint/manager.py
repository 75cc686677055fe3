"""Checkpoints: ``<root>/step-<N>/``, committed by a ``manifest.json`` written last.

A step directory without its manifest is an interrupted save and does not exist for the loader,
so a crash at any moment leaves either the previous or the new checkpoint. Rank 0 writes the
manifest only once every rank's files are durable:

- DDP (``DcpBackend``): each rank copies its state into reused CPU buffers (the only time the loop
  is blocked) while ``dcp.save`` on a writer thread, on a dedicated gloo group, writes one raw file
  per rank (``checkpoint_io``), each tensor as soon as its copy is done. DCP's coordinator (rank 0)
  finishes a save only after gathering every rank's write result, so rank 0 commits in the save
  future's done-callback, with no extra collective and without blocking the loop.
  ``checkpoint.async_save: false`` saves in the loop.
- DeepSpeed (``trainpipe_trainer.strategies.deepspeed``): ``engine.save_checkpoint`` into the same
  ``step-<N>/``, each rank's RNG/counters next to it, a barrier, then the manifest.

Pruning keeps the newest ``keep_last``, the best by validation loss (``best.json`` points at it)
and the checkpoint this process resumed from.

Each manifest also records the dataset snapshot and the result-changing settings it was written
with (``config.ResumeIdentity``); ``restore`` refuses a checkpoint whose record differs from this
run's (``ResumeMismatchError``), before touching the folder. A checkpoint written before manifests
carried that record is resumed with a warning, checked only for world size, batch size and strategy.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from trainpipe_trainer import storage
from trainpipe_trainer.checkpoint.rng import capture_rng_state, restore_rng_state, seed_all
from trainpipe_trainer.checkpoint.state import TrainState
from trainpipe_trainer.checkpoint.transfer import RawReader, RawWriter, StagingProgress, abort_interrupted_uploads
from trainpipe_trainer.config import CheckpointConfig
from trainpipe_trainer.distributed import DistEnv, broadcast_object
from trainpipe_trainer.errors import CheckpointMismatchError, CheckpointSaveError, ResumeMismatchError
from trainpipe_trainer.resume import (
    ResumeIdentity,
    resume_refusal,
)
from trainpipe_trainer.run_layout import (
    BEST_CHECKPOINT_POINTER,
    CHECKPOINT_MANIFEST,
    checkpoint_dir_name,
    checkpoint_step,
)


def rank_key(rank: int) -> str:
    # One key per rank: DCP de-duplicates equal keys across ranks, and these values differ.
    return f"rank_state_{rank}"


# -- storage layout ----------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class CheckpointStore:
    """The checkpoint root: which steps exist, commit (manifest last), prune, best pointer."""

    root_uri: str
    storage_options: dict[str, Any]
    fs: fsspec.AbstractFileSystem = field(init=False)
    root: str = field(init=False)

    def __post_init__(self) -> None:
        self.fs, root = storage.url_to_fs(self.root_uri, self.storage_options)
        self.root = root.rstrip("/")

    @property
    def is_local(self) -> bool:
        return storage.is_local(self.fs)

    def step_path(self, step: int) -> str:
        return f"{self.root}/{checkpoint_dir_name(step)}"

    def uri(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def step_dirs(self) -> list[int]:
        # Other ranks and earlier attempts wrote here: never trust a cached object-store listing.
        self.fs.invalidate_cache(self.root)
        if not self.fs.exists(self.root):
            return []
        names = (entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.root, detail=False))
        return sorted(step for step in map(checkpoint_step, names) if step is not None)

    def is_committed(self, step: int) -> bool:
        return self.fs.exists(f"{self.step_path(step)}/{CHECKPOINT_MANIFEST}")

    def committed_steps(self) -> list[int]:
        """Steps with a manifest, oldest first."""
        return [step for step in self.step_dirs() if self.is_committed(step)]

    def read_manifest(self, step: int) -> dict[str, Any]:
        with self.fs.open(f"{self.step_path(step)}/{CHECKPOINT_MANIFEST}", "r", encoding="utf-8") as handle:
            return json.load(handle)

    def remove_uncommitted(self) -> tuple[list[int], list[str]]:
        """Delete the leftovers of interrupted saves (call before anything writes, on one rank): the
        uncommitted step folders, and the uploads a killed save left unfinished (S3); both listed."""
        steps = self.step_dirs()
        committed = {step for step in steps if self.is_committed(step)}
        torn = [step for step in steps if step not in committed]
        for step in torn:
            self.fs.rm(self.step_path(step), recursive=True)
        uploads = abort_interrupted_uploads(self.fs, self.root, keep={checkpoint_dir_name(step) for step in committed})
        return torn, uploads

    def commit(self, step: int, manifest: dict[str, Any]) -> None:
        storage.write_text(
            self.uri(f"{self.step_path(step)}/{CHECKPOINT_MANIFEST}"), json.dumps(manifest, indent=2), self.storage_options
        )

    def best(self, steps: list[int]) -> tuple[int, float] | None:
        """The committed step with the lowest validation loss (the earliest on a tie)."""
        best = None
        for step in steps:
            loss = self.read_manifest(step).get("validation_loss")
            if loss is not None and (best is None or loss < best[1]):
                best = (step, float(loss))
        return best

    def prune(self, *, keep_last: int, keep_best: bool, protect: set[int]) -> tuple[int, float] | None:
        """Delete committed checkpoints outside keep_last/best/protect; update ``best.json``."""
        steps = self.committed_steps()
        keep = set(steps[-keep_last:]) | (protect & set(steps))
        best = self.best(steps) if keep_best else None
        if best is not None:
            keep.add(best[0])
            pointer = {"step": best[0], "validation_loss": best[1], "path": checkpoint_dir_name(best[0])}
            pointer_uri = self.uri(f"{self.root}/{BEST_CHECKPOINT_POINTER}")
            storage.write_text(pointer_uri, json.dumps(pointer, indent=2), self.storage_options)
        for step in steps:
            if step not in keep:
                # Manifest first: a crash mid-delete leaves an uncommitted (ignored) directory.
                self.fs.rm(f"{self.step_path(step)}/{CHECKPOINT_MANIFEST}")
                self.fs.rm(self.step_path(step), recursive=True)
        return best


# -- backends: how one rank's state is written and read ----------------------------------------


class CheckpointBackend(Protocol):
    # What this backend writes into the manifest, and which formats it can resume.
    format: str
    reads: frozenset[str]

    def write(self, step: int, rank_blob: bytes) -> Future | None:
        """Start writing this rank's part of ``step-<step>`` (collective); a Future if asynchronous."""

    def read(self, step: int, *, blob_rank: int) -> bytes:
        """Load ``step-<step>`` into the live objects (collective); returns the blob rank ``blob_rank`` wrote."""

    def reserve(self) -> None:
        """Allocate what every save reuses, before the loop's first save (a no-op where nothing is)."""

    def close(self) -> None: ...


class ReusableCpuStager(AsyncStager):
    """Copies the state dict into CPU buffers kept from one save to the next.

    Allocating fresh buffers on every save (DCP's default stager) costs more than the copy itself
    (page faults), and DCP's caching stager pins memory, which needs a GPU. Safe to reuse because
    the manager waits for a save to finish before staging the next one.

    Tensors on a GPU are copied into pinned buffers without blocking, on the training stream: the
    copy follows the step that produced the values and precedes the next step's updates, and the
    writer (not the loop) waits for it (``StagingProgress``).
    """

    _synchronize_after_execute = False

    def __init__(self, *, threads: int = 1) -> None:
        self._cache: dict[tuple[Any, ...], torch.Tensor] = {}
        self.threads = threads

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        staged, copies = self.prepare(state_dict)
        self.fill(copies)
        return staged

    def prepare(self, state_dict: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        """The snapshot's structure with this stager's buffers in it (not filled yet; anything else
        copied), and the (source, buffer) copies ``fill`` makes, in the state dict's order."""
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        return self._buffers(state_dict, (), copies), copies

    def fill(self, copies: list[tuple[torch.Tensor, torch.Tensor]], progress: StagingProgress | None = None) -> None:
        """Copy each source into its buffer, telling ``progress`` after each (the writer waits on it)."""
        # The loop waits for this copy anyway: let torch use this rank's share of the cores for it.
        previous = torch.get_num_threads()
        if self.threads > previous:
            torch.set_num_threads(self.threads)
        try:
            queued = []
            for source, buffer in copies:
                on_device = source.is_cuda
                buffer.copy_(source.detach(), non_blocking=on_device)
                if on_device:
                    queued.append(buffer)
                elif progress is not None:
                    progress.filled(buffer)
            if queued:
                copied = torch.cuda.Event()
                copied.record()
                if progress is None:
                    copied.synchronize()
                else:
                    for buffer in queued:
                        progress.filled(buffer, copied=copied)
        finally:
            if self.threads > previous:
                torch.set_num_threads(previous)

    def stage_beside(
        self, state_dict: dict[str, Any], writer_thread: ThreadPoolExecutor,
        write: Callable[[dict[str, Any], StagingProgress], Any],
    ) -> Future:
        """Start ``write(snapshot, progress)`` on the writer thread, then fill the snapshot here: the
        writer takes each buffer once it is filled, and the caller waits for the copies only."""
        staged, copies = self.prepare(state_dict)
        progress = StagingProgress([buffer for _, buffer in copies])
        future = writer_thread.submit(write, staged, progress)
        try:
            self.fill(copies, progress)
        except BaseException as err:
            progress.fail(err)
            raise
        return future

    def _buffers(self, obj: Any, path: tuple[Any, ...], copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        if isinstance(obj, torch.Tensor):
            buffer = self._cache.get(path)
            if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
                # Pinned for a GPU tensor: its copy can then run without blocking the host.
                buffer = self._cache[path] = torch.empty(obj.shape, dtype=obj.dtype, device="cpu", pin_memory=obj.is_cuda)
            copies.append((obj, buffer))
            return buffer
        if isinstance(obj, dict):
            return {key: self._buffers(value, (*path, key), copies) for key, value in obj.items()}
        if isinstance(obj, list):
            return [self._buffers(value, (*path, index), copies) for index, value in enumerate(obj)]
        return copy.deepcopy(obj)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` copies synchronously."""

    def close(self) -> None:
        self._cache.clear()


def staging_threads() -> int:
    """This rank's share of the machine's cores (torchrun sets LOCAL_WORLD_SIZE)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1))


@dataclass(kw_only=True, slots=True)
class DcpBackend:
    """torch.distributed.checkpoint: one shard per rank, model + optimizer + this rank's blob.

    DCP plans what each rank writes and reads (and reshards on load); ``checkpoint_io`` moves the
    bytes (``trainpipe-dcp/2``). Checkpoints DCP's own writer wrote (``trainpipe-dcp/1``) still resume.
    """

    format = "trainpipe-dcp/2"
    reads = frozenset({"trainpipe-dcp/1", "trainpipe-dcp/2"})

    store: CheckpointStore
    env: DistEnv
    model: nn.Module
    optimizer: Optimizer
    async_save: bool
    # Dedicated gloo group for DCP's own collectives (they run on the writer thread).
    group: dist.ProcessGroup | None = None
    _stager: ReusableCpuStager = field(init=False)
    _writer_thread: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._stager = ReusableCpuStager(threads=staging_threads())
        self._writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")

    def _writer(self, path: str, staged: StagingProgress | None = None) -> dcp.StorageWriter:
        target = path if self.store.is_local else self.store.uri(path)
        return RawWriter(target, staged=staged, **self.store.storage_options)

    def _reader(self, path: str) -> dcp.StorageReader:
        # Reads both layouts: trainpipe-dcp/2 rank files, and DCP's own of trainpipe-dcp/1 checkpoints.
        target = path if self.store.is_local else self.store.uri(path)
        return RawReader(target, **self.store.storage_options)

    def write(self, step: int, rank_blob: bytes) -> Future | None:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        payload = {"model": model_sd, "optim": optim_sd, rank_key(self.env.rank): rank_blob}
        path = self.store.step_path(step)
        if not self.async_save:
            dcp.save(payload, storage_writer=self._writer(path), process_group=self.group)
            return None
        # dcp.async_save would stage everything, then start writing. Here the writer thread plans and
        # writes each tensor as soon as this thread has copied it: the loop waits for the copy only,
        # as before, and the save ends about when its slower half (copy or write) does.
        return self._stager.stage_beside(
            payload,
            self._writer_thread,
            lambda staged, progress: dcp.save(
                staged, storage_writer=self._writer(path, progress), process_group=self.group
            ),
        )

    def reserve(self) -> None:
        """Allocate the snapshot buffers now (after the first step, once the optimizer has its state).
        On a GPU they are pinned, and pinning takes about a second per few GB: paid once at launch,
        not by the first save in the loop."""
        if self.async_save:
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            self._stager.prepare({"model": model_sd, "optim": optim_sd})

    def read(self, step: int, *, blob_rank: int) -> bytes:
        # The replicated model and optimizer load on any number of ranks (DCP reshards at load time).
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        key = rank_key(blob_rank)
        payload: dict[str, Any] = {"model": model_sd, "optim": optim_sd, key: b""}
        dcp.load(payload, storage_reader=self._reader(self.store.step_path(step)), process_group=self.group)
        set_state_dict(self.model, self.optimizer, model_state_dict=payload["model"], optim_state_dict=payload["optim"])
        return payload[key]

    def close(self) -> None:
        self._writer_thread.shutdown(wait=True)
        self._stager.close()


# -- the manager the training loop talks to ----------------------------------------------------


@dataclass(kw_only=True, slots=True, eq=False)
class _InFlight:
    step: int
    manifest: dict[str, Any]
    started: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(kw_only=True, slots=True)
class CheckpointManager:
    config: CheckpointConfig
    env: DistEnv
    store: CheckpointStore
    backend: CheckpointBackend
    # What a checkpoint must match to be resumed: the snapshot and result-changing settings.
    identity: ResumeIdentity
    # The part of it that manifests recorded before ``identity`` existed (world_size, batch_size,
    # strategy, ...): still written, and all that can be checked on such an old checkpoint.
    shape: dict[str, Any]
    # Optional: its state goes into every rank's blob (DeepSpeed saves its scheduler itself).
    scheduler: LRScheduler | None = None
    resumed_step: int | None = field(init=False, default=None)
    # The world size that wrote the resumed checkpoint, when it was not this run's (resharded).
    resharded_from: int | None = field(init=False, default=None)
    last_saved_step: int | None = field(init=False, default=None)
    last_save_time: float = field(init=False, default_factory=time.monotonic)
    # Seconds the loop was blocked by each save (snapshot + start for async, everything for sync).
    blocked_seconds: list[float] = field(init=False, default_factory=list)
    # Seconds each save first waited for the previous one to be written and committed: 0 while
    # the storage keeps up with how often checkpoints are due.
    waited_seconds: list[float] = field(init=False, default_factory=list)
    # Seconds from each save's start to its commit (this rank's write, on rank 0 also the commit).
    write_seconds: list[float] = field(init=False, default_factory=list)
    best: tuple[int, float] | None = field(init=False, default=None)
    # Early stopping's best weights (CPU state dict) as the restored checkpoint held them, if any.
    restored_best_weights: dict[str, Any] | None = field(init=False, default=None)
    # Called on rank 0 as soon as a step's manifest is written (before older checkpoints are pruned).
    on_commit: Callable[[int], None] | None = None
    _in_flight: _InFlight | None = field(init=False, default=None)

    # -- resume ----------------------------------------------------------------------------------

    def restore(self) -> TrainState | None:
        """Load the newest committed checkpoint into the live objects and RNGs (collective).

        Returns this rank's saved ``TrainState``, or None when there is nothing to resume.
        """
        manifest = None
        if self.env.is_main:
            steps = self.store.committed_steps()
            manifest = self.store.read_manifest(steps[-1]) if steps else None
        # Rank 0 decides, so all ranks load the same step even if storage listings disagree.
        manifest = broadcast_object(manifest, self.env)
        if manifest is not None:
            # Every rank raises alike, and before anything in the folder changes.
            self.check_resumable(manifest)
        if self.env.is_main:
            torn, uploads = self.store.remove_uncommitted()
            if torn:
                print(f"checkpoint: removed interrupted saves (no manifest): {', '.join(checkpoint_dir_name(s) for s in torn)}")
            if uploads:
                print(f"checkpoint: aborted {len(uploads)} unfinished upload(s) of interrupted saves")
        if manifest is None:
            return None
        step = int(manifest["step"])
        written_by = int(manifest.get("world_size", self.env.world_size))
        mine = self.env.rank < written_by
        rank_state = pickle.loads(self.backend.read(step, blob_rank=self.env.rank if mine else 0))
        if self.scheduler is not None and rank_state.get("scheduler") is not None:
            self.scheduler.load_state_dict(rank_state["scheduler"])
        state = TrainState.from_dict(rank_state["train_state"])
        self.restored_best_weights = rank_state.get("best_weights")
        if "sample_in_epoch" not in rank_state["train_state"]:
            # Written before checkpoints recorded the global position: every rank had done as many micro-batches.
            state.sample_in_epoch = state.batch_in_epoch * int(manifest.get("batch_size", 0)) * written_by
        self.resumed_step = self.last_saved_step = step
        self.resharded_from = written_by if written_by != self.env.world_size else None
        if self.resharded_from is None:
            # Last, so nothing above (state-dict helpers, DCP, DeepSpeed) can draw from the restored generators.
            restore_rng_state(rank_state["rng"])
            return state
        # Another layout: this rank's generators and running loss sums were another rank's (or none). New
        # streams from the seed, the step and the rank, so the same history always trains the same weights.
        seed_all(int(self.identity.settings.get("seed") or 0) + 1_000_003 * step + self.env.rank)
        if not mine:
            state.epoch_loss_sum, state.epoch_loss_count = 0.0, 0
            state.interval_loss_sum, state.interval_loss_count = 0.0, 0
            state.compute_seconds = 0.0
        return state

    def check_resumable(self, manifest: dict[str, Any]) -> None:
        """Raise if this run must not resume the checkpoint ``manifest`` commits (the resume guard)."""
        where = f"{self.config.root_uri}/{checkpoint_dir_name(manifest['step'])}"
        recorded = ResumeIdentity.from_manifest(manifest)
        if recorded is not None:
            changes = recorded.differences(self.identity)
            if changes:
                raise ResumeMismatchError(resume_refusal(where, changes), changes=changes)
        if manifest.get("format") not in self.backend.reads:
            raise CheckpointMismatchError(
                f"checkpoint {where} has format {manifest.get('format')!r}, this run writes {self.backend.format!r} "
                "(another strategy); relaunch with the strategy that wrote it or use a new checkpoint.root_uri"
            )
        if recorded is not None:
            return
        for key, ours in self.shape.items():
            if manifest.get(key) != ours:
                raise CheckpointMismatchError(
                    f"checkpoint {where} was written with {key} {manifest.get(key)}, this run has {ours}; "
                    f"relaunch with the same {key} or use a new checkpoint.root_uri"
                )
        if self.env.is_main:
            # Refusing would fail a retry that spans an upgrade; an old checkpoint is resumed as before.
            print(
                f"warning: checkpoint {where} was written before checkpoints recorded their dataset snapshot "
                "and settings: resuming it with only world size, batch size and strategy checked; if the data "
                "or the settings changed since, start fresh in a new run folder instead",
                file=sys.stderr, flush=True,
            )

    # -- save ------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.config.every_n_steps is not None and step % self.config.every_n_steps == 0

    def clock_due(self) -> bool:
        """This rank's view of ``every_seconds`` (rank 0's is shared through the step flags)."""
        every = self.config.every_seconds
        return every is not None and time.monotonic() - self.last_save_time >= every

    def save(self, state: TrainState, *, validation_loss: float | None = None, wait: bool = False,
             best_weights: dict[str, Any] | None = None) -> bool:
        """Checkpoint ``step-<global_step>`` (collective); False if this step is already saved.

        Blocks only for the snapshot when saving asynchronously; ``wait`` also waits for the commit.
        """
        step = state.global_step
        if step == self.last_saved_step:
            if wait:
                self.wait()
            return False
        # One save at a time: the previous one must be committed (and its buffers free) first.
        waiting = time.perf_counter()
        self.wait()
        started = time.perf_counter()
        self.waited_seconds.append(started - waiting)
        blob = pickle.dumps(
            {
                "rng": capture_rng_state(),
                "train_state": state.to_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                # Early stopping: the weights that become the model, kept until training ends.
                "best_weights": best_weights,
            },
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        manifest = {
            "format": self.backend.format,
            "step": step,
            "epoch": state.epoch,
            "batch_in_epoch": state.batch_in_epoch,
            **self.shape,
            **self.identity.to_manifest(),
            "validation_loss": validation_loss,
            "saved_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        in_flight = _InFlight(step=step, manifest=manifest, started=started)
        future = self.backend.write(step, blob)
        if future is None:
            self._finish(in_flight, None)
        else:
            future.add_done_callback(lambda done: self._finish(in_flight, done))
        self._in_flight = in_flight
        self.blocked_seconds.append(time.perf_counter() - started)
        self.last_saved_step, self.last_save_time = step, time.monotonic()
        if wait:
            self.wait()
        return True

    def _finish(self, in_flight: _InFlight, future: Future | None) -> None:
        """Runs when this rank's write is done: on the writer thread for async saves."""
        try:
            if future is not None:
                future.result()
            if self.env.is_main:
                # DCP's coordinator finished: every rank's shard is written. Manifest last.
                self.store.commit(in_flight.step, in_flight.manifest)
                if self.on_commit is not None:
                    self.on_commit(in_flight.step)
                self.best = self.store.prune(
                    keep_last=self.config.keep_last,
                    keep_best=self.config.keep_best,
                    protect={s for s in (self.resumed_step,) if s is not None},
                )
        except BaseException as err:
            in_flight.error = err
        finally:
            self.write_seconds.append(time.perf_counter() - in_flight.started)
            in_flight.done.set()

    def reserve(self) -> None:
        """Allocate the backend's reused save buffers now, so the first save in the loop does not."""
        self.backend.reserve()

    def wait(self) -> None:
        """Wait until the save in flight is written (and, on rank 0, committed); raise its error."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        in_flight.done.wait()
        if in_flight.error is not None:
            raise CheckpointSaveError(
                f"saving checkpoint {self.config.root_uri}/{checkpoint_dir_name(in_flight.step)} failed: "
                f"{type(in_flight.error).__name__}: {in_flight.error}"
            ) from in_flight.error

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.backend.close()
