"""The two-tower network: ``[..., n_inputs]`` float32 -> ``[..., 1]``, for any leading dimensions (ranking's
``[queries, documents]`` too)."""

from __future__ import annotations

import torch
from torch import nn


def tower(n_inputs: int, hidden: int, embedding_dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_inputs, hidden), nn.ReLU(), nn.Linear(hidden, embedding_dim))


class TwoTower(nn.Module):
    def __init__(self, *, user_inputs: list[int], item_inputs: list[int], embedding_dim: int,
                 tower_hidden: int) -> None:
        super().__init__()
        # Not persistent: the positions follow from the family's params, so they stay out of the checkpoints and
        # the weights hash, and still move to the module's device with it.
        self.register_buffer("user_inputs", torch.tensor(user_inputs, dtype=torch.long), persistent=False)
        self.register_buffer("item_inputs", torch.tensor(item_inputs, dtype=torch.long), persistent=False)
        self.user_tower = tower(len(user_inputs), tower_hidden, embedding_dim)
        self.item_tower = tower(len(item_inputs), tower_hidden, embedding_dim)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        user = self.user_tower(inputs.index_select(-1, self.user_inputs))
        item = self.item_tower(inputs.index_select(-1, self.item_inputs))
        return (user * item).sum(dim=-1, keepdim=True) + self.bias
