"""Data beyond memory (issue 54): snapshot, validate and train on Parquet folders of growing size.

    python benchmarks/data_scale.py                       # 1, 4, 16 GB, then 32 GB (> this machine's 24 GiB)
    python benchmarks/data_scale.py --sizes 1 4           # a quick look (about 10 minutes)

For each size the script writes a synthetic Parquet folder (``--features`` float32 columns and a 0/1 label,
files of about 128 MB in row groups of ``--row-group-rows`` rows: the layout a data lake stages for training),
then runs each step as its own process, as Airflow runs each task:

- **snapshot**: ``trainpipe.steps.snapshot.take_snapshot`` with ``data.snapshot: manifest`` (lists the files and
  reads their footers; no copy);
- **validate**: ``trainpipe.steps.validate.validate.validate_snapshot`` (one streamed pass: exact aggregates,
  a bounded seeded sample for the distribution checks, the trainer's feature statistics);
- **train**: ``trainpipe train SPEC --nproc-per-node 2`` with ``training.data_placement: stream``, one epoch of a
  small MLP (the launchers' command: torchrun on CPU, gloo).

First it times the manifest snapshot of 1,000 tiny files on the local disk and in a versioned bucket of moto's S3
server (``--no-listing`` skips it). Then, per size, each step's wall time and peak RSS per process (``VmHWM`` of
every process of the step's tree, read every 0.2 s: the snapshot's and validate's process, the train command's
launcher and each rank), and the trainer's samples/s. At the smallest size (2 GB or less) it also trains the
in-memory path (``data_placement: auto`` on a copy snapshot of the same rows) for the streamed/in-memory
samples/s ratio: each path's trainer runs ``--repeats`` times (default 5), in turn, and the medians are compared
(one run's step-loop rate moves by up to 2x on a shared 2-core machine).

Targets (issue 54): the largest folder (>= 32 GB, larger than memory) snapshotted, validated and trained for an
epoch with the peak RSS of the snapshot, of validate and of each of 2 ranks under 3 GiB plus the model; peak RSS
flat (within 20%) from 1 GB to 32 GB; streamed samples/s at 1 GB >= 0.8 of the in-memory path. Each folder is
deleted after its size is measured (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3
TARGET_RSS_GIB = 3.0
TARGET_FLATNESS = 0.20
TARGET_STREAM_RATIO = 0.8


def write_folder(folder: Path, *, size_gb: float, features: int, row_group_rows: int, seed: int = 0) -> int:
    """Parquet files of about 128 MB until ``size_gb`` is reached; the label depends on the features (a model can
    learn it). Returns the row count."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=features).astype(np.float32)
    names = [f"f{i:02d}" for i in range(features)]
    groups_per_file = max(1, (128 * 1024**2) // (row_group_rows * (features + 1) * 4))
    # Eight random row groups, written in turn: drawing 32 GB of normals would take longer than the benchmark.
    blocks = []
    for _ in range(8):
        x = rng.standard_normal((row_group_rows, features), dtype=np.float32)
        label = ((x @ weights + rng.standard_normal(row_group_rows, dtype=np.float32)) > 0).astype(np.int8)
        blocks.append(pa.table({**{n: x[:, i] for i, n in enumerate(names)}, "label": label}))
    target, written, rows, index = size_gb * 1e9, 0, 0, 0
    while written < target:
        path = folder / f"part-{index:05d}.parquet"
        with pq.ParquetWriter(path, blocks[0].schema, compression="none") as writer:
            for group in range(groups_per_file):
                writer.write_table(blocks[(index * groups_per_file + group) % len(blocks)],
                                   row_group_size=row_group_rows)
                rows += row_group_rows
        written += path.stat().st_size
        index += 1
    return rows


@dataclass
class TreeMemory:
    """Peak RSS (VmHWM) of every process of a tree, sampled until the root exits."""

    root: int
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)

    def _children(self, pid: int) -> list[int]:
        try:
            return [int(c) for t in os.listdir(f"/proc/{pid}/task")
                    for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        except OSError:
            return []

    def sample(self) -> None:
        stack = [self.root]
        while stack:
            pid = stack.pop()
            stack.extend(self._children(pid))
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found = re.search(r"VmHWM:\s+(\d+) kB", status)
            if found:
                peak = int(found.group(1)) * 1024
                if peak >= self.peaks.get(pid, ("", 0))[1]:
                    self.peaks[pid] = (_role(command, pid), peak)

    def by_role(self) -> dict[str, int]:
        roles: dict[str, int] = {}
        for role, peak in self.peaks.values():
            roles[role] = max(roles.get(role, 0), peak)
        return roles


def _role(command: str, pid: int) -> str:
    if "-m trainpipe_trainer " in command + " " and "elastic" not in command:
        rank = _environ(pid).get("RANK", "?")
        return f"rank {rank}"
    if "trainpipe_trainer.elastic" in command or "torchrun" in command:
        return "launcher"
    if "tracking" in command or "mlflow" in command:
        return "tracking"
    return "step"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def run_measured(command: list[str], *, env: dict[str, str], log: Path) -> tuple[float, dict[str, int], str]:
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        memory = TreeMemory(process.pid)
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.2):
                memory.sample()

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        code = process.wait()
        stop.set()
        poller.join()
    wall = time.perf_counter() - started
    text = log.read_text()
    if code != 0:
        raise SystemExit(f"{' '.join(command)} failed ({code}):\n{text[-4000:]}")
    return wall, memory.by_role(), text


SPEC = """\
pipeline_id: {name}
owner: benchmarks
data:
  uri: {uri}
  snapshot: {snapshot}
validation:
  expectations:
    - expect_column_values_to_not_be_null: {{column: label}}
    - expect_column_values_to_be_between: {{column: f00, min_value: -100, max_value: 100}}
training:
  task: binary_classification
  label: label
  features: [{features}]
  model: {{type: mlp, hidden_layers: [64]}}
  epochs: 1
  batch_size: 4096
  data_placement: {placement}
  distributed: {{nproc_per_node: 2, nnodes: 1, strategy: ddp}}
  checkpoint: {{every_n_steps: 1000000, keep_best: false}}
evaluation:
  metrics: [auc]
  holdout_fraction: 0.02
registration:
  model_name: {name}
"""

def _child(step: str, spec: str, out: str) -> None:
    """One step of a spec in this process (``--child``): what an Airflow task of that step does."""
    from datetime import UTC, datetime

    from trainpipe.compile.compiler import compile_file
    from trainpipe.settings import Settings
    from trainpipe.state.datasets import SnapshotInfo
    from trainpipe.steps.snapshot import take_snapshot
    from trainpipe.steps.validate.validate import validate_snapshot

    settings = Settings.from_env()
    plan = compile_file(Path(spec), settings=settings)
    when = datetime.now(UTC)
    if step == "snapshot":
        info = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=when)
        Path(out).write_text(json.dumps(info.to_dict()))
    else:
        info = SnapshotInfo.from_dict(json.loads(Path(out).read_text()))
        validate_snapshot(plan.dag_id, plan.validation, info, settings=settings, trainer=plan.trainer)


def listing_times(work: Path, files: int = 1000) -> dict[str, float]:
    """Seconds to snapshot ``files`` tiny Parquet files as a manifest: on the local disk, and in a versioned bucket
    of moto's S3 server (ListObjectVersions, then one footer read per object)."""
    import io
    from concurrent.futures import ThreadPoolExecutor
    from datetime import UTC, datetime

    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(REPO / "tests"))
    from moto_s3 import moto_s3_server

    from trainpipe.plan.model import DataPlan
    from trainpipe.settings import Settings
    from trainpipe.steps.snapshot import take_snapshot
    from trainpipe.storage import storage_access

    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [1.0, 2.0], "y": [0, 1]}), sink)
    body, when, times = sink.getvalue(), datetime.now(UTC), {}

    def plan(uri: str, conn_id: str | None) -> DataPlan:
        return DataPlan(uri=uri, conn_id=conn_id, format="parquet", time_column=None, window=None,
                        holdout_fraction=0.1, holdout_key=None, snapshot="manifest")

    local = work / "listing" / "storage"
    for i in range(files):
        (local / "many" / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (local / "many" / f"d{i % 10}" / f"f{i:04d}.parquet").write_bytes(body)
    settings = Settings(home=work / "listing" / "home", storage_root=local.as_uri(), storage_conn_id=None,
                        mlflow_tracking_uri="unused", mlflow_artifact_root=str(work / "listing" / "artifacts"))
    started = time.perf_counter()
    take_snapshot("listing", plan("many", None), settings=settings, logical_date=when)
    times["local"] = time.perf_counter() - started
    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(name, value)
    with moto_s3_server() as url:
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket="lake")
        client.put_bucket_versioning(Bucket="lake", VersioningConfiguration={"Status": "Enabled"})
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: client.put_object(Bucket="lake", Key=f"many/d{i % 10}/f{i:04d}.parquet",
                                                      Body=body), range(files)))
        os.environ["AIRFLOW_CONN_TRAINPIPE_BENCH_S3"] = json.dumps({
            "conn_type": "aws", "login": "bench", "password": "bench",
            "extra": {"endpoint_url": url, "region_name": "us-east-1"}})
        settings = Settings(home=work / "listing" / "home", storage_root="s3://lake/storage",
                            storage_conn_id="trainpipe_bench_s3", mlflow_tracking_uri="unused",
                            mlflow_artifact_root=str(work / "listing" / "artifacts"))
        started = time.perf_counter()
        with storage_access(settings):
            take_snapshot("listing", plan("s3://lake/many", "trainpipe_bench_s3"), settings=settings,
                          logical_date=when)
        times["s3"] = time.perf_counter() - started
    shutil.rmtree(work / "listing")
    return times


def measure(size_gb: float, args: argparse.Namespace, work: Path, *, in_memory: bool) -> dict:
    data = work / "storage" / f"lake-{size_gb:g}gb"
    started = time.perf_counter()
    rows = write_folder(data, size_gb=size_gb, features=args.features, row_group_rows=args.row_group_rows)
    on_disk = sum(p.stat().st_size for p in data.glob("*.parquet"))
    print(f"\n== {size_gb:g} GB: {on_disk / 1e9:.2f} GB on disk, {rows:,} rows, "
          f"{len(list(data.glob('*.parquet')))} files, written in {time.perf_counter() - started:.0f} s", flush=True)
    features = ", ".join(f"f{i:02d}" for i in range(args.features))
    env = {**os.environ, "TRAINPIPE_STORAGE_ROOT": (work / "storage").as_uri(), "TRAINPIPE_HOME": str(work / "home"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    result: dict = {"size_gb": size_gb, "bytes": on_disk, "rows": rows}
    modes = [("stream", "manifest", "stream")] + ([("memory", "copy", "auto")] if in_memory else [])
    for mode, snapshot, placement in modes:
        name = f"scale_{mode}_{str(size_gb).replace('.', '_')}"
        spec = work / "configs" / f"{name}.yaml"
        spec.parent.mkdir(exist_ok=True)
        spec.write_text(SPEC.format(name=name, uri=data.name, snapshot=snapshot, features=features,
                                    placement=placement))
        info = work / f"{name}.snapshot.json"
        this = result.setdefault(mode, {})
        for step in ("snapshot", "validate"):
            wall, peaks, _ = run_measured([sys.executable, __file__, "--child", step, str(spec), str(info)], env=env,
                                          log=work / f"{name}.{step}.log")
            this[step] = {"seconds": round(wall, 1), "peak_rss_gib": round(peaks.get("step", 0) / GIB, 2)}
            print(f"  {mode:6s} {step:8s} {wall:7.1f} s   peak RSS {peaks.get('step', 0) / GIB:5.2f} GiB", flush=True)
        wall, peaks, text = run_measured([str(Path(sys.executable).with_name("trainpipe")), "train", str(spec),
                                          "--nproc-per-node", "2", "--run-dir", str(work / "runs" / name)],
                                         env=env, log=work / f"{name}.train.log")
        ranks = {role: round(peak / GIB, 2) for role, peak in peaks.items() if role.startswith("rank")}
        # The step loop's rate (the trainer's launch line), and the epoch's rate from the data read to the loop's
        # end: the in-memory path reads and transforms the split before its loop, the streamed path inside it.
        loop = re.search(r"step loop: (\d+) steps in ([\d.]+) s, ([\d,]+) samples/s", text)
        read = re.search(r"data read ([\d.]+)", text)
        loop_seconds, loop_rate = float(loop.group(2)), float(loop.group(3).replace(",", ""))
        epoch_rate = loop_seconds * loop_rate / (loop_seconds + float(read.group(1)))
        this["train"] = {"seconds": round(wall, 1), "samples_per_s": loop_rate, "epoch_rows_per_s": round(epoch_rate),
                         "peak_rss_gib": ranks, "launcher_gib": round(peaks.get("launcher", 0) / GIB, 2),
                         "loop_rates": [loop_rate]}
        print(f"  {mode:6s} train    {wall:7.1f} s   peak RSS per rank {ranks} GiB, step loop {loop_rate:,.0f} "
              f"samples/s, data read + loop {epoch_rate:,.0f} rows/s", flush=True)
    if in_memory and args.repeats > 1:
        # One run's step-loop rate moves by up to 2x on this shared machine (the in-memory loop's most):
        # the two paths' trainers run again in turn and the comparison takes each one's median.
        for repeat in range(1, args.repeats):
            for mode in ("stream", "memory"):
                rate = rerun_trainer(work / "runs" / f"scale_{mode}_{str(size_gb).replace('.', '_')}", repeat, env)
                result[mode]["train"]["loop_rates"].append(rate)
                print(f"  {mode:6s} train again ({repeat + 1}/{args.repeats}): step loop {rate:,.0f} samples/s",
                      flush=True)
    for mode in result.keys() & {"stream", "memory"}:
        train = result[mode]["train"]
        train["median_samples_per_s"] = round(statistics.median(train["loop_rates"]))
    if not args.keep:
        shutil.rmtree(data)
    return result


def rerun_trainer(run_dir: Path, repeat: int, env: dict[str, str]) -> float:
    """The step-loop rate of the train step's trainer run again: its trainer config with fresh checkpoint and
    output folders and its own MLflow run, launched by the launchers' command (torchrun, 2 ranks, gloo)."""
    config = json.loads((run_dir / "trainer_config.json").read_text())
    again = run_dir.with_name(f"{run_dir.name}-again-{repeat}")
    shutil.rmtree(again, ignore_errors=True)
    again.mkdir(parents=True)
    config["checkpoint"]["root_uri"] = (again / "checkpoints").as_uri()
    config["output_uri"] = (again / "output").as_uri()
    config["tracking"]["run_id"] = None
    (again / "trainer_config.json").write_text(json.dumps(config))
    done = subprocess.run([sys.executable, "-m", "trainpipe_trainer.elastic", "--nnodes=1", "--nproc_per_node=2",
                           "--standalone", "-m", "trainpipe_trainer", "--config",
                           (again / "trainer_config.json").as_uri()], env=env, capture_output=True, text=True)
    loop = re.search(r"step loop: \d+ steps in [\d.]+ s, ([\d,]+) samples/s", done.stdout + done.stderr)
    if done.returncode != 0 or loop is None:
        raise SystemExit(f"the trainer run again in {again} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    shutil.rmtree(again)
    return float(loop.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 32], help="folder sizes in GB")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--row-group-rows", type=int, default=131_072)
    parser.add_argument("--workdir", help="where the folders are written (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the folders")
    parser.add_argument("--repeats", type=int, default=5,
                        help="trainer runs of each path for the streamed/in-memory comparison (medians compared)")
    parser.add_argument("--listing", action=argparse.BooleanOptionalAction, default=True,
                        help="time the manifest snapshot of 1,000 tiny files (local disk, moto S3 with versioning)")
    parser.add_argument("--child", nargs=3, metavar=("STEP", "SPEC", "SNAPSHOT_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="trainpipe-data-scale-"))
    if args.listing:
        times = listing_times(work)
        print(f"manifest snapshot of 1,000 files: local {times['local']:.2f} s, moto S3 with versioning "
              f"{times['s3']:.2f} s (target < 10 s each)", flush=True)
    # The in-memory path holds about 6x the data per rank: compared at the smallest size only, if it fits.
    results = [measure(size, args, work, in_memory=index == 0 and size <= 2)
               for index, size in enumerate(sorted(args.sizes))]
    print("\n| size | rows | snapshot s / GiB | validate s / GiB | train s | rank peak GiB | samples/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        s = r["stream"]
        print(f"| {r['bytes'] / 1e9:.1f} GB | {r['rows']:,} | {s['snapshot']['seconds']} / "
              f"{s['snapshot']['peak_rss_gib']} | {s['validate']['seconds']} / {s['validate']['peak_rss_gib']} | "
              f"{s['train']['seconds']} | {max(s['train']['peak_rss_gib'].values(), default=0)} | "
              f"{s['train']['samples_per_s']} |")
    first, last = results[0], results[-1]
    peak = lambda r: max([r["stream"]["snapshot"]["peak_rss_gib"], r["stream"]["validate"]["peak_rss_gib"],  # noqa: E731
                          *r["stream"]["train"]["peak_rss_gib"].values()])
    print(f"\npeak RSS at {last['bytes'] / 1e9:.1f} GB: {peak(last)} GiB (target < {TARGET_RSS_GIB} GiB plus the "
          f"model); flatness {peak(last) / peak(first) - 1:+.0%} from {first['bytes'] / 1e9:.1f} GB (target within "
          f"{TARGET_FLATNESS:.0%})")
    memory = first.get("memory", {}).get("train", {}).get("median_samples_per_s")
    streamed = first["stream"]["train"]["median_samples_per_s"]
    if memory and streamed:
        runs = len(first["memory"]["train"]["loop_rates"])
        print(f"streamed vs in-memory samples/s at {first['bytes'] / 1e9:.1f} GB, median of {runs} runs each: step "
              f"loop {streamed:,.0f} vs {memory:,.0f} = {streamed / memory:.2f} (target >= {TARGET_STREAM_RATIO}); "
              f"runs: streamed {first['stream']['train']['loop_rates']}, in memory "
              f"{first['memory']['train']['loop_rates']}; first runs' data read + loop "
              f"{first['stream']['train']['epoch_rows_per_s']:,} vs {first['memory']['train']['epoch_rows_per_s']:,} "
              f"rows/s = {first['stream']['train']['epoch_rows_per_s'] / first['memory']['train']['epoch_rows_per_s']:.2f}")
    (work / "data_scale.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
