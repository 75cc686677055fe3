"""A spec deleted or fixed loses its import error at the next parse of the DAG file (issue 34): real Airflow
CLI (`airflow dags reserialize`, `airflow dags list-import-errors`) on a real metadata DB, the specs folder
outside the DAG bundle as an Airflow home's `dag_configs/` beside `dags/` is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, copy_airflow_db

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
BROKEN = "pipeline_id: {id}\nunknown_key: 1\n"


def _airflow(env: dict[str, str], *command: str, codes: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run([AIRFLOW, *command], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode in codes, done.stderr[-3000:]
    return done.stdout


def _errors(env: dict[str, str]) -> dict[str, str]:
    _airflow(env, "dags", "reserialize")
    # list-import-errors exits 1 when it lists any
    errors = json.loads(_airflow(env, "dags", "list-import-errors", "-o", "json", codes=(0, 1)))
    return {e["filepath"]: e["error"] for e in errors}


@pytest.fixture
def home(tmp_path: Path, airflow_db_template: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "dags").mkdir()
    (tmp_path / "dag_configs").mkdir()
    (tmp_path / "dags" / "trainpipe_dags.py").write_text((REPO / "dags" / "trainpipe_dags.py").read_text())
    env = {key: value for key, value in os.environ.items() if key != "TRAINPIPE_DAG_CONFIGS"}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow"),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
                "TRAINPIPE_HOME": str(tmp_path / "home")})
    copy_airflow_db(airflow_db_template, tmp_path / "airflow.db")
    return tmp_path / "dag_configs", env


def test_deleted_and_fixed_specs_lose_their_import_errors_others_keep_theirs(home):
    specs, env = home
    good = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    (specs / "good.yaml").write_text(good)
    for name in ("deleted", "fixed", "still_broken"):
        (specs / f"{name}.yaml").write_text(BROKEN.format(id=name))
    # Filed as their messages name them, relative to the specs folder's parent: no path of this machine.
    paths = {name: f"dag_configs/{name}.yaml" for name in ("deleted", "fixed", "still_broken")}
    first = _errors(env)
    assert set(first) == set(paths.values())
    assert all(error.startswith(f"{path}:") for path, error in first.items()), first

    (specs / "deleted.yaml").unlink()
    (specs / "fixed.yaml").write_text(good.replace("pipeline_id: fraud_detector", "pipeline_id: fixed"))
    errors = _errors(env)
    assert set(errors) == {paths["still_broken"]}
    assert "unknown_key: unknown key" in errors[paths["still_broken"]]
    assert {"fraud_detector", "fixed"} <= {d["dag_id"] for d in json.loads(_airflow(env, "dags", "list", "-o", "json"))}

    # Broken again after the fix: reported again (a cleared error is not remembered as cleared).
    (specs / "fixed.yaml").write_text(BROKEN.format(id="fixed"))
    assert set(_errors(env)) == {paths["still_broken"], paths["fixed"]}
