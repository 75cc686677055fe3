"""How every end-to-end test gets its DAG: as Airflow loads it, from the repository's DAG files
(``trainpipe.load_dags``) parsing a folder of specs, every one of which must load."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from airflow.sdk import DAG

REPO = Path(__file__).resolve().parents[2]


def load_dag(configs: Path, dag_id: str, env: pytest.MonkeyPatch) -> DAG:
    """The DAG ``dag_id`` of the folder ``configs`` (``TRAINPIPE_DAG_CONFIGS`` set through ``env``)."""
    from airflow.dag_processing.dagbag import DagBag

    env.setenv("TRAINPIPE_DAG_CONFIGS", str(configs))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.get_dag(dag_id)


def run_dag(dag: DAG, **test_arguments: Any) -> tuple[Any, dict[str, str]]:
    """``dag.test(...)``: the DAG run and each task's final state."""
    dag_run = dag.test(**test_arguments)
    return dag_run, {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
