"""Parse time at scale: the slowest single DAG-file import of ``dags/`` with 1,000, 10,000 and 20,000
specs, cold and warm plan cache, as Airflow's dag-processor does it.

    python benchmarks/parse_scale.py [--sizes 1000 10000 20000] [--baseline-max 10000] [--sample K]

Specs are copies of ``dag_configs/fraud_detector.yaml``, each with its own pipeline id, cron
schedule and feature list. Like the dag-processor, one parent process imports Airflow once and
forks a child per DAG file; the child runs ``DagBag`` on that one file (the import Airflow bounds
with ``dagbag_import_timeout``, 30 s by default) and the parent reads the child's peak memory.
Cold: an empty plan cache (``TRAINPIPE_HOME/cache``); warm: the same files parsed again.
Airflow's import timeout is lifted so that an overloaded machine still gives a figure, compared
with the targets. With --sample K only the K files with the most specs are parsed (the slowest
file is among them) and the total of all files is bounded by their mean times the file count.
Baseline: today's layout before sharding, one file compiling the whole folder (no cache), in a
child the same way, up to --baseline-max specs.
Targets: the slowest file import <= 10 s at 20,000 specs, cold; warm >= 3x faster than cold.
"""

from __future__ import annotations

import argparse
import compileall
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from itertools import combinations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "dag_configs" / "fraud_detector.yaml"
# Features the example's transforms name stay in every spec; the others vary per spec.
FIXED_FEATURES = ["amount", "distance_from_home_km", "merchant_category"]
VARIED_FEATURES = ["merchant_risk", "hour_of_day", "transactions_last_24h", "account_age_days", "is_foreign"]
_FEATURES_LINE = re.compile(r"^  features: \[[^\]]*\]\n", re.M)


def _write_specs(folder: Path, count: int) -> None:
    template = EXAMPLE.read_text()
    assert len(_FEATURES_LINE.findall(template)) == 1 and 'schedule: "@daily"' in template
    feature_sets = [FIXED_FEATURES + list(c) for size in range(1, len(VARIED_FEATURES) + 1)
                    for c in combinations(VARIED_FEATURES, size)]
    folder.mkdir(parents=True)
    for i in range(count):
        features = feature_sets[i % len(feature_sets)]
        text = _FEATURES_LINE.sub(f"  features: [{', '.join(features)}]\n", template.replace(
            "pipeline_id: fraud_detector", f"pipeline_id: p{i:05d}").replace(
            'schedule: "@daily"', f'schedule: "{i % 60} {i // 60 % 24} * * *"'))
        # Spread over team folders, as a platform's specs would be.
        (folder / f"team{i % 20:02d}").mkdir(exist_ok=True)
        (folder / f"team{i % 20:02d}" / f"p{i:05d}.yaml").write_text(text)


def _in_child(work) -> tuple[dict, int]:
    """Run ``work()`` (returns a dict) in a forked child: (its result, its peak RSS in KB)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            payload = json.dumps(work()).encode()
        except BaseException as err:
            payload = json.dumps({"error": f"{type(err).__name__}: {err}"}).encode()
        with os.fdopen(write_end, "wb") as handle:
            handle.write(payload)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        payload = handle.read()
    _, status, usage = os.wait4(pid, 0)
    result = json.loads(payload or b"{}")
    if status != 0 or "error" in result:
        raise RuntimeError(f"child failed ({status}): {result.get('error')}")
    # CPU time: what the wall time would be on an idle machine (Airflow's timeout counts wall time).
    result["cpu"] = usage.ru_utime + usage.ru_stime
    return result, usage.ru_maxrss


def _parse_file(dag_file: Path):
    def work() -> dict:
        from airflow.dag_processing.dagbag import DagBag

        start = time.perf_counter()
        bag = DagBag(dag_folder=str(dag_file))
        return {"seconds": time.perf_counter() - start, "dags": len(bag.dag_ids), "errors": len(bag.import_errors)}
    return work


def _one_file_baseline(folder: Path):
    def work() -> dict:
        start = time.perf_counter()
        from trainpipe.compile.compiler import compile_directory
        from trainpipe.dags.builder import build_dag
        from trainpipe.settings import Settings

        plans = compile_directory(folder, settings=Settings.from_env()).plans
        namespace = {dag_id: build_dag(plan) for dag_id, plan in plans.items()}
        return {"seconds": time.perf_counter() - start, "dags": len(namespace)}
    return work


def _listing(folder: Path):
    def work() -> dict:
        from trainpipe.compile.spec_files import list_specs

        start = time.perf_counter()
        specs = list_specs(folder)
        listed = time.perf_counter() - start
        from trainpipe.compile.plan_cache import PlanCache
        from trainpipe.dags.files import declared_pipeline_id
        from trainpipe.settings import Settings

        cache = PlanCache(folder, "benchmark", home=Settings.from_env().home)
        paths = [path for _, path in specs]  # strings, as the shards pass them
        cache.declared_ids(paths, declared_pipeline_id)  # what the parses left: this one only stats
        start = time.perf_counter()
        cache.declared_ids(paths, declared_pipeline_id)
        looked = time.perf_counter() - start
        start = time.perf_counter()
        for path in paths:
            declared_pipeline_id(path)
        return {"listing": listed, "id_look": looked, "id_read": time.perf_counter() - start}
    return work


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 20000])
    parser.add_argument("--baseline-max", type=int, default=10000, help="largest size the one-file baseline runs at")
    parser.add_argument("--sample", type=int, default=0, help="parse only the K DAG files with the most specs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="trainpipe-parse-scale-"))
    os.environ["AIRFLOW_HOME"] = str(work / "airflow")
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    os.environ["AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT"] = "0"
    os.environ.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    # What the dag-processor has imported before it forks a child per file; trainpipe is not among it.
    import airflow.sdk  # noqa: F401
    from airflow.dag_processing.dagbag import DagBag  # noqa: F401

    # Bytecode as an installed package has it (pip compiles on install; PYTHONDONTWRITEBYTECODE or a
    # fresh editable checkout would otherwise make every child compile trainpipe's sources again).
    import trainpipe_trainer.config
    from trainpipe.compile.spec_files import list_specs
    from trainpipe.dags.files import SHARD_FILES, shard_count, shard_of
    compileall.compile_dir(str(REPO / "provider" / "trainpipe"), quiet=1)
    compileall.compile_file(trainpipe_trainer.config.__file__, quiet=1)

    dag_files = [REPO / "dags" / ("trainpipe_dags.py" if shard == 0 else f"shards/trainpipe_dags_{shard:02d}.py")
                 for shard in range(SHARD_FILES)]
    assert all(dag_file.is_file() for dag_file in dag_files)
    parent_rss_mb = _in_child(dict)[1] / 1024
    print(f"trainpipe parse scale: {len(dag_files)} DAG files, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {_load()} at start")
    try:
        for size in args.sizes:
            folder = work / f"specs_{size}" / "dag_configs"
            _write_specs(folder, size)
            os.environ["TRAINPIPE_DAG_CONFIGS"] = str(folder)
            os.environ["TRAINPIPE_HOME"] = str(work / f"home_{size}")
            count = shard_count(size)
            per_shard = [0] * SHARD_FILES
            for relative, _ in list_specs(folder):
                per_shard[shard_of(relative, count)] += 1
            by_size = sorted(range(SHARD_FILES), key=lambda shard: -per_shard[shard])
            measured = by_size[: args.sample] if args.sample else by_size
            sampled_specs = sum(per_shard[shard] for shard in measured)
            figures = {}
            cpu = {}
            for state in ("cold", "warm"):
                if state == "cold":
                    shutil.rmtree(work / f"home_{size}" / "cache", ignore_errors=True)
                runs = [_in_child(_parse_file(dag_files[shard])) for shard in measured]
                dags = sum(result["dags"] for result, _ in runs)
                errors = sum(result["errors"] for result, _ in runs)
                assert (dags, errors) == (sampled_specs, 0), f"{state}: {dags} DAGs, {errors} import errors"
                times = [result["seconds"] for result, _ in runs]
                # A sample holds the largest files: its mean file times the file count bounds the total.
                total = sum(times) if not args.sample else sum(times) / len(times) * SHARD_FILES
                figures[state] = (max(times), total, max(rss for _, rss in runs) / 1024)
                cpu[state] = max(result["cpu"] for result, _ in runs)
            listing = _in_child(_listing(folder))[0]
            (cold_max, cold_total, cold_rss), (warm_max, warm_total, warm_rss) = figures["cold"], figures["warm"]
            print(f"\n{size:,} specs, {max(per_shard)} in the largest file (load average {_load()}):")
            print(f"  slowest DAG-file import, cold cache: {cold_max:6.2f} s   (target <= 10 s at 20,000)")
            print(f"  slowest DAG-file import, warm cache: {warm_max:6.2f} s   {cold_max / warm_max:.1f}x faster than cold "
                  "(target >= 3x)")
            print(f"  CPU time of the slowest file (its wall time on an idle machine): cold {cpu['cold']:.2f} s, "
                  f"warm {cpu['warm']:.2f} s, {cpu['cold'] / cpu['warm']:.1f}x")
            how = f"at most (from the {len(measured)} largest files)" if args.sample else "one after another"
            print(f"  all {len(dag_files)} files, {how}: cold {cold_total:.1f} s, warm {warm_total:.1f} s "
                  "(the dag-processor spreads them over its parsing_processes)")
            print(f"  memory of one parse (peak RSS of the largest): cold {cold_rss:.0f} MB, warm {warm_rss:.0f} MB "
                  f"(the forking parent: {parent_rss_mb:.0f} MB)")
            print(f"  per parse, growing with the folder: listing it {listing['listing'] * 1000:.0f} ms, "
                  f"the other shards' pipeline ids {listing['id_look'] * 1000:.0f} ms "
                  f"(a stat per file; reading them all would take {listing['id_read'] * 1000:.0f} ms)")
            if size <= args.baseline_max:
                baseline, baseline_rss = _in_child(_one_file_baseline(folder))
                assert baseline["dags"] == size
                print(f"  baseline, one file compiling the whole folder (no cache): {baseline['seconds']:.1f} s "
                      f"({baseline['cpu']:.1f} s CPU), {baseline_rss / 1024:.0f} MB; "
                      f"slowest shard cold is {baseline['seconds'] / cold_max:.1f}x faster")
            shutil.rmtree(work / f"specs_{size}", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average {_load()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
