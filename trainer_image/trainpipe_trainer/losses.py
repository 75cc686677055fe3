"""Loss per task: ``loss_fn(scores, labels, mask)``; mask is only set for listwise ranking batches."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.preprocessing import IGNORED_TARGET

LossFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def bce_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(scores, labels)


def cross_entropy_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax cross-entropy: ``scores`` are ``[N, classes]`` logits, ``labels`` the int64 class indices."""
    return F.cross_entropy(scores, labels)


def mse_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.mse_loss(scores, labels)


def listnet_loss(scores: torch.Tensor, relevance: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """ListNet (top-1): cross-entropy between softmax(relevance) and softmax(scores) per query.

    ``scores``/``relevance``/``mask`` are ``[queries, max_docs]``; padded documents (mask False)
    get zero probability on both sides and contribute nothing to the loss or the gradient.
    """
    if mask is None:
        raise ValueError("listnet_loss needs the padding mask of the query lists")
    lowest = torch.finfo(scores.dtype).min
    target = torch.softmax(relevance.masked_fill(~mask, lowest), dim=-1)
    log_probs = torch.log_softmax(scores.masked_fill(~mask, lowest), dim=-1)
    per_query = -(target * log_probs).masked_fill(~mask, 0.0).sum(dim=-1)
    return per_query.mean()


def token_cross_entropy_sums(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """causal_lm: the summed cross-entropy over the target tokens (``targets`` != ``IGNORED_TARGET``) of
    ``[rows, length, vocabulary]`` logits, and their number (float32 tensors)."""
    flat = targets.reshape(-1).long()
    total = F.cross_entropy(logits.reshape(flat.numel(), -1).float(), flat, ignore_index=IGNORED_TARGET,
                            reduction="sum")
    return total, (flat != IGNORED_TARGET).sum().to(total.dtype)


def token_cross_entropy_loss(scores: torch.Tensor, labels: torch.Tensor,
                             mask: torch.Tensor | None = None) -> torch.Tensor:
    """causal_lm: the mean cross-entropy over the batch's target tokens (0 for a batch without any, which then
    trains nothing: a mean over no tokens would be NaN and stop the run)."""
    total, count = token_cross_entropy_sums(scores, labels)
    return total / count.clamp(min=1)


def make_loss_fn(config: TrainingConfig) -> LossFn:
    if config.task == "causal_lm":
        return token_cross_entropy_loss
    if config.task == "binary_classification":
        return bce_loss
    if config.task == "multiclass_classification":
        return cross_entropy_loss
    if config.task == "ranking" and config.model.ranking_loss == "listwise":
        return listnet_loss
    # Regression, and pointwise ranking (regress the graded relevance).
    return mse_loss
