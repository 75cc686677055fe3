"""The MLflow pyfunc of a family served through torch, logged as "models from code" (nothing unpickled).

Nothing imports this module: ``set_model`` below must run only when MLflow loads the model.
"""

from __future__ import annotations

from mlflow.models import set_model

from trainpipe_trainer.models.torch_serving import TorchScorer
from trainpipe_trainer.serving.pyfunc import ScorerModel

set_model(ScorerModel(TorchScorer.from_artifacts))
