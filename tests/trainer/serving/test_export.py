"""The model export skips MLflow's scan of every installed distribution (0.7 s of each launch) and still
logs the same requirements; the scan's map is left as it was, so a later inference in the process maps
every package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.utils import requirements_utils

from trainpipe_trainer.config import CheckpointConfig, ModelConfig, TrackingConfig, TrainingConfig
from trainpipe_trainer.model import build_mlp
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.serving.export import log_pyfunc_model


def test_export_logs_requirements_without_scanning_installed_distributions(
    tracking: Any, use_tracking: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[int] = []
    real_scan = requirements_utils.importlib_metadata.packages_distributions

    def counted_scan() -> Any:
        scans.append(1)
        return real_scan()

    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions", counted_scan)
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(20, 2)), columns=["a", "b"])
    config = TrainingConfig(pipeline_id="export", task="regression", train_data_uri="t.parquet", features=("a", "b"),
                            label="y", checkpoint=CheckpointConfig(root_uri="file:///unused"), output_uri="o",
                            tracking=TrackingConfig(tracking_uri=tracking.uri))
    transformer = FeatureTransformer.fit(frame, config.feature_transforms(), source="train")
    torch.manual_seed(0)
    model = build_mlp(n_features=transformer.width, config=ModelConfig(hidden_layers=(3,)))
    with mlflow.start_run(experiment_id=tracking.experiment_id):
        uri = log_pyfunc_model(model, transformer=transformer, config=config, sample_frame=frame.head(5))

    assert scans == []
    requirements = (Path(mlflow.artifacts.download_artifacts(uri)) / "requirements.txt").read_text().split()
    assert requirements == [f"mlflow=={mlflow.__version__}", "numpy", "pandas"]
    # Unset again: the next model logged with inferred requirements gets the whole map.
    assert requirements_utils._MODULES_TO_PACKAGES is None
    requirements_utils._init_modules_to_packages_map()
    assert scans == [1]
