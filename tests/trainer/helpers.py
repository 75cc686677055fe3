"""Test helpers for the trainer: synthetic learnable data and a real launcher (no mocks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

BINARY_FEATURES = ("f_small", "f_large", "f_offset", "f_noise")
RANKING_FEATURES = ("r_a", "r_b", "r_c")


@dataclass(frozen=True)
class Datasets:
    binary_train: Path
    binary_holdout: Path
    ranking_train: Path
    ranking_holdout: Path
    regression_train: Path


def binary_frame(rng: np.random.Generator, n: int) -> pd.DataFrame:
    # Very different scales and offsets, so standardisation matters; f_noise carries no signal.
    z = rng.normal(size=(n, 4))
    frame = pd.DataFrame(
        {
            "f_small": 0.01 * z[:, 0],
            "f_large": 1000.0 * z[:, 1],
            "f_offset": 50.0 + z[:, 2],
            "f_noise": z[:, 3],
        }
    )
    logit = 2.0 * z[:, 0] - 1.5 * z[:, 1] + 1.0 * z[:, 2] + 0.5 * rng.normal(size=n)
    frame["label"] = (1.0 / (1.0 + np.exp(-logit)) > 0.5).astype(np.int64)
    return frame


def ranking_frame(rng: np.random.Generator, n_queries: int, docs: int, first_qid: int) -> pd.DataFrame:
    z = rng.normal(size=(n_queries * docs, 3))
    utility = 1.2 * z[:, 0] - 0.8 * z[:, 1] + 0.3 * rng.normal(size=len(z))
    relevance = np.clip(np.round(2.0 + utility), 0, 4).astype(np.int64)
    return pd.DataFrame(
        {
            "qid": np.repeat(np.arange(first_qid, first_qid + n_queries), docs),
            "r_a": z[:, 0],
            "r_b": 10.0 * z[:, 1],
            "r_c": z[:, 2],
            "label": relevance,
        }
    )


@dataclass(frozen=True)
class S3:
    bucket: str
    storage_options: dict[str, Any]

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


@dataclass(frozen=True)
class Tracking:
    uri: str
    experiment_name: str
    experiment_id: str


@dataclass(frozen=True)
class Launch:
    returncode: int
    stdout: str
    stderr: str
    workdir: Path

    def result(self) -> dict[str, Any]:
        return json.loads((self.workdir / "output" / "result.json").read_text())

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-6000:]}"


def launch(config: dict[str, Any], workdir: Path, *, nproc: int | None) -> Launch:
    """Run the trainer the way launchers do: torchrun (via this interpreter) or a plain process."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(config, indent=2))
    trainer = ["-m", "trainpipe_trainer", "--config", config_path.as_uri()]
    if nproc is None:
        command = [sys.executable, *trainer]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *trainer]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    # cwd in tmp: nothing the trainer or MLflow might write relative to cwd lands in the repo.
    proc = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600, check=False)
    return Launch(returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, workdir=workdir)
