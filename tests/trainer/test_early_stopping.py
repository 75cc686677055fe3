"""Early stopping: judged on the validation split at epoch ends, the best epoch's weights are the model,
and a run stops (and resumes) at the same step with the same weights every time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from trainpipe_trainer.config import CheckpointConfig, EarlyStoppingConfig, TrainerConfigError, TrainingConfig
from trainpipe_trainer.resume import resume_identity

from .helpers import launch

pytestmark = pytest.mark.integration

FEATURES = tuple(f"x{i}" for i in range(8))


@pytest.fixture(scope="module")
def overfitting_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A weak signal in few rows and many noise features: a wide MLP soon fits the noise, and the
    validation loss turns up after a few epochs."""
    rng = np.random.default_rng(7)
    n = 240
    frame = pd.DataFrame(rng.normal(size=(n, len(FEATURES))), columns=list(FEATURES))
    frame["label"] = 0.5 * frame["x0"] + rng.normal(0, 1.0, n)
    path = tmp_path_factory.mktemp("es") / "train.parquet"
    frame.to_parquet(path)
    return path


def _config(make_config: Callable[..., dict[str, Any]], workdir: Path, data: Path, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = dict(
        task="regression", model={"hidden_layers": [64, 64], "dropout": 0.0}, epochs=40, batch_size=16,
        learning_rate=0.01, checkpoint={"every_n_steps": 7, "keep_last": 2, "validation_fraction": 0.25},
        early_stopping={"metric": "validation_loss", "patience": 2, "min_delta": 0.0},
    )
    values.update(overrides)
    return make_config(workdir, train_data=data, features=FEATURES, **values)


def _early_stopping_tag(run_id: str, tracking_uri: str) -> dict[str, Any]:
    from mlflow import MlflowClient

    return json.loads(MlflowClient(tracking_uri).get_run(run_id).data.tags["trainpipe.early_stopping"])


def test_stops_keeps_the_best_epoch_and_reproduces_bit_identically(
    tmp_path: Path, overfitting_data: Path, make_config: Callable[..., dict[str, Any]], tracking: Any
) -> None:
    first = launch(_config(make_config, tmp_path / "a", overfitting_data), tmp_path / "a", nproc=None)
    assert first.returncode == 0, first.describe()
    tag = _early_stopping_tag(first.result()["mlflow_run_id"], tracking.uri)
    assert tag["stopped"] and tag["epochs_trained"] < 40
    assert tag["epochs_trained"] == tag["best_epoch"] + 2  # patience 2: two epochs without improvement
    assert (f"early stopping after epoch {tag['epochs_trained']} of 40 (step {first.result()['global_step']}): "
            f"validation_loss has not improved by more than 0 for 2 epoch(s); the model is the weights of epoch "
            f"{tag['best_epoch']} (step {tag['best_step']}") in first.stdout

    # The model is the best epoch's weights: exactly what training for best_epoch epochs alone gives
    # (a constant learning rate, and judging an epoch draws no random number).
    short = _config(make_config, tmp_path / "b", overfitting_data, epochs=tag["best_epoch"], early_stopping=None)
    best_only = launch(short, tmp_path / "b", nproc=None)
    assert best_only.returncode == 0, best_only.describe()
    assert best_only.result()["weights_sha256"] == first.result()["weights_sha256"]
    # Its last line is the hash, once.
    assert first.stdout.count("weights sha256:") == 1

    # The same run again: the same stop and the same weights.
    again = launch(_config(make_config, tmp_path / "c", overfitting_data), tmp_path / "c", nproc=None)
    assert (again.result()["global_step"], again.result()["weights_sha256"]) == (
        first.result()["global_step"], first.result()["weights_sha256"])

    # Crash after a checkpoint past the best epoch, then resume: the state (best value, patience count,
    # best weights) comes back from the checkpoint, so it stops at the same step with the same model.
    crash_step = tag["best_step"] + 3
    crashed = launch(_config(make_config, tmp_path / "d", overfitting_data,
                             fault_injection={"crash_after_step": crash_step}), tmp_path / "d", nproc=None)
    assert crashed.returncode == 3, crashed.describe()
    resumed = launch(_config(make_config, tmp_path / "d", overfitting_data), tmp_path / "d", nproc=None)
    assert resumed.returncode == 0, resumed.describe()
    assert f"resumed from step {crash_step}" in resumed.stdout
    assert (resumed.result()["global_step"], resumed.result()["weights_sha256"]) == (
        first.result()["global_step"], first.result()["weights_sha256"])


def test_early_stopping_needs_a_validation_split_and_is_in_the_resume_identity(tmp_path: Path) -> None:
    base = dict(pipeline_id="p", task="regression", train_data_uri="t.parquet", features=("a",), label="y",
                output_uri="o")
    with pytest.raises(TrainerConfigError, match=r"early_stopping: needs a validation split \(checkpoint.keep_best"):
        TrainingConfig(**base, checkpoint=CheckpointConfig(root_uri="r", keep_best=False),
                       early_stopping=EarlyStoppingConfig())
    on = TrainingConfig(**base, checkpoint=CheckpointConfig(root_uri="r"), early_stopping=EarlyStoppingConfig())
    off = TrainingConfig(**base, checkpoint=CheckpointConfig(root_uri="r"))
    changes = resume_identity(on, world_size=1).differences(resume_identity(off, world_size=1))
    assert changes == ["early_stopping.metric \"validation_loss\" -> null", "early_stopping.min_delta 0.0 -> null",
                       "early_stopping.patience 3 -> null"]


def test_a_metric_that_rises_keeps_its_highest_epoch(
    tmp_path: Path, overfitting_data: Path, make_config: Callable[..., dict[str, Any]], tracking: Any
) -> None:
    from mlflow import MlflowClient

    # The same weak signal as a yes/no label: the validation AUC climbs, then falls as the noise is fitted.
    frame = pd.read_parquet(overfitting_data)
    frame["label"] = (frame["label"] > 0).astype("int64")
    data = tmp_path / "binary.parquet"
    frame.to_parquet(data)
    config = _config(make_config, tmp_path / "a", data, task="binary_classification",
                     early_stopping={"metric": "validation_auc", "patience": 2, "min_delta": 0.0})
    run = launch(config, tmp_path / "a", nproc=None)
    assert run.returncode == 0, run.describe()
    tag = _early_stopping_tag(run.result()["mlflow_run_id"], tracking.uri)
    history = MlflowClient(tracking.uri).get_metric_history(run.result()["mlflow_run_id"], "epoch_end_validation_auc")
    values = [point.value for point in sorted(history, key=lambda point: point.step)]
    assert tag["stopped"] and len(values) == tag["epochs_trained"] < 40
    # The kept epoch is the highest AUC (the first of equals), and the ones after it are no higher.
    assert tag["best_value"] == max(values) == values[tag["best_epoch"] - 1]
    assert all(value <= tag["best_value"] for value in values[tag["best_epoch"]:])
    assert "validation_auc has not improved by more than 0 for 2 epoch(s)" in run.stdout


def test_early_stopping_watches_only_what_the_task_computes() -> None:
    base = dict(pipeline_id="p", train_data_uri="t.parquet", features=("a",), label="y", output_uri="o",
                checkpoint=CheckpointConfig(root_uri="r"))
    TrainingConfig(**base, task="multiclass_classification",
                   early_stopping=EarlyStoppingConfig(metric="validation_macro_f1"))
    with pytest.raises(TrainerConfigError, match=r"early_stopping.metric: a regression trainer computes "
                                                  r"\['validation_loss', 'validation_mae', 'validation_rmse'\]"):
        TrainingConfig(**base, task="regression", early_stopping=EarlyStoppingConfig(metric="validation_auc"))
