"""MLflow in a process of its own, beside rank 0's trainer; the trainer itself never imports MLflow.

Importing MLflow, opening its store and creating the run are about 2 s of Python (1.2 s import, 0.6 s
store, 0.2 s run on this 2-core machine). In the trainer's process that time held the one GIL that
torch's import and the model build also need, and the step loop waited for it. In a child process it
runs on another core while torch loads, and every later MLflow call (a batch of metrics, a trial's run
opened and closed, the model export) costs the trainer's GIL no more than a pickle over a socket.

``MlflowProcess.shared()`` starts one child per trainer process (at the launch's first moment, so the
import overlaps torch's) and restarts it if it died. Calls are answered in order, one at a time; an
MLflow error comes back as ``TrackingProcessError`` with MLflow's message. The child ignores SIGTERM and
SIGINT (the trainer's own shutdown still logs through it) and ends when the trainer's end of the socket
closes: at the trainer's exit, or when the trainer is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

from trainpipe_trainer.errors import TrackingProcessError

# The trainer package's parent folder: the child imports the same trainer as its parent.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
# How long the trainer's exit waits for the child to finish MLflow's own exit handlers.
EXIT_WAIT_SECONDS = 30.0


def store_uri(configured: str) -> str:
    """The tracking store: the config's, else MLFLOW_TRACKING_URI as the trainer sees it now (else
    MLflow's own default, which the child resolves)."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI", "")


@dataclass(frozen=True, slots=True)
class MlflowStore:
    """One tracking store, reached through this process's MLflow child (started by ``open``)."""

    uri: str

    @classmethod
    def open(cls, configured: str) -> MlflowStore:
        store = cls(store_uri(configured))
        MlflowProcess.shared(store.uri)
        return store

    def call(self, op: str, **kwargs: Any) -> Any:
        """``MlflowCalls.<op>(uri, **kwargs)`` in the child."""
        return MlflowProcess.shared(self.uri).call(op, uri=self.uri, **kwargs)


class MlflowProcess:
    """The trainer's side: one socket to the child, one call at a time."""

    _shared: ClassVar[MlflowProcess | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, tracking_uri: str = "") -> None:
        self._tracking_uri = tracking_uri
        self._lock = threading.Lock()
        self._mlflow_env: dict[str, str] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._spawn()

    @classmethod
    def shared(cls, tracking_uri: str = "") -> MlflowProcess:
        """This process's child (started on first use). ``tracking_uri`` lets it open the store early."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(tracking_uri)
                atexit.register(cls.close_shared)
            return cls._shared

    @classmethod
    def close_shared(cls) -> None:
        with cls._shared_lock:
            shared, cls._shared = cls._shared, None
        if shared is not None:
            shared.close()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        self._mlflow_env = _mlflow_settings()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "trainpipe_trainer.tracking.mlflow_process", str(theirs.fileno()),
                 self._tracking_uri],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env,
            )
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())

    @property
    def pid(self) -> int | None:
        """The child's process id (None once closed)."""
        return self._process.pid if self._process is not None else None

    def call(self, op: str, **kwargs: Any) -> Any:
        """Run ``op`` in the child and return its result; an MLflow error raises TrackingProcessError."""
        with self._lock:
            if self._process is None:
                self._spawn()  # closed before (at exit): a late call still gets an answer
            elif self._process.poll() is not None:
                print(f"tracking: the MLflow process ended (exit code {self._process.returncode}); starting another",
                      file=sys.stderr, flush=True)
                self._restart()
            elif _mlflow_settings() != self._mlflow_env:
                # MLflow reads its settings from the environment it started with (a test's, say, changed since).
                self._restart()
            assert self._conn is not None  # every branch above leaves a connected child
            try:
                self._conn.send((op, kwargs))
                outcome, value = self._conn.recv()
            except (EOFError, OSError) as err:
                raise TrackingProcessError(f"the MLflow process ended during {op}: {err}") from err
        if outcome == "error":
            raise TrackingProcessError(value)
        return value

    def _restart(self) -> None:
        self._discard()
        if self._process is not None:
            self._process.wait()
        self._spawn()

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the socket (the child then exits) and wait for the child's exit handlers."""
        with self._lock:
            self._discard()
            if self._process is not None:
                try:
                    self._process.wait(timeout=EXIT_WAIT_SECONDS)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
                self._process = None


def _mlflow_settings() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}


# -- the child -------------------------------------------------------------------------------------


@contextlib.contextmanager
def no_installed_package_scan(requirements: tuple[str, ...]) -> Iterator[None]:
    """Before logging a model, MLflow compares its pip requirements with the installed packages, and to
    do so first maps every module of every installed distribution to its package
    (``importlib_metadata.packages_distributions``: 0.7 s of a launch on 2 cores). The requirements
    logged here are named by their package, whose versions MLflow then looks up by name: so while the
    model is logged the map holds just these names (what is logged is unchanged), and afterwards it is
    unset again, so a later requirements inference in the process still maps every package."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", ()) is not None:
        yield  # already mapped (or an MLflow without the map): nothing to save
        return
    requirements_utils._MODULES_TO_PACKAGES = {name: [name] for name in requirements}
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = None


def import_mlflow() -> Any:
    # Progress bars would fill the Airflow task log with carriage-return noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's own INFO lines ("Creating a new experiment", "Validating input example") are not the
    # trainer's: its warnings and errors still reach the log. MLFLOW_LOGGING_LEVEL set by the
    # deployment wins.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    try:
        import mlflow
    except ImportError as err:
        raise ImportError("mlflow is not installed: pip install 'trainpipe-trainer[tracking]'") from err
    return mlflow


class MlflowCalls:
    """What the trainer asks of MLflow, with plain values in and out (the trainer has no MLflow types)."""

    def __init__(self) -> None:
        self.mlflow = import_mlflow()
        self._clients: dict[str, Any] = {}

    def warm(self, uri: str) -> None:
        """Open the store before the first call needs it (its tables, on a new SQLite store)."""
        self._client(uri)

    def _client(self, uri: str) -> Any:
        from trainpipe_trainer.tracking.mlflow_store import prepare_store

        uri = uri or self.mlflow.get_tracking_uri()
        if uri not in self._clients:
            prepare_store(uri)
            self._clients[uri] = self.mlflow.MlflowClient(uri)
        return self._clients[uri]

    def _fluent(self, uri: str) -> Any:
        """The client of ``uri``, with MLflow's fluent API (experiments by name, the active run) on the same store."""
        client = self._client(uri)
        self.mlflow.set_tracking_uri(client.tracking_uri)
        return client

    def open_run(self, uri: str, experiment_name: str, run_id: str | None, argv: list[str]) -> str:
        """The run to log into: ``run_id`` set RUNNING again, or a new run in ``experiment_name``."""
        client = self._fluent(uri)
        if run_id:
            client.update_run(run_id, status="RUNNING")
            return run_id
        from mlflow.tracking.context.registry import resolve_tags

        # What mlflow.start_run() does, with the trainer's command line as the run's source.
        sys.argv = list(argv)
        experiment = self.mlflow.set_experiment(experiment_name)
        return str(client.create_run(experiment.experiment_id, tags=resolve_tags()).info.run_id)

    def create_run(self, uri: str, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
        return str(self._client(uri).create_run(experiment_id, run_name=run_name, tags=tags).info.run_id)

    def log_batch(self, uri: str, run_id: str, metrics: Sequence[tuple[str, float, int, int]] = (),
                  params: dict[str, str] | None = None, tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self._client(uri).log_batch(
            run_id, metrics=[Metric(key, value, timestamp, step) for key, value, timestamp, step in metrics],
            params=[Param(key, value) for key, value in (params or {}).items()],
            tags=[RunTag(key, value) for key, value in (tags or {}).items()], synchronous=True)

    def run_data(self, uri: str, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's params and latest metrics."""
        data = self._client(uri).get_run(run_id).data
        return {"params": dict(data.params), "metrics": dict(data.metrics)}

    def finish_run(self, uri: str, run_id: str, status: str) -> None:
        active = self.mlflow.active_run()
        if active is not None and active.info.run_id == run_id:
            self.mlflow.end_run(status=status)
        else:
            self._client(uri).set_terminated(run_id, status=status)

    def log_model(self, uri: str, run_id: str, *, name: str, python_model: str, artifacts: dict[str, str],
                  code_paths: list[str], pip_requirements: list[str], sample_frame: Any, prediction: Any,
                  params: dict[str, Any] | None = None) -> str:
        """Log a pyfunc model into ``run_id``; its ``models:/...`` URI. ``params``: the predict params the model
        takes, with their defaults (the signature's params schema; without one MLflow drops them)."""
        from mlflow.models import infer_signature

        self._fluent(uri)
        active = self.mlflow.active_run()
        if active is None or active.info.run_id != run_id:
            if active is not None:
                self.mlflow.end_run()
            self.mlflow.start_run(run_id=run_id)
        with no_installed_package_scan((*pip_requirements, "mlflow")):
            info = self.mlflow.pyfunc.log_model(
                name=name, python_model=python_model, artifacts=artifacts, code_paths=code_paths,
                pip_requirements=pip_requirements, signature=infer_signature(sample_frame, prediction, params=params),
                input_example=sample_frame.head(3))
        return str(info.model_uri)


def serve(conn: Connection, tracking_uri: str) -> None:
    calls = MlflowCalls()
    with contextlib.suppress(Exception):
        # A store that cannot open now is reported by the call that needs it.
        calls.warm(tracking_uri)
    while True:
        try:
            op, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the trainer exited (or was killed)
        try:
            reply: tuple[str, Any] = ("ok", getattr(calls, op)(**kwargs))
        except Exception as err:
            reply = ("error", f"{type(err).__name__}: {err}"[:4000])
        try:
            conn.send(reply)
        except OSError:
            return


if __name__ == "__main__":
    # The trainer decides when tracking ends: its shutdown (and a preemption's) still logs through here.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(Connection(int(sys.argv[1])), sys.argv[2] if len(sys.argv) > 2 else "")
    # MLflow's exit handlers run; the teardown of every module after them (0.7 s with MLflow loaded,
    # which the trainer's exit waits for) is skipped, as the trainer skips its own.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
