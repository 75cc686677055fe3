"""``trainpipe train SPEC --run-dir DIR``: a run dir with committed checkpoints is resumed.

The example spec, shortened to 2 epochs, trained twice in one run dir: the second time after its
newest checkpoints were un-committed (as a crash mid-save leaves them). Same weights either way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
LOGICAL_DATE = "2026-11-22"

pytestmark = pytest.mark.integration


def _trainpipe(*args: str, home: Path) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("trainpipe")), *args]
    # Its own storage: the session's demo data is the e2e tests' (other rows, other dates).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINPIPE_HOME": str(home),
           "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}"}
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

    first = _sha(_trainpipe(*args, home=home))
    root = run_dir / "checkpoints"
    steps = _committed(root)
    assert len(steps) >= 3
    # A crash while committing the last two saves: their manifests are missing.
    for step in steps[-2:]:
        (root / f"step-{step}" / "manifest.json").unlink()

    second = _trainpipe(*args, home=home)
    assert f"resumed from step {steps[-3]}" in second.stdout
    assert _sha(second) == first
