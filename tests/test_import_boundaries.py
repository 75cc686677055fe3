"""The provider imports without torch; the trainer imports without Airflow; the import contracts hold."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import REPO

BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == {blocked!r} or name.startswith({blocked!r} + "."):
            raise ImportError("blocked by test: " + name)
        return None
sys.meta_path.insert(0, _Block())
"""


def _import_with(blocked: str, statement: str) -> subprocess.CompletedProcess:
    code = BLOCK.format(blocked=blocked) + statement
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_provider_and_dag_factory_import_without_torch():
    result = _import_with(
        "torch",
        "import trainpipe.compile.compiler, trainpipe.dags.builder, trainpipe.operators.pipeline, trainpipe.steps.train.train, "
        "trainpipe.commands.main\nprint('ok')",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_trainer_imports_without_airflow():
    result = _import_with(
        "airflow",
        "import trainpipe_trainer, trainpipe_trainer.config, trainpipe_trainer.__main__\nprint('ok')",
    )
    assert result.returncode == 0, result.stderr


def test_blocking_really_blocks():
    result = _import_with("torch", "import torch")
    assert result.returncode != 0
    assert "blocked by test: torch" in result.stderr


LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_the_import_contracts_hold():
    """`.importlinter` states the allowed directions: spec -> plan -> compile/operators -> dags, the
    trainer imports nothing of the provider or Airflow, the plan imports no Airflow."""
    result = _lint_imports(REPO / ".importlinter")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_contract_fails(tmp_path):
    # The same analysis with a contract the code does not keep: the checker really reads the imports.
    config = tmp_path / "contracts.ini"
    config.write_text((REPO / ".importlinter").read_text() + textwrap.dedent("""
        [importlinter:contract:dag-builder-without-plan]
        name = dag_builder imports no plan (false on purpose)
        type = forbidden
        source_modules =
            trainpipe.dags.builder
        forbidden_modules =
            trainpipe.plan
        """))

    result = _lint_imports(config)

    assert result.returncode == 1
    assert "dag_builder imports no plan (false on purpose) BROKEN" in result.stdout


@pytest.mark.integration
def test_the_factory_dag_files_cycle_would_break_the_contracts(tmp_path):
    """The cycle issue 21 cut (the compiler importing the DAG-file binding back) fails `make test`:
    a copy of the provider with that one import added breaks the cycle, layer and Airflow-free contracts."""
    import os
    import shutil

    shutil.copytree(REPO / "provider" / "trainpipe", tmp_path / "trainpipe",
                    ignore=shutil.ignore_patterns("__pycache__"))
    factory = tmp_path / "trainpipe" / "compile" / "compiler.py"
    factory.write_text(factory.read_text() + "\n\ndef _register_back():\n    from trainpipe.dags.files import register_dags\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "trainer_image")])}

    result = subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / ".importlinter"), "--no-cache"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    assert result.returncode == 1
    for contract in ("No import cycles in either package, at any depth BROKEN",
                     "imports a later one BROKEN"):
        assert contract in result.stdout, result.stdout
    assert "trainpipe.compile is not allowed to import airflow" in result.stdout
