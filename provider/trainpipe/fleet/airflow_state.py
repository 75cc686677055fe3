"""The fleet's facts from Airflow's metadata database, in a fixed number of queries for any number of DAGs.

Read in the api-server (the plugin's routes get Airflow's session): the trainpipe DAGs among those the caller
may read, their last run each, that run's tasks, and whether its ``approve`` task waits for an answer.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from trainpipe.fleet.collect import PipelineFacts
from trainpipe.fleet.outcome import RunFacts, TaskFacts
from trainpipe.plan.steps import APPROVE_TASK

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

TRAINPIPE_TAG = "trainpipe"
TEAM_TAG_PREFIX = "team:"


def team_of(tags: Collection[str], owner: str) -> str:
    """A DAG's ``team:<name>`` tag; without one, its owner."""
    return next((t.removeprefix(TEAM_TAG_PREFIX) for t in sorted(tags) if t.startswith(TEAM_TAG_PREFIX)), owner)


def pipelines(session: Session, readable: Collection[str], *, only: str | None = None) -> list[PipelineFacts]:
    from airflow.models.dag import DagModel, DagTag
    from airflow.models.dagrun import DagRun, DagRunNote
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance

    query = (select(DagModel.dag_id, DagModel.owners, DagModel.timetable_summary, DagModel.is_paused)
             .join(DagTag, DagTag.dag_id == DagModel.dag_id)
             .where(DagTag.name == TRAINPIPE_TAG, DagModel.is_stale.is_(False), DagModel.dag_id.in_(set(readable))))
    if only is not None:
        query = query.where(DagModel.dag_id == only)
    dags = session.execute(query).all()
    dag_ids = [d.dag_id for d in dags]
    if not dag_ids:
        return []
    tags: dict[str, list[str]] = {}
    for dag_id, name in session.execute(select(DagTag.dag_id, DagTag.name).where(DagTag.dag_id.in_(dag_ids))):
        tags.setdefault(dag_id, []).append(name)
    last_ids = select(func.max(DagRun.id)).where(DagRun.dag_id.in_(dag_ids)).group_by(DagRun.dag_id)
    # Columns and the note in one query (DagRun.note is a per-row lazy load).
    runs = {r.dag_id: r for r in session.execute(
        select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.logical_date, DagRun.start_date, DagRun.end_date,
               DagRunNote.content.label("note"))
        .outerjoin(DagRunNote, DagRunNote.dag_run_id == DagRun.id).where(DagRun.id.in_(last_ids)))}
    tasks: dict[tuple[str, str], list[TaskFacts]] = {}
    waiting: dict[tuple[str, str], object] = {}
    if runs:
        keys = [(r.dag_id, r.run_id) for r in runs.values()]
        rows = session.execute(
            select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id, TaskInstance.state,
                   TaskInstance.try_number, TaskInstance.id)
            .where(TaskInstance.dag_id.in_(dag_ids), TaskInstance.run_id.in_({k[1] for k in keys}))).all()
        wanted = set(keys)
        parked = []
        for row in rows:
            if (row.dag_id, row.run_id) not in wanted:
                continue
            state = str(row.state.value if hasattr(row.state, "value") else row.state) if row.state else None
            tasks.setdefault((row.dag_id, row.run_id), []).append(
                TaskFacts(task_id=row.task_id, state=state, try_number=row.try_number or 1))
            if row.task_id == APPROVE_TASK and state == "awaiting_input":
                parked.append((row.id, (row.dag_id, row.run_id)))
        if parked:
            created = dict(session.execute(select(HITLDetail.ti_id, HITLDetail.created_at)
                                           .where(HITLDetail.ti_id.in_([p[0] for p in parked]))).all())
            waiting = {key: created.get(ti_id) for ti_id, key in parked}
    out = []
    for dag in dags:
        owner = dag.owners or "airflow"
        run = runs.get(dag.dag_id)
        facts = None
        if run is not None:
            key = (run.dag_id, run.run_id)
            facts = RunFacts(run_id=run.run_id, state=str(getattr(run.state, "value", run.state)), logical_date=run.logical_date,
                             start_date=run.start_date, end_date=run.end_date, note=run.note,
                             tasks=tuple(sorted(tasks.get(key, []), key=lambda t: t.task_id)),
                             awaiting_input_since=(waiting.get(key) or run.start_date) if key in waiting else None)
        out.append(PipelineFacts(pipeline_id=dag.dag_id, owner=owner, team=team_of(tags.get(dag.dag_id, []), owner),
                                 schedule=None if dag.timetable_summary in (None, "None") else dag.timetable_summary,
                                 is_paused=bool(dag.is_paused), last_run=facts))
    return out


def pending_approval(session: Session, dag_id: str) -> dict | None:
    """The parked ``approve`` task of ``dag_id``'s runs, with its request (subject, body, options)."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance

    row = session.execute(
        select(TaskInstance.run_id, TaskInstance.map_index, HITLDetail.subject, HITLDetail.body, HITLDetail.options,
               HITLDetail.created_at)
        .join(HITLDetail, HITLDetail.ti_id == TaskInstance.id)
        .where(TaskInstance.dag_id == dag_id, TaskInstance.task_id == APPROVE_TASK,
               TaskInstance.state == "awaiting_input", HITLDetail.responded_at.is_(None))
        .order_by(HITLDetail.created_at.desc()).limit(1)).first()
    if row is None:
        return None
    return {"run_id": row.run_id, "task_id": APPROVE_TASK, "map_index": row.map_index, "subject": row.subject,
            "body": row.body, "options": list(row.options or []),
            "created_at": row.created_at.isoformat(timespec="seconds") if row.created_at else None}
