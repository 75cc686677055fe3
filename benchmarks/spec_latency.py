"""Spec latency: how long after a spec is written, edited or deleted a real ``airflow dag-processor``
serves the change, at 1,000, 10,000 and 20,000 specs.

    python benchmarks/spec_latency.py [--sizes 1000 10000 20000] [--trials 10] [--set KEY=VALUE ...]

Per size: the specs (copies of ``dag_configs/fraud_detector.yaml`` with their own ids, schedules and
feature lists, in 20 team folders, as ``parse_scale.py`` writes them), a fresh ``AIRFLOW_HOME`` with
a SQLite metadata database (``airflow db migrate``), and one ``airflow dag-processor`` over the
repository's ``dags/`` with the stack's dag-processor settings (``DAG_PROCESSOR_SETTINGS`` in
``tools/stack/trainpipe_stack.py``, default ``parsing_processes``; ``--set`` overrides one, e.g.
``--set AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=30``). Measured:

- the first full parse: start to every DAG in the database;
- per trial: a new spec written -> its DAG active in the database; an existing spec's description
  edited -> the DAG's description changed there; a spec deleted -> its DAG stale (gone from the API's
  DAG list). Each change is a file written with a temporary name and renamed in place, as an editor or
  ``git pull`` writes it;
- the dag-processor's CPU at rest (itself and its parsing children, a minute with no change).

"Served" is read from the metadata database the REST API serves from (``dag`` table: ``is_stale``,
``description``), polled every 0.25 s, so the API server's own response time is not included.
Targets at 20,000 specs: a new or edited spec live within 60 s, 90th percentile over >= 10 trials.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools" / "stack"))

from parse_scale import _write_specs  # noqa: E402  (benchmarks/ is the script's folder)
from trainpipe_stack import DAG_PROCESSOR_SETTINGS  # noqa: E402

POLL_SECONDS = 0.25
TARGET_SECONDS = 60.0
TEAM_FOLDERS = 20


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _write(path: Path, text: str) -> None:
    """Written beside, then renamed over: the reader never sees half a file."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank: the smallest value at least ``fraction`` of the values are at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


class Database:
    """Read-only look at the SQLite metadata database while the dag-processor writes it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _query(self, sql: str, *args: object) -> list[tuple]:
        for _ in range(40):
            try:
                with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5) as connection:
                    return connection.execute(sql, args).fetchall()
            except sqlite3.OperationalError:  # locked by a writer for longer than the timeout
                time.sleep(POLL_SECONDS)
        raise RuntimeError(f"{self.path} stayed locked")

    def active(self) -> int:
        return self._query("SELECT COUNT(*) FROM dag WHERE is_stale = 0")[0][0]

    def state(self, dag_id: str) -> tuple[bool, str | None] | None:
        """(active, description) of a DAG, or None when the database has never seen it."""
        rows = self._query("SELECT is_stale, description FROM dag WHERE dag_id = ?", dag_id)
        return (not rows[0][0], rows[0][1]) if rows else None


def _wait(condition: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            return float("inf")
        time.sleep(POLL_SECONDS)
    return time.monotonic() - start


def _cpu_seconds(process: psutil.Process) -> float:
    """CPU of the dag-processor and its children (reaped ones included), and of live children."""
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
            total += child_times.user + child_times.system
        except psutil.NoSuchProcess:
            continue
    return total


def measure(size: int, trials: int, overrides: dict[str, str], work: Path, timeout: float,
            deadline: float) -> dict:
    configs = work / "dag_configs"
    _write_specs(configs, size)
    airflow_home = work / "airflow"
    airflow_home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AIRFLOW", "TRAINPIPE_", "_AIRFLOW_PARSING_CONTEXT"))}
    env |= {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "TRAINPIPE_DAG_CONFIGS": str(configs),
        "TRAINPIPE_HOME": str(work / "trainpipe"),
        **DAG_PROCESSOR_SETTINGS,
        **overrides,
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=900)
    database = Database(airflow_home / "airflow.db")
    log = (work / "dag-processor.log").open("w")
    started = time.monotonic()
    processor = subprocess.Popen([airflow, "dag-processor"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    figures: dict = {"size": size, "load_start": _load()}
    try:
        first = _wait(lambda: database.active() >= size, timeout)
        figures["first_parse"] = first if first == float("inf") else time.monotonic() - started
        figures["load_first_parse"] = _load()
        print(f"  first full parse: {figures['first_parse']:.0f} s (load average {figures['load_first_parse']})",
              flush=True)
        if first == float("inf"):
            return figures
        time.sleep(30)  # the rest of the first round settles
        handle = psutil.Process(processor.pid)
        before, start = _cpu_seconds(handle), time.monotonic()
        time.sleep(60)
        figures["rest_cpu"] = (_cpu_seconds(handle) - before) / (time.monotonic() - start)
        figures["load_rest"] = _load()
        print(f"  at rest: {figures['rest_cpu'] * 100:.0f}% of a core (load average {figures['load_rest']})",
              flush=True)
        rng = random.Random(size)
        existing = sorted(configs.rglob("p*.yaml"))
        template, template_id = existing[0].read_text(), existing[0].stem
        new, edited, deleted = [], [], []
        for trial in range(trials):
            if time.monotonic() > deadline:
                print(f"  --stop-after reached: {trial} trials", flush=True)
                break
            time.sleep(rng.uniform(0, 10))  # a moment of the dag-processor's cycle chosen by chance
            dag_id = f"n{trial:03d}_{size}"
            path = configs / f"team{rng.randrange(TEAM_FOLDERS):02d}" / f"{dag_id}.yaml"
            _write(path, template.replace(f"pipeline_id: {template_id}", f"pipeline_id: {dag_id}"))
            new.append(_wait(lambda dag_id=dag_id: (database.state(dag_id) or (False,))[0], timeout))

            target = existing.pop(rng.randrange(len(existing)))
            marker = f"edited in trial {trial}"
            text = target.read_text()
            assert "\ndescription: " in text
            _write(target, text.replace("\ndescription: ", f"\ndescription: {marker}. ", 1))
            edited.append(_wait(
                lambda marker=marker, target=target: marker in ((database.state(target.stem) or (False, ""))[1] or ""), timeout))

            gone = existing.pop(rng.randrange(len(existing)))
            gone.unlink()
            deleted.append(_wait(lambda gone=gone: not (database.state(gone.stem) or (False,))[0], timeout))
            print(f"  trial {trial + 1}: new {new[-1]:.1f} s, edited {edited[-1]:.1f} s, deleted {deleted[-1]:.1f} s "
                  f"(load average {_load()})", flush=True)
        figures |= {"new": new, "edited": edited, "deleted": deleted, "load_end": _load()}
        return figures
    finally:
        try:
            os.killpg(processor.pid, signal.SIGTERM)
            processor.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(processor.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            processor.wait()
        log.close()


def _summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: no trials"
    return (f"{name}: median {statistics.median(values):.1f} s, p90 {_percentile(values, 0.9):.1f} s, "
            f"max {max(values):.1f} s over {len(values)} trials")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 20000])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one change")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an Airflow setting to override, as its environment variable")
    parser.add_argument("--stop-after", type=float, default=float("inf"), metavar="SECONDS",
                        help="start no trial after this many seconds of the whole run (fewer trials, reported)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs) when done")
    args = parser.parse_args()
    deadline = time.monotonic() + args.stop_after
    # Stopped with SIGTERM, the dag-processor is still stopped (the finally blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    overrides = dict(item.split("=", 1) for item in args.set)
    settings = {**DAG_PROCESSOR_SETTINGS, **overrides}
    print(f"spec latency: airflow dag-processor over {REPO.name}/dags (64 DAG files), SQLite, {os.cpu_count()} CPUs, "
          f"load average {_load()} at start")
    print("  settings: " + ", ".join(f"{key.removeprefix('AIRFLOW__')}={value}" for key, value in settings.items()))
    for size in args.sizes:
        work = Path(tempfile.mkdtemp(prefix=f"trainpipe-spec-latency-{size}-"))
        print(f"\n{size:,} specs (work folder {work.name}):", flush=True)
        try:
            figures = measure(size, args.trials, overrides, work, args.timeout, deadline)
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        if "new" not in figures:
            print("  no trials: the first full parse did not finish")
            continue
        print("  " + _summary("new spec -> DAG served", figures["new"]))
        print("  " + _summary("edited spec -> served DAG changed", figures["edited"]))
        print("  " + _summary("deleted spec -> DAG gone", figures["deleted"]))
        worst = max(_percentile(figures["new"], 0.9), _percentile(figures["edited"], 0.9))
        print(f"  p90 of new and edited: {worst:.1f} s (target <= {TARGET_SECONDS:.0f} s at 20,000 specs"
              f"{', met' if worst <= TARGET_SECONDS else ', missed'}); load average {figures['load_end']} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
