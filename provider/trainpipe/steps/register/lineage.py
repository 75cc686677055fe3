"""Lineage facts recorded on every trained model: where the spec came from, and what it says."""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from trainpipe.plan.tracking import MODEL_FAMILY_TAGS

if TYPE_CHECKING:
    from mlflow import MlflowClient

# Folder of the training run's artifacts that holds the spec file's text.
SPEC_ARTIFACT_DIR = "spec"


def git_commit(near: str | Path) -> str | None:
    """The commit of the git checkout holding ``near`` (the spec file); None when the spec's folder
    is not a checkout (a deployed copy, an image), so no made-up value is ever recorded."""
    if not str(near):
        return None
    try:
        out = subprocess.run(["git", "-C", str(Path(near).resolve().parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def spec_artifact_path(spec_relative_path: str) -> str:
    """``spec/<file name>``: where the spec's text is logged on the training run."""
    return f"{SPEC_ARTIFACT_DIR}/{PurePosixPath(spec_relative_path).name}"


def log_spec_text(client: MlflowClient, mlflow_run_id: str, *, spec_relative_path: str, spec_text: str) -> str:
    """Log the spec's text on the training run (a retry rewrites the same file); returns its artifact path."""
    path = spec_artifact_path(spec_relative_path)
    client.log_text(mlflow_run_id, spec_text, path)
    return path


def model_family_tags(client: MlflowClient, mlflow_run_id: str) -> dict[str, str]:
    """The model family tags the train step wrote on the training run, to be copied onto its registered version
    (reproduce reads them there); a run trained before families were recorded has none."""
    tags = client.get_run(mlflow_run_id).data.tags
    return {key: tags[key] for key in MODEL_FAMILY_TAGS if tags.get(key)}
