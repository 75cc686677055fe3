"""The text_bag family under the harness: support tickets (subject and body text, a channel) trained under
torchrun with 2 CPU ranks, by DDP (multiclass) and DeepSpeed ZeRO-2 (binary); a rank killed after a commit
resumes to the uninterrupted run's weights; the logged model takes the raw text and scores as well as
TF-IDF + logistic regression on the same split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from .helpers import Launch, launch, resumes_to

pytestmark = pytest.mark.integration

FEATURES = ("subject", "body", "channel")
TRANSFORMS = [
    {"feature": "subject", "type": "text", "hash_buckets": 4096, "max_tokens": 16},
    {"feature": "body", "type": "text", "hash_buckets": 4096, "max_tokens": 96},
    {"feature": "channel", "type": "categorical"},
]
EPOCHS = 20
CHECKPOINT_EVERY = 20
# Issue 52: within 0.03 of a TF-IDF + logistic regression on the same split.
ACCURACY_TOLERANCE = 0.03


@dataclass(frozen=True)
class Tickets:
    train: Path
    holdout: Path
    binary_train: Path
    classes: tuple[str, ...]


@pytest.fixture(scope="module")
def tickets(tmp_path_factory: pytest.TempPathFactory) -> Tickets:
    from sklearn.model_selection import train_test_split

    from trainpipe.demo.synthetic import TICKET_QUEUES, generate_tickets

    frame = generate_tickets(rows=1_200, end=datetime(2026, 1, 1, tzinfo=UTC)).drop(columns="event_time")
    frame = frame.rename(columns={"queue": "label"})
    train, holdout = train_test_split(frame, test_size=0.3, random_state=0, stratify=frame["label"])
    root = tmp_path_factory.mktemp("tickets")
    paths = Tickets(train=root / "train.parquet", holdout=root / "holdout.parquet",
                    binary_train=root / "binary.parquet", classes=TICKET_QUEUES)
    train.reset_index(drop=True).to_parquet(paths.train)
    holdout.reset_index(drop=True).to_parquet(paths.holdout)
    train.assign(label=(train["label"] == "billing").astype("int64")).reset_index(drop=True).to_parquet(
        paths.binary_train)
    return paths


def _config(make_config: Callable[..., Any], workdir: Path, tickets: Tickets, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "task": "multiclass_classification", "label_classes": list(tickets.classes), "transforms": TRANSFORMS,
        "model": {"type": "text_bag", "params": {"embedding_dim": 16}}, "epochs": EPOCHS, "batch_size": 32,
        "learning_rate": 0.003, "checkpoint": {"every_n_steps": CHECKPOINT_EVERY}, **overrides}
    return make_config(workdir, train_data=tickets.train, features=FEATURES, **settings)


def _binary(make_config: Callable[..., Any], workdir: Path, tickets: Tickets, **overrides: Any) -> dict[str, Any]:
    config = _config(make_config, workdir, tickets, task="binary_classification", **overrides)
    del config["label_classes"]
    return {**config, "train_data_uri": str(tickets.binary_train)}


def _ok(run: Launch) -> dict[str, Any]:
    assert run.returncode == 0, run.describe()
    return run.result()


def _resumes_to(reference: Launch, config: dict[str, Any], workdir: Path) -> None:
    resumes_to(reference, config, workdir, checkpoint_every=CHECKPOINT_EVERY, step_delay_seconds=0.2)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, tickets: Tickets, make_config: Callable[..., Any]) -> Launch:
    """The uninterrupted reference: 2 ranks, strategy ddp, multiclass."""
    workdir = tmp_path_factory.mktemp("text-bag-ddp")
    return launch(_config(make_config, workdir, tickets), workdir, nproc=2)


def test_the_served_model_takes_raw_text_and_scores_as_well_as_tfidf_logistic_regression(
        ddp_run: Launch, tickets: Tickets, use_tracking: str) -> None:
    import mlflow
    from sklearn.compose import make_column_transformer
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    result = _ok(ddp_run)
    model = mlflow.pyfunc.load_model(result["model_uri"])
    holdout = pd.read_parquet(tickets.holdout)
    served = model.predict(holdout[list(FEATURES)])
    assert list(served.columns) == ["label", *(f"probability_{name}" for name in tickets.classes)]
    np.testing.assert_allclose(served.iloc[:, 1:].sum(axis=1), 1.0, rtol=1e-6)
    accuracy = float((served["label"] == holdout["label"]).mean())

    train = pd.read_parquet(tickets.train)
    words = {"ngram_range": (1, 2), "sublinear_tf": True}
    reference = make_pipeline(make_column_transformer(
        (TfidfVectorizer(**words), "subject"), (TfidfVectorizer(**words), "body"), (OneHotEncoder(), ["channel"])),
        LogisticRegression(max_iter=2000)).fit(train[list(FEATURES)], train["label"])
    reference_accuracy = float((reference.predict(holdout[list(FEATURES)]) == holdout["label"]).mean())
    print(f"tickets holdout accuracy: text_bag {accuracy:.4f}, TF-IDF + logistic regression {reference_accuracy:.4f}")
    assert accuracy >= reference_accuracy - ACCURACY_TOLERANCE, (accuracy, reference_accuracy)

    # A template in the text is words to the model, never evaluated: it scores as its words do.
    probe = pd.DataFrame({"subject": ["{{ var.value.secret }}", "var value secret"], "body": ["refund", "refund"],
                          "channel": ["email", "email"]})
    scored = model.predict(probe)
    np.testing.assert_array_equal(scored.iloc[0, 1:].to_numpy(), scored.iloc[1, 1:].to_numpy())


def test_the_run_records_the_text_bag_family(ddp_run: Launch, tracking: Any) -> None:
    from mlflow import MlflowClient

    run = MlflowClient(tracking.uri).get_run(_ok(ddp_run)["mlflow_run_id"])
    assert run.data.tags["trainpipe.model_family"] == "text_bag"
    assert run.data.tags["trainpipe.model_family_distribution"] == "trainpipe-trainer"
    assert run.data.metrics["validation_accuracy"] > 0.8


def test_a_rank_killed_after_a_commit_resumes_to_the_uninterrupted_weights(
        ddp_run: Launch, tmp_path: Path, tickets: Tickets, make_config: Callable[..., Any]) -> None:
    _resumes_to(ddp_run, _config(make_config, tmp_path, tickets), tmp_path)


def test_deepspeed_zero2_trains_binary_text_and_resumes_a_killed_run_bit_identically(
        tmp_path_factory: pytest.TempPathFactory, tickets: Tickets, make_config: Callable[..., Any]) -> None:
    pytest.importorskip("deepspeed", reason="pip install 'trainpipe-trainer[deepspeed]'")
    settings = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}
    reference_dir = tmp_path_factory.mktemp("text-bag-zero2")
    reference = launch(_binary(make_config, reference_dir, tickets, **settings), reference_dir, nproc=2)
    workdir = tmp_path_factory.mktemp("text-bag-zero2-killed")
    _resumes_to(reference, _binary(make_config, workdir, tickets, **settings), workdir)
