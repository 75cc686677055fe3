"""The DAG run's note: a one-line outcome a person sees in the run list and on the run page.

Airflow 3 gives a task no way to set its run's note (the task SDK talks to the execution API, which has no
such route, and task processes have no database access), and DAG callbacks run in the DAG processor under the
same restriction. So a task leaves its line as an XCom under ``RUN_NOTE_KEY``, and trainpipe's listener
(``trainpipe.listeners.run_notes``, loaded by the scheduler through the provider's plugin) writes the lines
into the note when the run ends, in the scheduler's own session: no credentials, no REST call.
"""

from __future__ import annotations

from typing import Any

RUN_NOTE_KEY = "trainpipe_run_note"
# Airflow's limit on a note's length (dag_run_note.content is a String(1000)).
NOTE_MAX_CHARS = 1000


def leave_note(ti: Any, line: str) -> None:
    """From a task: ``line`` becomes part of the run's note when the run ends."""
    ti.xcom_push(key=RUN_NOTE_KEY, value=line)


def merged_note(existing: str | None, lines: list[str]) -> str | None:
    """The note with trainpipe's lines appended once each (a person's own note is kept, first)."""
    kept = [line for line in (existing or "").splitlines() if line.strip()]
    for line in lines:
        if line and line not in kept:
            kept.append(line)
    if not kept:
        return existing
    note = "\n".join(kept)
    return note if len(note) <= NOTE_MAX_CHARS else note[: NOTE_MAX_CHARS - 1] + "…"
