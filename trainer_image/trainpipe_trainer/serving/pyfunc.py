"""The MLflow pyfunc every served family shares: a scorer loaded from the model's artifacts, answering raw rows.

Imported only by the "models from code" files (``models/mlp/pyfunc_model.py``, ``models/torch_pyfunc_model.py``),
which MLflow executes when it loads a model: the trainer itself never imports MLflow here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

from trainpipe_trainer.errors import TrainerDataError


class Scorer(Protocol):
    def prediction(self, frame: pd.DataFrame) -> np.ndarray | pd.DataFrame: ...


class ScorerModel(PythonModel):
    def __init__(self, load_scorer: Callable[[dict[str, str]], Scorer]) -> None:
        self._load_scorer = load_scorer

    def load_context(self, context: Any) -> None:
        self._scorer = self._load_scorer(context.artifacts)

    # pd.DataFrame is a hint MLflow does not validate against: the logged signature stays in charge.
    # A multiclass model answers a DataFrame (the class, then a probability per class); the others an array.
    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> np.ndarray | pd.DataFrame:
        if not isinstance(model_input, pd.DataFrame):
            model_input = pd.DataFrame(model_input)
        try:
            return self._scorer.prediction(model_input)
        except TrainerDataError as err:
            # An MlflowException's message is what the scoring server answers (HTTP 400, "message"); any
            # other exception becomes its generic "unexpected error", our line only in the stack trace.
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None
