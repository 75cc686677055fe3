"""``trainpipe train SPEC [--run-dir DIR] [--logical-date DATE]``: the training step alone.

* The command that runs is the rendered plan's launch, byte for byte.
* A run dir with committed checkpoints is resumed: the example spec, shortened to 2 epochs, trained
  twice in one run dir, the second time after its newest checkpoints were un-committed (as a crash
  mid-save leaves them). Same weights either way.
* Without ``--logical-date`` the window ends at the start of the current UTC day, so two runs on one
  day train on one snapshot and give the same weights.
* A run dir whose checkpoints another snapshot or other settings wrote is refused, untouched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.steps.train.standalone import default_logical_date
from trainpipe.steps.train.train import TrainerReasons

LOGICAL_DATE = "2026-11-22"

pytestmark = pytest.mark.integration


def _trainpipe(*args: str, home: Path) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("trainpipe")), *args]
    # Its own storage and MLflow: the session's demo data is the e2e tests' (other rows, other dates),
    # and a CLI run's MLflow run is found again by its run dir's name.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINPIPE_HOME": str(home),
           "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}"}
    for name in ("MLFLOW_TRACKING_URI", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT"):
        env.pop(name, None)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


def _sha(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    match = re.fullmatch(r"weights sha256: ([0-9a-f]{64})", run.stdout.strip().splitlines()[-1])
    assert match, run.stdout[-2000:]
    return match.group(1)


def _committed(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "manifest.json").exists())


def test_train_cli_resumes_a_run_dir_from_its_newest_committed_checkpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    demo = _trainpipe("demo-data", "--end", LOGICAL_DATE, home=home)
    assert demo.returncode == 0, demo.stderr
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["epochs"] = 2
    spec["training"]["checkpoint"]["keep_last"] = 10
    spec_path = tmp_path / "fraud_detector.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_dir = tmp_path / "run"
    args = ("train", str(spec_path), "--run-dir", str(run_dir), "--logical-date", LOGICAL_DATE)

    first_run = _trainpipe(*args, home=home)
    first = _sha(first_run)
    # What ran is what `trainpipe render` shows: the plan's argv with this run's config URI.
    rendered = json.loads(_trainpipe("render", str(spec_path), home=home).stdout)
    config_uri = (run_dir / "trainer_config.json").resolve().as_uri()
    argv = [arg.replace("{config_uri}", config_uri) for arg in rendered["launch"]["argv"]]
    assert f"launching: {' '.join(argv)}" in first_run.stdout.splitlines()
    root = run_dir / "checkpoints"
    steps = _committed(root)
    assert len(steps) >= 3
    # A crash while committing the last two saves: their manifests are missing.
    for step in steps[-2:]:
        (root / f"step-{step}" / "manifest.json").unlink()

    second = _trainpipe(*args, home=home)
    assert f"resumed from step {steps[-3]}" in second.stdout
    assert _sha(second) == first


def test_default_logical_date_is_the_start_of_the_current_utc_day() -> None:
    assert default_logical_date(datetime(2026, 3, 4, 17, 5, 9, 1, tzinfo=UTC)) == datetime(2026, 3, 4, tzinfo=UTC)
    # 21:00 in New York is already the next day in UTC.
    new_york = timezone(timedelta(hours=-5))
    assert default_logical_date(datetime(2026, 3, 4, 21, 0, tzinfo=new_york)) == datetime(2026, 3, 5, tzinfo=UTC)
    before = datetime.now(UTC).date()
    today = default_logical_date()
    assert today.tzinfo == UTC and today.time() == time(0, 0)
    assert before <= today.date() <= datetime.now(UTC).date()


def _small_spec(path: Path, **training: object) -> Path:
    """The example spec on a 7-day window, 1 epoch, 1 process: cheap, and still a real torchrun run."""
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["data"]["window"] = "7d"
    spec["training"].update({"epochs": 1, "distributed": {"nproc_per_node": 1, "nnodes": 1, "strategy": "ddp"},
                             **training})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def trained_today(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Two runs of one spec without --logical-date, each in a fresh run dir (and demo data through today)."""
    tmp = tmp_path_factory.mktemp("today")
    home = tmp / "home"
    # Rows up to tomorrow 00:00: a window ending "now" would hold rows a window ending today 00:00 does not.
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d")
    demo = _trainpipe("demo-data", "--end", tomorrow, home=home)
    assert demo.returncode == 0, demo.stderr
    spec = _small_spec(tmp / "fraud_detector.yaml")
    for _attempt in range(2):
        day = datetime.now(UTC).date()
        runs = [_trainpipe("train", str(spec), "--run-dir", str(tmp / name), home=home) for name in ("a", "b")]
        if datetime.now(UTC).date() == day:  # else the runs straddled midnight UTC: once more, within one day
            break
    return {"tmp": tmp, "home": home, "spec": spec, "day": day, "runs": runs}


def test_two_runs_on_one_day_without_logical_date_give_the_same_weights(trained_today: dict) -> None:
    first, second = (_sha(run) for run in trained_today["runs"])
    assert first == second
    # One snapshot for both, its window ending at the start of the day (what a @daily run uses).
    snapshots = list((trained_today["home"] / "storage" / "snapshots" / "fraud_detector").glob("*/manifest.json"))
    assert len(snapshots) == 1
    manifest = yaml.safe_load(snapshots[0].read_text())
    day = trained_today["day"]
    assert datetime.fromisoformat(manifest["window_end"]) == datetime(day.year, day.month, day.day, tzinfo=UTC)


def _refused(run: subprocess.CompletedProcess, run_dir: Path) -> str:
    assert run.returncode == 1, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    # Refused before anything was launched: one located line, no traceback.
    assert "launching:" not in run.stdout and "Traceback" not in run.stdout + run.stderr
    message = run.stderr.strip()
    assert message.startswith(f"trainpipe train: {(run_dir / 'checkpoints').as_uri()}/step-"), message
    assert "cannot resume this checkpoint" in message and "another --run-dir" in message
    return message


def _run_dir_files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_run_dir_is_not_resumed_on_another_snapshot(trained_today: dict) -> None:
    run_dir = trained_today["tmp"] / "a"
    before = _run_dir_files(run_dir)
    yesterday = (trained_today["day"] - timedelta(days=1)).isoformat()
    run = _trainpipe("train", str(trained_today["spec"]), "--run-dir", str(run_dir), "--logical-date", yesterday,
                     home=trained_today["home"])
    message = _refused(run, run_dir)
    assert re.search(r"\(checkpoint -> this run: dataset snapshot [0-9a-f]{16} -> [0-9a-f]{16}\)", message), message
    assert _run_dir_files(run_dir) == before


def test_a_run_dir_is_not_resumed_with_another_seed(trained_today: dict) -> None:
    run_dir = trained_today["tmp"] / "b"
    before = _run_dir_files(run_dir)
    spec = _small_spec(trained_today["tmp"] / "seed7" / "fraud_detector.yaml", seed=7)
    run = _trainpipe("train", str(spec), "--run-dir", str(run_dir), home=trained_today["home"])
    assert "(checkpoint -> this run: seed 42 -> 7)" in _refused(run, run_dir)
    assert _run_dir_files(run_dir) == before


def test_the_trainers_own_reason_is_kept_once_from_the_streamed_output() -> None:
    shown: list[str] = []
    reasons = TrainerReasons(shown.append)
    lines = [
        "launching: torchrun --nproc_per_node=2 -m trainpipe_trainer --config file:///x",
        "trainpipe_trainer: [rank 1] error: file:///r/step-4: cannot resume this checkpoint: (seed 0 -> 1)",
        "trainpipe_trainer: [rank 0] error: file:///r/step-4: cannot resume this checkpoint: (seed 0 -> 1)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "trainpipe_trainer: stopped: received SIGTERM: committed checkpoint step-9",
    ]
    for line in lines:
        reasons.line(line)
    assert shown == lines
    assert reasons.messages == [
        "file:///r/step-4: cannot resume this checkpoint: (seed 0 -> 1)",
        "received SIGTERM: committed checkpoint step-9",
    ]
