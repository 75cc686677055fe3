"""The MLP family's served model: the trained MLP's forward pass in numpy.

Torch-free (and mlflow-free) on purpose: serving images and batch-scoring jobs score with only
numpy and pandas. The weights travel as an ``.npz`` artifact and the fitted feature transforms as
JSON (``preprocessing.FeatureTransformer``, the same code the trainer fitted and applied);
``pyfunc_model.py`` wraps this scorer as the MLflow pyfunc.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler
from trainpipe_trainer.serving.outputs import scores_from_outputs, served_prediction

# 4: a multiclass model's classes ("classes"); 3: a regression model's target scale ("target");
# 2: declared feature transforms ("transforms"); 1 (a standardizer only) is still read.
SERVING_FORMAT_VERSION = 4
_READABLE_FORMATS = (1, 2, 3, 4)
WEIGHTS_ARTIFACT = "weights"
PREPROCESSING_ARTIFACT = "preprocessing"


@dataclass(kw_only=True, slots=True, frozen=True)
class MLPScorer:
    """Feature transforms, then Linear -> ReLU ... -> Linear; sigmoid for binary classification, softmax
    over the classes for multiclass."""

    task: str
    transformer: FeatureTransformer
    # (weight [out, in], bias [out]) per Linear layer, input to output.
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    # Regression trained on the standardised label: the output is turned back into the label's units.
    target: TargetScaler | None = None
    # Multiclass: the class of each output, in output order; () for the other tasks (one output).
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        width = self.transformer.width
        for index, (weight, bias) in enumerate(self.layers):
            if weight.shape != (bias.shape[0], width):
                raise ValueError(f"layer {index}: weight shape {weight.shape} does not follow input width {width}")
            width = bias.shape[0]
        if self.task == "multiclass_classification":
            if width != len(self.classes):
                raise ValueError(f"the last layer must produce one score per class ({len(self.classes)}), "
                                 f"it produces {width}")
        elif width != 1:
            raise ValueError(f"the last layer must produce one score, it produces {width}")

    @classmethod
    def from_artifacts(cls, artifacts: dict[str, str]) -> MLPScorer:
        """From the local paths MLflow hands the pyfunc (``context.artifacts``)."""
        return cls.load(weights_path=artifacts[WEIGHTS_ARTIFACT], preprocessing_path=artifacts[PREPROCESSING_ARTIFACT])

    @classmethod
    def load(cls, *, weights_path: str, preprocessing_path: str) -> MLPScorer:
        with open(preprocessing_path, encoding="utf-8") as handle:
            meta = json.load(handle)
        if meta.get("format_version") not in _READABLE_FORMATS:
            raise ValueError(
                f"{preprocessing_path}: serving format {meta.get('format_version')!r}, this code reads "
                f"{', '.join(map(str, _READABLE_FORMATS))}"
            )
        with np.load(weights_path) as arrays:
            layers = tuple((arrays[layer["weight"]], arrays[layer["bias"]]) for layer in meta["layers"])
        transformer = (FeatureTransformer.from_dict(meta["transforms"]) if "transforms" in meta
                       else FeatureTransformer.from_standardizer(meta["standardizer"]))
        return cls(task=meta["task"], transformer=transformer, layers=layers,
                   target=TargetScaler.from_dict(meta.get("target")), classes=tuple(meta.get("classes", ())))

    def feature_matrix(self, frame: pd.DataFrame) -> np.ndarray:
        """The model's input matrix for raw feature rows: what training computed for the same rows."""
        return self.transformer.transform(frame, source="model input")

    def score(self, frame: pd.DataFrame) -> np.ndarray:
        """One score per row: P(label = 1) for binary, the prediction in the label's units for
        regression, the raw output for ranking; for multiclass a ``[rows, classes]`` matrix of class
        probabilities (columns in ``classes`` order)."""
        hidden = self.feature_matrix(frame)
        for weight, bias in self.layers[:-1]:
            hidden = np.maximum(hidden @ weight.T + bias, 0.0)
        weight, bias = self.layers[-1]
        return scores_from_outputs(self.task, hidden @ weight.T + bias, target=self.target)

    def prediction(self, frame: pd.DataFrame) -> np.ndarray | pd.DataFrame:
        """What the served model answers for ``frame`` (``serving.outputs.served_prediction``)."""
        return served_prediction(self.task, self.score(frame), classes=self.classes, index=frame.index)
