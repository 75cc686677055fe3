"""Parse speed: marginal milliseconds per DAG for trainpipe (cold and warm plan cache), a
hand-written DAG of the same shape, and dag-factory 1.1 given an equivalent YAML.

    python benchmarks/parse_specs.py [--specs 1000] [--repeats 3] [--dag-factory DIR] [--in-process]

Fresh processes (the default, what a dag-processor pays): each figure is one new Python process
that has imported Airflow and then runs a ``DagBag`` over a folder of DAG files, timed from there:
trainpipe over every DAG file of the repository's ``dags/`` (64 files; the specs are copies of
``fraud_detector.yaml`` with their own ids, schedules and feature lists, in 20 team folders), cold
(an empty plan cache) and warm (the same parse again); the hand-written pipeline as one DAG file
defining the DAGs in a loop; dag-factory as one DAG file calling ``load_yaml_dags`` on a folder of
YAML files. Each figure is (T(N) - T(N/10)) / (N - N/10), each T the best of --repeats runs, the
contenders interleaved so that a busy moment of the machine does not favour one of them.
--in-process adds the older comparison of all three in this one process (imports and Airflow's
config already warm), which isolates the compile stages from everything a DAG file's parse pays.

Baseline: the same pipeline written by hand in Python (same task count and edges, schedule, tags,
default_args, Params with the same schemas, its own outlet Assets, the checkpoint watch as a
reschedule-mode sensor; standard-provider operators). dag-factory gets the same DAG as YAML
(BashOperator tasks, the same params as plain values). dag-factory registers an Airflow plugin in
every process of the environment it is installed in, so install it apart, for this benchmark only:
``pip install --no-deps --target DIR dag-factory==1.1.0`` and pass ``--dag-factory DIR``.
Targets: trainpipe cold <= 1.5x hand-written; dag-factory / trainpipe >= 4x (in one process).
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "dag_configs" / "fraud_detector.yaml"

# One fresh process: Airflow imported (as the dag-processor has it before it forks a parse), then a
# DagBag over one folder, timed.
_CHILD = """
import json, logging, sys, time, warnings
logging.disable(logging.WARNING)
warnings.simplefilter("ignore")
import airflow.sdk
from airflow.dag_processing.dagbag import DagBag
start = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - start, "dags": len(bag.dag_ids), "errors": len(bag.import_errors)}))
"""

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


def in_process(n: int, repeats: int) -> None:
    """All three in this one process, interleaved: the compile stages without a DAG file's parse."""
    small = max(10, n // 10)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")

    from airflow.sdk import DAG, chain

    from trainpipe.compile.compiler import compile_directory
    from trainpipe.dags.builder import build_dag
    from trainpipe.settings import Settings

    template = EXAMPLE.read_text()
    work = Path(tempfile.mkdtemp(prefix="trainpipe-bench-"))
    trainpipe_dirs: dict[int, Path] = {}
    for count in (small, n):
        folder = work / f"trainpipe_{count}"
        folder.mkdir()
        for i in range(count):
            (folder / f"p{i:05d}.yaml").write_text(template.replace("pipeline_id: fraud_detector", f"pipeline_id: p{i:05d}"))
        trainpipe_dirs[count] = folder

    probe = compile_directory(trainpipe_dirs[small], settings=Settings.from_env()).plans["p00000"]
    task_ids = [t.task_id for t in build_dag(probe).topological_sort()]
    n_tasks = len(task_ids)

    def trainpipe(count: int) -> None:
        result = compile_directory(trainpipe_dirs[count], settings=Settings.from_env())
        namespace = {dag_id: build_dag(plan) for dag_id, plan in result.plans.items()}
        assert len(namespace) == count, result.errors

    from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
    from airflow.providers.standard.sensors.python import PythonSensor
    from airflow.sdk import Asset, Param

    from trainpipe.plan.steps import CHECKPOINT_SENSOR

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
        import dagfactory
        from dagfactory import load_yaml_dags
    except ImportError:
        load_yaml_dags = None

    def dag_factory(count: int) -> None:
        namespace: dict = {}
        load_yaml_dags(globals_dict=namespace, dags_folder=str(dagfactory_dirs[count]), suffix=[".yml"])
        assert sum(1 for v in namespace.values() if isinstance(v, DAG)) == count

    def trainpipe_compile_only(count: int) -> None:
        assert len(compile_directory(trainpipe_dirs[count], settings=Settings.from_env()).plans) == count

    from airflow.serialization.serialized_objects import DagSerialization

    def airflow_serialization(count: int) -> None:
        """What the DAG processor does with every DAG after the file is parsed: serialize it."""
        for dag in serializable[count]:
            DagSerialization.to_dict(dag)

    serializable = {count: [build_dag(p) for p in compile_directory(trainpipe_dirs[count],
                                                                    settings=Settings.from_env()).plans.values()]
                    for count in (small, n)}

    contenders = {"hand-written": hand_written, "trainpipe": trainpipe, "compile": trainpipe_compile_only,
                  "serialize": airflow_serialization}
    if load_yaml_dags is not None:
        contenders["dag-factory"] = dag_factory
    for fn in contenders.values():
        fn(small)  # warm: imports, caches
    timings = {name: {small: [], n: []} for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            for count in (small, n):
                timings[name][count].append(_timed(fn, count))
    hand_ms, ours_ms = (_marginal_ms(timings[name], small, n) for name in ("hand-written", "trainpipe"))
    print(f"\nIn one process: {n} specs (marginal cost between {small} and {n} DAGs, best of {repeats}; "
          f"{n_tasks} tasks per DAG), "
          f"Python {sys.version.split()[0]}")
    print(f"hand-written Airflow DAG (baseline): {hand_ms:7.3f} ms/DAG")
    print(f"trainpipe YAML -> DAG:               {ours_ms:7.3f} ms/DAG   "
          f"ratio vs hand-written: {ours_ms / hand_ms:.2f}x (target <= 1.5x)")
    compile_ms, serialize_ms = (_marginal_ms(timings[name], small, n) for name in ("compile", "serialize"))
    print(f"  of which YAML -> plan (compile):   {compile_ms:7.3f} ms/DAG   "
          f"(Airflow then serializes each DAG it parsed: {serialize_ms:.3f} ms/DAG)")
    if load_yaml_dags is None:
        print("dag-factory: not importable here (see --dag-factory); skipped")
        return
    theirs_ms = _marginal_ms(timings["dag-factory"], small, n)
    print(f"dag-factory {dagfactory.__version__} YAML -> DAG:        {theirs_ms:7.3f} ms/DAG   "
          f"ratio vs hand-written: {theirs_ms / hand_ms:.2f}x")
    print(f"dag-factory / trainpipe:             {theirs_ms / ours_ms:.2f}x faster (target >= 4x)")



def _hand_written_file(count: int, *, params_after_tasks: bool = False) -> str:
    """A DAG file defining ``count`` copies of the example pipeline by hand (its values written in).
    ``params_after_tasks``: the Params attached to the DAG after its tasks, as trainpipe does (ADR
    0006), so Airflow neither validates their schemas again nor copies them into every task."""
    from trainpipe.compile.compiler import compile_file
    from trainpipe.settings import Settings

    probe = compile_file(EXAMPLE, settings=Settings.from_env())
    params = {p.name: (p.default, p.type, p.description, {b.keyword: b.value for b in p.bounds}) for p in probe.params}
    tasks = [(t.task_id, list(t.outlets), list(t.upstream)) for t in probe.tasks]
    return f"""\
import datetime

from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, Asset, Param

PARAMS = {params!r}
TASKS = {tasks!r}


def dag_params():
    return {{name: Param(default, type=kind, description=text, **bounds)
            for name, (default, kind, text, bounds) in PARAMS.items()}}


for i in range({count}):
    with DAG(dag_id=f"h{{i:05d}}", schedule=f"{{i % 60}} {{i // 60 % 24}} * * *", start_date={probe.start_date!r},
             catchup=False, tags={list(probe.tags)!r}, description={probe.description!r}, max_active_runs=1,
             {"" if params_after_tasks else "params=dag_params(),"}
             default_args={{"owner": {probe.owner!r}, "retries": {probe.retries!r},
                           "retry_delay": {probe.retry_delay!r}}}) as dag:
        built = {{}}
        for task_id, outlets, upstream in TASKS:
            assets = [Asset(uri.replace("{probe.dag_id}", dag.dag_id)) for uri in outlets]
            if task_id == "watch_checkpoints":
                task = PythonSensor(task_id=task_id, python_callable=bool, mode="reschedule", retries=0)
            else:
                task = (ShortCircuitOperator if task_id == "gate" else PythonOperator)(
                    task_id=task_id, python_callable=print, outlets=assets)
            task.set_upstream([built[name] for name in upstream])
            built[task_id] = task
    {"dag.params.update(dag_params())" if params_after_tasks else ""}
    globals()[dag.dag_id] = dag
"""


def _dag_factory_folder(folder: Path, count: int) -> None:
    """One DAG file calling dag-factory on ``count`` YAML files of the same pipeline beside it."""
    from trainpipe.compile.compiler import compile_file
    from trainpipe.settings import Settings

    probe = compile_file(EXAMPLE, settings=Settings.from_env())
    configs = folder / "configs"
    configs.mkdir(parents=True)
    for i in range(count):
        tasks = "\n".join(
            f"    - task_id: {t.task_id}\n      operator: airflow.providers.standard.operators.bash.BashOperator\n"
            f"      bash_command: 'true'" + (f"\n      dependencies: [{', '.join(t.upstream)}]" if t.upstream else "")
            for t in probe.tasks)
        (configs / f"d{i:05d}.yml").write_text(
            f"d{i:05d}:\n  default_args:\n    owner: {probe.owner}\n    retries: {probe.retries}\n"
            f"    start_date: 2025-01-01\n  schedule: '{i % 60} {i // 60 % 24} * * *'\n  catchup: false\n"
            f"  max_active_runs: 1\n  description: {probe.description!r}\n  tags: {list(probe.tags)}\n"
            f"  params: {{{', '.join(f'{p.name}: {p.default}' for p in probe.params)}}}\n  tasks:\n{tasks}\n")
    (folder / "dag_factory_dags.py").write_text(
        "# airflow DAG file\nfrom dagfactory import load_yaml_dags\n\n"
        f"load_yaml_dags(globals_dict=globals(), dags_folder={str(configs)!r}, suffix=['.yml'])\n")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def fresh_processes(n: int, repeats: int, dag_factory: Path | None) -> None:
    """Each contender in a new process per run, over all its DAG files (what a dag-processor pays)."""
    from parse_scale import _write_specs

    import trainpipe_trainer.config

    small = max(10, n // 10)
    work = Path(tempfile.mkdtemp(prefix="trainpipe-bench-fresh-"))
    # Bytecode as an installed package has it (a fresh checkout would compile trainpipe in every child).
    compileall.compile_dir(str(REPO / "provider" / "trainpipe"), quiet=1)
    compileall.compile_file(trainpipe_trainer.config.__file__, quiet=1)
    base_env = {key: value for key, value in os.environ.items()
                if not key.startswith(("AIRFLOW__", "TRAINPIPE_", "_AIRFLOW_PARSING_CONTEXT"))}
    base_env |= {"AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                 "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "0", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")}
    contenders: dict[str, tuple[Path, dict[int, dict[str, str]]]] = {}
    try:
        for name, params_after_tasks in (("hand-written", False), ("hand-written, Params after tasks", True)):
            hand = {count: work / f"hand_{count}_{params_after_tasks}" for count in (small, n)}
            for count, folder in hand.items():
                folder.mkdir()
                (folder / "hand_written_dags.py").write_text(
                    _hand_written_file(count, params_after_tasks=params_after_tasks))
            contenders[name] = (hand, {count: base_env for count in hand})
        if dag_factory is not None:
            folders = {count: work / f"dagfactory_{count}" for count in (small, n)}
            for count, folder in folders.items():
                _dag_factory_folder(folder, count)
            env = base_env | {"PYTHONPATH": os.pathsep.join(filter(None, [str(dag_factory), base_env.get("PYTHONPATH")]))}
            contenders["dag-factory"] = (folders, {count: env for count in folders})
        specs_env = {}
        for count in (small, n):
            _write_specs(work / f"specs_{count}" / "dag_configs", count)
            specs_env[count] = base_env | {"TRAINPIPE_DAG_CONFIGS": str(work / f"specs_{count}" / "dag_configs"),
                                           "TRAINPIPE_HOME": str(work / f"home_{count}")}
        dags = {count: REPO / "dags" for count in (small, n)}
        contenders["trainpipe cold"] = (dags, specs_env)
        contenders["trainpipe warm"] = (dags, specs_env)

        def run(name: str, count: int) -> float:
            folders, envs = contenders[name]
            if name == "trainpipe cold":
                shutil.rmtree(work / f"home_{count}" / "cache", ignore_errors=True)
            done = subprocess.run([sys.executable, "-c", _CHILD, str(folders[count])], env=envs[count],
                                  capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"{name} at {count}: {done.stderr[-2000:]}")
            result = json.loads(lines[-1])
            if (result["dags"], result["errors"]) != (count, 0):
                raise RuntimeError(f"{name} at {count}: {result['dags']} DAGs, {result['errors']} import errors")
            return result["seconds"]

        timings: dict[str, dict[int, list[float]]] = {name: {small: [], n: []} for name in contenders}
        print(f"Fresh processes: {n} specs, marginal cost between {small} and {n} DAGs, best of {repeats}, "
              f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {_load()} at start")
        for repeat in range(repeats):
            for name in contenders:
                for count in (small, n):
                    timings[name][count].append(run(name, count))
            print(f"  run {repeat + 1}: " + ", ".join(
                f"{name} {timings[name][small][-1]:.2f}/{timings[name][n][-1]:.2f} s" for name in contenders)
                + f" (load average {_load()})")
        figures = {name: _marginal_ms(timings[name], small, n) for name in contenders}
        hand_ms, lean_ms = figures["hand-written"], figures["hand-written, Params after tasks"]
        print(f"hand-written Airflow DAG (baseline):  {hand_ms:7.3f} ms/DAG")
        print(f"  the same, Params after the tasks:   {lean_ms:7.3f} ms/DAG   (the stricter baseline)")
        for state in ("cold", "warm"):
            ours = figures[f"trainpipe {state}"]
            print(f"trainpipe, {state} plan cache:           {ours:7.3f} ms/DAG   {ours / hand_ms:.2f}x hand-written, "
                  f"{ours / lean_ms:.2f}x the stricter" + (" (target <= 1.5x)" if state == "cold" else ""))
        if "dag-factory" in figures:
            print(f"dag-factory 1.1:                      {figures['dag-factory']:7.3f} ms/DAG   "
                  f"{figures['dag-factory'] / hand_ms:.2f}x hand-written, "
                  f"{figures['dag-factory'] / figures['trainpipe cold']:.2f}x trainpipe cold")
        else:
            print("dag-factory: skipped (pass --dag-factory DIR, see the docstring)")
        print(f"load average {_load()} at the end")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="runs per size and contender; the best counts")
    parser.add_argument("--dag-factory", type=Path, help="a folder dag-factory 1.1 is installed in (pip --target)")
    parser.add_argument("--in-process", action="store_true", help="also compare the three in this one process")
    args = parser.parse_args()
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="trainpipe-bench-airflow-"))
    fresh_processes(args.specs, args.repeats, args.dag_factory.resolve() if args.dag_factory else None)
    if args.in_process:
        if args.dag_factory:
            sys.path.insert(0, str(args.dag_factory.resolve()))
        in_process(args.specs, args.repeats)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
