"""The trainer end to end: real torchrun processes, real DCP checkpoints, real MLflow (sqlite).

Six launches in all, shared through fixtures (``binary_run`` is in conftest); each costs a few
seconds of imports.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from .helpers import BINARY_FEATURES, RANKING_FEATURES, Datasets, Launch, Tracking, committed_steps, launch

pytestmark = pytest.mark.integration

SHA_LINE = re.compile(r"^weights sha256: ([0-9a-f]{64})$", re.MULTILINE)


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    result = run.result()
    # The sha line is the last thing rank 0 prints, and it matches result.json.
    assert run.stdout.strip().splitlines()[-1] == f"weights sha256: {result['weights_sha256']}"
    return result


def _best(root: Path) -> int:
    return json.loads((root / "best.json").read_text())["step"]


@pytest.fixture(scope="module")
def binary_rerun(
    tmp_path_factory: pytest.TempPathFactory, datasets: Datasets, make_config: Callable[..., Any]
) -> Launch:
    """The same training with another checkpoint cadence (every 3 steps, all kept), its own run."""
    workdir = tmp_path_factory.mktemp("binary_rerun")
    config = make_config(
        workdir,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 3, "keep_last": 10},
    )
    return launch(config, workdir, nproc=2)


def test_binary_classification_on_two_ranks(
    binary_run: Launch, datasets: Datasets, tracking: Tracking, use_tracking: str
) -> None:
    import mlflow
    from mlflow import MlflowClient
    from sklearn.metrics import roc_auc_score

    result = _ok(binary_run)
    assert result["world_size"] == 2
    # 600 rows - 60 held out for validation = 540; / 2 ranks / 32 per batch = 9 batches; 2 epochs.
    assert result["global_step"] == 18
    assert result["resumed_from_step"] is None
    assert result["model_uri"].startswith("models:/m-")
    assert "step 18/18 epoch 2/2 loss " in binary_run.stdout

    client = MlflowClient(tracking.uri)
    run = client.get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2"
    assert run.data.params["features_count"] == "4"
    assert run.data.params["train_rows"] == "540"
    assert run.data.params["validation_rows"] == "60"
    assert run.data.params["steps_per_epoch"] == "9"
    assert run.data.tags["dag_id"] == "trainer_tests"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in history] == list(range(2, 19, 2))
    assert len(client.get_metric_history(run.info.run_id, "epoch_loss")) == 2
    assert [m.step for m in client.get_metric_history(run.info.run_id, "learning_rate")] == list(range(2, 19, 2))
    # Every checkpoint: its validation loss and how long the loop was blocked.
    assert [m.step for m in client.get_metric_history(run.info.run_id, "validation_loss")] == [4, 8, 12, 16, 18]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "checkpoint_blocked_ms")] == [4, 8, 12, 16, 18]
    # The task's metrics at the same evaluation points (a study may tune on them).
    for name in ("validation_auc", "validation_accuracy"):
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == [4, 8, 12, 16, 18]
        assert all(0 <= m.value <= 1 for m in history)
    assert max(m.value for m in client.get_metric_history(run.info.run_id, "validation_auc")) > 0.7
    assert run.data.metrics["trainer_cpu_hours"] > 0

    # every_n_steps=4 saved 4, 8, 12, 16 and the end (18); keep_last=2 leaves the newest two plus the best.
    root = binary_run.workdir / "checkpoints"
    best = _best(root)
    assert run.data.tags["best_checkpoint_step"] == str(best)
    assert committed_steps(root) == sorted({16, 18, best})
    losses = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "validation_loss")}
    assert losses[best] == min(losses[s] for s in committed_steps(root))

    model = mlflow.pyfunc.load_model(result["model_uri"])
    holdout = pd.read_parquet(datasets.binary_holdout)
    scores = model.predict(holdout[list(BINARY_FEATURES)])
    assert scores.shape == (len(holdout),)
    assert ((scores >= 0) & (scores <= 1)).all()
    assert roc_auc_score(holdout["label"], scores) > 0.75


def test_same_seed_gives_the_same_weights(binary_run: Launch, binary_rerun: Launch) -> None:
    assert _ok(binary_rerun)["weights_sha256"] == _ok(binary_run)["weights_sha256"]


def test_another_seed_gives_other_weights(
    binary_run: Launch, tmp_path: Path, datasets: Datasets, make_config: Callable[..., Any]
) -> None:
    config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES, seed=1)
    assert _ok(launch(config, tmp_path, nproc=2))["weights_sha256"] != _ok(binary_run)["weights_sha256"]


def test_resume_mid_epoch_is_bit_identical_and_ignores_uncommitted_steps(
    binary_run: Launch,
    binary_rerun: Launch,
    tmp_path: Path,
    datasets: Datasets,
    tracking: Tracking,
    make_config: Callable[..., Any],
) -> None:
    from mlflow import MlflowClient

    _ok(binary_rerun)
    # Simulate a run killed while committing step 15: copy its checkpoints, un-commit 15 and 18.
    root = tmp_path / "checkpoints"
    shutil.copytree(binary_rerun.workdir / "checkpoints", root)
    (root / "best.json").unlink()
    for step in (15, 18):
        (root / f"step-{step}" / "manifest.json").unlink()
    (root / "step-999").mkdir()
    (root / "step-999" / "__0_0.distcp").write_bytes(b"torn write")
    assert committed_steps(root) == [3, 6, 9, 12]

    config = make_config(
        tmp_path,
        train_data=datasets.binary_train,
        features=BINARY_FEATURES,
        checkpoint={"every_n_steps": 3, "keep_last": 2},
    )
    resumed = launch(config, tmp_path, nproc=2)
    result = _ok(resumed)
    assert "resumed from step 12" in resumed.stdout
    assert "removed interrupted saves (no manifest): step-15, step-18, step-999" in resumed.stdout
    # Step 12 is batch 3 of epoch 2: the first line printed is the next logging step.
    assert "step 12/" not in resumed.stdout and "step 14/18 epoch 2/2" in resumed.stdout
    assert result["resumed_from_step"] == 12
    assert result["global_step"] == 18
    assert result["weights_sha256"] == _ok(binary_run)["weights_sha256"]
    tags = MlflowClient(tracking.uri).get_run(result["mlflow_run_id"]).data.tags
    assert tags["resumed_from_step"] == "12"
    # keep_last=2 plus the checkpoint resumed from plus the best; the torn dirs are gone.
    assert committed_steps(root) == sorted({12, 15, 18, _best(root)})
    assert not (root / "step-999").exists()


def test_listwise_ranking_on_two_ranks(
    tmp_path: Path, datasets: Datasets, use_tracking: str, make_config: Callable[..., Any]
) -> None:
    import mlflow
    from sklearn.metrics import ndcg_score

    config = make_config(
        tmp_path,
        task="ranking",
        group_column="qid",
        train_data=datasets.ranking_train,
        features=RANKING_FEATURES,
        model={"ranking_loss": "listwise", "dropout": 0.0},
        epochs=6,
        batch_size=4,  # queries per batch for listwise
        learning_rate=0.02,
    )
    result = _ok(launch(config, tmp_path, nproc=2))
    assert result["world_size"] == 2
    # 30 queries - 3 held out = 27; / 2 ranks = 14 (padded), 4 per batch = 4 batches; 6 epochs.
    assert result["global_step"] == 24

    holdout = pd.read_parquet(datasets.ranking_holdout).sort_values(["qid"], kind="stable")
    scores = mlflow.pyfunc.load_model(result["model_uri"]).predict(holdout[list(RANKING_FEATURES)])
    relevance = holdout["label"].to_numpy().reshape(-1, 10)
    model_ndcg = ndcg_score(relevance, scores.reshape(-1, 10))
    rng = np.random.default_rng(0)
    random_ndcg = np.mean([ndcg_score(relevance, rng.random(relevance.shape)) for _ in range(20)])
    assert model_ndcg > random_ndcg + 0.1, (model_ndcg, random_ndcg)


def test_single_process_without_torchrun(
    tmp_path: Path, datasets: Datasets, use_tracking: str, tracking: Tracking, make_config: Callable[..., Any]
) -> None:
    """Plain ``python -m trainpipe_trainer``: world size 1, wall-clock checkpoints, regression."""
    import mlflow

    config = make_config(
        tmp_path,
        task="regression",
        train_data=datasets.regression_train,
        features=BINARY_FEATURES,
        model={"dropout": 0.0},
        epochs=6,
        learning_rate=0.02,
        checkpoint={"every_n_steps": None, "every_seconds": 0.05, "keep_last": 2},
        # Labels as they are: the loss and rmse are then in the same units (scaled targets:
        # tests/trainer/test_target_scaling.py).
        scale_target=False,
    )
    run = launch(config, tmp_path, nproc=None)
    result = _ok(run)
    assert result["world_size"] == 1
    # The log holds the trainer's lines, not MLflow's INFO chatter (a new experiment, the input example).
    assert " INFO mlflow" not in run.stdout + run.stderr, run.describe()
    assert result["global_step"] == 6 * 12  # 400 rows - 40 held out = 360 / 32 per batch = 12 batches
    assert committed_steps(tmp_path / "checkpoints")[-1] == result["global_step"]
    assert len(committed_steps(tmp_path / "checkpoints")) <= 2

    frame = pd.read_parquet(datasets.regression_train)
    predictions = mlflow.pyfunc.load_model(result["model_uri"]).predict(frame[list(BINARY_FEATURES)])
    assert np.corrcoef(predictions, frame["label"])[0, 1] > 0.9

    # Regression's evaluation points carry rmse and mae too; the loss is the mean squared error, so
    # rmse is its square root at every point.
    client = mlflow.MlflowClient(tracking.uri)
    losses = {m.step: m.value for m in client.get_metric_history(result["mlflow_run_id"], "validation_loss")}
    rmse = {m.step: m.value for m in client.get_metric_history(result["mlflow_run_id"], "validation_rmse")}
    mae = {m.step: m.value for m in client.get_metric_history(result["mlflow_run_id"], "validation_mae")}
    assert losses and rmse.keys() == mae.keys() == losses.keys()
    assert all(rmse[s] == pytest.approx(losses[s] ** 0.5, rel=1e-4) and 0 < mae[s] <= rmse[s] for s in losses)
