"""The MLP family's MLflow pyfunc, logged as "models from code": MLflow executes this file to build the model.

Logged as a file path instead of a pickled object, so loading the model unpickles nothing.
Nothing imports this module: ``set_model`` below must run only when MLflow loads the model.
"""

from __future__ import annotations

from mlflow.models import set_model

from trainpipe_trainer.models.mlp.scorer import MLPScorer
from trainpipe_trainer.serving.pyfunc import ScorerModel

set_model(ScorerModel(MLPScorer.from_artifacts))
