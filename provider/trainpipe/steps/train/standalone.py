"""The training step alone, outside Airflow (``trainpipe train SPEC [--run-dir DIR]``).

Same snapshot code, same trainer config, same launcher and command as the DAG's ``train`` task.
Without ``--logical-date`` the data window ends at the start of the current UTC day, the logical
date of today's ``@daily`` run, so every run on one day trains on the same snapshot and gives the
same weights. A run dir that already holds committed checkpoints is resumed, if they were written
with the same snapshot and result-changing settings (else the run stops, see ``check_resumable``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from trainpipe import storage
from trainpipe.errors import SpecError
from trainpipe.plan import launch
from trainpipe.plan.model import PipelinePlan
from trainpipe.settings import Settings
from trainpipe.steps.register.lineage import git_commit
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.train import RunContext, run_training
from trainpipe_trainer.outcomes import TrainingResult


def _run_dir(value: str, settings: Settings):
    if "://" not in value:
        value = Path(value).resolve().as_uri()
    return storage.resolve_uri(value, settings, settings.storage_conn_id)


def default_logical_date(now: datetime | None = None) -> datetime:
    """The start of the current UTC day: what a ``@daily`` run of today uses, whatever the hour."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def with_nproc_per_node(plan: PipelinePlan, nproc_per_node: int) -> PipelinePlan:
    """The plan launched with another number of processes per node (``--nproc-per-node``): the same
    training otherwise, so its run dir's checkpoints resume at the new size (resharded)."""
    return dataclasses.replace(plan, launch=launch.with_nproc_per_node(plan.launch, nproc_per_node))


def train_spec(plan: PipelinePlan, *, settings: Settings, run_dir: str | None, logical_date: str | None,
               on_line: Callable[[str], None]) -> TrainingResult | None:
    """Snapshot the window ending at ``logical_date`` and train on it in ``run_dir`` (a fresh one without it), with
    the launch the DAG's train task uses; ``on_line`` gets each line of the launch's output."""
    try:
        when = datetime.fromisoformat(logical_date) if logical_date else default_logical_date()
    except ValueError as err:
        raise SpecError(f"--logical-date: {logical_date!r} is not an ISO date; use YYYY-MM-DD or "
                        "YYYY-MM-DDTHH:MM:SS+00:00") from err
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    folder = _run_dir(run_dir, settings) if run_dir else None
    # One MLflow run per run dir: re-running the same dir (a resume) logs into the same run. Without
    # a run dir, the wall-clock name gives a fresh run dir and MLflow run; it does not reach the weights.
    run_name = f"cli__{folder.name}" if folder is not None else f"cli__{datetime.now(UTC):%Y%m%dT%H%M%S}"
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=when, class_label=plan.class_label)
    run = RunContext(dag_id=plan.dag_id, airflow_run_id=run_name, try_number=1, spec_sha256=plan.spec_sha256,
                     git_commit=git_commit(plan.source_path))
    return run_training(plan, snapshot, settings=settings, run=run, run_dir=folder, on_line=on_line)
