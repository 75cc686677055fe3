"""The MLflow pyfunc of the ``transformer`` family, logged as "models from code" (nothing unpickled).

Nothing imports this module: ``set_model`` below must run only when MLflow loads the model.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import set_model
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models.transformer.served import TransformerScorer


class TransformerModel(PythonModel):
    def load_context(self, context: Any) -> None:
        self._scorer = TransformerScorer.from_artifacts(context.artifacts)

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        if not isinstance(model_input, pd.DataFrame):
            model_input = pd.DataFrame(model_input)
        try:
            return self._scorer.prediction(model_input, params)
        except TrainerDataError as err:
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None


set_model(TransformerModel())
