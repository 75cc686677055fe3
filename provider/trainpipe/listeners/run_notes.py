"""Writes the lines trainpipe's tasks left (``trainpipe.state.run_notes``) into the DAG run's note when the run ends.

Runs where Airflow changes a run's state: in the scheduler (and in ``dag.test()``), inside the session that
commits the new state, so the note is saved with it. A failure here is logged by Airflow and changes nothing
about the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.listeners import hookimpl

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from sqlalchemy.orm import Session


def _write_note(dag_run: DagRun, *, failed: bool = False) -> None:
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is not None:  # the scheduler: its session commits the run's new state, and the note with it
        _write_note_in(session, dag_run, failed=failed)
        return
    # dag.test() hands over a run detached from any session: write it in one of our own.
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as own:
        attached = own.scalar(select(DagRun).where(DagRun.dag_id == dag_run.dag_id, DagRun.run_id == dag_run.run_id))
        if attached is not None:
            _write_note_in(own, attached, failed=failed)


def _write_note_in(session: Session, dag_run: DagRun, *, failed: bool) -> None:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    from trainpipe.state.run_notes import RUN_NOTE_KEY, merged_note

    rows = session.scalars(
        select(XComModel)
        .where(XComModel.dag_id == dag_run.dag_id, XComModel.run_id == dag_run.run_id, XComModel.key == RUN_NOTE_KEY)
        .order_by(XComModel.timestamp)
    ).all()
    lines = [str(XComModel.deserialize_value(row)) for row in rows]
    if not lines and failed:
        lines = _failed_tasks_line(session, dag_run)
    if not lines:
        return
    note = merged_note(dag_run.note, lines)
    if note != dag_run.note:
        dag_run.note = note


def _failed_tasks_line(session: Session, dag_run: DagRun) -> list[str]:
    """A failure no step explained (a crash, a lost worker) still says where it happened."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    from trainpipe.state.run_notes import failed_at_note

    failed = session.scalars(
        select(TaskInstance.task_id)
        .where(TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
               TaskInstance.state == "failed")
        .order_by(TaskInstance.end_date)
    ).all()
    return [failed_at_note(list(failed))] if failed else []


@hookimpl
def on_dag_run_success(dag_run: DagRun, msg: str) -> None:
    _write_note(dag_run)


@hookimpl
def on_dag_run_failed(dag_run: DagRun, msg: str) -> None:
    _write_note(dag_run, failed=True)
