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
from trainpipe.settings import Settings

model = MlflowHook(Settings.from_env()).load_pyfunc(sys.argv[1])
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
    logged = subprocess.run([sys.executable, "-c", LOG_MODEL],
                            env={**env, "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"},
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


# Each process opens the store the way a task (the hook) or the trainer (its tracker) does, once told to go.
OPEN_STORE = """
import sys
kind = sys.argv[1]
if kind == "task":
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings
    open_store = lambda: MlflowHook(Settings.from_env()).client.search_registered_models(max_results=1)
else:
    from trainpipe_trainer.tracking.mlflow_store import prepare_store
    open_store = lambda: prepare_store(sys.argv[2])
import mlflow
print("ready", file=sys.stderr, flush=True)
sys.stdin.readline()
open_store()
print(len(mlflow.MlflowClient(sys.argv[2]).search_experiments()))
"""


def test_tasks_and_trainers_that_open_a_new_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    # Found in a first run: validate's process and train's trainer both created the new store's tables,
    # and the second failed in MLflow's migrations. Four at once failed three of them every time without the lock.
    uri = f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"
    env = {**os.environ, "TRAINPIPE_HOME": str(tmp_path / "home"), "MLFLOW_TRACKING_URI": uri}
    env.pop("MLFLOW_EXPERIMENT_ID", None)
    processes = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, kind, uri], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for kind in ("task", "trainer", "task", "trainer")]
    for process in processes:
        assert "ready\n" in iter(process.stderr.readline, ""), process.stderr.read()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    outcomes = [process.communicate(timeout=300) for process in processes]
    # Every process read the store: MLflow's Default experiment, and no migration error.
    assert [(process.returncode, out.strip()) for process, (out, _) in zip(processes, outcomes, strict=True)] == [(0, "1")] * 4, \
        "\n".join(err[-2000:] for _, err in outcomes)
