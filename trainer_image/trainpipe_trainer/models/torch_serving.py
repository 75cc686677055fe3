"""The served model of a family without an export of its own: the module rebuilt by its family, scored through
torch (``ModelFamily.export``'s default).

The artifacts are the module's weights (``weights.pt``, a plain state dict: loaded with ``weights_only``, so no
pickled code runs) and ``model.json``: the family and its parameters, the data description, the fitted
transforms, the target scale and the classes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from trainpipe_trainer.config import ModelConfig
from trainpipe_trainer.models.family import DataDescription
from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler
from trainpipe_trainer.serving.export import PACKAGE_DIR
from trainpipe_trainer.serving.outputs import scores_from_outputs, served_prediction

if TYPE_CHECKING:
    from torch import nn

    from trainpipe_trainer.models.family import ExportContext

# The pyfunc file sits beside this one (logged from code: nothing is unpickled when it loads).
MODEL_CODE = Path(__file__).resolve().with_name("torch_pyfunc_model.py")
TORCH_FORMAT_VERSION = 1
WEIGHTS_ARTIFACT = "weights"
MODEL_ARTIFACT = "model"


def write_torch_artifacts(module: nn.Module, *, params: dict[str, Any], context: ExportContext,
                          directory: str) -> dict[str, str]:
    from trainpipe_trainer.models import family_provenance

    config = context.config
    weights_path = os.path.join(directory, "weights.pt")
    model_path = os.path.join(directory, "model.json")
    torch.save({key: value.detach().cpu() for key, value in module.state_dict().items()}, weights_path)
    meta = {
        "format_version": TORCH_FORMAT_VERSION,
        "task": config.task,
        "model": {**asdict(config.model), "hidden_layers": list(config.model.hidden_layers)},
        "params": params,
        "family": family_provenance(config.model.type),
        "transforms": context.transformer.to_dict(),
        "target": context.target.to_dict() if context.target is not None else None,
        "classes": list(context.classes),
    }
    with open(model_path, "w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=2)
    return {WEIGHTS_ARTIFACT: weights_path, MODEL_ARTIFACT: model_path}


@dataclass(kw_only=True, slots=True)
class TorchScorer:
    task: str
    transformer: FeatureTransformer
    module: Any  # torch.nn.Module, in eval mode
    target: TargetScaler | None = None
    classes: tuple[str, ...] = ()

    @classmethod
    def from_artifacts(cls, artifacts: dict[str, str]) -> TorchScorer:
        from trainpipe_trainer.models import load_family

        with open(artifacts[MODEL_ARTIFACT], encoding="utf-8") as handle:
            meta = json.load(handle)
        if meta.get("format_version") != TORCH_FORMAT_VERSION:
            raise ValueError(f"{artifacts[MODEL_ARTIFACT]}: format {meta.get('format_version')!r}, this code reads "
                             f"{TORCH_FORMAT_VERSION}")
        model = ModelConfig(**{**meta["model"], "hidden_layers": tuple(meta["model"]["hidden_layers"])})
        transformer = FeatureTransformer.from_dict(meta["transforms"])
        classes = tuple(meta["classes"])
        description = DataDescription.of(meta["task"], transformer, classes)
        module = load_family(model.type).build(model, meta["params"], description)
        module.load_state_dict(torch.load(artifacts[WEIGHTS_ARTIFACT], weights_only=True))
        module.eval()
        return cls(task=meta["task"], transformer=transformer, module=module,
                   target=TargetScaler.from_dict(meta.get("target")), classes=classes)

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        inputs = torch.from_numpy(self.transformer.transform_float32(frame, source="model input"))
        with torch.no_grad():
            outputs = self.module(inputs).double().numpy()
        return scores_from_outputs(self.task, outputs.reshape(len(frame), -1), target=self.target)

    def prediction(self, frame: pd.DataFrame) -> np.ndarray | pd.DataFrame:
        return served_prediction(self.task, self.score(frame), classes=self.classes, index=frame.index)


def log_torch_model(module: nn.Module, *, params: dict[str, Any], context: ExportContext) -> str:
    """Log ``module`` as a pyfunc that rebuilds it with its family and scores through torch; returns its URI.

    The family's distribution (name and version) is a requirement of the served model, beside torch: it must
    be installed where the model is served, as where it was trained."""
    from trainpipe_trainer.models import family_provenance

    config = context.config
    provenance = family_provenance(config.model.type)
    requirements = ["numpy", "pandas", f"torch=={torch.__version__.split('+')[0]}"]
    if provenance["distribution"] and provenance["distribution"] != "trainpipe-trainer":
        requirements.append(f"{provenance['distribution']}=={provenance['version']}")
    with tempfile.TemporaryDirectory(prefix="trainpipe-model-") as directory:
        artifacts = write_torch_artifacts(module, params=params, context=context, directory=directory)
        scorer = TorchScorer.from_artifacts(artifacts)
        return context.tracker.log_model(
            name=config.tracking.model_artifact_name,
            python_model=str(MODEL_CODE),
            artifacts=artifacts,
            code_paths=[str(PACKAGE_DIR)],
            pip_requirements=requirements,
            sample_frame=context.sample_frame,
            prediction=scorer.prediction(context.sample_frame),
        )
