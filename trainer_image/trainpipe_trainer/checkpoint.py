"""Checkpoints: ``<root>/step-<N>/`` written with torch.distributed.checkpoint, committed by a manifest.

Commit protocol: every rank writes its shard (DCP), all ranks pass a barrier, then rank 0 writes
``manifest.json`` last. A step directory without a manifest is an interrupted save and does not
exist for the loader, so a crash at any moment leaves either the previous or the new checkpoint.
"""

from __future__ import annotations

import json
import pickle
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim import Optimizer

from trainpipe_trainer import storage
from trainpipe_trainer.config import CheckpointConfig
from trainpipe_trainer.distributed import DistEnv, barrier, broadcast_flag, broadcast_object
from trainpipe_trainer.errors import CheckpointMismatchError
from trainpipe_trainer.rng import capture_rng_state, restore_rng_state
from trainpipe_trainer.state import TrainState

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "trainpipe-dcp/1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _rank_key(rank: int) -> str:
    # One key per rank: DCP de-duplicates equal keys across ranks, and these values differ.
    return f"rank_state_{rank}"


@dataclass(kw_only=True, slots=True)
class CheckpointManager:
    config: CheckpointConfig
    env: DistEnv
    storage_options: dict[str, Any]
    # Training shape the checkpoint must match to be resumable bit-exactly.
    batch_size: int
    fs: fsspec.AbstractFileSystem = field(init=False)
    root: str = field(init=False)
    resumed_step: int | None = field(init=False, default=None)
    last_saved_step: int | None = field(init=False, default=None)
    last_save_time: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("CheckpointManager: batch_size must be >= 1")
        self.fs, self.root = storage.url_to_fs(self.config.root_uri, self.storage_options)
        self.root = self.root.rstrip("/")

    # -- discovery -------------------------------------------------------------------------------

    def step_path(self, step: int) -> str:
        return f"{self.root}/step-{step}"

    def committed_steps(self) -> list[int]:
        """Steps with a manifest, oldest first (reads storage; call on rank 0)."""
        # Other ranks and earlier attempts wrote here: never trust a cached object-store listing.
        self.fs.invalidate_cache(self.root)
        if not self.fs.exists(self.root):
            return []
        steps = []
        for entry in self.fs.ls(self.root, detail=False):
            match = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match and self.fs.exists(f"{self.step_path(int(match.group(1)))}/{MANIFEST}"):
                steps.append(int(match.group(1)))
        return sorted(steps)

    def _read_manifest(self, step: int) -> dict[str, Any]:
        with self.fs.open(f"{self.step_path(step)}/{MANIFEST}", "r", encoding="utf-8") as handle:
            return json.load(handle)

    # -- DCP plumbing ----------------------------------------------------------------------------

    def _writer(self, path: str) -> dcp.StorageWriter:
        if storage.is_local(self.fs):
            return dcp.FileSystemWriter(path)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(self.fs.unstrip_protocol(path), **self.storage_options)

    def _reader(self, path: str) -> dcp.StorageReader:
        if storage.is_local(self.fs):
            return dcp.FileSystemReader(path)
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(self.fs.unstrip_protocol(path), **self.storage_options)

    # -- resume ----------------------------------------------------------------------------------

    def restore(self, *, model: nn.Module, optimizer: Optimizer) -> TrainState | None:
        """Load the newest committed checkpoint into model, optimizer and RNGs (collective).

        Returns this rank's saved ``TrainState``, or None when there is nothing to resume.
        """
        manifest = None
        if self.env.is_main:
            steps = self.committed_steps()
            manifest = self._read_manifest(steps[-1]) if steps else None
        # Rank 0 decides, so all ranks load the same step even if storage listings disagree.
        manifest = broadcast_object(manifest, self.env)
        if manifest is None:
            return None
        step = int(manifest["step"])
        for key, ours in (("world_size", self.env.world_size), ("batch_size", self.batch_size)):
            if manifest[key] != ours:
                raise CheckpointMismatchError(
                    f"checkpoint {self.config.root_uri}/step-{step} was written with {key} {manifest[key]}, "
                    f"this run has {ours}; relaunch with the same {key} or use a new checkpoint.root_uri"
                )
        model_sd, optim_sd = get_state_dict(model, optimizer)
        rank_key = _rank_key(self.env.rank)
        payload: dict[str, Any] = {"model": model_sd, "optim": optim_sd, rank_key: b""}
        dcp.load(payload, storage_reader=self._reader(self.step_path(step)))
        set_state_dict(model, optimizer, model_state_dict=payload["model"], optim_state_dict=payload["optim"])
        # Our own blob from save(): pickle is how numpy's and python's RNG states round-trip exactly.
        rank_state = pickle.loads(payload[rank_key])
        # Last, so nothing above (state-dict helpers, DCP) can draw from the restored generators.
        restore_rng_state(rank_state["rng"])
        self.resumed_step = self.last_saved_step = step
        return TrainState.from_dict(rank_state["train_state"])

    # -- save ------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether to save after ``step``; rank 0's clock decides for every_seconds (collective then)."""
        by_steps = self.config.every_n_steps is not None and step % self.config.every_n_steps == 0
        if self.config.every_seconds is None:
            return by_steps
        by_time = time.monotonic() - self.last_save_time >= self.config.every_seconds
        return broadcast_flag(by_steps or by_time, self.env)

    def save(self, *, model: nn.Module, optimizer: Optimizer, state: TrainState) -> bool:
        """Write and commit ``step-<global_step>`` (collective); False if it was already committed."""
        step = state.global_step
        path = self.step_path(step)
        already = None
        if self.env.is_main:
            already = self.fs.exists(f"{path}/{MANIFEST}")
            if not already and self.fs.exists(path):
                # Leftovers of an interrupted save of this same step: start clean.
                self.fs.rm(path, recursive=True)
        if broadcast_object(already, self.env):
            self.last_saved_step = step
            return False
        model_sd, optim_sd = get_state_dict(model, optimizer)
        rank_blob = pickle.dumps(
            {"rng": capture_rng_state(), "train_state": state.to_dict()}, protocol=pickle.HIGHEST_PROTOCOL
        )
        # Step, epoch and batch position travel in every rank's blob, next to its RNG states.
        payload = {"model": model_sd, "optim": optim_sd, _rank_key(self.env.rank): rank_blob}
        dcp.save(payload, storage_writer=self._writer(path))
        barrier(self.env)
        if self.env.is_main:
            manifest = {
                "format": MANIFEST_FORMAT,
                "step": step,
                "epoch": state.epoch,
                "batch_in_epoch": state.batch_in_epoch,
                "world_size": self.env.world_size,
                "batch_size": self.batch_size,
                "saved_at": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            storage.write_text(
                self.fs.unstrip_protocol(f"{path}/{MANIFEST}"), json.dumps(manifest, indent=2), self.storage_options
            )
            self._prune()
        self.last_saved_step = step
        self.last_save_time = time.monotonic()
        return True

    def _prune(self) -> None:
        steps = self.committed_steps()
        keep = set(steps[-self.config.keep_last :])
        if self.resumed_step is not None:
            keep.add(self.resumed_step)
        for step in steps:
            if step not in keep:
                self.fs.rm(self.step_path(step), recursive=True)
