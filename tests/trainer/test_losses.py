"""trainpipe_trainer.losses: ListNet over padded query lists."""

from __future__ import annotations

import math

import torch

from trainpipe_trainer.losses import listnet_loss


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
