"""The built-in family ``transformer``: a Hugging Face model fine-tuned from pretrained weights.

``model.pretrained_uri`` names a folder ``save_pretrained`` wrote (weights and tokenizer). The trainer tokenises
each split once with that tokenizer (``text_tokenizer``: ids + 1 of a text's first ``max_length`` tokens, 0
pads; for causal_lm one sequence per row, prompt then completion, targets -1 where not trained on); the module
is ``AutoModelForSequenceClassification`` (binary: one score, multiclass: one logit per class, regression: one
value; several text columns are encoded to ``max_length`` each and read as one sequence, each column's tokens
in feature order) or ``AutoModelForCausalLM``; ``trainable`` trains all weights, the head only, or LoRA adapters
(peft). The harness keeps the loop, precision, DDP/DeepSpeed, checkpoints and resume; the served model is the
family's own (``export``): the fine-tuned folder and a pyfunc that takes the raw text.

Importable without transformers installed: it is imported where it is used, with an install hint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.models.family import DataDescription, ExportContext, LossFn, ModelFamily
from trainpipe_trainer.models.transformer.params import validate_transformer_params
from trainpipe_trainer.outcomes import PRETRAINED_SHA256_TAG, PRETRAINED_URI_TAG

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.config import ModelConfig
    from trainpipe_trainer.models.transformer.tokenizing import PretrainedTokenizer



class TransformerFamily(ModelFamily):
    reads_token_ids = True

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return validate_transformer_params(params)

    def text_tokenizer(self, model: ModelConfig, params: dict[str, Any], *,
                       storage_options: Mapping[str, Any]) -> PretrainedTokenizer:
        from trainpipe_trainer.models.transformer.pretrained import pretrained_folder
        from trainpipe_trainer.models.transformer.tokenizing import PretrainedTokenizer

        folder = pretrained_folder(model.pretrained_uri, storage_options)
        return PretrainedTokenizer.load(folder.path, max_length=params["max_length"], uri=folder.uri,
                                        sha256=folder.sha256)

    def run_tags(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> dict[str, str]:
        tokenizer = data.text_tokenizer
        if tokenizer is None:
            return {}
        return {PRETRAINED_URI_TAG: tokenizer.uri, PRETRAINED_SHA256_TAG: tokenizer.sha256}

    def build(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> nn.Module:
        from trainpipe_trainer.errors import TrainerInputError
        from trainpipe_trainer.models.transformer.network import build_network

        tokenizer = data.text_tokenizer
        folder = getattr(tokenizer, "folder", None)
        if folder is None:
            raise TrainerInputError("transforms: the transformer family reads text columns (transforms: "
                                    "{<column>: {type: text}}) tokenised by its pretrained folder's tokenizer")
        return build_network(str(folder), params, data)

    def loss(self, task: str) -> LossFn | None:
        if task == "causal_lm":
            from trainpipe_trainer.losses import token_cross_entropy_loss

            return token_cross_entropy_loss
        return None

    def export(self, module: nn.Module, params: dict[str, Any], context: ExportContext) -> str | None:
        from trainpipe_trainer.models.transformer.export import log_transformer_model

        return log_transformer_model(module, params=params, context=context)
