"""task multiclass_classification end to end: scikit-learn's wine table (3 classes, bundled, no download)
trained under torchrun with 2 CPU ranks, by DDP and by DeepSpeed ZeRO-2; under each, a rank killed after a
commit resumes to the uninterrupted run's weights; the logged model serves a class and a probability per class,
as accurately as a multinomial logistic regression on the same split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from .helpers import Launch, committed_steps, kill_a_rank_after_a_commit, launch

pytestmark = pytest.mark.integration

EPOCHS = 30
# Each rank's batch: the 112 rows trained on make 4 steps an epoch on 2 ranks (120 steps in all).
BATCH_SIZE = 16
CHECKPOINT_EVERY = 20
# How far the trained MLP's holdout accuracy may fall below (or rise above) the logistic regression's.
ACCURACY_TOLERANCE = 0.02


@dataclass(frozen=True)
class Wine:
    train: Path
    holdout: Path
    features: tuple[str, ...]
    classes: tuple[str, ...]


@pytest.fixture(scope="module")
def wine(tmp_path_factory: pytest.TempPathFactory) -> Wine:
    from sklearn.datasets import load_wine
    from sklearn.model_selection import train_test_split

    bunch = load_wine(as_frame=True)
    frame = bunch.frame.drop(columns="target")
    # The class names as text ("class_0" ...): the served label is the name, not its index.
    frame["label"] = np.asarray(bunch.target_names)[bunch.target]
    train, holdout = train_test_split(frame, test_size=0.3, random_state=0, stratify=frame["label"])
    root = tmp_path_factory.mktemp("wine")
    paths = Wine(train=root / "train.parquet", holdout=root / "holdout.parquet",
                 features=tuple(bunch.feature_names), classes=tuple(map(str, bunch.target_names)))
    train.reset_index(drop=True).to_parquet(paths.train)
    holdout.reset_index(drop=True).to_parquet(paths.holdout)
    return paths


def _config(make_config: Callable[..., Any], workdir: Path, wine: Wine, **overrides: Any) -> dict[str, Any]:
    settings = {"task": "multiclass_classification", "label_classes": list(wine.classes), "epochs": EPOCHS,
                "batch_size": BATCH_SIZE, "checkpoint": {"every_n_steps": CHECKPOINT_EVERY}, **overrides}
    config = make_config(workdir, train_data=wine.train, features=wine.features, **settings)
    # The model and learning rate a spec gets when it names none: nothing tuned for this table.
    del config["model"], config["learning_rate"]
    return config


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.result()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, wine: Wine, make_config: Callable[..., Any]) -> Launch:
    """The uninterrupted reference: 2 ranks, strategy ddp."""
    workdir = tmp_path_factory.mktemp("multiclass-ddp")
    return launch(_config(make_config, workdir, wine), workdir, nproc=2)


def test_ddp_trains_and_logs_the_multiclass_validation_metrics(ddp_run: Launch, tracking: Any) -> None:
    from mlflow import MlflowClient

    result = _ok(ddp_run)
    assert result["global_step"] == EPOCHS * 4
    run = MlflowClient(tracking.uri).get_run(result["mlflow_run_id"])
    metrics = run.data.metrics
    for name in ("validation_loss", "validation_accuracy", "validation_balanced_accuracy", "validation_macro_f1"):
        assert name in metrics, sorted(metrics)
    assert metrics["validation_accuracy"] > 0.9
    # The trainer records the family it trained as installed where it ran (a pod's own record on Kubernetes).
    from importlib.metadata import version

    assert run.data.tags["trainpipe.model_family"] == "mlp"
    assert run.data.tags["trainpipe.model_family_distribution"] == "trainpipe-trainer"
    assert run.data.tags["trainpipe.model_family_version"] == version("trainpipe-trainer")
    assert len(run.data.tags["trainpipe.model_family_sha256"]) == 64


def test_the_served_model_is_as_accurate_as_logistic_regression(ddp_run: Launch, wine: Wine, use_tracking: str) -> None:
    import mlflow
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = mlflow.pyfunc.load_model(_ok(ddp_run)["model_uri"])
    holdout = pd.read_parquet(wine.holdout)
    served = model.predict(holdout.drop(columns="label"))
    columns = ["label", *(f"probability_{name}" for name in wine.classes)]
    assert list(served.columns) == columns
    assert model.metadata.signature.outputs.input_names() == columns
    np.testing.assert_allclose(served.iloc[:, 1:].sum(axis=1), 1.0)
    mlp_accuracy = float((served["label"] == holdout["label"]).mean())

    train = pd.read_parquet(wine.train)
    features = list(wine.features)
    # lbfgs on three classes is the multinomial (softmax) model; standardised like the trainer's inputs.
    reference = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(train[features], train["label"])
    reference_accuracy = float((reference.predict(holdout[features]) == holdout["label"]).mean())
    print(f"wine holdout accuracy: trainer MLP {mlp_accuracy:.4f}, logistic regression {reference_accuracy:.4f}")
    assert abs(mlp_accuracy - reference_accuracy) <= ACCURACY_TOLERANCE, (mlp_accuracy, reference_accuracy)


def test_sigkill_of_one_rank_then_a_rerun_resumes_to_the_same_weights(
    ddp_run: Launch, tmp_path: Path, wine: Wine, make_config: Callable[..., Any]
) -> None:
    root = tmp_path / "checkpoints"
    config = _config(make_config, tmp_path, wine, fault_injection={"step_delay_seconds": 0.2})
    killed = kill_a_rank_after_a_commit(config, tmp_path)
    assert killed.returncode != 0
    assert not (tmp_path / "output" / "result.json").exists()
    resume_from = committed_steps(root)[-1]
    assert CHECKPOINT_EVERY <= resume_from < EPOCHS * 4

    config["fault_injection"] = None
    rerun = launch(config, tmp_path, nproc=2)
    result = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert result["weights_sha256"] == _ok(ddp_run)["weights_sha256"]


def test_deepspeed_zero2_trains_a_multiclass_model_and_resumes_a_killed_run_bit_identically(
    tmp_path_factory: pytest.TempPathFactory, wine: Wine, make_config: Callable[..., Any], use_tracking: str
) -> None:
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")
    import mlflow

    epochs = 10
    settings = {"epochs": epochs, "strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}
    reference_dir = tmp_path_factory.mktemp("multiclass-zero2")
    result = _ok(launch(_config(make_config, reference_dir, wine, **settings), reference_dir, nproc=2))
    assert result["global_step"] == epochs * 4
    # The engine's module (the exported one, gathered from the ZeRO shards) has an output per class.
    served = mlflow.pyfunc.load_model(result["model_uri"]).predict(
        pd.read_parquet(wine.holdout, columns=list(wine.features)).head(5))
    assert list(served.columns) == ["label", *(f"probability_{name}" for name in wine.classes)]
    assert set(served["label"]) <= set(wine.classes)

    workdir = tmp_path_factory.mktemp("multiclass-zero2-killed")
    config = _config(make_config, workdir, wine, **settings)
    killed = kill_a_rank_after_a_commit({**config, "fault_injection": {"step_delay_seconds": 0.2}}, workdir)
    assert killed.returncode != 0
    resume_from = committed_steps(workdir / "checkpoints")[-1]
    assert CHECKPOINT_EVERY <= resume_from < epochs * 4
    rerun = launch(config, workdir, nproc=2)
    resumed = _ok(rerun)
    assert f"resumed from step {resume_from}" in rerun.stdout
    assert resumed["weights_sha256"] == result["weights_sha256"]
