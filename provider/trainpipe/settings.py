"""Where trainpipe keeps its state, read from the environment (the embedded default: ``.trainpipe/``).

| variable | default |
| --- | --- |
| ``TRAINPIPE_HOME`` | ``./.trainpipe`` |
| ``TRAINPIPE_STORAGE_ROOT`` | ``file://$TRAINPIPE_HOME/storage`` (``s3://bucket/prefix`` in the compose stack) |
| ``TRAINPIPE_STORAGE_CONN_ID`` | unset (the Airflow connection for an ``s3://`` root) |
| ``MLFLOW_TRACKING_URI`` | ``sqlite:///$TRAINPIPE_HOME/mlflow.db`` |
| ``TRAINPIPE_MLFLOW_ARTIFACT_ROOT`` | ``$TRAINPIPE_HOME/mlartifacts`` |
| ``TRAINPIPE_OPTUNA_STORAGE`` | ``$TRAINPIPE_HOME/optuna/journal.log`` (an Optuna journal file; or ``sqlite:///...``, ``postgresql://...``) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    home: Path
    storage_root: str
    storage_conn_id: str | None
    mlflow_tracking_uri: str
    mlflow_artifact_root: str
    # Where hyperparameter-search studies live (trainpipe.runtime.tuning): one storage for every pipeline.
    optuna_storage: str = ""

    @classmethod
    def from_env(cls) -> Settings:
        home = Path(os.environ.get("TRAINPIPE_HOME") or Path.cwd() / ".trainpipe").resolve()
        return cls(
            home=home,
            storage_root=os.environ.get("TRAINPIPE_STORAGE_ROOT") or f"file://{home / 'storage'}",
            storage_conn_id=os.environ.get("TRAINPIPE_STORAGE_CONN_ID") or None,
            mlflow_tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
            mlflow_artifact_root=os.environ.get("TRAINPIPE_MLFLOW_ARTIFACT_ROOT") or str(home / "mlartifacts"),
            optuna_storage=os.environ.get("TRAINPIPE_OPTUNA_STORAGE") or str(home / "optuna" / "journal.log"),
        )
