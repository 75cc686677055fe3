"""The MLflow hook finds the store the settings name, also when only TRAINPIPE_HOME is set: a task
process starts with MLflow's own default (``mlflow.db`` of its working directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOG_MODEL = """
import mlflow, mlflow.pyfunc

class Doubler(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):
        return model_input["x"] * 2

with mlflow.start_run():
    info = mlflow.pyfunc.log_model(name="model", python_model=Doubler())
print(info.model_uri)
"""

PREDICT = """
import sys
import pandas as pd
from trainpipe.hooks.mlflow import MlflowHook

model = MlflowHook().load_pyfunc(sys.argv[1])
print(list(model.predict(pd.DataFrame({"x": [1.0, 4.0]}))))
"""


def test_a_logged_model_loads_from_the_default_store_under_trainpipe_home(tmp_path: Path):
    home, workdir = tmp_path / "home", tmp_path / "worker_cwd"
    home.mkdir()
    workdir.mkdir()
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("MLFLOW_EXPERIMENT_ID", None)  # mlflow.set_experiment() in an earlier test of the session sets it
    env.pop("TRAINPIPE_MLFLOW_ARTIFACT_ROOT", None)
    # The model is logged where the settings' default says the store is...
    logged = subprocess.run([sys.executable, "-c", LOG_MODEL], env={**env, "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"},
                            cwd=workdir, capture_output=True, text=True, timeout=300)
    assert logged.returncode == 0, logged.stderr
    model_uri = logged.stdout.strip().splitlines()[-1]
    assert model_uri.startswith("models:/m-")

    # ... and a task process that was told nothing but TRAINPIPE_HOME loads it from there.
    loaded = subprocess.run([sys.executable, "-c", PREDICT, model_uri], env=env, cwd=workdir,
                            capture_output=True, text=True, timeout=300)

    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip().splitlines()[-1] == "[2.0, 8.0]"
    assert not (workdir / "mlflow.db").exists()
