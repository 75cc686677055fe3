"""The ``transformer`` module: a Hugging Face model read from the pretrained folder, fed the harness's ids.

The inputs are the harness's float matrix of token ids + 1 (0 pads); the module turns them into ``input_ids``
(the tokenizer's padding id at padded positions) and an ``attention_mask`` and returns the model's logits:
``[rows, n_outputs]`` for a classifier or regression, ``[rows, max_length, vocabulary]`` for causal_lm.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from trainpipe_trainer.errors import TrainerInputError
from trainpipe_trainer.models.family import DataDescription
from trainpipe_trainer.models.transformer.loading import quiet_transformers

TASKS = ("binary_classification", "multiclass_classification", "regression", "causal_lm")
CAUSAL_LM = "causal_lm"


class TransformerNetwork(nn.Module):
    def __init__(self, model: nn.Module, *, pad_token_id: int, causal: bool) -> None:
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id
        self.causal = causal

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        ids = inputs.long()
        present = ids > 0
        if not self.causal:
            # Several text columns: each column's tokens, then the next column's, then the padding (a stable
            # sort keeps the order), so positions count tokens and the last token is the last real one.
            order = torch.argsort((~present).to(torch.uint8), dim=-1, stable=True)
            ids, present = ids.gather(-1, order), present.gather(-1, order)
        # A row without tokens (a missing text) attends to its first position: attention over nothing is NaN.
        present[:, 0] |= ~present.any(dim=-1)
        input_ids = torch.where(present & (ids > 0), ids - 1, torch.full_like(ids, self.pad_token_id))
        return self.model(input_ids=input_ids, attention_mask=present.long()).logits


def build_network(folder: str, params: dict[str, Any], data: DataDescription) -> TransformerNetwork:
    """From the folder ``save_pretrained`` wrote; a new head (classification) from torch's generator, which the
    harness seeded: every rank builds the same weights."""
    if data.task not in TASKS:
        raise TrainerInputError(f"task: the transformer family trains {', '.join(TASKS)}, not {data.task}")
    tokenizer = data.text_tokenizer
    text = set(data.vocabularies)
    other = sorted({feature for feature in data.input_features if feature not in text})
    if other:
        raise TrainerInputError(f"features: the transformer family reads text columns only; declare "
                                f"{', '.join(map(repr, other))} as text (transforms: {{type: text}}) or remove them")
    causal = data.task == CAUSAL_LM
    with quiet_transformers() as transformers:
        if causal:
            model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        else:
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                folder, num_labels=data.n_outputs, dtype=torch.float32)
    config = model.config
    length = data.n_inputs
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions is not None and length > positions:
        raise TrainerInputError(f"model.params.max_length: {len(text)} text column(s) of "
                                f"{length // max(len(text), 1)} tokens are {length} positions, and the pretrained "
                                f"model has {positions}; lower max_length")
    # The served model continues a prompt of up to max_length tokens by max_new_tokens: said before training, not
    # at the export after it.
    if causal and positions is not None and length + params["max_new_tokens"] > positions:
        raise TrainerInputError(f"model.params: max_length ({length}) + max_new_tokens ({params['max_new_tokens']}) "
                                f"are more positions than the pretrained model has ({positions}); lower one of them")
    pad = config.pad_token_id
    if pad is None and tokenizer is not None:
        inner = getattr(tokenizer, "tokenizer", None)
        pad = getattr(inner, "pad_token_id", None)
        if pad is None:
            pad = getattr(inner, "eos_token_id", None)
    pad = int(pad) if pad is not None else 0
    # A classifier finds each row's last token by the padding id.
    config.pad_token_id = pad
    if causal:
        config.use_cache = False
    model = _trainable(model, params, causal=causal)
    if params["gradient_checkpointing"]:
        # Non-reentrant: works under DDP and with frozen inputs. transformers 5.24 renamed the method.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return TransformerNetwork(model, pad_token_id=pad, causal=causal)


def _trainable(model: Any, params: dict[str, Any], *, causal: bool) -> Any:
    trainable = params["trainable"]
    if trainable == "head":
        head = model.get_output_embeddings() if causal else None
        head_params = ({id(p) for p in head.parameters()} if head is not None else
                       {id(p) for p in model.parameters()} - {id(p) for p in model.base_model.parameters()})
        for parameter in model.parameters():
            parameter.requires_grad_(id(parameter) in head_params)
        return model
    if trainable == "lora":
        try:
            import peft
        except ImportError as err:
            raise TrainerInputError("model.params.trainable: lora needs peft: "
                                    "pip install 'trainpipe-trainer[transformers]'") from err
        lora = params["lora"]
        config = peft.LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                 target_modules=lora["target_modules"],
                                 task_type="CAUSAL_LM" if causal else "SEQ_CLS")
        with warnings.catch_warnings():
            # peft's notes on its own choices (GPT-2's Conv1D layers take fan_in_fan_out; a transformers
            # attribute renamed in v5), not the user's: a task log carries no foreign warnings.
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False", category=UserWarning)
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            return peft.get_peft_model(model, config)
    return model
