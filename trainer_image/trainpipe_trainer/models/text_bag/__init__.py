"""The built-in family ``text_bag``: fastText-style text classification, with no pretrained weights.

Each text column's hashed word and bigram ids (``training.transforms: {<column>: {type: text}}``, tokenised
by the trainer's preprocessing, the same when serving raw text) are averaged by an ``EmbeddingBag``; the
averages and the other encoded columns feed a linear head, or an MLP head with ``hidden_layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.models.family import DataDescription, ModelFamily
from trainpipe_trainer.models.text_bag.params import validate_text_bag_params

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.config import ModelConfig


class TextBagFamily(ModelFamily):
    reads_token_ids = True

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return validate_text_bag_params(params)

    def build(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> nn.Module:
        from trainpipe_trainer.models.text_bag.network import TextBagNetwork

        return TextBagNetwork(data, embedding_dim=params["embedding_dim"], hidden_layers=params["hidden_layers"],
                              dropout=params["dropout"])
