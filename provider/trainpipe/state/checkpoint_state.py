"""What a run folder says about its training: committed checkpoints and the train task's status.

One reader for every caller: the checkpoint sensor's first check (on a worker) and its trigger
(on the triggerer) both call ``read_checkpoint_state`` and ``assess``, so they cannot drift.

The run folder's layout is the trainer contract's (``trainpipe_trainer.run_layout``): the trainer
writes ``checkpoints/step-<N>/manifest.json`` (committed) and ``output/result.json``, the train
task writes ``output/status.json``.

Reads go through Airflow's ``ObjectStoragePath`` (fsspec underneath), so ``file://`` and ``s3://``
run folders behave the same. Airflow-free apart from that path type.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from trainpipe import storage
from trainpipe.errors import TrainpipeError
from trainpipe.settings import Settings
from trainpipe.state.run_folder import run_dir_for
from trainpipe_trainer.run_layout import (
    CHECKPOINT_MANIFEST,
    CHECKPOINTS_DIR,
    OUTPUT_DIR,
    STATUS_FILE,
    checkpoint_dir_name,
    checkpoint_step,
)

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

log = logging.getLogger(__name__)

# queued: the train Job waits for quota in a Kueue queue (created suspended): not a stall.
TrainingState = Literal["queued", "running", "succeeded", "failed", "skipped"]
# The status of a train task that skipped itself (its inputs unchanged): read as finished, nothing to watch.
SKIPPED = "skipped"


class TrainingStalledError(TrainpipeError):
    """Training runs but has committed no checkpoint for longer than ``stall_timeout``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingStatus:
    """The train task's own account of the training: written on start, success, retry and failure."""

    state: TrainingState
    try_number: int
    # failed only: no retry follows (the task failed for good).
    final: bool
    started_at: datetime
    updated_at: datetime
    # The DAG run's clear_number when written: a status from before the run (or task) was cleared
    # describes an earlier training and must not end the watch of the new one.
    clear_number: int = 0
    # queued only: the Kueue LocalQueue and since when the Job waits in it.
    queue: str | None = None
    queued_since: datetime | None = None

    def to_json(self) -> str:
        raw = asdict(self)
        raw["started_at"] = self.started_at.isoformat()
        raw["updated_at"] = self.updated_at.isoformat()
        raw["queued_since"] = self.queued_since.isoformat() if self.queued_since else None
        return json.dumps(raw, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainingStatus:
        return cls(
            state=raw["state"], try_number=int(raw["try_number"]), final=bool(raw.get("final", False)),
            started_at=datetime.fromisoformat(raw["started_at"]), updated_at=datetime.fromisoformat(raw["updated_at"]),
            clear_number=int(raw.get("clear_number", 0)), queue=raw.get("queue"),
            queued_since=datetime.fromisoformat(raw["queued_since"]) if raw.get("queued_since") else None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedCheckpoint:
    step: int
    # From the manifest; None when the manifest has no (readable) timestamp.
    saved_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointState:
    # The newest committed checkpoints, oldest first (at most two: enough for a rate).
    checkpoints: tuple[CommittedCheckpoint, ...]
    committed_count: int
    status: TrainingStatus | None

    @property
    def latest(self) -> CommittedCheckpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """The verdict on a ``CheckpointState`` at one moment."""

    # waiting: not started, or between tries; running: within stall_timeout; stalled: no new
    # checkpoint for stall_timeout while running; finished: the train task ended for good.
    kind: Literal["waiting", "running", "stalled", "finished"]
    message: str
    latest_step: int | None = None
    # Seconds since the last sign of progress (newest checkpoint, or the try's start).
    idle_seconds: float | None = None
    steps_per_hour: float | None = None
    succeeded: bool | None = None
    # Finished because train skipped itself: the watch is skipped too.
    skipped: bool = False

    def to_event(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "latest_step": self.latest_step,
                "idle_seconds": self.idle_seconds, "steps_per_hour": self.steps_per_hour, "succeeded": self.succeeded,
                "skipped": self.skipped}


def status_path(run_dir: ObjectStoragePath) -> ObjectStoragePath:
    return run_dir / OUTPUT_DIR / STATUS_FILE


def _invalidate(path: ObjectStoragePath) -> None:
    # Object-store listings are cached per filesystem instance; other processes write here.
    invalidate = getattr(path.fs, "invalidate_cache", None)
    if invalidate is not None:
        invalidate()


def _read_json(path: ObjectStoragePath) -> Any | None:
    try:
        return storage.read_json(path)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        # A half-written file on a filesystem without atomic writes: treat as absent this round.
        return None


def _saved_at(manifest: Any) -> datetime | None:
    if not isinstance(manifest, dict) or not isinstance(manifest.get("saved_at"), str):
        return None
    try:
        return datetime.fromisoformat(manifest["saved_at"])
    except ValueError:
        return None


def read_checkpoint_state(run_dir: ObjectStoragePath, *, clear_number: int = 0) -> CheckpointState:
    """Committed checkpoints and the train task's status of one run folder (never raises for absence);
    a status written before the DAG run's ``clear_number`` reads as none."""
    _invalidate(run_dir)
    root = run_dir / CHECKPOINTS_DIR
    names = [entry.name for entry in root.iterdir()] if root.exists() else []
    steps = [step for step in map(checkpoint_step, names) if step is not None]
    newest: list[CommittedCheckpoint] = []
    committed = 0
    for step in sorted(steps, reverse=True):
        manifest = _read_json(root / checkpoint_dir_name(step) / CHECKPOINT_MANIFEST)
        if manifest is None:
            continue  # an interrupted or in-progress save: not committed
        committed += 1
        if len(newest) < 2:
            newest.append(CommittedCheckpoint(step=step, saved_at=_saved_at(manifest)))
    return CheckpointState(checkpoints=tuple(reversed(newest)), committed_count=committed,
                           status=read_training_status(run_dir, clear_number=clear_number))


def read_training_status(run_dir: ObjectStoragePath, *, clear_number: int = 0) -> TrainingStatus | None:
    raw = _read_json(status_path(run_dir))
    status = TrainingStatus.from_dict(raw) if isinstance(raw, dict) else None
    return status if status is not None and status.clear_number >= clear_number else None


def refresh_status(state: CheckpointState, run_dir: ObjectStoragePath, *, clear_number: int = 0) -> CheckpointState:
    """``state`` with the train task's status read again and its checkpoints as they were: one small
    read instead of a listing, so a watcher can notice the end of training within seconds."""
    _invalidate(run_dir)
    return replace(state, status=read_training_status(run_dir, clear_number=clear_number))


def wait_for_training_status(run_dir: ObjectStoragePath, state: CheckpointState, *, timeout: float,
                             interval: float = 0.5, clear_number: int = 0) -> CheckpointState:
    """Read the train task's status again every ``interval`` seconds until it has written one or
    ``timeout`` seconds have passed; ``state`` with the last status read."""
    deadline = time.monotonic() + timeout
    while state.status is None and time.monotonic() < deadline:
        time.sleep(interval)
        state = refresh_status(state, run_dir, clear_number=clear_number)
    return state


def write_training_status(run_dir: ObjectStoragePath, status: TrainingStatus) -> None:
    path = status_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        handle.write(status.to_json())


# The status marker (<run_dir>/output/status.json) the checkpoint sensor reads. Written from the train task's
# callbacks (trainpipe.operators.callbacks), whatever its launcher: only Airflow knows whether a failure is retried.


def record_training_status(pipeline_id: str, *, settings: Settings, airflow_run_id: str, state: str,
                           try_number: int, final: bool = False, clear_number: int = 0,
                           queue: str | None = None) -> None:
    run_dir = run_dir_for(pipeline_id, settings, airflow_run_id)
    now = datetime.now(UTC)
    previous = read_training_status(run_dir)
    if previous is not None and previous.try_number > try_number:
        # A late callback: the scheduler hands a try that lost its heartbeat to the dag-processor, which may
        # run its retry callback after the next try started. The newer try's status stands.
        log.info("try %d's status is %s; try %d's late '%s' is not recorded over it",
                 previous.try_number, previous.state, try_number, state)
        return
    same_try = previous is not None and previous.try_number == try_number
    # A try keeps its start time (a deferred task runs its execute callback again on each resume); a try
    # that waited for quota starts when it is admitted (from then on its devices are held and a stall counts).
    started_at = previous.started_at if same_try and previous.state != "queued" else now
    queued_since = None
    if state == "queued":
        queued_since = previous.queued_since if same_try and previous.state == "queued" else now
    write_training_status(run_dir, TrainingStatus(state=state, try_number=try_number, final=final,
                                                  started_at=started_at, updated_at=now, clear_number=clear_number,
                                                  queue=queue if state == "queued" else None,
                                                  queued_since=queued_since))


def dag_run_clear_number(context: Any) -> int:
    """How many times the DAG run (or some of its tasks) was cleared: 0 for a run never cleared."""
    return int(getattr(context.get("dag_run"), "clear_number", 0) or 0)


def _duration_text(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def queue_wait_text(queue: str | None, since: datetime | None) -> str:
    """The one wording of a Job waiting for quota, for the task log and the checkpoint sensor."""
    when = f"{since.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC" if since else "an unknown time"
    return f"waiting for quota in queue {queue} since {when}"


def assess(state: CheckpointState, *, now: datetime, stall_timeout: timedelta) -> Progress:
    """Decide what a state means: the one rule the sensor and its trigger both apply."""
    latest = state.latest
    rate = None
    if len(state.checkpoints) == 2 and all(c.saved_at for c in state.checkpoints):
        first, last = state.checkpoints
        elapsed = (last.saved_at - first.saved_at).total_seconds()  # type: ignore[operator]
        if elapsed > 0:
            rate = (last.step - first.step) * 3600.0 / elapsed
    if latest is None:
        checkpoint_text = "no committed checkpoint yet"
    else:
        age = f", committed {_duration_text((now - latest.saved_at).total_seconds())} ago" if latest.saved_at else ""
        checkpoint_text = f"latest committed step {latest.step}{age}"
        if rate is not None:
            checkpoint_text += f", {rate:.0f} steps/hour"
    common = {"latest_step": latest.step if latest else None, "steps_per_hour": rate}

    status = state.status
    if status is None:
        return Progress(kind="waiting", message=f"training has not started; {checkpoint_text}", **common)
    if status.state == "queued":
        return Progress(kind="waiting", message=f"{queue_wait_text(status.queue, status.queued_since)} (try "
                        f"{status.try_number}; not a stall); {checkpoint_text}", **common)
    if status.state == SKIPPED:  # nothing was launched, nothing to watch
        return Progress(kind="finished", succeeded=False, skipped=True,
                        message=f"training skipped (try {status.try_number}): nothing launched", **common)
    if status.state == "succeeded":
        return Progress(kind="finished", succeeded=True,
                        message=f"training succeeded (try {status.try_number}); {checkpoint_text}", **common)
    if status.state == "failed":
        if status.final:
            return Progress(kind="finished", succeeded=False,
                            message=f"training failed for good (try {status.try_number}); {checkpoint_text}", **common)
        return Progress(kind="waiting",
                        message=f"try {status.try_number} failed, waiting for the retry; {checkpoint_text}", **common)

    # Running: progress is the newest checkpoint of this try, or the try's start before it has one.
    last_activity = status.started_at
    if latest is not None and latest.saved_at is not None and latest.saved_at > last_activity:
        last_activity = latest.saved_at
    idle = (now - last_activity).total_seconds()
    running = f"try {status.try_number} running; {checkpoint_text}"
    if idle > stall_timeout.total_seconds():
        return Progress(
            kind="stalled", idle_seconds=idle,
            message=f"training stalled: no checkpoint committed for {_duration_text(idle)} "
            f"(stall_timeout {_duration_text(stall_timeout.total_seconds())}); {running}. A hung collective "
            "(NCCL) or a lost node looks like this: check the trainer's log, then clear the train task",
            **common,
        )
    return Progress(kind="running", idle_seconds=idle, message=running, **common)
