"""``trainpipe.dags.airflow_compat`` reaches into private Airflow 3.3 internals to report a broken spec as
an import error of the spec file. These tests pin each internal it relies on, so an Airflow upgrade
that changes one fails here (and the pin in pyproject.toml says which versions are known good);
whatever happens, reporting degrades to the log and never raises into ``register_dags``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.support import REPO
from trainpipe.dags.airflow_compat import report_spec_errors
from trainpipe.errors import SpecError, SpecProblem


def _error(file: str = "dag_configs/x.yaml") -> SpecError:
    return SpecError([SpecProblem(file, 3, 5, "training.epochs", "must be >= 1, got 0")])


def test_importer_module_and_the_fields_trainpipe_passes():
    base = importlib.import_module("airflow.dag_processing.importers.base")
    error_fields = {f.name for f in dataclasses.fields(base.DagImportError)}
    assert {"file_path", "message", "error_type", "line_number", "column_number", "suggestion"} <= error_fields
    result = base.DagImportResult(file_path="x.py")
    assert result.errors == [] and isinstance(result.errors, list)  # trainpipe appends to it


def test_the_frames_that_run_a_dag_file_hold_result_and_bundle_path():
    """The DAG file runs beneath ``PythonDagImporter.import_file`` (called by ``DagBag.process_file``),
    whose locals ``result`` (the DagImportResult) and ``bundle_path`` trainpipe reads from the stack."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.dag_processing.importers.python_importer import PythonDagImporter

    import_file = PythonDagImporter.import_file.__code__
    assert {"result", "bundle_path"} <= set(import_file.co_varnames)
    assert "_load_modules_from_file" in import_file.co_names
    load = PythonDagImporter._load_modules_from_file.__code__
    assert "result" in load.co_varnames[: load.co_argcount]
    assert "import_file" in DagBag.process_file.__code__.co_names


def test_pinned_airflow_range_holds_the_installed_version_and_stops_before_the_next_minor():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    airflow = next(Requirement(d) for d in dependencies if Requirement(d).name == "apache-airflow")
    installed = version("apache-airflow")
    assert airflow.specifier.contains(installed), (str(airflow.specifier), installed)
    major, minor = (int(part) for part in installed.split(".")[:2])
    assert not airflow.specifier.contains(f"{major}.{minor + 1}.0")  # widened only after these tests pass on it


def test_outside_a_dag_parse_the_errors_are_only_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="trainpipe.dags.airflow_compat"):
        assert report_spec_errors({Path("dag_configs/x.yaml"): _error()}) is False
    assert "dag_configs/x.yaml:3:5: training.epochs: must be >= 1, got 0" in caplog.text


def test_a_changed_import_result_degrades_to_a_logged_per_spec_message(caplog):
    """The stack walk finds these locals as it would Airflow's; their shapes are what a changed
    Airflow could hand over: the errors no longer a list, a bundle path no longer a path."""
    from airflow.dag_processing.importers.base import DagImportResult

    result = DagImportResult(file_path="dags/trainpipe_dags.py", errors=())
    bundle_path = None
    with caplog.at_level(logging.WARNING, logger="trainpipe.dags.airflow_compat"):
        assert report_spec_errors({Path("dag_configs/a.yaml"): _error("dag_configs/a.yaml")}) is False
    assert "dag_configs/a.yaml could not be reported to Airflow as an import error" in caplog.text

    result = DagImportResult(file_path="dags/trainpipe_dags.py")
    bundle_path = 42  # noqa: F841
    errors = {Path("dag_configs/a.yaml"): _error("dag_configs/a.yaml"), Path("dag_configs/b.yaml"): _error("dag_configs/b.yaml")}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainpipe.dags.airflow_compat"):
        assert report_spec_errors(errors) is False
    assert "dag_configs/a.yaml could not be reported" in caplog.text and "dag_configs/b.yaml could not be reported" in caplog.text
    assert result.errors == []


@pytest.mark.integration
def test_a_dag_file_parse_lists_the_reported_spec_as_its_own_import_error(tmp_path, airflow_db):
    """End to end through the pinned internals: a DAG file reports a spec error while DagBag parses it."""
    from airflow.dag_processing.dagbag import DagBag

    dags = tmp_path / "dags"
    dags.mkdir()
    spec = tmp_path / "dag_configs" / "x.yaml"
    (dags / "reporting_dag.py").write_text(
        "# airflow DAG\n"
        "from pathlib import Path\n"
        "from trainpipe.dags.airflow_compat import report_spec_errors\n"
        "from trainpipe.errors import SpecError, SpecProblem\n"
        f"REPORTED = report_spec_errors({{Path({str(spec)!r}): "
        "SpecError([SpecProblem('dag_configs/x.yaml', 3, 5, 'training.epochs', 'must be >= 1, got 0')])})\n"
    )

    bag = DagBag(dag_folder=str(dags))

    assert bag.import_errors == {str(spec): "dag_configs/x.yaml:3:5: training.epochs: must be >= 1, got 0"}


def test_reserialize_counts_the_file_last_changed_keys_as_parsed():
    """``clear_spec_errors`` adds fixed and deleted specs to ``DagBag.file_last_changed`` (named through the
    bag's ``_get_relative_fileloc``), which ``sync_bag_to_db`` (``airflow dags reserialize``) counts as parsed
    files whose old import errors it deletes; tests/dags/test_import_errors_cleared.py runs it for real."""
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    codes = [inspect.unwrap(sync_bag_to_db).__code__]  # under provide_session
    codes += [c for c in codes[0].co_consts if hasattr(c, "co_names")]  # the generator over file_last_changed
    names = {name for code in codes for name in (*code.co_names, *code.co_varnames)}
    assert {"file_last_changed", "_get_relative_fileloc", "files_parsed"} <= names
    assert "self" in DagBag.process_file.__code__.co_varnames[:1]
