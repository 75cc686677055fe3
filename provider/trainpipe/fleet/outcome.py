"""A DAG run's outcome and its reason in words, from what Airflow and MLflow recorded (Airflow-free).

The reason is the run note's first line when there is one (trainpipe's tasks and the run-notes listener
write it, ADR 0009); otherwise it is composed from the run's state, its tasks and the drift tags on its MLflow
run, so a run from before notes existed still says why it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from trainpipe.plan.steps import APPROVE, PROMOTE, TRAIN, VALIDATE
from trainpipe.state.run_notes import FAILED_AT

# Outcomes, in the order "needs attention" sorts them (most urgent first).
FAILED = "failed"
DRIFT_STOPPED = "validation_failed"
GATES_FAILED = "gates_failed"
AWAITING_APPROVAL = "awaiting_approval"
REJECTED = "rejected"
RUNNING = "running"
NEVER_RUN = "never_run"
NOT_PROMOTED = "not_promoted"
PROMOTED = "promoted"
OUTCOMES = (FAILED, DRIFT_STOPPED, GATES_FAILED, AWAITING_APPROVAL, REJECTED, RUNNING, NEVER_RUN, NOT_PROMOTED,
            PROMOTED)
NEEDS_ATTENTION = frozenset({FAILED, DRIFT_STOPPED, GATES_FAILED, AWAITING_APPROVAL, REJECTED})


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFacts:
    task_id: str
    state: str | None
    try_number: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """What Airflow knows about a pipeline's last DAG run."""

    run_id: str
    state: str
    logical_date: datetime | None
    start_date: datetime | None
    end_date: datetime | None
    note: str | None
    tasks: tuple[TaskFacts, ...] = ()
    # When the approve task parked (its HITL request), if it is waiting now.
    awaiting_input_since: datetime | None = None

    def task(self, task_id: str) -> TaskFacts | None:
        return next((t for t in self.tasks if t.task_id == task_id), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftFacts:
    """The drift record validate left on the DAG run's MLflow run."""

    verdict: str | None = None
    failed_features: tuple[str, ...] = ()
    psi: dict[str, float] = field(default_factory=dict)
    ks: dict[str, float] = field(default_factory=dict)


def duration_words(seconds: float) -> str:
    """``3 h``, ``2 d``, ``45 min``: the one unit a person reads at a glance."""
    seconds = max(0.0, seconds)
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def _drift_reason(drift: DriftFacts) -> str | None:
    if drift.verdict != "fail" or not drift.failed_features:
        return None
    parts = []
    for feature in drift.failed_features:
        values = [f"PSI {drift.psi[feature]:.2f}" if feature in drift.psi else "",
                  f"KS {drift.ks[feature]:.2f}" if feature in drift.ks else ""]
        shown = ", ".join(v for v in values if v)
        parts.append(f"{feature} ({shown})" if shown else feature)
    return "validation failed: drift in " + ", ".join(parts)


def _retries(run: RunFacts) -> str:
    train = run.task(TRAIN.task_id)
    if train is None or train.try_number <= 1:
        return ""
    extra = train.try_number - 1
    return f"train retried {'once' if extra == 1 else f'{extra} times'}, then "


def outcome_of(run: RunFacts | None, *, now: datetime, drift: DriftFacts | None = None) -> tuple[str, str]:
    """``(outcome, reason)`` of the last run; the reason is one line of words."""
    if run is None:
        return NEVER_RUN, "never run"
    first_line = next((line.strip() for line in (run.note or "").splitlines() if line.strip()), "")
    if first_line.startswith(f"{FAILED_AT}:"):
        # The listener's fallback (no step said why): the run's own facts below say more.
        first_line = ""
    if run.awaiting_input_since is not None:
        waited = duration_words((now - run.awaiting_input_since).total_seconds())
        return AWAITING_APPROVAL, f"awaiting approval for {waited}"
    if run.state in ("running", "queued"):
        since = run.start_date or run.logical_date
        return RUNNING, f"{run.state} for {duration_words((now - since).total_seconds())}" if since else run.state
    promote = run.task(PROMOTE.task_id)
    approve = run.task(APPROVE.task_id)
    lowered = first_line.lower()
    if run.state == "failed":
        failed = [t.task_id for t in run.tasks if t.state == "failed"]
        validate = run.task(VALIDATE.task_id)
        drift_reason = _drift_reason(drift) if drift is not None else None
        if (validate is not None and validate.state == "failed") or lowered.startswith(("validation failed",
                                                                                          "drift")):
            return DRIFT_STOPPED, first_line or drift_reason or "validation failed (see the validate task's log)"
        if lowered.startswith("gates failed"):
            return GATES_FAILED, first_line
        where = f" in {', '.join(failed)}" if failed else ""
        return FAILED, first_line or f"{_retries(run)}failed{where}"
    # The run succeeded (or was marked so): did it promote?
    if promote is not None and promote.state == "success":
        return PROMOTED, _retries(run) + (first_line or "promoted")
    if lowered.startswith("gates failed"):
        return GATES_FAILED, first_line
    if approve is not None and approve.state in ("skipped", "success") and "rejected" in lowered:
        return REJECTED, first_line
    if promote is not None and promote.state == "skipped":
        return NOT_PROMOTED, first_line or "not promoted (promote was skipped)"
    return NOT_PROMOTED, first_line or f"run {run.state}"


def attention_rank(outcome: str, *, champion_age_days: float | None, stale_after_days: float) -> int:
    """Sort key: outcomes that need attention first, then a champion older than ``stale_after_days``."""
    if outcome in NEEDS_ATTENTION:
        return OUTCOMES.index(outcome)
    if champion_age_days is not None and champion_age_days > stale_after_days:
        return len(NEEDS_ATTENTION)
    return len(NEEDS_ATTENTION) + 1 + OUTCOMES.index(outcome)
