"""The model-family contract: what a family supplies, and what the harness keeps (ADR 0029).

A family builds a ``torch.nn.Module`` from its validated parameters and a description of the data. The
harness keeps everything else: the loop, backward and the optimizer step, precision, DDP and DeepSpeed
wrapping, checkpoints and resume, preemption, validation metrics and the evaluation predictions. A family
never calls backward or step and never wraps its module, so ``strategy: ddp | deepspeed`` stays a switch
of the spec for every family.

The inputs a module receives are the harness's: the feature columns after ``training.transforms`` (fitted
on the rows trained on, applied the same way when serving), as a float32 tensor ``[..., n_inputs]``. The
encoding is done once per split, deterministically, on the CPU: it is the family's collate, shared. A text
feature's inputs are token ids (whole numbers, 0 for padding; ``DataDescription.vocabularies``), given only to
a family with ``reads_token_ids``. A module
returns ``[..., n_outputs]`` (one score, or one logit per class for multiclass); for listwise ranking the
leading dimensions are ``[queries, documents]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.errors import TrainerInputError

if TYPE_CHECKING:
    import pandas as pd
    import torch
    from torch import nn

    from trainpipe_trainer.config import ModelConfig, TrainingConfig
    from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler, TextTokenizer
    from trainpipe_trainer.tracking.tracker import Tracker

# ``loss(scores, labels, mask)``; mask only for listwise ranking batches (trainpipe_trainer.losses).
LossFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]


class FamilyParamsError(TrainerInputError):
    """A family's parameter is missing, unknown or out of range; ``path`` is its place under ``model.params``."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"model.params.{path}: {message}" if path else f"model.params: {message}")


@dataclass(frozen=True, kw_only=True, slots=True)
class DataDescription:
    """What a family may know of the data when it builds its module (never the rows themselves)."""

    task: str
    # The model's inputs in order: a numeric feature's name (and ``<name>__missing`` for its indicator), a
    # categorical feature's ``<name>=<category>`` or ``<name>#<bucket>`` columns.
    input_names: tuple[str, ...]
    # The raw feature column each input comes from, in the same order.
    input_features: tuple[str, ...]
    # Multiclass: the class of each output, in output order; () for the other tasks.
    classes: tuple[str, ...] = ()
    # Each text feature's number of token ids (0 pads). Its inputs (``inputs_of``) hold ids, not numbers.
    vocabularies: Mapping[str, int] = field(default_factory=dict)
    # The family's own tokenizer the text columns were encoded with (``ModelFamily.text_tokenizer``), else None.
    text_tokenizer: TextTokenizer | None = None

    @classmethod
    def of(cls, task: str, transformer: FeatureTransformer, classes: tuple[str, ...] = ()) -> DataDescription:
        """The description of the inputs ``transformer`` makes."""
        return cls(task=task, input_names=transformer.output_names, input_features=transformer.output_features,
                   classes=classes, vocabularies=transformer.vocabularies, text_tokenizer=transformer.text_tokenizer)

    @property
    def n_inputs(self) -> int:
        return len(self.input_names)

    @property
    def n_outputs(self) -> int:
        return len(self.classes) if self.classes else 1

    def inputs_of(self, features: tuple[str, ...] | list[str]) -> list[int]:
        """The input positions that come from ``features`` (raw column names), in input order."""
        wanted = set(features)
        return [index for index, feature in enumerate(self.input_features) if feature in wanted]


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportContext:
    """What a family's export gets besides its module: the fitted transforms, the tracker of the run."""

    config: TrainingConfig
    transformer: FeatureTransformer
    target: TargetScaler | None
    classes: tuple[str, ...]
    sample_frame: pd.DataFrame
    tracker: Tracker


class ModelFamily:
    """Subclass, implement ``build``, and register the class under the ``trainpipe.models`` entry-point group
    (its entry-point name is the spec's ``model.type``). The rest has working defaults."""

    # Whether the module reads text columns' token ids (``DataDescription.vocabularies``); a family that does not
    # is never given a text column (it would take the ids for numbers).
    reads_token_ids: bool = False

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``model.params``, checked and with defaults filled, before any data is read; raise
        :class:`FamilyParamsError` naming the parameter. The default: a family without parameters."""
        if params:
            raise FamilyParamsError(next(iter(params)), "this model family takes no parameters; remove it")
        return {}

    def text_tokenizer(self, model: ModelConfig, params: dict[str, Any], *,
                       storage_options: Mapping[str, Any]) -> TextTokenizer | None:
        """The tokenizer of this family's text columns, used instead of the harness's hashed words: a text's inputs
        are the ids + 1 of its first ``max_length`` tokens (0 pads), and for causal_lm each row is one token
        sequence (``preprocessing.TextTokenizer``). Called once per process, before the data is encoded
        (``storage_options`` reads ``model.pretrained_uri``). None, the default: the harness's hashed words."""
        return None

    def run_tags(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> dict[str, str]:
        """Tags for the training run (what the weights started from, say), set by rank 0 after the build."""
        return {}

    def build(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> nn.Module:
        """The module, its weights initialised from torch's generator (the harness seeds it: every rank builds
        the same weights). ``params`` is what ``validate_params`` returned."""
        raise NotImplementedError

    def loss(self, task: str) -> LossFn | None:
        """A loss for ``task``, or None for the task's own (binary and softmax cross-entropy, MSE, ListNet)."""
        return None

    def export(self, module: nn.Module, params: dict[str, Any], context: ExportContext) -> str | None:
        """Log the served model into the run and return its ``models:/...`` URI, or None (the default): the
        harness then serves the module itself through torch (``models.torch_serving``), which needs the
        family's package installed where the model is served, as where it was trained."""
        return None
