"""The served model's input errors reach the caller: `mlflow models serve` of a champion answers a row it
cannot score with HTTP 400 and the trainpipe message (the column and the fix) in the response's `message`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from trainpipe_trainer.config import CheckpointConfig, ModelConfig, TrackingConfig, TrainingConfig
from trainpipe_trainer.models.mlp.export import log_pyfunc_model
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.tracking.tracker import Tracker

pytestmark = pytest.mark.integration

FEATURES = ("age", "bmi", "bp")
MESSAGE = ("model input: feature column 'bmi' has 1 missing value(s); declare how to fill them "
           "(training.transforms.bmi.impute: mean, median or constant)")


@pytest.fixture(scope="module")
def champion(tmp_path_factory: pytest.TempPathFactory, tracking: Any) -> str:
    """A regression model logged by the trainer's own export code and registered as `champion`."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    # The process-wide URI is put back afterwards (as the use_tracking fixture does): later tests of the
    # session log into the session's own store.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(utils, "_tracking_uri", utils._tracking_uri)
        patch.setenv("MLFLOW_TRACKING_URI", tracking.uri)
        mlflow.set_tracking_uri(tracking.uri)
        return _register_champion(tracking)


def _register_champion(tracking: Any) -> str:
    import mlflow
    from mlflow import MlflowClient

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(50, 3)) * [13, 4, 14] + [48, 26, 95], columns=list(FEATURES))
    config = TrainingConfig(pipeline_id="served", task="regression", train_data_uri="t.parquet", features=FEATURES,
                            label="y", checkpoint=CheckpointConfig(root_uri="file:///unused"), output_uri="o",
                            tracking=TrackingConfig(tracking_uri=tracking.uri))
    transformer = FeatureTransformer.fit(frame, config.feature_transforms(), source="train")
    torch.manual_seed(0)
    model = build_mlp(n_features=transformer.width, config=ModelConfig(hidden_layers=(4,)))
    with Tracker(config=TrackingConfig(tracking_uri=tracking.uri, experiment_name=tracking.experiment_name),
                 enabled=True) as tracker:
        uri = log_pyfunc_model(model, transformer=transformer, config=config, sample_frame=frame.head(5),
                               tracker=tracker)
    version = mlflow.register_model(uri, "served_model")
    MlflowClient(tracking.uri).set_registered_model_alias("served_model", "champion", version.version)
    return "models:/served_model@champion"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(port: int, rows: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations",
                                     data=json.dumps({"dataframe_records": rows}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_null_row_gets_the_trainpipe_message(champion: str, tracking: Any, tmp_path: Path) -> None:
    port = _free_port()
    # The server runs uvicorn by name: this venv's bin first on PATH.
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking.uri, "MLFLOW_DISABLE_TELEMETRY": "true",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", champion, "--env-manager", "local",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, cwd=tmp_path, stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the scoring server did not answer /ping within 120 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)

        good = {"age": 50.0, "bmi": 27.0, "bp": 90.0}
        status, body = _post(port, [good])
        assert status == 200 and len(body["predictions"]) == 1

        status, body = _post(port, [good, {**good, "bmi": None}])
        assert status == 400
        assert MESSAGE in body["message"], body["message"]
        assert body["error_code"] == "INVALID_PARAMETER_VALUE"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
