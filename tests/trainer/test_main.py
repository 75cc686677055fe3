"""trainpipe_trainer.__main__: bad input gives a one-line error and exit code 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainpipe_trainer.__main__ import main
from trainpipe_trainer.config import CONFIG_VERSION

from .helpers import BINARY_FEATURES, Datasets, Tracking


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "absent.json")]) == 2
    assert f"--config {tmp_path / 'absent.json'}: no such file" in capsys.readouterr().err


def test_config_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text("task: ranking\n")
    assert main(["--config", path.as_uri()]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_config_from_a_newer_provider(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"config_version": 99}))
    assert main(["--config", str(path)]) == 2
    assert f"training config does not match version {CONFIG_VERSION}" in capsys.readouterr().err


def test_deepspeed_without_its_section_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], datasets: Datasets, make_config: Callable[..., dict[str, Any]]
) -> None:
    config = make_config(tmp_path, train_data=datasets.binary_train, features=BINARY_FEATURES, strategy="deepspeed")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["--config", str(path)]) == 2
    assert "deepspeed: required when strategy is 'deepspeed' (zero_stage, offload)" in capsys.readouterr().err


def test_data_error_fails_the_run_with_the_column_and_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    datasets: Datasets,
    tracking: Tracking,
    use_tracking: str,
    make_config: Callable[..., dict[str, Any]],
) -> None:
    from mlflow import MlflowClient

    for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    run_id = MlflowClient(tracking.uri).create_run(tracking.experiment_id).info.run_id
    config = make_config(
        tmp_path, train_data=datasets.binary_train, features=(*BINARY_FEATURES, "f_absent"), tracking={"run_id": run_id}
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["--config", str(path)]) == 2
    assert f"{datasets.binary_train}: missing feature column(s) 'f_absent'" in capsys.readouterr().err
    assert MlflowClient(tracking.uri).get_run(run_id).info.status == "FAILED"
