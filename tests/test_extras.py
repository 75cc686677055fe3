"""Dependencies by role (pyproject.toml): parsing needs only the required ones; a task needing an extra
that is missing says which to install; development and benchmark tools stay out of `make demo`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainpipe.errors import TrainpipeError
from trainpipe.factory import compile_directory

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!\[; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_each_optional_sdk_is_an_extra_of_its_role_and_tools_are_not_required():
    extras = PROJECT["optional-dependencies"]
    assert {"kubernetes", "amazon", "tuning", "slack", "dev", "bench"} <= set(extras)
    required = _names(PROJECT["dependencies"])
    assert not required & {"optuna", "apache-airflow-providers-cncf-kubernetes", "apache-airflow-providers-amazon",
                           "apache-airflow-providers-slack", "dag-factory", "pytest", "build"}
    assert "optuna" in _names(extras["tuning"]) and "dag-factory" in _names(extras["bench"])


def test_make_demo_installs_no_development_or_benchmark_extra():
    makefile = (REPO / "Makefile").read_text()
    demo_install = re.search(r"^\$\(STAMP\):.*?(?=^\S)", makefile, re.MULTILINE | re.DOTALL).group(0)
    assert re.search(r'-e "\.\[kubernetes,amazon,tuning\]"', demo_install)
    assert not re.search(r"\b(dev|bench|stack)\b", demo_install.split("pip install", 1)[1])
    assert re.search(r"^demo: install$", makefile, re.MULTILINE)
    assert "bench" not in re.search(r"^\$\(DEV_STAMP\):.*?(?=^\S)", makefile, re.MULTILINE | re.DOTALL).group(0)


@pytest.mark.integration
def test_a_tuned_spec_parses_into_its_dag_without_optuna():
    code = ("import sys; sys.modules['optuna'] = None; from pathlib import Path; "
            "from trainpipe.factory import compile_directory; from trainpipe.dag_builder import build_dag; "
            f"plan = compile_directory(Path({str(REPO / 'dag_configs')!r})).plans['fraud_detector_tuned']; "
            "import json; print(json.dumps(sorted(build_dag(plan).task_ids)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"create_study", "trials", "pick_best"} <= set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_tuning_task_without_optuna_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    from trainpipe.runtime.tuning import make_sampler

    plan = compile_directory(REPO / "dag_configs").plans["fraud_detector_tuned"]
    monkeypatch.setitem(sys.modules, "optuna", None)  # what an environment without the extra imports

    with pytest.raises(TrainpipeError, match=re.escape(
            "a tuning: spec's study tasks need optuna on this worker: pip install 'airflow-provider-trainpipe[tuning]'")):
        make_sampler(plan.tuning, 0)
