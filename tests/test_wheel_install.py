"""The pip path (docs/install.md): the built wheels, installed into a fresh virtual environment outside
the repository, load the example specs from a folder outside it through the two-line DAG file.

How the environment is made, and why: installing Airflow, MLflow and Great Expectations from an index
into a fresh venv takes many minutes and needs the network, so the fresh venv (made with ``python -m
venv``, no ``--system-site-packages``: the base interpreter's site holds none of them) gets a
read-only view of the third-party packages of the test interpreter's environment instead: one
symlink per entry of its site-packages, leaving out every trainpipe entry (the editable installs'
``.pth`` files, which put this repository on ``sys.path``, and both packages' metadata). The two
wheels are then installed into it with ``pip install --no-deps --no-index`` and ``pip check`` must
find every requirement they declare present. The child runs with no ``PYTHONPATH``, in a temporary
working directory, so trainpipe can only come from the wheel; the test asserts it does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO
from trainpipe.compile.compiler import compile_directory
from trainpipe.settings import Settings

# Names in site-packages that belong to trainpipe's own (editable) installs.
_OWN = ("trainpipe", "airflow_provider_trainpipe", "_editable_impl_airflow_provider_trainpipe",
        "_editable_impl_trainpipe_trainer", "__editable__")
DAG_FILE = "from trainpipe import load_dags  # Airflow DAG file: one DAG per trainpipe spec\nload_dags(globals())\n"


def _run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both packages built as a user builds them (``python -m build``: sdist, then the wheel from it);
    --no-isolation uses the dev extra's hatchling instead of fetching one."""
    dist = tmp_path_factory.mktemp("dist")
    for project in (REPO, REPO / "trainer_image"):
        _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, project, cwd=dist)
    (provider,) = dist.glob("airflow_provider_trainpipe-*.whl")
    (trainer,) = dist.glob("trainpipe_trainer-*.whl")
    assert len(list(dist.glob("*.tar.gz"))) == 2
    return {"provider": provider, "trainer": trainer}


@pytest.mark.integration
def test_the_provider_wheel_ships_the_package_and_no_developer_tools(wheels: dict[str, Path]):
    names = zipfile.ZipFile(wheels["provider"]).namelist()
    modules = {name for name in names if name.startswith("trainpipe/")}
    # py.typed: type checkers of code that imports trainpipe read its annotations (PEP 561).
    assert {"trainpipe/__init__.py", "trainpipe/dags/files.py", "trainpipe/spec/schema.json", "trainpipe/py.typed"} <= modules
    assert not any(name.startswith("trainpipe/stack") for name in names)  # `make stack` is tools/stack/
    assert not any(name.startswith(("tests/", "dags/", "benchmarks/", "tools/")) for name in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "apache_airflow_provider" in zipfile.ZipFile(wheels["provider"]).read(entry_points).decode()
    assert "trainpipe_trainer/py.typed" in zipfile.ZipFile(wheels["trainer"]).namelist()


def _fresh_venv(root: Path) -> Path:
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=root)
    python = venv / "bin" / "python"
    target = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).strip())
    shared = Path(sysconfig.get_paths()["purelib"])
    for entry in shared.iterdir():
        if not entry.name.lower().startswith(_OWN) and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python


@pytest.mark.integration
def test_a_pip_user_loads_the_example_specs_from_outside_the_repository(wheels: dict[str, Path], tmp_path: Path):
    python = _fresh_venv(tmp_path)
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index",
         wheels["provider"], wheels["trainer"], cwd=tmp_path)
    problems = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "check"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300).stdout
    assert not [line for line in problems.splitlines() if "trainpipe" in line.lower()], problems

    # An Airflow home of a user: the two-line DAG file, the specs beside the DAGs folder.
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "trainpipe_dags.py").write_text(DAG_FILE)
    shutil.copytree(REPO / "dag_configs", home / "dag_configs")
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "TRAINPIPE_DAG_CONFIGS") and not key.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"), "TRAINPIPE_HOME": str(tmp_path / "state")})
    probe = textwrap.dedent(f"""
        import json, os, sys
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(home / "dags")!r})
        import trainpipe, trainpipe_trainer
        print(json.dumps({{"dags": sorted(bag.dag_ids), "errors": bag.import_errors,
                          "trainpipe": os.path.realpath(trainpipe.__file__),
                          "trainer": os.path.realpath(trainpipe_trainer.__file__),
                          "path": sys.path}}))
    """)

    loaded = json.loads(_run(python, "-c", probe, cwd=tmp_path, env=env).splitlines()[-1])

    assert loaded["errors"] == {}
    assert loaded["dags"] == sorted(compile_directory(REPO / "dag_configs",
                                                      settings=Settings.from_env()).plans) and len(loaded["dags"]) >= 4
    site = str(tmp_path / "venv")
    assert loaded["trainpipe"].startswith(site) and loaded["trainer"].startswith(site)
    assert not [entry for entry in loaded["path"] if entry.startswith(str(REPO))]
