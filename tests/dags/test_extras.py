"""Dependencies by role (pyproject.toml): parsing needs only the required ones; a task needing an extra
that is missing says which to install; development and benchmark tools stay out of `make demo`."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.probes import probe
from tests.support import REPO
from trainpipe.compile.compiler import compile_directory
from trainpipe.errors import TrainpipeError
from trainpipe.settings import Settings

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!\[; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_each_optional_sdk_is_an_extra_of_its_role_and_tools_are_not_required():
    extras = PROJECT["optional-dependencies"]
    assert {"kubernetes", "amazon", "tuning", "slack", "lineage", "dev", "bench"} <= set(extras)
    required = _names(PROJECT["dependencies"])
    assert not required & {"optuna", "apache-airflow-providers-cncf-kubernetes", "apache-airflow-providers-amazon",
                           "apache-airflow-providers-slack", "apache-airflow-providers-openlineage", "dag-factory",
                           "pytest", "build"}
    assert "optuna" in _names(extras["tuning"]) and "dag-factory" in _names(extras["bench"])


def test_make_demo_installs_no_development_or_benchmark_extra():
    makefile = (REPO / "Makefile").read_text()
    demo_install = re.search(r"^\$\(STAMP\):.*?(?=^\S)", makefile, re.MULTILINE | re.DOTALL).group(0)
    assert re.search(r'-e "\.\[kubernetes,amazon,tuning\]"', demo_install)
    assert not re.search(r"\b(dev|bench|stack)\b", demo_install.split("$(UV)", 1)[1])
    assert re.search(r"^demo: install$", makefile, re.MULTILINE)
    assert "bench" not in re.search(r"^\$\(DEV_STAMP\):.*?(?=^\S)", makefile, re.MULTILINE | re.DOTALL).group(0)


def test_ci_installs_the_lineage_extra_through_dev():
    """tests/e2e/test_openlineage.py needs the OpenLineage provider; `make test` installs the dev extra only."""
    assert "airflow-provider-trainpipe[lineage]" in PROJECT["optional-dependencies"]["dev"]
    assert "apache-airflow-providers-openlineage" in _names(PROJECT["optional-dependencies"]["lineage"])


@pytest.mark.integration
def test_without_the_openlineage_provider_the_dag_builds_and_its_steps_emit_nothing():
    # What trainpipe imports of the provider and its client fail, as where they are not installed (the provider's
    # package itself stays: Airflow's provider discovery reads its metadata from the installed distribution).
    code = ("import sys; sys.modules.update(dict.fromkeys(['airflow.providers.openlineage.extractors', 'openlineage', "
            "'openlineage.client', 'openlineage.client.facet_v2', 'openlineage.client.event_v2'])); "
            "from pathlib import Path; from trainpipe.compile.compiler import compile_directory; "
            "from trainpipe.dags.builder import build_dag; from trainpipe.operators import openlineage; "
            "from trainpipe.settings import Settings; "
            f"plan = compile_directory(Path({str(REPO / 'dag_configs')!r}), settings=Settings.from_env())"
            ".plans['fraud_detector']; "
            "dag = build_dag(plan); "
            "print(openlineage.available(), dag.get_task('snapshot').get_openlineage_facets_on_complete(None))")
    out = probe(code, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False None"


@pytest.mark.integration
def test_a_tuned_spec_parses_into_its_dag_without_optuna():
    code = ("import sys; sys.modules['optuna'] = None; from pathlib import Path; "
            "from trainpipe.compile.compiler import compile_directory; from trainpipe.dags.builder import build_dag; "
            "from trainpipe.settings import Settings; "
            f"plan = compile_directory(Path({str(REPO / 'dag_configs')!r}), settings=Settings.from_env())"
            ".plans['fraud_detector_tuned']; "
            "import json; print(json.dumps(sorted(build_dag(plan).task_ids)))")
    out = probe(code, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"create_study", "trials", "pick_best"} <= set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_tuning_task_without_optuna_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    from trainpipe.steps.tuning import make_sampler

    plan = compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans["fraud_detector_tuned"]
    monkeypatch.setitem(sys.modules, "optuna", None)  # what an environment without the extra imports

    with pytest.raises(TrainpipeError, match=re.escape(
            "a tuning: spec's study tasks need optuna on this worker: pip install 'airflow-provider-trainpipe[tuning]'")):
        make_sampler(plan.tuning, 0)


@pytest.mark.integration
def test_a_kubernetes_spec_without_the_extra_is_a_located_error_naming_it_and_the_others_load(tmp_path: Path):
    """Found on the pip path: without the extra, the Kubernetes specs were import errors that called themselves
    "a trainpipe bug" (with a traceback in the log), and Airflow's CLI dropped "[kubernetes]" from the hint."""
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / "trainpipe_dags.py").write_text(
        "from trainpipe import load_dags  # Airflow DAG file: one DAG per trainpipe spec\nload_dags(globals())\n")
    configs = home / "dag_configs"
    configs.mkdir()
    for name in ("fraud_detector.yaml", "fraud_detector_multinode.yaml"):
        (configs / name).write_text((REPO / "dag_configs" / name).read_text())
    # What an environment without the extra imports: the cncf.kubernetes provider and the Kubernetes client fail.
    blocked = ("airflow.providers.cncf.kubernetes.operators.job", "airflow.providers.cncf.kubernetes.operators.pod",
               "kubernetes.client")
    code = (f"import sys, json; sys.modules.update(dict.fromkeys({blocked!r}))\n"
            "from airflow.dag_processing.dagbag import DagBag\n"
            f"bag = DagBag(dag_folder={str(home / 'dags')!r})\n"
            "print(json.dumps({'dags': sorted(bag.dag_ids), 'errors': bag.import_errors}))")
    out = probe(code, timeout=300, cwd=tmp_path,
                env={**__import__("os").environ, "TRAINPIPE_DAG_CONFIGS": str(configs),
                     "TRAINPIPE_HOME": str(tmp_path / "state")})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["dags"] == ["fraud_detector"], loaded
    (error,) = loaded["errors"].values()
    launcher_line = next(number for number, line in
                         enumerate((configs / "fraud_detector_multinode.yaml").read_text().splitlines(), 1)
                         if line.strip() == "launcher: kubernetes")
    assert error.startswith(f"dag_configs/fraud_detector_multinode.yaml:{launcher_line}:")
    assert "training.launcher: launcher 'kubernetes' needs trainpipe's 'kubernetes' extra" in error
    assert "pip install 'airflow-provider-trainpipe[kubernetes]'" in error
    assert "bug" not in error and "Traceback" not in out.stderr
