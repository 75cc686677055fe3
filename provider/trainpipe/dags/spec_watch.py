"""Watches the specs folder from inside the dag-processor, so a written, edited or deleted spec is parsed
within seconds at any folder size (ADR 0022).

Airflow parses DAG files, not YAML: a spec's change shows only when the DAG file that compiles it is
parsed again, and at 20,000 specs the dag-processor came round to each file every 5-6 minutes. This
listener starts a thread in the dag-processor (``on_starting`` of its job; it ends in any other
component) that every ``WATCH_SECONDS`` lists the folder and stats each spec
(``trainpipe.dags.files.watch_specs``) and marks modified the DAG file of each shard whose specs were
added, changed or removed, or every file when a ``_defaults.yaml`` or the platform policy changed,
and asks the dag-processor to parse those files first (Airflow's reparse request), again until a parse
begun after the change has run. DAG files' time stamps change, never their content.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

WATCH_SECONDS = 5.0
_DAG_PROCESSOR_JOB = "DagProcessorJob"
_stop = threading.Event()


@hookimpl
def on_starting(component: Any) -> None:
    # Airflow calls this as a job is created, before its runner names the job type: the thread looks
    # at the type once the first interval has passed.
    _stop.clear()
    threading.Thread(target=_run, args=(component,), name="trainpipe-spec-watch", daemon=True).start()


@hookimpl
def before_stopping(component: Any) -> None:
    _stop.set()


def _run(component: Any) -> None:
    if _stop.wait(WATCH_SECONDS) or getattr(component, "job_type", None) != _DAG_PROCESSOR_JOB:
        return
    from trainpipe.dags.files import watch_specs
    from trainpipe.settings import Settings

    # A listener is where the dag-processor enters trainpipe: the settings are read here and passed down.
    watch_specs(_stop, WATCH_SECONDS, Settings.from_env())
