"""`trainpipe train` on data the spec cannot train on: a located error naming the fix, no traceback, and
nothing launched (the same check runs in the train task before torchrun starts). And one hash line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.integration

SPEC = """\
pipeline_id: diabetes
data:
  uri: {uri}
training:
  task: regression
  features: [age, bmi, bp]
  label: progression
  epochs: 2
  batch_size: 32
  distributed: {{nproc_per_node: 1}}
evaluation:
  metrics: [rmse]
registration:
  model_name: diabetes
"""


def _table(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"age": rng.normal(48, 13, n), "bmi": rng.normal(26, 4, n), "bp": rng.normal(95, 14, n)})
    frame["progression"] = 150 + 9 * (frame["bmi"] - 26) + rng.normal(0, 30, n)
    return frame


def _train(tmp_path: Path, spec_text: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    (home / "storage" / "diabetes").mkdir(parents=True, exist_ok=True)
    spec = tmp_path / "diabetes.yaml"
    spec.write_text(spec_text)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINPIPE_HOME": str(home),
           "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}"}
    for name in ("MLFLOW_TRACKING_URI", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT"):
        env.pop(name, None)
    return subprocess.run([str(Path(sys.executable).with_name("trainpipe")), "train", str(spec), "--run-dir",
                           str(tmp_path / "run"), "--logical-date", "2026-11-27"],
                          capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp_path)


def test_a_missing_data_uri_is_located_at_data_uri(tmp_path: Path) -> None:
    run = _train(tmp_path, SPEC.format(uri="diabetes/diabetess.parquet"))

    assert run.returncode == 1
    assert "Traceback" not in run.stderr + run.stdout
    assert (f"trainpipe train: {tmp_path / 'diabetes.yaml'}:3:3: data.uri: diabetes/diabetess.parquet does not "
            "exist (read as file://") in run.stderr
    assert "fix data.uri: a path relative to the storage root, or a file:// or s3:// URI" in run.stderr
    assert "launching:" not in run.stdout


@pytest.mark.parametrize(("change", "field", "message"), [
    (lambda frame: frame.drop(columns="bmi"), "6:3: training.features",
     "missing feature column(s) 'bmi'; columns present: age, bp, progression"),
    (lambda frame: frame.assign(bp=frame["bp"].where(frame.index % 7 > 0)), "6:3: training.features",
     "feature column 'bp' has 24 missing value(s); declare how to fill them (training.transforms.bp.impute: "
     "mean, median or constant)"),
    (lambda frame: frame.assign(progression=frame["progression"].astype(str)), "7:3: training.label",
     "label column 'progression' must be numeric without missing values"),
])
def test_data_the_trainer_would_refuse_is_refused_before_torchrun(tmp_path: Path, change, field, message) -> None:
    home = tmp_path / "home" / "storage" / "diabetes"
    home.mkdir(parents=True)
    change(_table()).to_parquet(home / "table.parquet")

    run = _train(tmp_path, SPEC.format(uri="diabetes/table.parquet"))

    assert run.returncode == 1, run.stdout[-2000:]
    assert "Traceback" not in run.stderr + run.stdout and "exitcode" not in run.stderr + run.stdout
    assert "launching:" not in run.stdout  # torchrun never started
    [line] = [line for line in run.stderr.splitlines() if line.startswith("trainpipe train:")]
    assert line.startswith(f"trainpipe train: {tmp_path / 'diabetes.yaml'}:{field}: the snapshot's train split (")
    assert line.endswith(message)


def test_a_good_table_trains_and_prints_one_hash_line(tmp_path: Path) -> None:
    home = tmp_path / "home" / "storage" / "diabetes"
    home.mkdir(parents=True)
    _table().to_parquet(home / "table.parquet")

    run = _train(tmp_path, SPEC.format(uri="diabetes/table.parquet"))

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("weights sha256:") == 1
    assert run.stdout.strip().splitlines()[-1].startswith("weights sha256: ")
