"""Fixtures for the trainer tests: tiny learnable datasets, a sqlite MLflow, a real launcher."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .helpers import BINARY_FEATURES, S3, Datasets, Launch, Tracking, binary_frame, launch, ranking_frame

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


def pytest_configure(config: pytest.Config) -> None:
    # The root pyproject registers it too; this keeps `pytest tests/trainer` strict-marker safe alone.
    config.addinivalue_line("markers", "integration: starts real processes (torchrun, MLflow); slower")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A one-process gloo group (a DistEnv) with no launcher variables inherited from the shell."""
    from trainpipe_trainer.distributed import destroy_distributed, init_distributed

    for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    yield init_distributed()
    destroy_distributed()


@pytest.fixture
def deepspeed_env(env: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``env`` for a DeepSpeed engine built in the test's process."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("pip install 'trainpipe-trainer[deepspeed]'")
    if env.device.type == "cpu":
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # as the strategy sets it, before DeepSpeed detects one
    monkeypatch.setenv("LOCAL_RANK", "0")  # DeepSpeed checks it is under a launcher
    from deepspeed.utils import groups

    # DeepSpeed keeps its clone of the world group across engines; each test's group is a new one.
    groups._WORLD_GROUP = None
    yield env
    groups._WORLD_GROUP = None


@pytest.fixture(scope="session")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> Datasets:
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(1234)
    paths = Datasets(
        binary_train=root / "binary_train.parquet",
        binary_holdout=root / "binary_holdout.parquet",
        ranking_train=root / "ranking_train.parquet",
        ranking_holdout=root / "ranking_holdout.parquet",
        regression_train=root / "regression_train.parquet",
    )
    binary_frame(rng, 600).to_parquet(paths.binary_train)
    binary_frame(rng, 300).to_parquet(paths.binary_holdout)
    ranking_frame(rng, 30, 10, first_qid=0).to_parquet(paths.ranking_train)
    ranking_frame(rng, 15, 10, first_qid=100).to_parquet(paths.ranking_holdout)
    regression = binary_frame(rng, 400).drop(columns="label")
    regression["label"] = 3.0 * regression["f_small"] / 0.01 - regression["f_large"] / 1000.0 + 0.1
    regression.to_parquet(paths.regression_train)
    return paths


@pytest.fixture(scope="session")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> Tracking:
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    # An explicit artifact location keeps every artifact in tmp (nothing lands in ./mlruns).
    experiment_id = MlflowClient(uri).create_experiment(
        "trainer-tests", artifact_location=(root / "artifacts").as_uri()
    )
    return Tracking(uri=uri, experiment_name="trainer-tests", experiment_id=experiment_id)


@pytest.fixture
def use_tracking(tracking: Tracking, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point this test's fluent MLflow calls (``load_model("models:/...")``) at the trainer store."""
    import mlflow
    from mlflow.tracking._tracking_service import utils

    # Undone at teardown: otherwise the process-wide URI (also set by an in-process trainer run)
    # would keep pointing here for every later test of the session.
    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking.uri)
    mlflow.set_tracking_uri(tracking.uri)
    return tracking.uri


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A local S3 (moto) on a free port; tests pass it as ``storage_options`` like a MinIO endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> S3:
    """A fresh bucket; credentials come from the environment, as in a pod (never from the config)."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return S3(bucket=bucket, storage_options={"client_kwargs": {"endpoint_url": s3_endpoint}})


@pytest.fixture(scope="session")
def make_config(tracking: Tracking) -> Callable[..., dict[str, Any]]:
    """A training config dict (the provider's JSON) for one run in ``workdir``; override any field."""

    def build(workdir: Path, *, train_data: Path, features: tuple[str, ...], **overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "pipeline_id": "trainer-test",
            "task": "binary_classification",
            "train_data_uri": str(train_data),
            "features": list(features),
            "label": "label",
            "model": {"hidden_layers": [16, 8], "dropout": 0.1},
            "epochs": 2,
            "batch_size": 32,
            "learning_rate": 0.01,
            "seed": 0,
            "checkpoint": {"root_uri": (workdir / "checkpoints").as_uri(), "every_n_steps": 4, "keep_last": 2},
            "tracking": {
                "tracking_uri": tracking.uri,
                "experiment_name": tracking.experiment_name,
                "log_every_n_steps": 2,
            },
            "output_uri": str(workdir / "output"),
            "tags": {"dag_id": "trainer_tests"},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return config

    return build


@pytest.fixture(scope="session")
def binary_run(
    tmp_path_factory: pytest.TempPathFactory, datasets: Datasets, tracking: Tracking, make_config: Callable[..., Any]
) -> Launch:
    """The reference run: 2 ranks, 18 steps, logging into a run the caller created (as the Airflow task does).

    Fault-tolerance tests compare their final weights with this run's.
    """
    from mlflow import MlflowClient

    run_id = MlflowClient(tracking.uri).create_run(tracking.experiment_id).info.run_id
    workdir = tmp_path_factory.mktemp("binary")
    config = make_config(
        workdir, train_data=datasets.binary_train, features=BINARY_FEATURES, tracking={"run_id": run_id}
    )
    return launch(config, workdir, nproc=2)
