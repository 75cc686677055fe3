"""A CUDA out-of-memory error is its own outcome, and a retry with the batch split into more accumulation
steps resumes the same training (``training.kubernetes.on_oom.reduce_batch``), with real torchrun ranks.

A real CUDA OOM cannot happen on a CPU-only machine: ``fault_injection.cuda_oom_at_step`` raises the
``torch.cuda.OutOfMemoryError`` a real one raises, in the forward pass of a micro-batch larger than
``oom_above_batch_size`` (so the split batch of the retry fits, as it would on the GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainpipe_trainer.outcomes import CUDA_OOM_EXIT_CODE
from trainpipe_trainer.resume import resume_identity

from .helpers import BINARY_FEATURES, Datasets, Launch, committed_steps, start

pytestmark = pytest.mark.integration


def test_a_cuda_oom_exits_with_its_code_and_the_split_batch_retry_resumes_the_same_training(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    # Saved synchronously: an OOM does not wait for a save still in flight (a rank that did not fail may be
    # blocked in a collective with the failed one), so the retry resumes at the last save committed in the loop.
    common = {"train_data": datasets.binary_train, "features": BINARY_FEATURES, "checkpoint": {"async_save": False}}
    oom = {"cuda_oom_at_step": 6, "oom_above_batch_size": 16}
    config = make_config(tmp_path, **common, fault_injection=oom)
    # The launchers' torchrun wrapper: it passes the ranks' OOM code on (plain torchrun exits 1 for any failure).
    first = start(config, tmp_path, nproc=2, runner="trainpipe_trainer.elastic").wait(timeout=300)
    assert first.returncode == CUDA_OOM_EXIT_CODE, first.describe()
    assert "CUDA out of memory in step 6 (batch_size 32, gradient_accumulation_steps 1)" in first.stderr
    # Nothing of the failed step was committed; the retry resumes at the last checkpoint.
    assert committed_steps(tmp_path / "checkpoints") == [4]

    # The retry's config as the provider writes it after the OOM (trainpipe.kubernetes.tries): half the
    # batch, twice the accumulation; the same fault still armed, which the smaller micro-batch passes.
    retry = make_config(tmp_path, **common, batch_size=16, optimization={"gradient_accumulation_steps": 2},
                        fault_injection=oom)
    second = start(retry, tmp_path, nproc=2, runner="trainpipe_trainer.elastic").wait(timeout=300)
    assert second.returncode == 0, second.describe()
    assert "resumed from step 4" in second.stdout
    result, reference = second.result(), binary_run.result()
    # The same samples per optimizer step: as many steps, and the loss of the same training (the sums of two
    # half-batch means differ from one whole-batch mean only in rounding).
    assert result["global_step"] == reference["global_step"] == 18
    assert result["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-3)


def test_the_resume_guard_accepts_a_split_batch_and_nothing_else(
    tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    from trainpipe_trainer.config import TrainingConfig

    def identity(batch_size: int, accumulation: int):
        config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES,
                             batch_size=batch_size, optimization={"gradient_accumulation_steps": accumulation})
        return resume_identity(TrainingConfig.from_dict(config), world_size=2)

    assert identity(32, 1).differences(identity(16, 2)) == []
    # Fewer samples per step is another training: refused, naming what changed.
    assert identity(32, 1).differences(identity(16, 1)) == ["batch_size 32 -> 16"]
