"""Reporting a broken spec to Airflow as an import error of the spec file itself.

Airflow 3.3 records import errors per parsed file, and a DAG file that raises loses all its DAGs.
So the DAG files of ``dags/`` never raise for a bad spec: it adds a structured ``DagImportError``
(file, line, column, the ``trainpipe validate`` text) to the import result Airflow is building for
the file being parsed. Airflow 3.4's experimental Dag importer interface is the supported home for
this once it is stable (ADR 0004).

That result is found through private Airflow 3.3 internals, pinned by ``tests/dags/test_airflow_compat.py``:
``airflow.dag_processing.importers.base.DagImportResult`` (its ``errors`` list) and
``DagImportError`` (the fields passed below), held in the locals ``result`` and ``bundle_path`` of
``PythonDagImporter.import_file`` and the functions it calls to execute the DAG file. Whatever
fails here (another Airflow version, the file imported outside a DAG parse, a changed internal) is
logged per spec and never raised: valid DAGs must never vanish.

A spec that is deleted or fixed is no longer reported, and Airflow 3.3 deletes an import error only
of a file it counts as parsed: the dag-processor counts the DAG file alone (and drops the errors of
files its bundle refresh does not see), ``airflow dags reserialize`` the keys of the ``DagBag``'s
``file_last_changed``. ``clear_spec_errors`` adds such specs there, on the ``DagBag`` found as
``self`` of ``DagBag.process_file`` on the stack, so the next parse of the DAG file clears them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from trainpipe.errors import SpecError

log = logging.getLogger(__name__)


def _import_result_in_progress():
    try:
        from airflow.dag_processing.importers.base import DagImportResult
    except ImportError:
        return None, None
    frame = inspect.currentframe()
    result = None
    try:
        while frame is not None:
            local = frame.f_locals
            if result is None and isinstance(local.get("result"), DagImportResult):
                result = local["result"]
            if result is not None and "bundle_path" in local:
                return result, local.get("bundle_path")
            frame = frame.f_back
    finally:
        del frame  # a frame reference kept here would keep every caller's locals alive
    return result, None


def spec_location(path: Path) -> Path:
    """Where a spec file is, as its import error is stored: its folders resolved, the file itself not, so a
    spec that is a link (refused when it leads out of the folder) never shows where it leads."""
    return path.parent.resolve() / path.name


def _airflow_relative_path(path: Path, bundle_path: Path | None, configs_root: Path | None = None) -> str:
    """The file name a spec's import error is stored and shown under: relative to the bundle when inside
    it, as Airflow names its own files; for a spec outside it (the usual dag_configs/ beside dags/), the
    name its messages give it, relative to the configs folder's parent (``dag_configs/risk/fraud.yaml``),
    so the UI shows no absolute path of the dag-processor's machine. Absolute only without a bundle (a
    DagBag of one's own) or a configs folder to name it by."""
    location = spec_location(path)
    if bundle_path is not None:
        for base in (Path(bundle_path).resolve(), configs_root.resolve().parent if configs_root else None):
            if base is not None and location.is_relative_to(base):
                return str(location.relative_to(base))
    return str(location)


def report_spec_errors(errors: dict[Path, SpecError], *, configs_root: Path | None = None) -> bool:
    """Attach each broken spec's problems to Airflow's import errors; True when Airflow got them all.
    ``configs_root``: the specs folder, whose parent names a spec outside the bundle. Never raises: on any
    failure the problems stay in the log only."""
    for path, err in errors.items():
        log.error("trainpipe: %s was not compiled:\n%s", path, err)
    try:
        result, bundle_path = _import_result_in_progress()
        if result is None:
            return False
        from airflow.dag_processing.importers.base import DagImportError
    except Exception:
        log.warning("trainpipe: Airflow's import result could not be found (have the Airflow internals named in "
                    "trainpipe.dags.airflow_compat changed?); the spec errors above are in this log only", exc_info=True)
        return False
    reported = True
    for path, err in errors.items():
        try:
            first = err.problems[0] if err.problems else None
            result.errors.append(
                DagImportError(
                    file_path=_airflow_relative_path(path, bundle_path, configs_root),
                    message=str(err),
                    error_type="trainpipe spec",
                    line_number=first.line if first else None,
                    column_number=first.column if first else None,
                    suggestion="run `trainpipe validate` on the file",
                )
            )
        except Exception:
            reported = False
            log.warning("trainpipe: %s could not be reported to Airflow as an import error (have the Airflow "
                        "internals named in trainpipe.dags.airflow_compat changed?); its errors are in this log only",
                        path, exc_info=True)
    return reported


def _dag_bag_in_progress():
    from airflow.dag_processing.dagbag import DagBag

    frame = inspect.currentframe()
    try:
        while frame is not None:
            bag = frame.f_locals.get("self")
            if isinstance(bag, DagBag) and frame.f_code is DagBag.process_file.__code__:
                return bag
            frame = frame.f_back
    finally:
        del frame
    return None


def clear_spec_errors(paths: Iterable[Path], *, configs_root: Path | None = None) -> bool:
    """Have Airflow delete the import errors of ``paths`` (spec files deleted, or parsed without a
    problem) when it stores this parse, under the names ``report_spec_errors`` gave them (``configs_root``:
    the same); True when the DagBag was found. Never raises."""
    paths = list(paths)
    if not paths:
        return True
    try:
        bag = _dag_bag_in_progress()
        if bag is None:
            return False
        # Airflow turns each key into its stored file name with _get_relative_fileloc, which raises for a
        # file outside the bundle (the usual dag_configs/ beside dags/): that name is what the error was
        # stored under, so it is given here for these keys alone.
        names = getattr(bag, "_trainpipe_spec_names", None)
        if names is None:
            names = bag._trainpipe_spec_names = {}
            relative = bag._get_relative_fileloc
            bag._get_relative_fileloc = lambda filepath: names.get(filepath) or relative(filepath)
        for path in paths:
            key = str(spec_location(path))
            names[key] = _airflow_relative_path(path, bag.bundle_path, configs_root)
            bag.file_last_changed.setdefault(key, datetime.now())
    except Exception:
        log.warning("trainpipe: the import errors of %d fixed or deleted spec(s) could not be cleared (have the "
                    "Airflow internals named in trainpipe.dags.airflow_compat changed?); the dag-processor clears them "
                    "at its next bundle refresh", len(paths), exc_info=True)
        return False
    return True
