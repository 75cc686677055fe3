"""What many tests share: the repository's DAG files parsed as Airflow does, and specs written as an example
with one text replaced."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import DAG

REPO = Path(__file__).resolve().parents[1]


def dag_bag(configs: Path | None = None, env: pytest.MonkeyPatch | None = None) -> DagBag:
    """Airflow's DagBag of the repository's DAG files, parsing ``configs`` (``TRAINPIPE_DAG_CONFIGS`` set
    through ``env``) or, without it, the folder the environment already names."""
    from airflow.dag_processing.dagbag import DagBag

    if configs is not None:
        assert env is not None, "configs are named through TRAINPIPE_DAG_CONFIGS: pass the test's MonkeyPatch"
        env.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    return DagBag(dag_folder=str(REPO / "dags"))


def load_dag(configs: Path, dag_id: str, env: pytest.MonkeyPatch) -> DAG:
    """The DAG ``dag_id`` of the folder ``configs``, every spec of which must load."""
    bag = dag_bag(configs, env)
    assert bag.import_errors == {}
    return bag.get_dag(dag_id)


def run_dag(dag: DAG, **test_arguments: Any) -> tuple[Any, dict[str, str]]:
    """``dag.test(...)``: the DAG run and each task's final state."""
    dag_run = dag.test(**test_arguments)
    return dag_run, {ti.task_id: ti.state for ti in dag_run.get_task_instances()}


def task_result(dag_run: Any, task_id: str) -> Any:
    """What task ``task_id`` of ``dag_run`` returned (its ``return_value`` XCom)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id, XComModel.task_id == task_id,
            XComModel.key == "return_value")).one()
        return XComModel.deserialize_value(row)


def spec_with(tmp_path: Path, old: str, new: str, *, example: str = "fraud_detector.yaml",
              name: str = "variant.yaml") -> Path:
    """The example spec ``example`` with ``old`` replaced by ``new``, written as ``tmp_path / name``.

    ``old`` must occur: otherwise the test would silently test the unchanged example."""
    text = (REPO / "dag_configs" / example).read_text()
    assert old in text, f"{old!r} is not in dag_configs/{example}"
    path = tmp_path / name
    path.write_text(text.replace(old, new))
    return path


def edited_spec(path: Path, replacements: tuple[tuple[str, str], ...]) -> str:
    """The spec at ``path`` with each ``(old, new)`` replaced; each ``old`` must occur (else a test would silently
    run the unchanged example)."""
    text = path.read_text()
    for old, new in replacements:
        assert old in text, f"{old!r} is not in {path.name}"
        text = text.replace(old, new)
    return text


def copy_airflow_db(template: Path, target: Path) -> Path:
    """A consumer's own migrated Airflow database: a copy of the session's template (``airflow_db_template``)."""
    import shutil

    target.parent.mkdir(parents=True, exist_ok=True)
    # Copied beside the target, then renamed over it: a connection still open on an old file never sees it half
    # written.
    partial = target.with_name(target.name + ".copying")
    shutil.copyfile(template, partial)
    partial.replace(target)
    return target


def record_secret_reads(monkeypatch: Any, *, secret: str, password: str) -> list[str]:
    """A variable (``SECRET``) and a connection (``LEAK``) a rendered template would read, holding ``secret`` and
    ``password``; every ``Variable.get`` / ``Connection.get`` is recorded in the returned list instead of read."""
    import json

    from airflow.sdk.definitions.connection import Connection
    from airflow.sdk.definitions.variable import Variable

    monkeypatch.setenv("AIRFLOW_VAR_SECRET", secret)
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", json.dumps({"conn_type": "generic", "password": password}))
    reads: list[str] = []
    monkeypatch.setattr(Connection, "get", classmethod(lambda cls, conn_id, *a, **k: reads.append(conn_id)))
    monkeypatch.setattr(Variable, "get", staticmethod(lambda key, *a, **k: reads.append(key)))
    return reads
