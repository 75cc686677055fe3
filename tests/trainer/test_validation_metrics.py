"""The metrics a trainer computes at each evaluation point, against scikit-learn on the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, mean_absolute_error, mean_squared_error, roc_auc_score

from trainpipe_trainer.config import CHECKPOINT_METRICS
from trainpipe_trainer.validation_metrics import roc_auc, task_metrics


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 500).astype(np.float32)
    # Rounded scores: many ties, which count half (sklearn's convention).
    scores = np.round(rng.normal(labels, 1.0), 1).astype(np.float32)
    assert roc_auc(torch.from_numpy(scores), torch.from_numpy(labels)) == pytest.approx(roc_auc_score(labels, scores))


def test_auc_is_undefined_on_one_class_and_left_out():
    scores, labels = torch.tensor([0.1, 0.7, -2.0]), torch.zeros(3)
    assert roc_auc(scores, labels) is None
    assert set(task_metrics("binary_classification", scores, labels)) == {"validation_accuracy"}


def test_binary_metrics_from_logits():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 0.2])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0])
    found = task_metrics("binary_classification", logits, labels)
    assert found["validation_accuracy"] == pytest.approx(accuracy_score(labels.numpy(), (logits > 0).numpy()))
    assert found["validation_auc"] == pytest.approx(roc_auc_score(labels.numpy(), logits.numpy()))


def test_regression_metrics():
    predictions, labels = torch.tensor([1.0, 2.5, -1.0, 4.0]), torch.tensor([1.5, 2.0, 0.0, 4.0])
    found = task_metrics("regression", predictions, labels)
    assert found["validation_rmse"] == pytest.approx(mean_squared_error(labels, predictions) ** 0.5)
    assert found["validation_mae"] == pytest.approx(mean_absolute_error(labels, predictions))


@pytest.mark.parametrize("task", sorted(CHECKPOINT_METRICS))
def test_every_metric_computed_is_in_the_contract_table(task):
    scores, labels = torch.tensor([0.3, -0.2, 1.0, -1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    computed = {"validation_loss", *task_metrics(task, scores, labels)}
    assert computed == set(CHECKPOINT_METRICS[task])
