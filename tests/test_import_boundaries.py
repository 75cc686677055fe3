"""The provider imports without torch; the trainer imports without Airflow; the import contracts hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.probes import probe
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
    return probe(BLOCK.format(blocked=blocked) + statement)


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
# A contract the code does not keep: the checker really reads the imports.
FALSE_CONTRACT = """
[importlinter:contract:dag-builder-without-plan]
name = dag_builder imports no plan (false on purpose)
type = forbidden
source_modules =
    trainpipe.dags.builder
forbidden_modules =
    trainpipe.plan
"""
# Contracts that the one import below (compile -> dags) does not touch: they must stay kept.
UNTOUCHED = ("The trainer imports nothing of the provider and no Airflow",
             "The provider imports no torch (the trainer process does)",
             "The data read imports no torch (it runs in a thread while torch imports)")


@pytest.fixture(scope="module")
def linted_with_a_cycle(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """One `lint-imports` run (`make lint` runs it on the real tree) over a copy of the provider with the cycle
    issue 21 cut put back (the compiler importing the DAG-file binding), against `.importlinter` plus a contract
    the code does not keep."""
    import os
    import shutil

    root = tmp_path_factory.mktemp("contracts")
    shutil.copytree(REPO / "provider" / "trainpipe", root / "trainpipe", ignore=shutil.ignore_patterns("__pycache__"))
    factory = root / "trainpipe" / "compile" / "compiler.py"
    factory.write_text(factory.read_text() + "\n\ndef _register_back():\n    from trainpipe.dags.files import register_dags\n")
    config = root / "contracts.ini"
    config.write_text((REPO / ".importlinter").read_text() + FALSE_CONTRACT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO / "trainer_image")])}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], capture_output=True, text=True,
                          timeout=300, cwd=root, env=env)


@pytest.mark.integration
def test_the_contracts_an_import_does_not_touch_hold(linted_with_a_cycle):
    """`.importlinter` states the allowed directions; a copy with one more import keeps every contract that import
    has nothing to do with (the analysis is exact, not a blanket failure)."""
    for contract in UNTOUCHED:
        assert f"{contract} KEPT" in linted_with_a_cycle.stdout, linted_with_a_cycle.stdout


@pytest.mark.integration
def test_a_broken_contract_fails(linted_with_a_cycle):
    assert linted_with_a_cycle.returncode == 1
    assert "dag_builder imports no plan (false on purpose) BROKEN" in linted_with_a_cycle.stdout


@pytest.mark.integration
def test_the_factory_dag_files_cycle_would_break_the_contracts(linted_with_a_cycle):
    """The cycle issue 21 cut (the compiler importing the DAG-file binding back) fails `make lint`: it breaks the
    cycle, layer and Airflow-free contracts."""
    result = linted_with_a_cycle
    for contract in ("No import cycles in either package, at any depth BROKEN",
                     "imports a later one BROKEN"):
        assert contract in result.stdout, result.stdout
    assert "trainpipe.compile is not allowed to import airflow" in result.stdout
