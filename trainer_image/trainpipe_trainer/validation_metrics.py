"""The metrics a trainer computes on its validation split at each evaluation point (each checkpoint).

Their names and directions are ``config.CHECKPOINT_METRICS`` (the contract): the provider checks a
spec's ``tuning.metric`` against that table, and a trial reports the one it tunes on. Plain torch on
the scores already computed for the validation loss, so an evaluation point costs no second pass.
"""

from __future__ import annotations

import math

import torch


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Area under the ROC curve (the Mann-Whitney U statistic, tied scores counted half), or None
    when the labels hold one class only (the AUC is undefined there)."""
    scores, positive = scores.double().flatten(), labels.flatten() > 0.5
    n_positive = int(positive.sum())
    n_negative = positive.numel() - n_positive
    if n_positive == 0 or n_negative == 0:
        return None
    ordered, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    last = torch.cumsum(counts, 0).double()  # 1-based rank of the last score of each tie group
    tied_rank = last - (counts.double() - 1) / 2  # the average rank of each tie group
    ranks = torch.empty_like(scores)
    ranks[order] = tied_rank[inverse]
    rank_sum = float(ranks[positive].sum())
    return (rank_sum - n_positive * (n_positive + 1) / 2) / (n_positive * n_negative)


def task_metrics(task: str, scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """The task's metrics besides the loss (``CHECKPOINT_METRICS[task]``) from validation scores
    (logits for binary classification, predictions for regression) and labels; a metric that is
    undefined on this split (AUC on one class) is left out."""
    found: dict[str, float] = {}
    if task == "binary_classification":
        auc = roc_auc(scores, labels)
        if auc is not None:
            found["validation_auc"] = auc
        # A logit above 0 is a probability above 0.5.
        found["validation_accuracy"] = float(((scores > 0).double() == (labels > 0.5).double()).double().mean())
    elif task == "regression":
        errors = (scores.double() - labels.double()).flatten()
        found["validation_rmse"] = math.sqrt(float((errors**2).mean()))
        found["validation_mae"] = float(errors.abs().mean())
    return found
