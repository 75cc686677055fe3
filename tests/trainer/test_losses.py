"""trainpipe_trainer.losses: ListNet over padded query lists, softmax cross-entropy over classes."""

from __future__ import annotations

import math

import torch

from trainpipe_trainer.losses import cross_entropy_loss, listnet_loss


def _listnet_reference(scores: list[float], relevance: list[float]) -> float:
    target = [math.exp(r) for r in relevance]
    probs = [math.exp(s) for s in scores]
    return -sum(t / sum(target) * math.log(p / sum(probs)) for t, p in zip(target, probs, strict=True))


def test_listnet_matches_reference_and_ignores_padding() -> None:
    scores = torch.tensor([[0.5, -1.0, 2.0, 9.0], [1.0, 0.0, 7.0, -3.0]], requires_grad=True)
    relevance = torch.tensor([[2.0, 0.0, 1.0, 4.0], [0.0, 3.0, 4.0, 1.0]])
    # Query 0 has three documents, query 1 two; the rest is padding with arbitrary values.
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    loss = listnet_loss(scores, relevance, mask)
    expected = (_listnet_reference([0.5, -1.0, 2.0], [2.0, 0.0, 1.0]) + _listnet_reference([1.0, 0.0], [0.0, 3.0])) / 2
    assert math.isclose(loss.item(), expected, rel_tol=1e-5)
    loss.backward()
    assert scores.grad is not None
    assert torch.equal(scores.grad[~mask], torch.zeros(3))


def test_cross_entropy_is_the_mean_negative_log_softmax_of_the_true_class() -> None:
    logits = [[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, 4.0, 1.0]]
    classes = [0, 2, 0]
    expected = sum(-math.log(math.exp(row[label]) / sum(math.exp(v) for v in row))
                   for row, label in zip(logits, classes, strict=True)) / len(classes)
    loss = cross_entropy_loss(torch.tensor(logits), torch.tensor(classes, dtype=torch.int64))
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
