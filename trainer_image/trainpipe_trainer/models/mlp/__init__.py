"""The built-in family ``mlp``: a multilayer perceptron over the encoded features (``model.hidden_layers``,
``model.dropout``), served by a numpy forward pass (no torch where it is served)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainpipe_trainer.models.family import DataDescription, ExportContext, ModelFamily

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.config import ModelConfig


class MLPFamily(ModelFamily):
    # Its settings are the spec's model.hidden_layers and model.dropout (before families existed); model.params
    # stays empty (the default validate_params refuses any).

    def build(self, model: ModelConfig, params: dict[str, Any], data: DataDescription) -> nn.Module:
        from trainpipe_trainer.models.mlp.network import build_mlp

        return build_mlp(n_features=data.n_inputs, config=model, n_outputs=data.n_outputs)

    def export(self, module: nn.Module, params: dict[str, Any], context: ExportContext) -> str:
        from trainpipe_trainer.models.mlp.export import log_pyfunc_model

        return log_pyfunc_model(module, transformer=context.transformer, config=context.config,
                                sample_frame=context.sample_frame, target=context.target, tracker=context.tracker,
                                classes=context.classes)
