"""MLflow tracking on rank 0 that costs the loop nothing and loses nothing; no-op on other ranks.

``log_metric`` appends a tuple to an in-process queue (about a microsecond). A background thread
(``MetricPublisher``) sends the queue in batches with ``MlflowClient.log_batch``. When the tracking
server is unreachable the thread keeps the batch and retries; the queue keeps filling, and beyond
``tracking.max_buffered_metrics`` the oldest entries are spilled to a local JSON-lines file that the
thread sends first when the server is back. A run that ends while the server is still down leaves
the spill file in place; a retry of the same MLflow run on the same machine sends it.

MLflow itself runs in a process of its own beside rank 0 (``mlflow_process``): the trainer never imports
it, which keeps every rank's start-up fast, and the other ranks log nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from trainpipe_trainer.config import TrackingConfig, TrainingConfig
from trainpipe_trainer.tracking.mlflow_process import MlflowStore

# Not logged as params: credentials may hide in URIs/options, tags are logged as tags, and the
# run id is the run itself.
# tuning.storage: a database URL may carry a password.
_NOT_PARAMS = ("storage_options", "tags", "tracking.run_id", "tracking.tracking_uri", "tuning.storage")
# MLflow's log_batch limits per request.
MAX_METRICS_PER_BATCH = 1000
MAX_TAGS_PER_BATCH = 100
MAX_PARAMS_PER_BATCH = 100
# How long opening the run may take before it is reported as an outage (as MetricPublisher.stall_seconds).
OPEN_STALL_SECONDS = 5.0
# How long the end of a run waits for buffered metrics to reach a server that is down.
DRAIN_TIMEOUT_SECONDS = 300.0
SPILL_DIR_ENV = "TRAINPIPE_METRICS_SPILL_DIR"
FAILURE_REASON_TAG = "trainpipe.failure_reason"
FAILURE_STEP_TAG = "trainpipe.failure_step"

# (key, value, timestamp in ms, step): what log_metric queues.
MetricTuple = tuple[str, float, int, int]


def flatten_params(config: TrainingConfig, *, world_size: int) -> dict[str, str]:
    """The config as dotted ``key -> str`` params, plus what only the running trainer knows."""
    flat: dict[str, str] = {}

    def visit(prefix: str, value: Any) -> None:
        if prefix in _NOT_PARAMS:
            return
        if isinstance(value, dict):
            for key, inner in value.items():
                visit(f"{prefix}.{key}" if prefix else key, inner)
        elif isinstance(value, (list, tuple)):
            flat[prefix] = json.dumps(list(value))
        else:
            flat[prefix] = str(value)

    visit("", dataclasses.asdict(config))
    # MLflow caps a param value at 6000 characters; the count is what dashboards compare anyway.
    flat["features"] = flat["features"][:6000]
    flat["transforms"] = flat["transforms"][:6000]
    flat["features_count"] = str(len(config.features))
    if config.label_classes:
        flat["label_classes"] = flat["label_classes"][:6000]
        flat["label_classes_count"] = str(len(config.label_classes))
    else:
        # Left out like the config's JSON leaves it out: runs of the other tasks keep their params.
        del flat["label_classes"]
    flat["world_size"] = str(world_size)
    return flat


def spill_path_for(run_id: str) -> Path:
    root = os.environ.get(SPILL_DIR_ENV) or os.path.join(tempfile.gettempdir(), "trainpipe-metrics")
    return Path(root) / f"{run_id}.jsonl"


def _say(message: str) -> None:
    print(f"tracking: {message}", file=sys.stderr, flush=True)


@dataclass(kw_only=True, slots=True, eq=False)
class MetricPublisher:
    """The queue, the spill file and the thread that empties both into ``send``.

    ``send(metrics, tags)`` delivers one batch or raises; it is MlflowClient.log_batch in production
    and a fake in unit tests. Only ``log_metric`` and ``set_tags`` run on the training thread.
    """

    send: Callable[[list[MetricTuple], dict[str, str]], None]
    max_buffered: int
    spill_path: Path
    flush_every_seconds: float = 1.0
    max_backoff_seconds: float = 30.0
    # A send still running after this long is reported as an outage (MLflow's client retries
    # connection errors with back-off inside one call, for minutes, before it raises).
    stall_seconds: float = 5.0
    say: Callable[[str], None] = _say
    _queue: collections.deque[MetricTuple] = field(init=False, default_factory=collections.deque)
    _tags: dict[str, str] = field(init=False, default_factory=dict)
    _spill_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _spill_offset: int = field(init=False, default=0)
    _pending: list[MetricTuple] = field(init=False, default_factory=list)
    _pending_tags: dict[str, str] = field(init=False, default_factory=dict)
    # Held by the thread while it moves metrics between queue, spill file and batch, so that
    # ``flush`` never sees a metric in none of them.
    _moving: threading.Lock = field(init=False, default_factory=threading.Lock)
    _wake: threading.Event = field(init=False, default_factory=threading.Event)
    _sent: threading.Event = field(init=False, default_factory=threading.Event)  # a batch went out
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, default=None)
    _watchdog: threading.Thread | None = field(init=False, default=None)
    _sending_since: float | None = field(init=False, default=None)
    failing: bool = field(init=False, default=False)
    sent: int = field(init=False, default=0)
    spilled: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.max_buffered < 1:
            raise ValueError("MetricPublisher: max_buffered must be >= 1")

    # -- training thread -------------------------------------------------------------------------

    def log_metric(self, key: str, value: float, step: int) -> None:
        self._queue.append((key, value, time.time_ns() // 1_000_000, step))
        if len(self._queue) > self.max_buffered:
            self._spill_queue()

    def set_tags(self, tags: dict[str, str]) -> None:
        # Few and rare: kept in memory (a dict, so a retried tag keeps its newest value).
        self._tags.update(tags)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainpipe-metrics", daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name="trainpipe-metrics-watchdog", daemon=True)
        self._watchdog.start()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far was sent (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        while True:
            # Cleared before the check: a batch sent after it wakes the wait below at once (a trial
            # worker flushes every trial's run; polling alone cost it up to 20 ms each time).
            self._sent.clear()
            if self._drained():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                return False
            self._wake.set()
            self._sent.wait(min(0.02, remaining))

    def close(self, timeout: float) -> bool:
        """Flush, stop the thread; what could not be sent stays in the spill file. True if all was sent."""
        drained = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=max(timeout, 1.0))
        if not drained:
            with self._spill_lock:
                self._write_spill(self._pending)
                self._pending = []
            self._spill_queue()
            self.say(
                f"the tracking server did not take {self.backlog()} metrics in {timeout:.0f}s; they are kept in "
                f"{self.spill_path} and sent by the next attempt of this run on this machine"
            )
        return drained

    def backlog(self) -> int:
        """Metrics not yet sent (queue, batch in hand and spill file); approximate while running."""
        return len(self._queue) + len(self._pending) + max(self._spill_lines_left(), 0)

    # -- spill file --------------------------------------------------------------------------------

    def _spill_queue(self) -> None:
        """Move the whole queue to the spill file (the queue is full: the server has been down a while)."""
        items = []
        while True:
            try:
                items.append(self._queue.popleft())
            except IndexError:
                break
        with self._spill_lock:
            self._write_spill(items)

    def _write_spill(self, items: list[MetricTuple]) -> None:
        if not items:
            return
        self.spill_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.spill_path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(item) + "\n" for item in items)
        self.spilled += len(items)

    def _read_spill(self, limit: int) -> list[MetricTuple]:
        with self._spill_lock:
            if not self.spill_path.exists():
                return []
            with open(self.spill_path, encoding="utf-8") as handle:
                handle.seek(self._spill_offset)
                items = []
                while len(items) < limit:
                    line = handle.readline()
                    if not line.endswith("\n"):
                        break
                    key, value, timestamp, step = json.loads(line)
                    items.append((key, value, timestamp, step))
                self._spill_offset = handle.tell()
                at_end = not handle.readline()
            if at_end:
                # Everything read (it is in hand now): the file starts over empty.
                self.spill_path.unlink()
                self._spill_offset = 0
            return items

    def _spill_lines_left(self) -> int:
        with self._spill_lock:
            if not self.spill_path.exists():
                return 0
            with open(self.spill_path, encoding="utf-8") as handle:
                handle.seek(self._spill_offset)
                return sum(1 for _ in handle)

    # -- background thread -----------------------------------------------------------------------

    def _drained(self) -> bool:
        with self._moving:
            return not (self._queue or self._pending or self._tags or self._pending_tags) and (
                self._spill_lines_left() == 0
            )

    def _take(self) -> None:
        if not self._pending:
            # Spilled metrics are older than the queue's: they go first.
            self._pending = self._read_spill(MAX_METRICS_PER_BATCH)
            while len(self._pending) < MAX_METRICS_PER_BATCH:
                try:
                    self._pending.append(self._queue.popleft())
                except IndexError:
                    break
        if not self._pending_tags and self._tags:
            while self._tags and len(self._pending_tags) < MAX_TAGS_PER_BATCH:
                key = next(iter(self._tags))
                self._pending_tags[key] = self._tags.pop(key)

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._moving:
                self._take()
            if not self._pending and not self._pending_tags:
                if self._stop.is_set():
                    return
                self._wake.wait(self.flush_every_seconds)
                self._wake.clear()
                continue
            self._sending_since = time.monotonic()
            try:
                self.send(self._pending, self._pending_tags)
            except Exception as err:
                self._sending_since = None
                self._report_outage(f"{type(err).__name__}: {str(err)[:200]}")
                # Only a stop interrupts the back-off: a flush must not hammer a server that is down.
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.max_backoff_seconds)
                continue
            self._sending_since = None
            with self._moving:
                self.sent += len(self._pending)
                self._pending, self._pending_tags = [], {}
            self._sent.set()
            backoff = 0.5
            if self.failing:
                self.failing = False
                queued = self.backlog()
                self.say(f"the tracking server is reachable again; sending the buffered metrics ({queued} queued)")


    def _report_outage(self, why: str) -> None:
        if not self.failing:
            self.failing = True
            self.say(
                f"cannot reach the tracking server ({why}); training continues and metrics are buffered "
                "until it is back"
            )

    def _watch(self) -> None:
        while not self._stop.wait(min(self.stall_seconds / 5, 1.0)):
            since = self._sending_since
            if since is not None and time.monotonic() - since > self.stall_seconds:
                self._report_outage(f"no answer for {self.stall_seconds:.0f}s")


@dataclass(kw_only=True, slots=True)
class Tracker:
    config: TrackingConfig
    enabled: bool
    run_id: str | None = field(init=False, default=None)
    publisher: MetricPublisher | None = field(init=False, default=None)
    _store: MlflowStore | None = field(init=False, default=None)
    _failure: tuple[str, int | None, str] | None = field(init=False, default=None)
    _monitor: Any = field(init=False, default=None)
    # Opening the run (MLflow's import and store in its process, then the run) takes seconds: a thread
    # waits for it beside the data read and the model build; the trainer joins it before its step loop.
    # What is logged before then waits here, and the opening thread hands it to the publisher under _lock.
    _opening: threading.Thread | None = field(init=False, default=None)
    _open_error: BaseException | None = field(init=False, default=None)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _early_params: dict[str, str] = field(init=False, default_factory=dict)
    _early_tags: dict[str, str] = field(init=False, default_factory=dict)
    _early_metrics: list[tuple[str, float, int]] = field(init=False, default_factory=list)

    def __enter__(self) -> Tracker:
        if self.enabled:
            self._store = MlflowStore.open(self.config.tracking_uri)
            self._opening = threading.Thread(target=self._open, name="trainpipe-tracking-open", daemon=True)
            self._opening.start()
        return self

    def _call(self, op: str, **kwargs: Any) -> Any:
        assert self._store is not None
        return self._store.call(op, **kwargs)

    def _open(self) -> None:
        """Open the run in MLflow's process, start the publisher, hand it what was logged so far."""
        slow: threading.Timer | None = None
        try:
            # A server that does not answer while the run opens is an outage like any other: said
            # once, training goes on, what is logged waits (MLflow's client retries for minutes).
            stalled = threading.Event()

            def report_stall() -> None:
                stalled.set()
                _say(f"cannot reach the tracking server (no answer for {OPEN_STALL_SECONDS:.0f}s while opening the "
                     "run); training continues and metrics are buffered until it is back")

            slow = threading.Timer(OPEN_STALL_SECONDS, report_stall)
            slow.daemon = True
            slow.start()
            run_id = self._call("open_run", experiment_name=self.config.experiment_name, run_id=self.config.run_id,
                                argv=list(sys.argv))
            slow.cancel()
            if stalled.is_set():
                _say("the tracking server is reachable again; the run is open, sending the buffered metrics")
            publisher = MetricPublisher(
                send=self._send, max_buffered=self.config.max_buffered_metrics, spill_path=spill_path_for(run_id)
            )
            self.run_id = run_id
            with self._lock:
                params, self._early_params = self._early_params, {}
                publisher.set_tags(self._early_tags)
                for name, value, step in self._early_metrics:
                    publisher.log_metric(name, value, step)
                self._early_tags, self._early_metrics = {}, []
                self.publisher = publisher
            publisher.start()
            if params:
                self._log_params_now(params)
        except BaseException as err:
            if slow is not None:
                slow.cancel()
            self._open_error = err

    def check(self) -> None:
        """Raise on the training thread if opening the run failed (without waiting for it to finish)."""
        if self._open_error is not None:
            error, self._open_error = self._open_error, None
            self._opening = None
            raise error

    def join(self) -> None:
        """Wait until the run is open."""
        if self._opening is not None:
            self._opening.join()
            self._opening = None
        self.check()

    def _send(self, metrics: list[MetricTuple], tags: dict[str, str]) -> None:
        self._call("log_batch", run_id=self.run_id, metrics=list(metrics), tags=dict(tags))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled and self.run_id is None:
            # Training ended before the run was open (bad data, say): open it, to record why.
            try:
                self.join()
            except Exception as err:
                _say(f"could not open the MLflow run: {err}")
        if not self.enabled or self.run_id is None:
            return
        if self._monitor is not None:
            self._monitor.stop()
        if self.publisher is not None:
            self.publisher.close(DRAIN_TIMEOUT_SECONDS)
        status = "FINISHED"
        if exc_type is not None:
            reason, step, status = self._failure or (f"{exc_type.__name__}: {exc}"[:4000], None, "FAILED")
            tags = {FAILURE_REASON_TAG: reason}
            if step is not None:
                tags[FAILURE_STEP_TAG] = str(step)
            try:
                self._call("log_batch", run_id=self.run_id, tags=tags)
            except Exception as err:
                _say(f"could not record the failure reason: {err}")
        self._call("finish_run", run_id=self.run_id, status=status)

    def log_model(self, **model: Any) -> str:
        """Log a pyfunc model into this run (``MlflowCalls.log_model``'s arguments); its ``models:/`` URI."""
        self.join()
        if self.run_id is None:
            raise RuntimeError("log_model: tracking is off on this rank")
        return str(self._call("log_model", run_id=self.run_id, **model))

    def failed(self, reason: str, *, step: int | None, status: str = "FAILED") -> None:
        """Record why the run is about to end badly (tags and status are written on exit)."""
        self._failure = (reason, step, status)

    def attach_monitor(self, monitor: Any) -> None:
        """A started ``SystemMonitor`` to stop before the last flush."""
        self._monitor = monitor

    def log_params(self, params: dict[str, str]) -> None:
        if not self.enabled:
            return
        if self.publisher is None:
            with self._lock:
                if self.publisher is None:
                    self._early_params.update(params)
                    return
        self._log_params_now(params)

    def _log_params_now(self, params: dict[str, str]) -> None:
        # A retry logs into the same run: MLflow refuses to change a param, so log only new ones
        # and report (not fail on) any that differ from the earlier attempt.
        existing = self._call("run_data", run_id=self.run_id)["params"]
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            print(f"warning: params differ from an earlier attempt, kept the old values: {changed}", file=sys.stderr)
        new = [(k, v) for k, v in params.items() if k not in existing]
        for start in range(0, len(new), MAX_PARAMS_PER_BATCH):
            self._call("log_batch", run_id=self.run_id, params=dict(new[start:start + MAX_PARAMS_PER_BATCH]))

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.enabled or not tags:
            return
        if self.publisher is None:
            with self._lock:
                if self.publisher is None:
                    self._early_tags.update(tags)
                    return
        self.publisher.set_tags(tags)

    def log_metric(self, name: str, value: float, *, step: int) -> None:
        if not self.enabled:
            return
        if self.publisher is None:
            with self._lock:
                if self.publisher is None:
                    self._early_metrics.append((name, value, step))
                    return
        self.publisher.log_metric(name, value, step)

    def flush(self, timeout: float = DRAIN_TIMEOUT_SECONDS) -> bool:
        if self.enabled:
            self.join()
        return self.publisher.flush(timeout) if self.publisher is not None else True

