"""The ``text_bag`` module: each text column's token embeddings pooled, then a linear or MLP head.

The pool is the sum over a text's tokens divided by the square root of their number: a long text's vector
does not grow with its length (as a sum's would), nor are its few telling words drowned by the many common
ones (as in a mean); TF-IDF's l2 normalisation has the same effect. On 1,200 of the demo's tickets it scored
0.936 where the mean scored 0.922 (2**18 buckets; TF-IDF + logistic regression 0.950).
"""

from __future__ import annotations

import torch
from torch import nn

from trainpipe_trainer.models.family import DataDescription
from trainpipe_trainer.preprocessing import PAD_TOKEN_ID


class TextBagNetwork(nn.Module):
    def __init__(self, data: DataDescription, *, embedding_dim: int, hidden_layers: list[int], dropout: float) -> None:
        super().__init__()
        self.n_outputs = data.n_outputs
        # One table per text column: a column's words mean what they mean in it (a title is not a body).
        self.bags = nn.ModuleList()
        text_positions: list[list[int]] = []
        for feature, vocabulary in data.vocabularies.items():
            bag = nn.EmbeddingBag(vocabulary, embedding_dim, mode="sum", padding_idx=PAD_TOKEN_ID)
            # fastText's initialisation: small, so a text's vector starts near zero whatever its length.
            nn.init.uniform_(bag.weight, -1.0 / embedding_dim, 1.0 / embedding_dim)
            with torch.no_grad():
                bag.weight[PAD_TOKEN_ID].zero_()
            self.bags.append(bag)
            text_positions.append(data.inputs_of([feature]))
        text_inputs = {i for positions in text_positions for i in positions}
        other = [i for i in range(data.n_inputs) if i not in text_inputs]
        # Not persistent: they follow from the data description, so the state dict holds only weights.
        for index, positions in enumerate(text_positions):
            self.register_buffer(f"text_positions_{index}", torch.tensor(positions, dtype=torch.long), persistent=False)
        self.register_buffer("other_positions", torch.tensor(other, dtype=torch.long), persistent=False)
        layers: list[nn.Module] = []
        width = len(self.bags) * embedding_dim + len(other)
        for hidden in hidden_layers:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, self.n_outputs))
        self.head = nn.Sequential(*layers)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # Leading dimensions are rows, or [queries, documents] for listwise ranking.
        leading = inputs.shape[:-1]
        flat = inputs.reshape(-1, inputs.shape[-1])
        parts = []
        for index, bag in enumerate(self.bags):
            ids = flat.index_select(1, getattr(self, f"text_positions_{index}")).long()
            tokens = (ids != PAD_TOKEN_ID).sum(dim=1, keepdim=True).clamp(min=1).to(flat.dtype)
            parts.append(bag(ids) / tokens.sqrt())
        parts.append(flat.index_select(1, self.other_positions))
        return self.head(torch.cat(parts, dim=1)).reshape(*leading, self.n_outputs)
