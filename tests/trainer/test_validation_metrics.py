"""The metrics a trainer computes at each evaluation point, against scikit-learn on the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    f1_score,
    mean_absolute_error,
    mean_squared_error,
    roc_auc_score,
)

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


def _logits_predicting(classes: list[int], n_classes: int) -> torch.Tensor:
    logits = torch.zeros(len(classes), n_classes)
    logits[torch.arange(len(classes)), torch.tensor(classes)] = 1.0
    return logits


def test_multiclass_metrics_of_the_argmax_class_by_hand() -> None:
    labels = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 2.0])
    found = task_metrics("multiclass_classification", _logits_predicting([0, 0, 1, 1, 2, 2], 3), labels)
    # Right: rows 0, 1, 3, 5. Recall per class: 2/3, 1/2, 1/1. F1 per class (2 tp / (true + predicted)):
    # 4/5, 2/4, 2/3.
    assert found == {
        "validation_accuracy": pytest.approx(4 / 6),
        "validation_balanced_accuracy": pytest.approx((2 / 3 + 1 / 2 + 1) / 3),
        "validation_macro_f1": pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3),
    }


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_multiclass_metrics_match_sklearn_when_a_class_is_only_predicted_or_absent() -> None:
    rng = np.random.default_rng(7)
    # Five outputs: class 3 is predicted but never true, class 4 neither (sklearn leaves both out of
    # balanced accuracy, and class 4 out of macro F1).
    labels = rng.integers(0, 3, 200)
    predicted = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 4, 200))
    found = task_metrics("multiclass_classification", _logits_predicting(predicted.tolist(), 5),
                         torch.from_numpy(labels).double())
    assert found["validation_accuracy"] == pytest.approx(accuracy_score(labels, predicted))
    assert found["validation_balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, predicted))
    assert found["validation_macro_f1"] == pytest.approx(f1_score(labels, predicted, average="macro"))


@pytest.mark.parametrize("task", sorted(CHECKPOINT_METRICS))
def test_every_metric_computed_is_in_the_contract_table(task):
    scores, labels = torch.tensor([0.3, -0.2, 1.0, -1.0]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    computed = {"validation_loss", *task_metrics(task, scores, labels)}
    assert computed == set(CHECKPOINT_METRICS[task])
