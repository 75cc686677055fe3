"""The resume guard: a checkpoint is resumed only by a run with its snapshot and result-changing settings.

Unit tests pin which config fields are in the fingerprint and how differences read; the integration
tests resume a copy of the reference run's checkpoints (``binary_run``) with another seed, another
snapshot, and with only harmless changes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainpipe_trainer.checkpoint.manager import CheckpointManager, CheckpointStore, DcpBackend
from trainpipe_trainer.checkpoint.state import TrainState
from trainpipe_trainer.config import (
    CheckpointConfig,
    DeepSpeedConfig,
    FaultInjection,
    ModelConfig,
    OptimizationConfig,
    TrackingConfig,
    TrainingConfig,
)
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import CheckpointMismatchError, ResumeMismatchError
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.optim import build_optimizer
from trainpipe_trainer.resume import (
    NOT_FINGERPRINTED_FIELDS,
    RESUME_FINGERPRINT_FIELDS,
    ResumeIdentity,
    resume_identity,
)

from .helpers import BINARY_FEATURES, Datasets, Launch, file_digests, launch

DIGEST = "3f2a9c1e0b7d4a55" + "0" * 48


def _config(**changes: Any) -> TrainingConfig:
    base = TrainingConfig(
        pipeline_id="fraud",
        task="binary_classification",
        train_data_uri="s3://bucket/snapshots/fraud/3f2a9c1e0b7d4a55/train.parquet",
        dataset_digest=DIGEST,
        features=("amount", "merchant_risk", "hour"),
        label="is_fraud",
        seed=42,
        checkpoint=CheckpointConfig(root_uri="s3://bucket/runs/fraud/r1/checkpoints", every_n_steps=20),
        tracking=TrackingConfig(tracking_uri="http://mlflow:5000", run_id="abc"),
        output_uri="s3://bucket/runs/fraud/r1/output",
        tags={"trainpipe.try_number": "1"},
    )
    return dataclasses.replace(base, **changes)


def _leaf_fields(obj: Any, prefix: str = "") -> list[str]:
    paths = []
    for field in dataclasses.fields(obj):
        path = f"{prefix}{field.name}"
        value = getattr(obj, field.name)
        paths.extend(_leaf_fields(value, f"{path}.") if dataclasses.is_dataclass(value) else [path])
    return paths


def test_every_config_field_is_either_fingerprinted_or_not() -> None:
    # Optional sections filled in, so their fields are listed too.
    config = _config(deepspeed=DeepSpeedConfig(zero_stage=2), strategy="deepspeed", fault_injection=FaultInjection())
    fields = _leaf_fields(config)
    assert "optimization.precision" in fields and "fault_injection.crash_after_step" in fields

    def covered_by(path: str, listed: tuple[str, ...]) -> list[str]:
        return [entry for entry in listed if path == entry or path.startswith(f"{entry}.")]

    unclassified = [p for p in fields if not covered_by(p, RESUME_FINGERPRINT_FIELDS + NOT_FINGERPRINTED_FIELDS)]
    both = [p for p in fields if covered_by(p, RESUME_FINGERPRINT_FIELDS) and covered_by(p, NOT_FINGERPRINTED_FIELDS)]
    assert unclassified == [], "add each new TrainingConfig field to one of the two lists in trainpipe_trainer/resume.py"
    assert both == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"seed": 7}, "seed 42 -> 7"),
        ({"dataset_digest": "81c0d2e4f6a8b0c1" + "f" * 48}, "dataset snapshot 3f2a9c1e0b7d4a55 -> 81c0d2e4f6a8b0c1"),
        ({"features": ("amount", "hour", "merchant_risk")}, "features (same columns, other order)"),
        ({"features": ("amount", "hour", "country")}, "features (added ['country'], removed ['merchant_risk'])"),
        ({"label": "chargeback"}, 'label "is_fraud" -> "chargeback"'),
        ({"model": ModelConfig(hidden_layers=(64, 16))}, "model.hidden_layers [64, 32] -> [64, 16]"),
        ({"epochs": 3}, "epochs 1 -> 3"),
        ({"batch_size": 512}, "batch_size 256 -> 512"),
        ({"learning_rate": 0.01}, "learning_rate 0.001 -> 0.01"),
        ({"optimization": OptimizationConfig(precision="bf16")}, 'optimization.precision "fp32" -> "bf16"'),
        ({"optimization": OptimizationConfig(gradient_accumulation_steps=4)},
         "optimization.gradient_accumulation_steps 1 -> 4"),
        ({"checkpoint": CheckpointConfig(root_uri="s3://bucket/runs/fraud/r1/checkpoints", validation_fraction=0.2)},
         "checkpoint.validation_fraction 0.1 -> 0.2"),
    ],
)
def test_a_result_changing_difference_is_named_with_its_values(changes: dict[str, Any], named: str) -> None:
    recorded = resume_identity(_config(), world_size=2)
    assert recorded.differences(resume_identity(_config(**changes), world_size=2)) == [named]


def test_world_size_and_strategy_are_in_the_fingerprint() -> None:
    recorded = resume_identity(_config(), world_size=2)
    # Recorded, but ddp reshards its checkpoints (ADR 0017): another world size resumes.
    assert recorded.settings["world_size"] == 2
    assert recorded.differences(resume_identity(_config(), world_size=4)) == []
    deepspeed = _config(strategy="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=1))
    (refused,) = resume_identity(deepspeed, world_size=2).differences(resume_identity(deepspeed, world_size=1))
    assert refused.startswith("world_size 2 -> 1 (strategy deepspeed cannot reshard: DeepSpeed ZeRO partitions the "
                              "optimizer state per rank; resume with 2 processes, or use ddp")
    assert recorded.differences(resume_identity(deepspeed, world_size=2)) == [
        "deepspeed.offload_optimizer null -> false",
        "deepspeed.offload_param null -> false",
        "deepspeed.zero_stage null -> 1",
        'strategy "ddp" -> "deepspeed"',
    ]
    zero3 = _config(strategy="deepspeed", deepspeed=DeepSpeedConfig(zero_stage=3))
    assert resume_identity(deepspeed, world_size=2).differences(resume_identity(zero3, world_size=2)) == [
        "deepspeed.zero_stage 1 -> 3"
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {"pipeline_id": "fraud_v2"},
        # Another path to the same content: the snapshot is compared by its digest.
        {"train_data_uri": "file:///mnt/snapshots/fraud/3f2a9c1e0b7d4a55/train.parquet"},
        {"checkpoint": CheckpointConfig(root_uri="file:///elsewhere", every_n_steps=5, every_seconds=60.0,
                                        keep_last=9, async_save=False)},
        {"tracking": TrackingConfig(tracking_uri="http://other:5000", run_id="def", log_every_n_steps=1)},
        {"output_uri": "file:///elsewhere/output"},
        {"storage_options": {"client_kwargs": {"endpoint_url": "http://minio:9000"}}},
        {"tags": {"trainpipe.try_number": "2"}},
        # An Airflow retry runs without the crash injected into its first try.
        {"fault_injection": FaultInjection(crash_after_step=40)},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_where_things_go_and_how_often_they_are_saved_or_logged_may_change(changes: dict[str, Any]) -> None:
    recorded = resume_identity(_config(), world_size=2)
    assert recorded.differences(resume_identity(_config(**changes), world_size=2)) == []


def test_identity_read_back_from_a_manifest_equals_the_live_one() -> None:
    config = _config(deepspeed=DeepSpeedConfig(zero_stage=3, offload_param=True), strategy="deepspeed",
                     optimization=OptimizationConfig(gradient_clip_norm=1.0))
    identity = resume_identity(config, world_size=8)
    manifest = json.loads(json.dumps({"step": 3, **identity.to_manifest()}))
    recorded = ResumeIdentity.from_manifest(manifest)
    assert recorded is not None and recorded.differences(identity) == []
    assert ResumeIdentity.from_manifest({"step": 3, "world_size": 8}) is None
    # A snapshot without a digest (a hand-written config) is its train_data_uri.
    assert resume_identity(_config(dataset_digest=""), world_size=1).snapshot == _config().train_data_uri


def test_fields_recorded_by_only_one_trainer_version_are_named() -> None:
    ours = resume_identity(_config(), world_size=2)
    older = ResumeIdentity(snapshot=ours.snapshot, settings={k: v for k, v in ours.settings.items() if k != "seed"})
    newer = ResumeIdentity(snapshot=ours.snapshot, settings={**ours.settings, "loss_scale": 2})
    assert older.differences(ours) == ["seed (not recorded by the trainer that wrote it)"]
    assert newer.differences(ours) == ["loss_scale (recorded, unknown to this trainer)"]


# -- the guard in the checkpoint manager (one real process group) -------------------------------


def _manager(root: Path, env: DistEnv, config: TrainingConfig) -> tuple[CheckpointManager, torch.nn.Module]:
    torch.manual_seed(0)
    model = build_mlp(n_features=len(config.features), config=ModelConfig(hidden_layers=(4,)))
    optimizer = build_optimizer(model.parameters(), learning_rate=0.1, config=OptimizationConfig())
    store = CheckpointStore(root_uri=root.as_uri(), storage_options={})
    backend = DcpBackend(store=store, env=env, model=model, optimizer=optimizer, async_save=False,
                         group=dist.new_group(backend="gloo"))
    manager = CheckpointManager(
        config=CheckpointConfig(root_uri=root.as_uri()), env=env, store=store, backend=backend,
        identity=resume_identity(config, world_size=env.world_size),
        shape={"world_size": env.world_size, "batch_size": config.batch_size, "strategy": "ddp"},
    )
    return manager, model


def _save_one_step(root: Path, env: DistEnv, config: TrainingConfig) -> None:
    manager, _ = _manager(root, env, config)
    manager.save(TrainState(global_step=5, epoch=0, batch_in_epoch=5), wait=True)
    manager.close()


def test_manager_refuses_before_touching_the_folder_and_names_every_difference(env: DistEnv, tmp_path: Path) -> None:
    _save_one_step(tmp_path, env, _config())
    manifest = json.loads((tmp_path / "step-5" / "manifest.json").read_text())
    assert manifest["snapshot"] == DIGEST and manifest["settings"]["seed"] == 42
    # An interrupted save of the other training stays too: a refused run changes nothing.
    (tmp_path / "step-9").mkdir()
    before = file_digests(tmp_path)

    other_snapshot = "81c0d2e4f6a8b0c1" + "f" * 48
    manager, _ = _manager(tmp_path, env, _config(seed=7, learning_rate=0.01, dataset_digest=other_snapshot))
    with pytest.raises(ResumeMismatchError, match=r"step-5: cannot resume this checkpoint") as refused:
        manager.restore()
    assert refused.value.changes == [
        "dataset snapshot 3f2a9c1e0b7d4a55 -> 81c0d2e4f6a8b0c1", "learning_rate 0.001 -> 0.01", "seed 42 -> 7"
    ]
    assert "start fresh in a new run folder" in str(refused.value)
    assert file_digests(tmp_path) == before and (tmp_path / "step-9").is_dir()


def test_a_checkpoint_from_before_the_guard_is_resumed_with_a_warning(
    env: DistEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _save_one_step(tmp_path, env, _config())
    manifest_path = tmp_path / "step-5" / "manifest.json"
    legacy = {k: v for k, v in json.loads(manifest_path.read_text()).items() if k not in ("snapshot", "settings")}
    manifest_path.write_text(json.dumps(legacy))

    manager, _ = _manager(tmp_path, env, _config(seed=7))
    state = manager.restore()
    assert state is not None and state.global_step == 5
    assert "was written before checkpoints recorded their dataset snapshot and settings" in capsys.readouterr().err
    manager.close()
    # What such a checkpoint does record (batch size, world size, strategy) is still checked.
    manager, _ = _manager(tmp_path, env, _config(batch_size=64))
    with pytest.raises(CheckpointMismatchError, match="written with batch_size 256, this run has 64"):
        manager.restore()


# -- the trainer, launched as the launchers do ---------------------------------------------------


def _copy_of_reference_checkpoints(binary_run: Launch, workdir: Path) -> Path:
    assert binary_run.returncode == 0, binary_run.describe()
    root = workdir / "checkpoints"
    shutil.copytree(binary_run.workdir / "checkpoints", root)
    return root


@pytest.mark.integration
def test_trainer_refuses_another_seed_with_exit_code_2(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    root = _copy_of_reference_checkpoints(binary_run, tmp_path)
    before = file_digests(root)
    config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES, seed=1)

    refused = launch(config, tmp_path, nproc=2)
    assert refused.returncode != 0, refused.describe()
    newest = max(int(p.name.split("-")[1]) for p in root.glob("step-*"))
    line = next(line for line in refused.stderr.splitlines() if "cannot resume" in line)
    # __main__'s one-line report on each rank (exit code 2, bad input; torchrun then reports failure).
    assert line.startswith("trainpipe_trainer: [rank ") and f"error: {root.as_uri()}/step-{newest}: " in line
    assert "(checkpoint -> this run: seed 0 -> 1)" in line, line
    assert "exitcode: 2" in refused.stderr
    # A reported refusal, not a crash: no frame of the trainer (torchrun adds its own ChildFailedError).
    assert "trainpipe_trainer/checkpoint/manager.py" not in refused.stderr
    assert file_digests(root) == before
    assert not (tmp_path / "output" / "result.json").exists()


@pytest.mark.integration
def test_a_retry_with_only_harmless_changes_resumes_to_the_same_weights(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    root = _copy_of_reference_checkpoints(binary_run, tmp_path)
    newest = max(int(p.name.split("-")[1]) for p in root.glob("step-*"))
    # Other cadences, another output folder and tags: what an Airflow retry may change.
    config = make_config(
        tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 3, "keep_last": 5}, tracking={"log_every_n_steps": 5},
        tags={"dag_id": "trainer_tests", "try_number": "2"},
    )
    resumed = launch(config, tmp_path, nproc=2)
    assert resumed.returncode == 0, resumed.describe()
    assert f"resumed from step {newest}" in resumed.stdout
    assert resumed.result()["weights_sha256"] == binary_run.result()["weights_sha256"]
