"""The train task's callbacks: they keep the status marker (``output/status.json``) that the checkpoint sensor
reads current, whatever the launcher, since only Airflow knows whether a failure is retried. Airflow calls them
beside the operator's ``execute`` (a retry or failure callback may run in the dag-processor), so each reads the
platform's settings where a task enters trainpipe (``operators.context.task_settings``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from trainpipe.operators.context import task_settings
from trainpipe.state.checkpoint_state import SKIPPED, dag_run_clear_number, record_training_status

log = logging.getLogger(__name__)


def _status_callback(context: Any, *, pipeline_id: str, state: str, final: bool = False) -> None:
    try:
        record_training_status(pipeline_id, settings=task_settings(), airflow_run_id=context["run_id"], state=state,
                               try_number=context["ti"].try_number, final=final,
                               clear_number=dag_run_clear_number(context))
    except Exception:
        log.exception("could not record the training status for the checkpoint sensor")


def training_status_callbacks(pipeline_id: str) -> dict[str, Callable[[Any], None]]:
    """Task callbacks that keep ``status.json`` current: start, success, retry, final failure."""
    return {
        "on_execute_callback": functools.partial(_status_callback, pipeline_id=pipeline_id, state="running"),
        "on_success_callback": functools.partial(_status_callback, pipeline_id=pipeline_id, state="succeeded"),
        "on_retry_callback": functools.partial(_status_callback, pipeline_id=pipeline_id, state="failed"),
        "on_failure_callback": functools.partial(_status_callback, pipeline_id=pipeline_id, state="failed",
                                                 final=True),
        # Skipped before anything launched (its inputs unchanged, training.cache): the sensor has nothing to watch.
        "on_skipped_callback": functools.partial(_status_callback, pipeline_id=pipeline_id, state=SKIPPED,
                                                 final=True),
    }
