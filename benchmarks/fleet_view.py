"""The fleet list's data assembly at fleet size: N pipelines with a year of nightly versions and runs.

    python benchmarks/fleet_view.py [--pipelines 2000] [--nights 365] [--store PATH] [--keep]

Builds an MLflow store (SQLite) the way trainpipe leaves one: per pipeline an experiment ``trainpipe/<id>``, one
run a night (tags ``trainpipe.airflow_run_id``/``trainpipe.dag_id``, metrics ``gpu_hours``, ``cpu_hours``, ``cost``,
drift metrics and tags) and one registered version a night (lineage and ``holdout_*`` tags), the champion alias on
the latest version but a few stale ones. Rows are bulk-inserted into MLflow's own schema (created by MLflow), as
the client would take hours for ~10 million rows; the fleet view then reads the store through MLflow's client
only.

Timed: ``trainpipe.fleet.collect`` assembling every row (MLflow searches, outcome and reason, sort) from the
pipelines' Airflow facts: cold (empty cache: the api-server's first request, or the first after a night in which
every pipeline ran), warm (no DAG run changed since), and after 5% of the pipelines had a new run. The Airflow
side of the request is a fixed number of queries (``trainpipe.fleet.airflow_state``) and is not part of it.
Target: under 1 s at 2,000 pipelines.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "provider"))
TARGET_SECONDS = 1.0
FEATURES = ("amount", "merchant_risk", "hour_of_day", "distance_from_home_km")


def build_store(path: Path, pipelines: int, nights: int, now: datetime) -> float:
    """MLflow's schema from MLflow itself, then the rows in bulk. Returns the seconds it took."""
    import mlflow

    started = time.perf_counter()
    uri = f"sqlite:///{path}"
    mlflow.MlflowClient(uri).search_experiments()  # creates and migrates the schema
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=OFF")
    db.execute("PRAGMA synchronous=OFF")
    rng = random.Random(7)
    now_ms = int(now.timestamp() * 1000)
    day_ms = 86_400_000
    for p in range(pipelines):
        name = f"pipeline_{p:05d}"
        experiment_id = p + 1
        db.execute("INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage, creation_time, "
                   "last_update_time) VALUES (?, ?, ?, 'active', ?, ?)",
                   (experiment_id, f"trainpipe/{name}", f"file:///artifacts/{name}", now_ms, now_ms))
        db.execute("INSERT INTO registered_models (name, creation_time, last_updated_time) VALUES (?, ?, ?)",
                   (name, now_ms - nights * day_ms, now_ms))
        runs, run_tags, metrics, versions, version_tags = [], [], [], [], []
        auc = 0.8 + rng.random() * 0.1
        for night in range(nights):
            started_ms = now_ms - (nights - night) * day_ms + 3_600_000
            run_uuid = f"{p:08x}{night:08x}" + "0" * 16
            airflow_run_id = f"scheduled__{datetime.fromtimestamp(started_ms / 1000, UTC):%Y-%m-%dT00:00:00+00:00}"
            runs.append((run_uuid, f"{name} {airflow_run_id}", "FINISHED", started_ms, started_ms + 1_800_000,
                         "active", f"file:///artifacts/{name}/{run_uuid}/artifacts", experiment_id))
            run_tags += [("trainpipe.airflow_run_id", airflow_run_id, run_uuid), ("trainpipe.dag_id", name, run_uuid),
                         ("trainpipe.drift_verdict", "pass", run_uuid), ("trainpipe.gates_passed", "true", run_uuid),
                         ("trainpipe.dataset_digest", f"{p:032x}{night:032x}", run_uuid)]
            values = {"gpu_hours": 0.5 + rng.random(), "cpu_hours": 2.0, "cost": 1.5 + rng.random()}
            values.update({f"drift_psi.{f}": rng.random() * 0.05 for f in FEATURES})
            metrics += [(key, value, started_ms, run_uuid) for key, value in values.items()]
            auc = min(0.99, max(0.5, auc + rng.gauss(0, 0.003)))
            version = night + 1
            versions.append((name, version, started_ms + 1_900_000, started_ms + 1_900_000, "airflow", "None",
                             f"models:/m-{run_uuid}", run_uuid, "READY"))
            version_tags += [("dag_id", name, name, version), ("airflow_run_id", airflow_run_id, name, version),
                             ("holdout_auc", f"{auc:.6f}", name, version),
                             ("holdout_f1", f"{auc - 0.4:.6f}", name, version)]
        db.executemany("INSERT INTO runs (run_uuid, name, status, start_time, end_time, lifecycle_stage, artifact_uri, "
                       "experiment_id, source_type, source_name, entry_point_name, user_id, source_version) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'UNKNOWN', '', '', 'airflow', '')", runs)
        db.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", run_tags)
        db.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, 0, 0)",
                       metrics)
        db.executemany("INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                       "VALUES (?, ?, ?, 0, 0, ?)", metrics)
        db.executemany("INSERT INTO model_versions (name, version, creation_time, last_updated_time, user_id, "
                       "current_stage, source, run_id, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", versions)
        db.executemany("INSERT INTO model_version_tags (key, value, name, version) VALUES (?, ?, ?, ?)", version_tags)
        # Most champions are last night's version; every 20th has been stuck for two months.
        champion = nights if p % 20 else max(1, nights - 60)
        db.executemany("INSERT INTO registered_model_aliases (alias, version, name) VALUES (?, ?, ?)",
                       [("champion", champion, name), ("previous_champion", max(1, champion - 1), name)])
        if p % 200 == 199:
            db.commit()
    db.commit()
    db.close()
    return time.perf_counter() - started


def pipeline_facts(pipelines: int, now: datetime, *, changed: set[int] = frozenset()) -> list:
    from trainpipe.fleet.collect import PipelineFacts
    from trainpipe.fleet.outcome import RunFacts, TaskFacts

    out = []
    logical = (now - timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    for p in range(pipelines):
        run_id = f"scheduled__{logical:%Y-%m-%dT00:00:00+00:00}"
        state, note = ("success", f"promoted version {p}: auc 0.9 vs 0.89") if p % 10 else (
            "failed", None)
        if p in changed:
            run_id, state, note = f"manual__{now.isoformat()}", "failed", "validation failed: drift in amount"
        tasks = (TaskFacts(task_id="validate", state="failed" if state == "failed" else "success"),
                 TaskFacts(task_id="promote", state="success" if state == "success" else None))
        out.append(PipelineFacts(pipeline_id=f"pipeline_{p:05d}", owner=f"team-{p % 40}", team=f"team-{p % 40}",
                                 schedule="0 0 * * *", is_paused=False,
                                 last_run=RunFacts(run_id=run_id, state=state, logical_date=logical,
                                                   start_date=logical + timedelta(hours=1),
                                                   end_date=logical + timedelta(hours=2), note=note, tasks=tasks)))
    return out


def assemble(reader, facts: list, now: datetime, *, wait: bool = False) -> tuple[float, list]:
    from trainpipe.fleet.collect import pipeline_row, sort_rows

    started = time.perf_counter()
    mlflow = reader.facts(facts, now=now, wait=wait)
    rows = sort_rows([pipeline_row(p, mlflow[p.pipeline_id], now=now) for p in facts])
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=2000)
    parser.add_argument("--nights", type=int, default=365)
    parser.add_argument("--store", type=Path, help="reuse (or keep) the store at this path")
    parser.add_argument("--keep", action="store_true", help="keep the store built in a temporary folder")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    import mlflow

    from trainpipe.fleet.collect import FleetReader

    now = datetime.now(UTC)
    folder = None if args.store else Path(tempfile.mkdtemp(prefix="fleet-view-bench-"))
    store = args.store or folder / "mlflow.db"
    if not store.exists():
        built = build_store(store, args.pipelines, args.nights, now)
        print(f"store: {args.pipelines} pipelines x {args.nights} nights = {args.pipelines * args.nights:,} versions "
              f"and runs, built in {built:.0f} s ({store.stat().st_size / 1e9:.1f} GB)")
    client = mlflow.MlflowClient(f"sqlite:///{store}")
    reader = FleetReader(client, ttl_seconds=3600)  # sync_limit: 100 pipelines read in the request
    facts = pipeline_facts(args.pipelines, now)
    # The api-server's first request: answered at once, MLflow read in the background.
    first, first_rows = assemble(reader, facts, now)
    started = time.perf_counter()
    reader.wait_for_refresh()
    cold = time.perf_counter() - started + first
    cold_requests = reader.requests
    warm, rows = assemble(reader, facts, now)
    assert len(rows) == args.pipelines and all(r["champion"] for r in rows), "every pipeline has a champion"
    # 5% of the pipelines ran (read in the request), then the whole fleet ran (read in the background).
    changed = set(random.Random(1).sample(range(args.pipelines), args.pipelines // 20))
    before = reader.requests
    some, _ = assemble(reader, pipeline_facts(args.pipelines, now, changed=changed), now, wait=True)
    some_requests = reader.requests - before
    everyone = set(range(args.pipelines))
    later = now + timedelta(minutes=1)
    night, night_rows = assemble(reader, pipeline_facts(args.pipelines, later, changed=everyone), later)
    started = time.perf_counter()
    reader.wait_for_refresh()
    night_refresh = time.perf_counter() - started + night
    load = os.getloadavg()
    print(f"list data assembly for {args.pipelines} pipelines (target: the list answers in < {TARGET_SECONDS:.0f} s):")
    print(f"  first request after start:  {first:7.3f} s  ({sum(r['refreshing'] for r in first_rows)} rows marked "
          "refreshing; MLflow read in the background)")
    print(f"    background read, cold:    {cold:7.1f} s  ({cold_requests} MLflow requests)")
    print(f"  warm (no DAG run changed):  {warm:7.3f} s  (0 MLflow requests)")
    print(f"  {len(changed)} pipelines ran (5%), read before answering (as the pipeline page does): {some:7.3f} s  "
          f"({some_requests} MLflow requests)")
    print(f"  every pipeline ran:         {night:7.3f} s  (answered at once, rows marked refreshing)")
    print(f"    background read:          {night_refresh:7.1f} s  ({reader.requests - before - some_requests} MLflow "
          "requests; only the runs of the last 2 days and the new versions)")
    print(f"load average while measured: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    if folder is not None and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    elif folder is not None:
        print(f"store kept at {store}")


if __name__ == "__main__":
    main()
