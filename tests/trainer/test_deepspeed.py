"""``strategy: deepspeed``: ZeRO stages 0-3 under torchrun with 2 CPU processes, and a crash-resume.

DeepSpeed on CPU falls back to gloo; the trainer skips the shared-memory op DeepSpeed would
compile, so no C++ toolchain is needed.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .helpers import BINARY_FEATURES, Datasets, Launch, committed_steps, launch, start, wait_until

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
    running = start(config, tmp_path, nproc=2)
    try:
        wait_until(lambda: bool(committed_steps(root)), timeout=180, what="a commit", running=running)
        os.kill(running.rank_pid(1), signal.SIGKILL)
        killed = running.wait(timeout=120)
    finally:
        running.stop()
    assert killed.returncode != 0
    resume_from = committed_steps(root)[-1]
    assert 4 <= resume_from < 18

    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["weights_sha256"] == _ok(zero2_run)["weights_sha256"]
