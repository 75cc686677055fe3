"""trainpipe_trainer.checkpoint.manager: DCP save/commit/restore/prune in one real (single-process) group."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.trainer.helpers import S3
from trainpipe_trainer.checkpoint.manager import CheckpointManager, CheckpointStore, DcpBackend, ReusableCpuStager
from trainpipe_trainer.checkpoint.state import TrainState
from trainpipe_trainer.config import CheckpointConfig, ModelConfig, OptimizationConfig
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import CheckpointMismatchError, CheckpointSaveError, ResumeMismatchError
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.optim import build_optimizer, build_scheduler
from trainpipe_trainer.resume import ResumeIdentity
from trainpipe_trainer.serving.export import weights_sha256


class Run:
    """A small model, its optimizer and LR schedule, and the counters a checkpoint carries."""

    def __init__(self, seed: int = 0, *, features: int = 3, hidden: int = 4, device: str | torch.device = "cpu") -> None:
        torch.manual_seed(seed)
        self.features, self.device = features, device
        module = build_mlp(n_features=features, config=ModelConfig(hidden_layers=(hidden,), dropout=0.5)).to(device)
        self.model = DistributedDataParallel(module)
        optimization = OptimizationConfig(lr_schedule="cosine", warmup_steps=2)
        self.optimizer = build_optimizer(self.model.parameters(), learning_rate=0.1, config=optimization)
        self.scheduler = build_scheduler(self.optimizer, config=optimization, total_steps=20)
        self.state = TrainState()

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.optimizer.zero_grad()
            loss = self.model(torch.randn(8, self.features, device=self.device)).pow(2).mean()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.state.finish_step()
            # The trainer reads its loss sums from the device at sync points; the checkpoint carries them.
            self.state.epoch_loss_sum += loss.item()
            self.state.interval_loss_sum += loss.item()

    def manager(
        self, root: Path | str, env: DistEnv, *, keep_last: int = 3, batch_size: int = 8, async_save: bool = True,
        keep_best: bool = True, storage_options: dict | None = None,
    ) -> CheckpointManager:
        uri = root if isinstance(root, str) else root.as_uri()
        config = CheckpointConfig(
            root_uri=uri, every_n_steps=2, keep_last=keep_last, keep_best=keep_best, async_save=async_save
        )
        store = CheckpointStore(root_uri=uri, storage_options=storage_options or {})
        backend = DcpBackend(
            store=store, env=env, model=self.model, optimizer=self.optimizer, async_save=async_save,
            group=dist.new_group(backend="gloo"),
        )
        shape = {"world_size": env.world_size, "batch_size": batch_size, "strategy": "ddp"}
        return CheckpointManager(
            config=config, env=env, store=store, backend=backend, scheduler=self.scheduler,
            identity=ResumeIdentity(snapshot="a" * 64, settings=shape), shape=shape,
        )


def _draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def _files(step_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(step_dir.iterdir())}


@pytest.mark.parametrize("async_save", [True, False], ids=["async", "sync"])
def test_restore_returns_weights_optimizer_schedule_counters_and_rng_streams(
    env: DistEnv, tmp_path: Path, async_save: bool
) -> None:
    run = Run()
    run.train(3)
    manager = run.manager(tmp_path, env, async_save=async_save)
    assert manager.save(run.state, validation_loss=0.5)
    saved_sha, saved_state = weights_sha256(run.model.module), run.state.to_dict()
    saved_lr = run.scheduler.get_last_lr()
    after_save = _draws()
    # The loop goes on while the save is written: later updates must not leak into it.
    run.train(1)
    continued_sha, continued_lr = weights_sha256(run.model.module), run.scheduler.get_last_lr()
    manager.close()
    assert json.loads((tmp_path / "step-3" / "manifest.json").read_text())["validation_loss"] == 0.5

    fresh = Run(seed=99)
    restored = fresh.manager(tmp_path, env).restore()
    assert restored is not None
    assert restored.to_dict() == saved_state
    assert weights_sha256(fresh.model.module) == saved_sha
    assert fresh.scheduler.get_last_lr() == saved_lr
    assert _draws() == after_save
    # Same RNG streams, optimizer moments and schedule: the next step is bit-identical to the original's.
    fresh.state = restored
    fresh.train(1)
    assert weights_sha256(fresh.model.module) == continued_sha
    assert fresh.scheduler.get_last_lr() == continued_lr
    assert continued_sha != saved_sha


def test_async_save_blocks_only_for_the_snapshot_and_commits_in_the_background(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(2)
    manager = run.manager(tmp_path, env)
    committed: list[int] = []
    manager.on_commit = committed.append
    manager.save(run.state)
    assert len(manager.blocked_seconds) == 1
    manager.wait()
    assert committed == [2]
    assert manager.store.committed_steps() == [2]
    # Saving the same step again is a no-op (e.g. the final save right after a periodic one).
    assert not manager.save(run.state)


def test_a_save_due_while_the_previous_write_runs_waits_for_it_and_records_the_wait(
    env: DistEnv, tmp_path: Path
) -> None:
    run = Run()
    run.train(2)
    manager = run.manager(tmp_path, env)
    release = threading.Event()
    # Step 2's write is slow to commit (slow storage); step 4 is due before it is done.
    manager.on_commit = lambda step: release.wait(timeout=60) if step == 2 else None
    manager.save(run.state)
    run.train(2)
    threading.Timer(0.3, release.set).start()
    manager.save(run.state)
    manager.close()

    assert manager.waited_seconds[0] < 0.05  # nothing was in flight
    assert manager.waited_seconds[1] >= 0.25
    assert manager.write_seconds[0] >= 0.25
    # Waiting loses nothing: both steps are committed, in order.
    assert manager.store.committed_steps() == [2, 4]


def test_reusable_stager_copies_into_the_same_buffers() -> None:
    stager = ReusableCpuStager()
    source = {"w": torch.ones(3), "opt": {"state": {"w": {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 0.1}]}}
    first = stager.stage(source)
    source["w"].add_(1)
    assert first["w"].tolist() == [1.0, 1.0, 1.0]
    second = stager.stage(source)
    assert second["w"] is first["w"] and second["w"].tolist() == [2.0, 2.0, 2.0]
    assert second["opt"]["param_groups"] == [{"lr": 0.1}]
    assert second["opt"]["param_groups"] is not source["opt"]["param_groups"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_on_cuda_the_snapshot_goes_to_pinned_buffers_reserved_beforehand_and_holds_its_step(
    env: DistEnv, tmp_path: Path
) -> None:
    """The copy to the host is only queued (the loop goes on at once), behind the step it snapshots and
    ahead of the next steps' updates; the buffers were pinned before the first save."""
    run = Run(features=256, hidden=4096, device=env.device)
    run.train(2)
    manager = run.manager(tmp_path, env)
    manager.reserve()
    reserved = list(manager.backend._stager._cache.values())
    assert reserved and all(buffer.is_pinned() for buffer in reserved)
    saved_sha = weights_sha256(run.model.module)
    manager.save(run.state)
    # The save filled the reserved buffers (it allocated none of its own).
    staged = list(manager.backend._stager._cache.values())
    assert len(staged) >= len(reserved) and all(a is b for a, b in zip(reserved, staged, strict=False))
    run.train(3)  # queued on the same stream, behind the snapshot's copies
    manager.close()
    fresh = Run(seed=99, features=256, hidden=4096, device=env.device)
    assert fresh.manager(tmp_path, env).restore() is not None
    assert weights_sha256(fresh.model.module) == saved_sha


def test_steps_without_manifest_do_not_exist_and_are_cleared_before_resuming(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(2)
    manager = run.manager(tmp_path, env)
    manager.save(run.state, wait=True)
    (tmp_path / "step-50").mkdir()
    (tmp_path / "step-50" / "__0_0.distcp").write_bytes(b"half-written")
    (tmp_path / "step-x").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert manager.store.committed_steps() == [2]
    restored = Run().manager(tmp_path, env).restore()
    assert restored is not None and restored.global_step == 2
    assert not (tmp_path / "step-50").exists()
    assert (tmp_path / "step-x").exists() and (tmp_path / "notes.txt").exists()


def test_keep_last_and_best_prune_but_never_the_resumed_checkpoint(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    first = run.manager(tmp_path, env, keep_last=2)
    for loss in (0.9, 0.1, 0.5, 0.7):
        run.train(1)
        first.save(run.state, validation_loss=loss)
    first.close()
    # Newest two (3, 4) plus the lowest validation loss (2).
    assert first.store.committed_steps() == [2, 3, 4]
    assert json.loads((tmp_path / "best.json").read_text()) == {"step": 2, "validation_loss": 0.1, "path": "step-2"}

    resumed_run = Run()
    resumed = resumed_run.manager(tmp_path, env, keep_last=1, keep_best=False)
    state = resumed.restore()
    assert state is not None and state.global_step == 4
    resumed_run.state = state
    for _ in range(2):
        resumed_run.train(1)
        resumed.save(resumed_run.state, validation_loss=0.3)
    resumed.close()
    assert resumed.store.committed_steps() == [4, 6]


def test_checkpoint_of_another_shape_or_strategy_is_refused(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(1)
    run.manager(tmp_path, env).save(run.state, wait=True)
    with pytest.raises(ResumeMismatchError, match=r"step-1: cannot resume .*: batch_size 8 -> 16\)"):
        Run().manager(tmp_path, env, batch_size=16).restore()
    manifest = tmp_path / "step-1" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": "trainpipe-deepspeed/1"}))
    expected = "format 'trainpipe-deepspeed/1', this run writes 'trainpipe-dcp/2'"
    with pytest.raises(CheckpointMismatchError, match=expected):
        Run().manager(tmp_path, env).restore()


def test_a_failed_async_save_is_never_committed_and_fails_the_next_wait(env: DistEnv, tmp_path: Path) -> None:
    run = Run()
    run.train(1)
    # A file where the step directory must go: the writer thread cannot create it.
    (tmp_path / "step-1").write_text("in the way")
    manager = run.manager(tmp_path, env)
    manager.save(run.state)
    with pytest.raises(CheckpointSaveError, match=r"saving checkpoint .*/step-1 failed"):
        manager.wait()
    assert manager.store.committed_steps() == []


def test_nothing_to_restore_in_an_empty_root(env: DistEnv, tmp_path: Path) -> None:
    assert Run().manager(tmp_path / "absent", env).restore() is None


def test_async_save_prune_and_restore_on_s3(env: DistEnv, s3_bucket: S3) -> None:
    uri = s3_bucket.uri("run-1/checkpoints")
    run = Run()
    manager = run.manager(uri, env, keep_last=1, keep_best=False, storage_options=s3_bucket.storage_options)
    for _ in range(2):
        run.train(1)
        manager.save(run.state)
    manager.close()
    assert manager.store.committed_steps() == [2]
    fresh = Run(seed=5)
    restored = fresh.manager(uri, env, storage_options=s3_bucket.storage_options).restore()
    assert restored is not None and restored.global_step == 2
    assert weights_sha256(fresh.model.module) == weights_sha256(run.model.module)
