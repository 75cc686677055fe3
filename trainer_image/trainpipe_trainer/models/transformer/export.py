"""The ``transformer`` family's served model: the fine-tuned folder (``save_pretrained``, LoRA adapters merged,
with the tokenizer) and ``trainpipe.json``, logged with the pyfunc of ``pyfunc_model.py``."""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainpipe_trainer.models.transformer.loading import quiet_transformers
from trainpipe_trainer.models.transformer.network import CAUSAL_LM
from trainpipe_trainer.models.transformer.served import (
    DEFAULT_PARAMS,
    FORMAT_VERSION,
    META_ARTIFACT,
    MODEL_ARTIFACT,
    TransformerScorer,
)
from trainpipe_trainer.serving.export import PACKAGE_DIR

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.models.family import ExportContext

MODEL_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
# Rows of the sample the signature is inferred from: a causal LM generates for each.
SIGNATURE_ROWS = 3


def write_transformer_artifacts(module: nn.Module, *, params: dict[str, Any], context: ExportContext,
                                directory: str) -> dict[str, str]:
    config = context.config
    tokenizer = context.transformer.text_tokenizer
    model = module.model
    if params["trainable"] == "lora":
        # A plain model to serve: the adapters merged into a copy (the trained module keeps its weights hash).
        model = copy.deepcopy(model).merge_and_unload()
    folder = os.path.join(directory, "model")
    with quiet_transformers():
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.tokenizer.save_pretrained(folder)
    meta = {
        "format_version": FORMAT_VERSION,
        "task": config.task,
        "features": list(config.features),
        "label": config.label,
        "classes": list(context.classes),
        "target": context.target.to_dict() if context.target is not None else None,
        "max_length": params["max_length"],
        "max_new_tokens": params["max_new_tokens"],
        "trainable": params["trainable"],
        "pretrained": {"uri": tokenizer.uri, "sha256": tokenizer.sha256},
    }
    meta_path = os.path.join(directory, "trainpipe.json")
    with open(meta_path, "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=2)
    return {MODEL_ARTIFACT: folder, META_ARTIFACT: meta_path}


def served_requirements() -> list[str]:
    import tokenizers
    import transformers

    return ["numpy", "pandas", f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}",
            f"tokenizers=={tokenizers.__version__}", "safetensors"]


def log_transformer_model(module: nn.Module, *, params: dict[str, Any], context: ExportContext) -> str:
    """Log the served model into the run; its ``models:/`` URI."""
    config = context.config
    sample = context.sample_frame.head(SIGNATURE_ROWS)
    causal = config.task == CAUSAL_LM
    if causal and config.label:
        # The completion column is an optional input: read only by the token_loss score.
        sample = sample.assign(**{config.label: None})
    with tempfile.TemporaryDirectory(prefix="trainpipe-model-") as directory:
        artifacts = write_transformer_artifacts(module, params=params, context=context, directory=directory)
        scorer = TransformerScorer.from_artifacts(artifacts)
        return context.tracker.log_model(
            name=config.tracking.model_artifact_name,
            python_model=str(MODEL_CODE),
            artifacts=artifacts,
            code_paths=[str(PACKAGE_DIR)],
            pip_requirements=served_requirements(),
            sample_frame=sample,
            prediction=scorer.prediction(sample),
            **({"params": dict(DEFAULT_PARAMS)} if causal else {}),
        )
