"""One broken spec never hides the other DAGs, and Airflow lists it under import errors with the
message `trainpipe validate` prints."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support import REPO, dag_bag
from trainpipe.commands.main import main
from trainpipe.settings import Settings

BAD_SPECS = REPO / "tests" / "fixtures" / "bad_specs"

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
    bag = dag_bag(configs_with_one_broken, monkeypatch)

    from trainpipe.compile.compiler import compile_directory

    assert set(bag.dag_ids) == set(compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans) >= {
        "fraud_detector", "search_ranker_nightly"}
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
    from trainpipe.dags.files import register_dags

    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "search_ranker_nightly")
    namespace: dict = {}
    result = register_dags(namespace, configs_with_one_broken, settings=Settings.from_env())

    assert set(namespace) == {"search_ranker_nightly"}
    assert result.errors == {}  # the broken spec was not even read as YAML


def test_parsing_for_one_task_still_finds_a_spec_the_quick_look_cannot_read(configs_with_one_broken, monkeypatch):
    """The parse for one task skips files by a regex on their `pipeline_id:` line; a file it cannot
    read must be compiled, never skipped, or the task's DAG would be missing on the worker."""
    from trainpipe.dags.files import register_dags

    spec = configs_with_one_broken / "search_ranker_nightly.yaml"
    text = spec.read_text()
    assert "pipeline_id: search_ranker_nightly\n" in text
    spec.write_text(text.replace("pipeline_id: search_ranker_nightly\n", "pipeline_id :   search_ranker_nightly\n"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "search_ranker_nightly")
    namespace: dict = {}
    register_dags(namespace, configs_with_one_broken, settings=Settings.from_env())

    assert set(namespace) == {"search_ranker_nightly"}


def test_every_bad_fixture_beside_the_examples_is_its_own_import_error(tmp_path, monkeypatch, airflow_db):
    """The whole bad-spec collection (decode errors, alias bombs, empty files, wrong types, ...) in one
    folder with the good examples: every good DAG is built, every bad file is listed under its own
    name with its located message, and the parse ends well within Airflow's import timeout (30 s)."""

    from trainpipe.compile.compiler import compile_directory, spec_files

    configs = tmp_path / "dag_configs"
    configs.mkdir()
    for spec in (REPO / "dag_configs").glob("*.yaml"):
        shutil.copy(spec, configs / spec.name)
    # Each fixture gets the defaults it is validated with: the ones in bad_specs/ their _defaults.yaml
    # (the valid base each mistake sits on), the ones in bad_specs/standalone/ none.
    shutil.copytree(BAD_SPECS, configs / "bad_specs", ignore=shutil.ignore_patterns("standalone"))
    shutil.copytree(BAD_SPECS / "standalone", configs / "standalone")
    bad = spec_files(configs / "bad_specs") + spec_files(configs / "standalone")
    assert len(bad) >= 30

    start = time.monotonic()
    bag = dag_bag(configs, monkeypatch)
    elapsed = time.monotonic() - start

    assert set(bag.dag_ids) == set(compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans) >= {
        "fraud_detector", "search_ranker_nightly"}
    assert sorted(bag.import_errors) == sorted(str(path.resolve()) for path in bad)
    for path in bad:
        name = f"dag_configs/{path.relative_to(configs)}"
        message = bag.import_errors[str(path.resolve())]
        assert re.match(rf"{re.escape(name)}:\d+:\d+: ", message), message
        last_line = path.read_bytes().decode("utf-8", errors="replace").rstrip("\n").rpartition("\n")[2]
        if last_line.startswith("# expect: "):
            assert f"{name}:{last_line.removeprefix('# expect: ')}" in message, message
    assert elapsed < 30, f"parsing took {elapsed:.1f} s, Airflow's default import timeout is 30 s"


def test_a_dag_that_fails_to_build_is_its_spec_files_error(configs_with_one_broken, monkeypatch):
    """No valid spec is known to fail in Airflow's DAG constructor, so one failure is injected; the
    DAG file must still define every other DAG instead of raising."""
    import trainpipe.dags.builder
    from trainpipe.dags.files import register_dags

    real_build_dag = trainpipe.dags.builder.build_dag

    def build_dag(plan):
        if plan.dag_id == "search_ranker_gpu":
            raise ValueError("bad schedule for this Airflow")
        return real_build_dag(plan)

    monkeypatch.setattr(trainpipe.dags.builder, "build_dag", build_dag)
    namespace: dict = {}
    result = register_dags(namespace, configs_with_one_broken, settings=Settings.from_env())

    assert set(namespace) == {"digit_classifier", "fraud_detector", "fraud_detector_approval",
                              "fraud_detector_multinode", "fraud_detector_tuned", "search_ranker_nightly", "ticket_assistant",
                              "ticket_intent", "ticket_router"}
    assert set(result.errors) == {"dag_configs/broken_one.yaml", "dag_configs/search_ranker_gpu.yaml"}
    assert str(result.errors["dag_configs/search_ranker_gpu.yaml"]) == (
        "dag_configs/search_ranker_gpu.yaml:1:1: trainpipe could not compile this file (ValueError: bad schedule for "
        "this Airflow); this is a trainpipe bug: please report it with the file (the traceback is in the log)")
    assert "search_ranker_gpu" not in result.plans
