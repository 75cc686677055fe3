"""The model export skips MLflow's scan of every installed distribution (0.7 s of each launch) and still
logs the same requirements; the scan's map is left as it was, so a later inference in the process maps
every package. The export runs in MLflow's own process (``mlflow_process``): the scan is tested there
in-process through the same ``MlflowCalls``, and the whole path through the tracker."""

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
from trainpipe_trainer.models.mlp.export import (
    MODEL_CODE,
    SERVED_REQUIREMENTS,
    log_pyfunc_model,
    write_serving_artifacts,
)
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.models.mlp.scorer import MLPScorer
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.serving.export import PACKAGE_DIR
from trainpipe_trainer.tracking.mlflow_process import MlflowCalls
from trainpipe_trainer.tracking.tracker import Tracker

EXPECTED_REQUIREMENTS = [f"mlflow=={mlflow.__version__}", "numpy", "pandas"]


def _model(tracking: Any) -> tuple[torch.nn.Module, FeatureTransformer, TrainingConfig, pd.DataFrame]:
    frame = pd.DataFrame(np.random.default_rng(0).normal(size=(20, 2)), columns=["a", "b"])
    config = TrainingConfig(pipeline_id="export", task="regression", train_data_uri="t.parquet", features=("a", "b"),
                            label="y", checkpoint=CheckpointConfig(root_uri="file:///unused"), output_uri="o",
                            tracking=TrackingConfig(tracking_uri=tracking.uri, experiment_name=tracking.experiment_name))
    transformer = FeatureTransformer.fit(frame, config.feature_transforms(), source="train")
    torch.manual_seed(0)
    return build_mlp(n_features=transformer.width, config=ModelConfig(hidden_layers=(3,))), transformer, config, frame


def test_model_logging_keeps_requirements_without_scanning_installed_distributions(
    tracking: Any, use_tracking: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    scans: list[int] = []
    real_scan = requirements_utils.importlib_metadata.packages_distributions

    def counted_scan() -> Any:
        scans.append(1)
        return real_scan()

    monkeypatch.setattr(requirements_utils.importlib_metadata, "packages_distributions", counted_scan)
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)
    model, transformer, config, frame = _model(tracking)
    artifacts = write_serving_artifacts(model, transformer=transformer, task=config.task, directory=str(tmp_path))
    sample = frame.head(5)
    calls = MlflowCalls()
    run_id = calls.open_run(tracking.uri, tracking.experiment_name, None, ["trainer"])
    try:
        uri = calls.log_model(tracking.uri, run_id, name="model", python_model=str(MODEL_CODE), artifacts=artifacts,
                              code_paths=[str(PACKAGE_DIR)], pip_requirements=list(SERVED_REQUIREMENTS),
                              sample_frame=sample, prediction=MLPScorer.from_artifacts(artifacts).score(sample))
    finally:
        calls.finish_run(tracking.uri, run_id, "FINISHED")

    assert scans == []
    requirements = (Path(mlflow.artifacts.download_artifacts(uri)) / "requirements.txt").read_text().split()
    assert requirements == EXPECTED_REQUIREMENTS
    # Unset again: the next model logged with inferred requirements gets the whole map.
    assert requirements_utils._MODULES_TO_PACKAGES is None
    requirements_utils._init_modules_to_packages_map()
    assert scans == [1]


def test_export_through_the_tracker_logs_a_model_that_scores_like_the_trainer(
    tracking: Any, use_tracking: str
) -> None:
    model, transformer, config, frame = _model(tracking)
    with Tracker(config=config.tracking, enabled=True) as tracker:
        uri = log_pyfunc_model(model, transformer=transformer, config=config, sample_frame=frame.head(5),
                               tracker=tracker)
    run = mlflow.MlflowClient(tracking.uri).get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    requirements = (Path(mlflow.artifacts.download_artifacts(uri)) / "requirements.txt").read_text().split()
    assert requirements == EXPECTED_REQUIREMENTS
    loaded = mlflow.pyfunc.load_model(uri)
    with torch.no_grad():
        expected = model(torch.tensor(transformer.transform(frame, source="test"), dtype=torch.float32)).squeeze(-1).numpy()
    np.testing.assert_allclose(np.asarray(loaded.predict(frame)).reshape(-1), expected, rtol=1e-5, atol=1e-6)
