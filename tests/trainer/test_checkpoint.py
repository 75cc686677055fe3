"""trainpipe_trainer.checkpoint: DCP save/commit/restore in one real (single-process) group."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel
from trainpipe_trainer.checkpoint import CheckpointManager
from trainpipe_trainer.config import CheckpointConfig, ModelConfig
from trainpipe_trainer.distributed import DistEnv, destroy_distributed, init_distributed
from trainpipe_trainer.errors import CheckpointMismatchError
from trainpipe_trainer.export import weights_sha256
from trainpipe_trainer.model import build_mlp
from trainpipe_trainer.state import TrainState

from .helpers import S3


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[DistEnv]:
    for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    yield init_distributed()
    destroy_distributed()


def _trainable(seed: int = 0) -> tuple[DistributedDataParallel, torch.optim.Adam]:
    torch.manual_seed(seed)
    model = DistributedDataParallel(build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,), dropout=0.5)))
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _train(model: DistributedDataParallel, optimizer: torch.optim.Adam, steps: int, state: TrainState) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(8, 3)).pow(2).mean()
        loss.backward()
        optimizer.step()
        state.add_loss(loss.item())


def _manager(root: Path, env: DistEnv, *, keep_last: int = 3, batch_size: int = 8) -> CheckpointManager:
    config = CheckpointConfig(root_uri=root.as_uri(), every_n_steps=2, keep_last=keep_last)
    return CheckpointManager(config=config, env=env, storage_options={}, batch_size=batch_size)


def _draws() -> tuple[float, float, float]:
    return torch.rand(1).item(), float(np.random.rand()), random.random()


def test_restore_returns_weights_optimizer_counters_and_rng_streams(env: DistEnv, tmp_path: Path) -> None:
    model, optimizer = _trainable()
    state = TrainState()
    _train(model, optimizer, 3, state)
    manager = _manager(tmp_path, env)
    assert manager.save(model=model, optimizer=optimizer, state=state)
    saved_sha, saved_state = weights_sha256(model.module), state.to_dict()
    after_save = _draws()
    _train(model, optimizer, 1, state)
    continued_sha = weights_sha256(model.module)

    fresh_model, fresh_optimizer = _trainable(seed=99)
    fresh_state = _manager(tmp_path, env).restore(model=fresh_model, optimizer=fresh_optimizer)
    assert fresh_state is not None
    assert fresh_state.to_dict() == saved_state
    assert weights_sha256(fresh_model.module) == saved_sha
    assert _draws() == after_save
    # Same RNG streams and optimizer moments: the next step is bit-identical to the original's.
    _train(fresh_model, fresh_optimizer, 1, fresh_state)
    assert weights_sha256(fresh_model.module) == continued_sha
    assert continued_sha != saved_sha


def test_uncommitted_step_dirs_do_not_exist_for_the_loader(env: DistEnv, tmp_path: Path) -> None:
    model, optimizer = _trainable()
    state = TrainState()
    _train(model, optimizer, 2, state)
    manager = _manager(tmp_path, env)
    manager.save(model=model, optimizer=optimizer, state=state)
    (tmp_path / "step-50").mkdir()
    (tmp_path / "step-50" / "__0_0.distcp").write_bytes(b"half-written")
    (tmp_path / "step-x").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert manager.committed_steps() == [2]
    restored = _manager(tmp_path, env).restore(model=model, optimizer=optimizer)
    assert restored is not None and restored.global_step == 2


def test_keep_last_prunes_old_checkpoints_but_never_the_resumed_one(env: DistEnv, tmp_path: Path) -> None:
    model, optimizer = _trainable()
    state = TrainState()
    first = _manager(tmp_path, env, keep_last=2)
    for _ in range(3):
        _train(model, optimizer, 1, state)
        first.save(model=model, optimizer=optimizer, state=state)
    assert first.committed_steps() == [2, 3]

    resumed = _manager(tmp_path, env, keep_last=1)
    state = resumed.restore(model=model, optimizer=optimizer)
    assert state is not None and state.global_step == 3
    for _ in range(2):
        _train(model, optimizer, 1, state)
        resumed.save(model=model, optimizer=optimizer, state=state)
    assert resumed.committed_steps() == [3, 5]


def test_checkpoint_from_another_batch_size_is_refused(env: DistEnv, tmp_path: Path) -> None:
    model, optimizer = _trainable()
    state = TrainState()
    _train(model, optimizer, 1, state)
    _manager(tmp_path, env).save(model=model, optimizer=optimizer, state=state)
    with pytest.raises(CheckpointMismatchError, match="written with batch_size 8, this run has 16"):
        _manager(tmp_path, env, batch_size=16).restore(model=model, optimizer=optimizer)


def test_nothing_to_restore_in_an_empty_root(env: DistEnv, tmp_path: Path) -> None:
    model, optimizer = _trainable()
    assert _manager(tmp_path / "absent", env).restore(model=model, optimizer=optimizer) is None


def test_save_prune_and_restore_on_s3(env: DistEnv, s3_bucket: S3) -> None:
    config = CheckpointConfig(root_uri=s3_bucket.uri("run-1/checkpoints"), every_n_steps=1, keep_last=1)
    manager = CheckpointManager(config=config, env=env, storage_options=s3_bucket.storage_options, batch_size=8)
    model, optimizer = _trainable()
    state = TrainState()
    for _ in range(2):
        _train(model, optimizer, 1, state)
        manager.save(model=model, optimizer=optimizer, state=state)
    assert manager.committed_steps() == [2]
    fresh_model, fresh_optimizer = _trainable(seed=5)
    fresh = CheckpointManager(config=config, env=env, storage_options=s3_bucket.storage_options, batch_size=8)
    restored = fresh.restore(model=fresh_model, optimizer=fresh_optimizer)
    assert restored is not None and restored.global_step == 2
    assert weights_sha256(fresh_model.module) == weights_sha256(model.module)
