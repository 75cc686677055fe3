"""The platform's settings, read from the environment in one place and passed down (the embedded default: ``.trainpipe/``).

| variable | default |
| --- | --- |
| ``TRAINPIPE_HOME`` | ``./.trainpipe`` |
| ``TRAINPIPE_STORAGE_ROOT`` | ``file://$TRAINPIPE_HOME/storage`` (``s3://bucket/prefix`` in the compose stack) |
| ``TRAINPIPE_STORAGE_CONN_ID`` | unset (the Airflow connection for an ``s3://`` root) |
| ``MLFLOW_TRACKING_URI`` | ``sqlite:///$TRAINPIPE_HOME/mlflow.db`` |
| ``TRAINPIPE_MLFLOW_ARTIFACT_ROOT`` | ``$TRAINPIPE_HOME/mlartifacts`` |
| ``TRAINPIPE_OPTUNA_STORAGE`` | ``$TRAINPIPE_HOME/optuna/journal.log`` (a journal; or ``sqlite:///...``, ``postgresql://...``) |
| ``TRAINPIPE_DAG_CONFIGS`` | unset: ``dag_configs/`` of the working directory (the specs folder) |
| ``TRAINPIPE_POLICY`` | unset: no platform policy (ADR 0014) |
| ``TRAINPIPE_ALLOW_FAULT_INJECTION`` | unset: without a policy, ``training.testing`` is refused |

Standard library only: listing the specs folder, on every DAG file parse, reads it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SPECS_FOLDER_ENV = "TRAINPIPE_DAG_CONFIGS"
# The policy file (YAML, owned by the platform, outside the specs folder).
POLICY_ENV = "TRAINPIPE_POLICY"
# Without a policy, `training.testing` (fault injection) is refused unless the platform sets this to 1.
FAULT_INJECTION_ENV = "TRAINPIPE_ALLOW_FAULT_INJECTION"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    home: Path
    storage_root: str
    storage_conn_id: str | None
    mlflow_tracking_uri: str
    mlflow_artifact_root: str
    # Where hyperparameter-search studies live (trainpipe.steps.tuning): one storage for every pipeline.
    optuna_storage: str = ""
    # The specs folder the platform configured; None: a command's argument, else dag_configs/.
    specs_folder: Path | None = None
    policy_path: Path | None = None
    fault_injection: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home = Path(env.get("TRAINPIPE_HOME") or Path.cwd() / ".trainpipe").resolve()
        return cls(
            home=home,
            storage_root=env.get("TRAINPIPE_STORAGE_ROOT") or f"file://{home / 'storage'}",
            storage_conn_id=env.get("TRAINPIPE_STORAGE_CONN_ID") or None,
            mlflow_tracking_uri=env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
            mlflow_artifact_root=env.get("TRAINPIPE_MLFLOW_ARTIFACT_ROOT") or str(home / "mlartifacts"),
            optuna_storage=env.get("TRAINPIPE_OPTUNA_STORAGE") or str(home / "optuna" / "journal.log"),
            specs_folder=Path(env[SPECS_FOLDER_ENV]) if env.get(SPECS_FOLDER_ENV) else None,
            policy_path=Path(env[POLICY_ENV]) if env.get(POLICY_ENV) else None,
            fault_injection=env.get(FAULT_INJECTION_ENV, "").strip().lower() in ("1", "true", "yes"),
        )

    def with_policy(self, path: str | os.PathLike[str] | None) -> Settings:
        """These settings under another policy file (a command's ``--policy``); None keeps the configured one."""
        return self if path is None else dataclasses.replace(self, policy_path=Path(path))
