"""``strategy: deepspeed``: ZeRO stages 0-3 under torchrun with 2 CPU processes, and a crash-resume.

DeepSpeed on CPU falls back to gloo; the trainer skips the shared-memory op DeepSpeed would
compile, so no C++ toolchain is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import (
    BINARY_FEATURES,
    Datasets,
    Launch,
    committed_steps,
    kill_a_rank_after_a_commit,
    launch,
)

pytestmark = pytest.mark.integration

pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")


# A ZeRO-3 run of a few steps printed 18 identical torch FutureWarnings (reduce_scatter_tensor, one per
# step and rank; about 1,800 in a real run): a task log may carry a handful of warnings, not a flood.
MAX_WARNING_LINES = 3
WARNING_LINE = re.compile(r"\b\w*Warning\b|^warning:", re.IGNORECASE)


def _warning_lines(run: Launch) -> list[str]:
    return [line for line in (run.stdout + run.stderr).splitlines() if WARNING_LINE.search(line)]


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    assert run.stdout.strip().splitlines()[-1] == f"weights sha256: {run.result()['weights_sha256']}"
    return run.result()


def _deepspeed_config(
    make_config: Callable[..., Any], workdir: Path, datasets: Datasets, stage: int, **extra: Any
) -> dict[str, Any]:
    return make_config(
        workdir,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        strategy="deepspeed",
        deepspeed={"zero_stage": stage},
        **extra,
    )


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory: pytest.TempPathFactory, datasets: Datasets, make_config: Callable[..., Any]) -> Launch:
    workdir = tmp_path_factory.mktemp("zero2")
    # bf16: the engine's own torch_autocast section, whose resume must be bit-identical too.
    return launch(_deepspeed_config(make_config, workdir, datasets, 2, optimization={"precision": "bf16"}), workdir, nproc=2)


# Each stage also exercises an optimization option, at no extra launch.
STAGE_OPTIONS = {
    0: {"gradient_accumulation_steps": 2, "gradient_clip_norm": 1.0},
    1: {"precision": "bf16"},
    3: {"gradient_clip_norm": 0.5, "lr_schedule": "cosine", "warmup_steps": 2},
}


@pytest.mark.parametrize("stage", sorted(STAGE_OPTIONS))
def test_zero_stage_trains_on_two_processes(
    stage: int, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    config = _deepspeed_config(make_config, tmp_path, datasets, stage, epochs=1, optimization=STAGE_OPTIONS[stage])
    run = launch(config, tmp_path, nproc=2)
    result = _ok(run)
    warning_lines = _warning_lines(run)
    assert len(warning_lines) <= MAX_WARNING_LINES, "\n".join(warning_lines)
    accumulation = STAGE_OPTIONS[stage].get("gradient_accumulation_steps", 1)
    assert result["world_size"] == 2
    assert result["global_step"] == -(-9 // accumulation)  # 9 micro-batches per rank
    root = tmp_path / "checkpoints"
    last = committed_steps(root)[-1]
    manifest = json.loads((root / f"step-{last}" / "manifest.json").read_text())
    assert manifest["format"] == "trainpipe-deepspeed/1"
    assert manifest["strategy"] == f"deepspeed-zero{stage}"
    # DeepSpeed's own files plus every rank's RNG states and counters.
    assert {"rank_state_0.pkl", "rank_state_1.pkl"} <= {p.name for p in (root / f"step-{last}").iterdir()}


def test_zero2_trains_and_checkpoints_in_the_common_layout(zero2_run: Launch) -> None:
    result = _ok(zero2_run)
    assert result["global_step"] == 18
    root = zero2_run.workdir / "checkpoints"
    best = json.loads((root / "best.json").read_text())["step"]
    assert committed_steps(root) == sorted({16, 18, best})


def test_zero2_sigkill_of_one_rank_then_a_rerun_resumes_bit_identically(
    zero2_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    root = tmp_path / "checkpoints"
    config = _deepspeed_config(
        make_config, tmp_path, datasets, 2, optimization={"precision": "bf16"}, fault_injection={"step_delay_seconds": 0.2}
    )
    killed = kill_a_rank_after_a_commit(config, tmp_path, commit_timeout=180)
    assert killed.returncode != 0
    resume_from = committed_steps(root)[-1]
    assert 4 <= resume_from < 18

    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["weights_sha256"] == _ok(zero2_run)["weights_sha256"]


def test_an_async_zero2_save_holds_its_steps_values_while_the_loop_trains_on(
    tmp_path: Path, datasets: Datasets, deepspeed_env: Any, make_config: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop waits for the snapshot only: DeepSpeed's files are written later, by the writer thread,
    with the values of the step they are named after, and the manifest follows them."""
    import threading

    import torch
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    from trainpipe_trainer.config import TrainingConfig
    from trainpipe_trainer.preemption import PreemptionWatcher
    from trainpipe_trainer.tracking.tracker import Tracker
    from trainpipe_trainer.trainer import Trainer

    raw = _deepspeed_config(make_config, tmp_path, datasets, 2, checkpoint={"every_n_steps": 1000, "keep_best": False})
    config = TrainingConfig.from_dict(raw)
    assert config.checkpoint.async_save  # the default
    trainer = Trainer(config=config, env=deepspeed_env, tracker=Tracker(config=config.tracking, enabled=False))
    engine = trainer.strategy.engine
    steps = trainer.step_groups(trainer.batches.epoch(0))
    written = threading.Event()
    release = threading.Event()
    write = TorchCheckpointEngine.save

    def held_write(self: Any, state_dict: Any, path: str) -> None:
        assert release.wait(timeout=60), "the test never released the writer"
        write(self, state_dict, path)
        written.set()

    monkeypatch.setattr(TorchCheckpointEngine, "save", held_write)
    with PreemptionWatcher() as watcher:
        for _ in range(3):
            trainer.train_step(next(steps), watcher)
        weights = {name: value.clone() for name, value in engine.module.state_dict().items()}
        master = engine.optimizer.single_partition_of_fp32_groups[0].clone()
        trainer.checkpoints.save(trainer.state)  # returns with the writer still held
        step_dir = Path(trainer.checkpoints.store.step_path(3))
        for _ in range(2):
            trainer.train_step(next(steps), watcher)
        assert not written.is_set() and not trainer.checkpoints.store.is_committed(3)
        assert not torch.equal(engine.optimizer.single_partition_of_fp32_groups[0], master)  # it trained on
        release.set()
        trainer.checkpoints.wait()
    assert trainer.checkpoints.store.is_committed(3)
    (model_file,) = step_dir.glob("*model_states.pt")
    (optim_file,) = step_dir.glob("*optim_states.pt")
    saved = torch.load(model_file, weights_only=False)["module"]
    assert saved.keys() == weights.keys()
    assert all(torch.equal(saved[name], weights[name]) for name in weights)
    optimizer_state = torch.load(optim_file, weights_only=False)["optimizer_state_dict"]
    saved_master = optimizer_state["single_partition_of_fp32_groups"][0]  # DeepSpeed drops the alignment padding
    assert torch.equal(saved_master, master[: saved_master.numel()])
