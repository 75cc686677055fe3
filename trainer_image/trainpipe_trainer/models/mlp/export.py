"""The MLP family's served model: numpy weights, the fitted transforms as JSON, the pyfunc logged from code."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from torch import nn

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.models.mlp.network import linear_layers
from trainpipe_trainer.models.mlp.scorer import (
    PREPROCESSING_ARTIFACT,
    SERVING_FORMAT_VERSION,
    WEIGHTS_ARTIFACT,
    MLPScorer,
)
from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler
from trainpipe_trainer.serving.export import PACKAGE_DIR
from trainpipe_trainer.tracking.tracker import Tracker

# The pyfunc file sits beside this one; the whole trainer package travels with the model (code_paths).
MODEL_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
# What the served model imports besides MLflow (which adds its own pin): the scorer is numpy and pandas only.
SERVED_REQUIREMENTS = ("numpy", "pandas")


def write_serving_artifacts(
    model: nn.Module, *, transformer: FeatureTransformer, task: str, directory: str,
    target: TargetScaler | None = None, classes: tuple[str, ...] = (),
) -> dict[str, str]:
    """Weights as ``.npz``, the fitted feature transforms, target scale and (multiclass) classes as JSON:
    all the torch-free scorer needs."""
    arrays: dict[str, np.ndarray] = {}
    layers = []
    for index, linear in enumerate(linear_layers(model)):
        weight_key, bias_key = f"layer{index}.weight", f"layer{index}.bias"
        arrays[weight_key] = linear.weight.detach().cpu().numpy().astype(np.float64)
        arrays[bias_key] = linear.bias.detach().cpu().numpy().astype(np.float64)
        layers.append({"weight": weight_key, "bias": bias_key, "shape": list(linear.weight.shape)})
    weights_path = os.path.join(directory, "weights.npz")
    preprocessing_path = os.path.join(directory, "preprocessing.json")
    np.savez(weights_path, **arrays)
    meta = {
        "format_version": SERVING_FORMAT_VERSION,
        "task": task,
        "transforms": transformer.to_dict(),
        "target": target.to_dict() if target is not None else None,
        # Multiclass: the class of each output, in output order (the served probability columns).
        "classes": list(classes),
        # The model's input columns, for people reading the artifact (the scorer derives them).
        "inputs": list(transformer.output_names),
        "layers": layers,
    }
    with open(preprocessing_path, "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=2)
    return {WEIGHTS_ARTIFACT: weights_path, PREPROCESSING_ARTIFACT: preprocessing_path}


def log_pyfunc_model(
    model: nn.Module, *, transformer: FeatureTransformer, config: TrainingConfig, sample_frame: pd.DataFrame,
    tracker: Tracker, target: TargetScaler | None = None, classes: tuple[str, ...] = (),
) -> str:
    """Log the numpy pyfunc into the tracker's run; returns its ``models:/...`` URI. ``classes``: a
    multiclass model's, in output order (the config's, or the training file's when it names none)."""
    with tempfile.TemporaryDirectory(prefix="trainpipe-model-") as directory:
        artifacts = write_serving_artifacts(model, transformer=transformer, task=config.task, directory=directory,
                                            target=target, classes=classes or config.label_classes)
        # Score the sample with the scorer that will serve: the signature then describes real output.
        scorer = MLPScorer.from_artifacts(artifacts)
        return tracker.log_model(
            name=config.tracking.model_artifact_name,
            python_model=str(MODEL_CODE),
            artifacts=artifacts,
            code_paths=[str(PACKAGE_DIR)],
            pip_requirements=list(SERVED_REQUIREMENTS),
            sample_frame=sample_frame,
            prediction=scorer.prediction(sample_frame),
        )
