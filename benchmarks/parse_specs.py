"""Parse speed: marginal milliseconds per DAG for trainpipe, a hand-written DAG of the same shape,
and dag-factory 1.1 given an equivalent YAML, all in this one process.

    python benchmarks/parse_specs.py [--specs 1000] [--repeats 5]

Baseline: the same pipeline written by hand in Python (same task count and chain, schedule, tags,
default_args, Params with the same schemas, its own outlet Assets, the checkpoint watch as a
reschedule-mode sensor; standard-provider operators). dag-factory gets the same DAG as YAML
(BashOperator tasks, the same params as plain values).
Each figure is (T(N) - T(N/10)) / (N - N/10), each T the best of --repeats runs, the three
implementations interleaved so that a busy moment of the machine does not favour one of them.
Targets: trainpipe <= 1.5x hand-written; dag-factory / trainpipe >= 4x.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "dag_configs" / "fraud_detector.yaml"


def _timed(fn, *args) -> float:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn(*args)
        return time.perf_counter() - start
    finally:
        gc.enable()


def _marginal_ms(timings: dict[int, list[float]], small: int, large: int) -> float:
    """(T(large) - T(small)) / (large - small): per-DAG cost without one-off imports and warm-up."""
    return (min(timings[large]) - min(timings[small])) / (large - small) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="runs per size; the best counts")
    args = parser.parse_args()
    n = args.specs
    small = max(10, n // 10)

    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="trainpipe-bench-airflow-"))
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")

    from airflow.providers.standard.operators.bash import BashOperator
    from airflow.sdk import DAG, chain

    from trainpipe.dag_builder import build_dag
    from trainpipe.factory import compile_directory

    template = EXAMPLE.read_text()
    work = Path(tempfile.mkdtemp(prefix="trainpipe-bench-"))
    trainpipe_dirs: dict[int, Path] = {}
    for count in (small, n):
        folder = work / f"trainpipe_{count}"
        folder.mkdir()
        for i in range(count):
            (folder / f"p{i:05d}.yaml").write_text(template.replace("pipeline_id: fraud_detector", f"pipeline_id: p{i:05d}"))
        trainpipe_dirs[count] = folder

    probe = compile_directory(trainpipe_dirs[small]).plans["p00000"]
    task_ids = [t.task_id for t in build_dag(probe).topological_sort()]
    n_tasks = len(task_ids)

    def trainpipe(count: int) -> None:
        result = compile_directory(trainpipe_dirs[count])
        namespace = {dag_id: build_dag(plan) for dag_id, plan in result.plans.items()}
        assert len(namespace) == count, result.errors

    from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
    from airflow.providers.standard.sensors.python import PythonSensor
    from airflow.sdk import Asset, Param

    from trainpipe.plan import CHECKPOINT_SENSOR

    outlet_uris = {t.task_id: t.outlets for t in probe.tasks}
    param_specs = {p.name: (p.default, p.type, p.description, {b.keyword: b.value for b in p.bounds})
                   for p in probe.params}

    def hand_written(count: int) -> None:
        """What an engineer writes by hand for the same pipeline: same DAG arguments, Params, Assets,
        seven standard-provider tasks in a chain."""
        namespace = {}
        for i in range(count):
            params = {
                name: Param(default, type=kind, description=text, **bounds)
                for name, (default, kind, text, bounds) in param_specs.items()
            }
            with DAG(dag_id=f"h{i:05d}", schedule=probe.schedule, start_date=probe.start_date, catchup=False,
                     tags=list(probe.tags), description=probe.description, max_active_runs=1, params=params,
                     default_args={"owner": probe.owner, "retries": probe.retries,
                                   "retry_delay": probe.retry_delay}) as dag:
                tasks = []
                for t in task_ids:
                    outlets = [Asset(uri.replace(probe.dag_id, dag.dag_id)) for uri in outlet_uris[t]]
                    if t == CHECKPOINT_SENSOR:
                        sensor = PythonSensor(task_id=t, python_callable=bool, mode="reschedule", retries=0)
                        continue
                    tasks.append((ShortCircuitOperator if t == "gate" else PythonOperator)(
                        task_id=t, python_callable=print, outlets=outlets))
                chain(*tasks)
                tasks[task_ids.index("train") - 1] >> sensor
            namespace[dag.dag_id] = dag

    dagfactory_dirs: dict[int, Path] = {}
    for count in (small, n):
        folder = work / f"dagfactory_{count}"
        folder.mkdir()
        for i in range(count):
            tasks = "\n".join(
                f"    - task_id: {t}\n      operator: airflow.providers.standard.operators.bash.BashOperator\n"
                f"      bash_command: 'true'" + (f"\n      dependencies: [{task_ids[j - 1]}]" if j else "")
                for j, t in enumerate(task_ids)
            )
            (folder / f"d{i:05d}.yml").write_text(
                f"d{i:05d}:\n  default_args:\n    owner: {probe.owner}\n    retries: {probe.retries}\n"
                f"    start_date: 2025-01-01\n  schedule: '@daily'\n  catchup: false\n  max_active_runs: 1\n"
                f"  description: {probe.description!r}\n  tags: {list(probe.tags)}\n"
                f"  params: {{{', '.join(f'{p.name}: {p.default}' for p in probe.params)}}}\n  tasks:\n{tasks}\n"
            )
        dagfactory_dirs[count] = folder

    try:
        from dagfactory import load_yaml_dags
        import dagfactory
    except ImportError:
        load_yaml_dags = None

    def dag_factory(count: int) -> None:
        namespace: dict = {}
        load_yaml_dags(globals_dict=namespace, dags_folder=str(dagfactory_dirs[count]), suffix=[".yml"])
        assert sum(1 for v in namespace.values() if isinstance(v, DAG)) == count

    def trainpipe_compile_only(count: int) -> None:
        assert len(compile_directory(trainpipe_dirs[count]).plans) == count

    from airflow.serialization.serialized_objects import DagSerialization

    def airflow_serialization(count: int) -> None:
        """What the DAG processor does with every DAG after the file is parsed: serialize it."""
        for dag in serializable[count]:
            DagSerialization.to_dict(dag)

    serializable = {count: [build_dag(p) for p in compile_directory(trainpipe_dirs[count]).plans.values()]
                    for count in (small, n)}

    contenders = {"hand-written": hand_written, "trainpipe": trainpipe, "compile": trainpipe_compile_only,
                  "serialize": airflow_serialization}
    if load_yaml_dags is not None:
        contenders["dag-factory"] = dag_factory
    for fn in contenders.values():
        fn(small)  # warm: imports, caches
    timings = {name: {small: [], n: []} for name in contenders}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            for count in (small, n):
                timings[name][count].append(_timed(fn, count))
    hand_ms, ours_ms = (_marginal_ms(timings[name], small, n) for name in ("hand-written", "trainpipe"))
    print(f"specs: {n} (marginal cost between {small} and {n} DAGs, best of {args.repeats}; {n_tasks} tasks per DAG), "
          f"Python {sys.version.split()[0]}")
    print(f"hand-written Airflow DAG (baseline): {hand_ms:7.3f} ms/DAG")
    print(f"trainpipe YAML -> DAG:               {ours_ms:7.3f} ms/DAG   ratio vs hand-written: {ours_ms / hand_ms:.2f}x (target <= 1.5x)")
    compile_ms, serialize_ms = (_marginal_ms(timings[name], small, n) for name in ("compile", "serialize"))
    print(f"  of which YAML -> plan (compile):   {compile_ms:7.3f} ms/DAG   "
          f"(Airflow then serializes each DAG it parsed: {serialize_ms:.3f} ms/DAG)")
    if load_yaml_dags is None:
        print("dag-factory: not installed (pip install 'dag-factory==1.1.0'); skipped")
        return 0
    theirs_ms = _marginal_ms(timings["dag-factory"], small, n)
    print(f"dag-factory {dagfactory.__version__} YAML -> DAG:        {theirs_ms:7.3f} ms/DAG   "
          f"ratio vs hand-written: {theirs_ms / hand_ms:.2f}x")
    print(f"dag-factory / trainpipe:             {theirs_ms / ours_ms:.2f}x faster (target >= 4x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
