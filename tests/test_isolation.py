"""One broken spec never hides the other DAGs, and Airflow lists it under import errors with the
message `trainpipe validate` prints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainpipe.cli import main

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


@pytest.fixture
def configs_with_one_broken(tmp_path: Path) -> Path:
    configs = tmp_path / "dag_configs"
    configs.mkdir()
    for spec in (REPO / "dag_configs").glob("*.yaml"):
        shutil.copy(spec, configs / spec.name)
    broken = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()
    broken = broken.replace("pipeline_id: fraud_detector", "pipeline_id: broken_one").replace("  epochs: 8", "  epochs: 0")
    (configs / "broken_one.yaml").write_text(broken)
    return configs


def test_good_dags_load_and_exactly_the_broken_spec_is_an_import_error(configs_with_one_broken, monkeypatch, capsys, airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TRAINPIPE_DAG_CONFIGS", str(configs_with_one_broken))
    bag = DagBag(dag_folder=str(REPO / "dags"))

    from trainpipe.factory import compile_directory

    assert set(bag.dag_ids) == set(compile_directory(REPO / "dag_configs").plans) >= {"fraud_detector", "search_ranker_nightly"}
    broken_path = str((configs_with_one_broken / "broken_one.yaml").resolve())
    assert list(bag.import_errors) == [broken_path]

    monkeypatch.chdir(configs_with_one_broken.parent)
    capsys.readouterr()  # drop what parsing logged: only validate's own lines are compared
    assert main(["validate", "dag_configs"]) == 1
    validate_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dag_configs/broken_one.yaml:")]
    assert validate_lines, "validate printed nothing for the broken spec"
    assert bag.import_errors[broken_path].splitlines() == validate_lines
    assert "dag_configs/broken_one.yaml:" in validate_lines[0] and "training.epochs:" in validate_lines[0]


def test_parsing_for_one_task_compiles_only_that_spec(configs_with_one_broken, monkeypatch):
    from trainpipe.factory import register_dags

    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "search_ranker_nightly")
    namespace: dict = {}
    result = register_dags(namespace, configs_with_one_broken)

    assert set(namespace) == {"search_ranker_nightly"}
    assert result.errors == {}  # the broken spec was not even read as YAML


def test_parsing_for_one_task_still_finds_a_spec_the_quick_look_cannot_read(configs_with_one_broken, monkeypatch):
    """The parse for one task skips files by a regex on their `pipeline_id:` line; a file it cannot
    read must be compiled, never skipped, or the task's DAG would be missing on the worker."""
    from trainpipe.factory import register_dags

    spec = configs_with_one_broken / "search_ranker_nightly.yaml"
    text = spec.read_text()
    assert "pipeline_id: search_ranker_nightly\n" in text
    spec.write_text(text.replace("pipeline_id: search_ranker_nightly\n", "pipeline_id :   search_ranker_nightly\n"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "search_ranker_nightly")
    namespace: dict = {}
    register_dags(namespace, configs_with_one_broken)

    assert set(namespace) == {"search_ranker_nightly"}
