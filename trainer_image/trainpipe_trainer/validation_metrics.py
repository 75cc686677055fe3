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


def multiclass_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy, balanced accuracy and macro F1 of the argmax class, as scikit-learn defines them:
    balanced accuracy averages the recall of the classes the labels hold, macro F1 the F1 of the
    classes the labels or the predictions hold (a class in neither has no F1 to average)."""
    true = labels.flatten().long()
    if true.numel() == 0:
        return {}
    # One row of class logits per label (a single column is a one-class row).
    predicted = logits.reshape(true.numel(), -1).argmax(dim=-1)
    n_classes = max(int(predicted.max()), int(true.max())) + 1
    support = torch.bincount(true, minlength=n_classes).double()
    predicted_count = torch.bincount(predicted, minlength=n_classes).double()
    hits = torch.bincount(true[predicted == true], minlength=n_classes).double()
    present = support > 0
    seen = present | (predicted_count > 0)
    f1 = 2 * hits[seen] / (support[seen] + predicted_count[seen])
    return {
        "validation_accuracy": float(hits.sum() / true.numel()),
        "validation_balanced_accuracy": float((hits[present] / support[present]).mean()),
        "validation_macro_f1": float(f1.mean()),
    }


def task_metrics(task: str, scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """The task's metrics besides the loss (``CHECKPOINT_METRICS[task]``) from validation scores
    (logits for binary classification, ``[N, classes]`` logits for multiclass, predictions for
    regression, each target token's cross-entropy for causal_lm) and labels (class indices for multiclass,
    1 where the most probable token was the target for causal_lm); a metric that is undefined on this split
    (AUC on one class) is left out."""
    found: dict[str, float] = {}
    if task == "binary_classification":
        auc = roc_auc(scores, labels)
        if auc is not None:
            found["validation_auc"] = auc
        # A logit above 0 is a probability above 0.5.
        found["validation_accuracy"] = float(((scores > 0).double() == (labels > 0.5).double()).double().mean())
    elif task == "multiclass_classification":
        found.update(multiclass_metrics(scores, labels))
    elif task == "causal_lm":
        # Per target token: ``scores`` its cross-entropy, ``labels`` 1 where it was the most probable token.
        if scores.numel():
            found["validation_perplexity"] = math.exp(min(float(scores.double().mean()), 700.0))
            found["validation_token_accuracy"] = float(labels.double().mean())
    elif task == "regression":
        errors = (scores.double() - labels.double()).flatten()
        found["validation_rmse"] = math.sqrt(float((errors**2).mean()))
        found["validation_mae"] = float(errors.abs().mean())
    return found
