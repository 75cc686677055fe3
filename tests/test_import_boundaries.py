"""The provider imports without torch; the trainer imports without Airflow."""

from __future__ import annotations

import subprocess
import sys

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
        "import trainpipe.factory, trainpipe.dag_builder, trainpipe.operators.pipeline, trainpipe.runtime.train, "
        "trainpipe.cli\nprint('ok')",
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
