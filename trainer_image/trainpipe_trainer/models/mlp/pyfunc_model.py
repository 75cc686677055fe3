"""The MLflow pyfunc, logged as "models from code": MLflow executes this file to build the model.

Logged as a file path instead of a pickled object, so loading the model unpickles nothing.
Nothing imports this module: ``set_model`` below must run only when MLflow loads the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models.mlp.scorer import MLPScorer


class TrainpipeMLPModel(PythonModel):
    def load_context(self, context: Any) -> None:
        self._scorer = MLPScorer.from_artifacts(context.artifacts)

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


set_model(TrainpipeMLPModel())
