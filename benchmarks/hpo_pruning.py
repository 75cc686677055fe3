"""Pruning against no pruning: the same study on the demo problem, the compute each spends, per seed.

    python benchmarks/hpo_pruning.py [--seeds 1 2 3] [--trials 24] [--rows 100000] [--trial-epochs 6]
        [--pruner successive_halving | --pruner '{type: successive_halving, min_resource: 5}'] [--replay]
        [--replay-from DIR]

For each sampler seed, runs the study of the tuned fraud demo (dag_configs/fraud_detector_tuned.yaml:
TPE, the same space, one trial worker unless --parallel) through the trial workers the ``trials``
tasks run (``trainpipe.steps.tuning.run_worker``: one real torchrun trainer launch per worker running
trials back to back, a journal-file study, MLflow on SQLite) twice in a temporary TRAINPIPE_HOME: with
``pruner: none`` (the baseline) and with ``--pruner`` (default: what a spec that names no pruner gets).
It prints, per seed: the trainers' compute (CPU seconds the trainers counted themselves, the
``trainer_cpu_hours`` metric, pruned trials included), the workers' launch wall seconds (torchrun start
to exit), the best value and the trial states, then the compute saved and the gap between the best
values; and the set-up share of each study: the part of its workers' launch wall outside the trials'
step loops (process start, imports, the one data read, each trial's model build, last checkpoint and
stop: launch wall minus the trials' step loops as each trainer timed its own, the ``step_loop_seconds``
metric), and where it went (the trials' own set-up, and the rest).

--replay also replays pruner settings on each seed's baseline learning curves (Optuna in memory: each
baseline trial in order reports its curve until the pruner stops it; compute counted as the share of
the trial's steps it ran): how the defaults were chosen, before the chosen one is measured for real.
A replay proposes the baseline's points, where a real pruned study's TPE sees other histories; it
carries the pruned study's name, which decides Hyperband's bracket of each trial. So each replay also
says up to which trial it stands for the real pruned study (its horizon): TPE proposes a trial from the
split of the trials before it into its best few (``gamma``) and the rest, where a pruned trial ranks
below every complete one. Until the first trial whose split differs from the baseline's, the pruned
study proposes the baseline's very points and the replay is exact; past it, the real study searches
elsewhere. The baseline's best trial before the horizon, not pruned, is a kept best value one can
count on; after it, it is luck. --replay-from DIR replays on the baselines an earlier run kept,
training nothing.

Target: >= 50% less trainer compute than no pruning with the best value within 1%, on every seed,
with the set-up under 10% of a trial.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
END = datetime(2026, 6, 30, tzinfo=UTC)
TARGET_SAVED, TARGET_GAP, TARGET_SETUP = 0.50, 0.01, 0.10
# Settings replayed with --replay (the spec's option names; type first).
REPLAYED: tuple[dict[str, Any], ...] = (
    {"type": "hyperband", "min_resource": 10, "reduction_factor": 3},
    {"type": "hyperband", "min_resource": 5, "reduction_factor": 3},
    {"type": "hyperband", "min_resource": 5, "reduction_factor": 2},
    {"type": "successive_halving", "min_resource": 10, "reduction_factor": 3},
    {"type": "successive_halving", "min_resource": 5, "reduction_factor": 3},
    {"type": "successive_halving", "min_resource": 5, "reduction_factor": 4},
    {"type": "successive_halving", "min_resource": 10, "reduction_factor": 2},
    {"type": "successive_halving", "min_resource": 5, "reduction_factor": 2},
    {"type": "successive_halving", "min_resource": 3, "reduction_factor": 3},
    {"type": "successive_halving", "min_resource": 20, "reduction_factor": 3},
    {"type": "successive_halving", "min_resource": 10, "reduction_factor": 3, "min_early_stopping_rate": 1},
    {"type": "median", "n_startup_trials": 2, "min_resource": 10},
    {"type": "median", "n_startup_trials": 2, "min_resource": 5},
    {"type": "median", "n_startup_trials": 4, "min_resource": 5},
)


def pruner_label(pruner: dict[str, Any] | str) -> str:
    if isinstance(pruner, str):
        return pruner
    return pruner["type"] + "(" + ", ".join(f"{k}={v}" for k, v in pruner.items() if k != "type") + ")"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="sampler seeds, one study pair each")
    parser.add_argument("--trials", type=int, default=24, help="trials per study (the issue-35 protocol: 24)")
    parser.add_argument("--rows", type=int, default=100_000, help="demo transactions")
    parser.add_argument("--trial-epochs", type=int, default=6)
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="checkpoint (evaluation point) every N steps; 0: about 20 per trial")
    parser.add_argument("--parallel", type=int, default=1, help="trial workers (threads, as the mapped tasks)")
    parser.add_argument("--pruner", default=None,
                        help="the pruned study's tuning.pruner (a name or a YAML mapping); default: the spec default")
    parser.add_argument("--metric", default="validation_loss")
    parser.add_argument("--replay", action="store_true", help="also replay pruner settings on the baseline curves")
    parser.add_argument("--baseline-only", action="store_true", help="run only the unpruned studies (with --replay)")
    parser.add_argument("--replay-from", type=Path, default=None, metavar="DIR",
                        help="train nothing: replay on the baselines an earlier run kept in DIR (its 'state kept in')")
    parser.add_argument("--baseline-from", type=Path, default=None, metavar="DIR",
                        help="train only the pruned studies, against the baselines an earlier run kept in DIR (the "
                             "same --trials, --rows and --trial-epochs; wall as the trials' own, no set-up share)")
    args = parser.parse_args()
    if args.replay_from is not None:
        rows = [{"seed": seed, "replay": replays(kept_baseline(args.replay_from, seed), seed, args.metric)}
                for seed in args.seeds]
        report(args, rows, None, os.getloadavg(), time.monotonic())
        return 0

    home = Path(tempfile.mkdtemp(prefix="trainpipe-hpo-bench-"))
    os.environ.update({
        "TRAINPIPE_HOME": str(home), "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT": str(home / "mlartifacts"),
        "TRAINPIPE_OPTUNA_STORAGE": str(home / "optuna" / "journal.log"), "MLFLOW_DISABLE_TELEMETRY": "true",
    })
    import yaml

    from trainpipe.demo.synthetic import generate_transactions
    from trainpipe.settings import Settings

    pruner = yaml.safe_load(args.pruner) if args.pruner else None
    settings = Settings.from_env()
    data = home / "storage" / "demo" / "transactions"
    data.mkdir(parents=True)
    generate_transactions(rows=args.rows, days=25, end=END).to_parquet(data / "transactions.parquet", index=False)

    started = time.monotonic()
    load_before = os.getloadavg()
    rows = []
    for seed in args.seeds:
        baseline = kept_baseline(args.baseline_from, seed) if args.baseline_from else run_study(args, settings, seed, "none")
        row = {"seed": seed, "none": baseline}
        if not args.baseline_only:
            row["pruned"] = run_study(args, settings, seed, pruner)
        if args.replay:
            row["replay"] = replays(baseline, seed, args.metric)
        rows.append(row)
        report(args, rows, pruner, load_before, started)
    print(f"state kept in {home}")
    return 0


def run_study(args: argparse.Namespace, settings: Any, seed: int, pruner: dict[str, Any] | str | None) -> dict[str, Any]:
    import yaml

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.plan.build import build_plan
    from trainpipe.spec.loader import load_yaml_text
    from trainpipe.spec.validate import validate_loaded
    from trainpipe.steps.snapshot import take_snapshot
    from trainpipe.steps.train.train import RunContext
    from trainpipe.steps.tuning import create_study, load_study, pick_best, run_worker

    label = "default" if pruner is None else pruner_label(pruner)
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text())
    spec["pipeline_id"] = pipeline_id(seed, pruned=pruner != "none")
    spec["tuning"].update(n_trials=args.trials, max_parallel=args.parallel, seed=seed, trial_epochs=args.trial_epochs,
                          metric=args.metric)
    spec["tuning"].pop("direction", None)  # the metric's own
    spec["tuning"].pop("pruner")
    if pruner is not None:
        spec["tuning"]["pruner"] = pruner
    if args.checkpoint_every:
        spec["training"]["checkpoint"]["every_n_steps"] = args.checkpoint_every
    else:
        # About 20 evaluation points per trial at the space's middle batch size (64): one every 5% of a
        # trial. Each scores the validation split (a tenth of the rows), so more would cost compute.
        train_rows = args.rows * 0.9  # the validation split is held out
        spec["training"]["checkpoint"]["every_n_steps"] = max(1, int(train_rows / 64 * args.trial_epochs / 20))
    text = yaml.safe_dump(spec, sort_keys=False)
    plan = build_plan(validate_loaded(load_yaml_text(text, "bench.yaml")), spec_file="bench.yaml", spec_text=text)
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END)
    run = RunContext(dag_id=plan.dag_id, airflow_run_id=run_id(seed), try_number=1, spec_sha256=plan.spec_sha256,
                     git_commit="bench")
    hook = MlflowHook(settings)
    study = create_study(plan, settings=settings, run=run, hook=hook)
    started = time.monotonic()
    walls: list[float] = []
    errors: list[BaseException] = []

    def worker(number: int) -> None:
        began = time.monotonic()
        try:
            run_worker(plan, number, snapshot, settings=settings, run=run, study=study, hook=hook,
                       on_line=lambda line: None)
        except BaseException as err:
            errors.append(err)
        walls.append(time.monotonic() - began)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.parallel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    for t in load_study(plan.tuning, settings, study["study_name"]).trials:
        print(f"  seed {seed} {label:40s} trial {t.number:2d} (worker {t.user_attrs.get('worker')}): "
              f"{t.state.name.lower():8s} value {t.value if t.value is not None else float('nan'):.5f} "
              f"compute {t.user_attrs.get('compute_seconds') or 0:6.1f} s  wall {t.user_attrs.get('trainer_seconds', 0):6.1f} s",
              flush=True)
    best = pick_best(plan, settings=settings, study=study, hook=hook, on_line=lambda line: None)
    trials = load_study(plan.tuning, settings, study["study_name"]).trials
    return {
        "label": f"{plan.tuning.pruner}{plan.tuning.pruner_options}" if pruner is None else label,
        "direction": plan.tuning.direction,
        "wall": sum(walls),
        "best": best["value"], "elapsed": time.monotonic() - started,
        **trial_figures(trials),
        "setup_share": setup_share(hook, trials, sum(walls)),
    }


def trial_figures(trials: list[Any]) -> dict[str, Any]:
    """A study's compute (the trainers' own count), trial states and complete trials' curves."""
    return {
        "compute": sum(t.user_attrs.get("compute_seconds") or 0.0 for t in trials),
        "states": {s: sum(1 for t in trials if t.state.name == s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "curves": [(dict(t.intermediate_values), t.user_attrs.get("compute_seconds") or 0.0) for t in trials
                   if t.state.name == "COMPLETE"],
    }


def pipeline_id(seed: int, *, pruned: bool) -> str:
    return f"hpo_bench_s{seed}_{'pruned' if pruned else 'none'}"


def run_id(seed: int) -> str:
    return f"bench-{seed}"


def bench_study_name(seed: int, *, pruned: bool) -> str:
    """A study's name. Hyperband puts each trial in a bracket by a hash of the study's name and the
    trial's number, so a replay that stands for the pruned study must carry that study's name."""
    from trainpipe.steps.tuning import study_name

    return study_name(pipeline_id(seed, pruned=pruned), run_id(seed))


def kept_baseline(home: Path, seed: int) -> dict[str, Any]:
    """A baseline study of an earlier run (its state folder), as ``run_study`` returns it for a replay."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(home / "optuna" / "journal.log")))
    study = optuna.load_study(study_name=bench_study_name(seed, pruned=False), storage=storage)
    return {"label": "none (kept)", "direction": study.direction.name.lower(),
            "wall": sum(t.user_attrs.get("trainer_seconds") or 0.0 for t in study.trials),
            "setup_share": None, "best": study.best_value, **trial_figures(study.trials)}


def setup_share(hook: Any, trials: list[Any], launch_wall: float) -> dict[str, float] | None:
    """The share of the workers' launch wall outside the trials' step loops (all trials, pruned too; each
    loop timed by the trainer itself, ``step_loop_seconds``: every optimizer step after the first, with
    its checkpoints and evaluations), and where it went: the trials' own set-up (a trial's wall in its
    worker, ``trainer_seconds``, outside its loop: model build, first step, the last checkpoint, export
    or stop, its run's opening and closing; for a launch's first trial also the wait for the data read
    and the first optimizer's import of torch._dynamo) and the rest (torchrun, process start and exit,
    imports, opening the study, asking and telling it)."""
    if launch_wall <= 0:
        return None
    looped = own = 0.0
    for trial in trials:
        run_id = trial.user_attrs.get("mlflow_run_id")
        loop = hook.client.get_metric_history(run_id, "step_loop_seconds") if run_id else []
        seconds = trial.user_attrs.get("trainer_seconds")
        if loop and seconds is not None:
            looped += loop[-1].value
            own += max(0.0, seconds - loop[-1].value)
    return {"share": 1 - looped / launch_wall, "own": own / launch_wall,
            "rest": 1 - (looped + own) / launch_wall}


def replays(baseline: dict[str, Any], seed: int, metric: str) -> dict[str, dict[str, float]]:
    """Every REPLAYED setting on ``baseline``, as the seed's pruned study (its name)."""
    name = bench_study_name(seed, pruned=True)
    return {pruner_label(p): replay(baseline, p, metric, name) for p in REPLAYED}


def replay(baseline: dict[str, Any], pruner: dict[str, Any], metric: str, study_name: str) -> dict[str, float]:
    """The baseline's trials, in order, reported into an in-memory study named ``study_name`` (the real
    pruned study's: the same Hyperband brackets) with ``pruner`` until it stops them: compute as the
    share of each trial's reports it made, best over the trials it kept."""
    import optuna

    from trainpipe.plan.build import pruner_arguments
    from trainpipe.spec.sections.tuning import PrunerSpec
    from trainpipe_trainer.tuning import make_pruner

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = PrunerSpec.model_validate(pruner)
    study = optuna.create_study(study_name=study_name, direction=baseline["direction"],
                                pruner=make_pruner(spec.type, pruner_arguments(spec)))
    compute, kept, ends = 0.0, [], []
    for curve, seconds in baseline["curves"]:
        trial = study.ask()
        steps = sorted(curve)
        for index, step in enumerate(steps):
            trial.report(curve[step], step)
            if step < steps[-1] and trial.should_prune():
                compute += seconds * (index + 1) / len(steps)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                ends.append((False, step, curve[step]))
                break
        else:
            compute += seconds
            kept.append(curve[steps[-1]])
            ends.append((True, steps[-1], curve[steps[-1]]))
            study.tell(trial, curve[steps[-1]])
    # Every trial stopped: nothing to train with, as bad as a search can end.
    best = (min if baseline["direction"] == "minimize" else max)(kept) if kept else None
    horizon = faithful_horizon(ends, baseline_finals(baseline), baseline["direction"])
    best_number = best_trial(baseline)
    return {"saved": 1 - compute / baseline["compute"],
            "gap": gap(best, baseline["best"], baseline["direction"]) if best is not None else float("inf"),
            "pruned": len(baseline["curves"]) - len(kept),
            "horizon": horizon, "best_trial": best_number,
            # The baseline's best trial is proposed as it was (before the horizon) and runs to the end.
            "vouched": best_number < horizon and ends[best_number][0]}


def best_trial(baseline: dict[str, Any]) -> int:
    """The number of the baseline's best trial (its trials are complete, in number order)."""
    finals = baseline_finals(baseline)
    return finals.index((min if baseline["direction"] == "minimize" else max)(finals))


def baseline_finals(baseline: dict[str, Any]) -> list[float]:
    return [curve[max(curve)] for curve, _ in baseline["curves"]]


def faithful_horizon(ends: list[tuple[bool, int, float]], finals: list[float], direction: str) -> int:
    """The first trial a real pruned study may propose differently from its baseline (len(ends): none).

    ``ends``: each trial's (complete, last step, value there) in the replay; ``finals``: the baseline's
    values, every trial complete. TPE proposes trial k from the trials before it, split into its best
    ``gamma(k)`` and the rest (Optuna's ``_split_trials``: complete trials by value, then pruned ones
    by last step, latest first, then by value). While every split equals the baseline's, the pruned
    study asks for the same points.
    """
    from optuna.samplers._tpe.sampler import default_gamma  # what TPESampler uses when given no gamma

    from trainpipe_trainer.tuning import tpe_startup_trials

    sign = 1.0 if direction == "minimize" else -1.0
    for k in range(tpe_startup_trials(len(ends)), len(ends)):
        n_below = default_gamma(k)
        baseline_below = sorted(range(k), key=lambda i: sign * finals[i])[:n_below]
        # Complete before pruned; pruned ones stopped later first; then by value.
        ranked = sorted(range(k), key=lambda i: (0, 0.0, sign * ends[i][2]) if ends[i][0]
                        else (1, -ends[i][1], sign * ends[i][2]))
        if set(ranked[:n_below]) != set(baseline_below):
            return k
    return len(ends)


def gap(value: float, reference: float, direction: str) -> float:
    """How much worse ``value`` is than ``reference`` (0 when as good or better), relative."""
    worse = value - reference if direction == "minimize" else reference - value
    return max(worse, 0.0) / abs(reference)


def report(args: argparse.Namespace, rows: list[dict[str, Any]], pruner: Any, load_before: tuple[float, ...],
           started: float) -> None:
    print(f"\n{args.trials} trials per study, {args.trial_epochs} epochs per trial, {args.rows} rows, "
          f"{args.parallel} at once, metric {args.metric}; {time.monotonic() - started:.0f} s so far; load average "
          f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} now, on {os.cpu_count()} cores")
    print(f"{'seed':>4s} {'study':42s} {'compute s':>10s} {'wall s':>8s} {'best':>9s}  states")
    for row in rows:
        for key in ("none", "pruned"):
            if key not in row:
                continue
            r = row[key]
            states = ", ".join(f"{n} {s.lower()}" for s, n in r["states"].items() if n)
            print(f"{row['seed']:4d} {r['label']:42s} {r['compute']:10.1f} {r['wall']:8.0f} {r['best']:9.5f}  {states}")
    for key in ("none", "pruned"):
        shares = [(row["seed"], row[key]["setup_share"]) for row in rows
                  if key in row and row[key]["setup_share"] is not None]
        if shares:
            print(f"set-up share of the {'unpruned' if key == 'none' else 'pruned'} studies' launch wall (outside the "
                  "trials' step loops), per seed: " + ", ".join(f"seed {seed} {s['share']:.1%}" for seed, s in shares)
                  + f"  [target < {TARGET_SETUP:.0%}]")
            for seed, s in shares:
                print(f"  seed {seed}: the trials' own set-up (model build, first step, last checkpoint, stop or "
                      f"export, run opening and closing) {s['own']:.1%}, the rest (torchrun, process start and "
                      f"exit, imports, the study, ask/tell) {s['rest']:.1%}")
    met = []
    for row in rows:
        if "pruned" not in row:
            continue
        base, pruned = row["none"], row["pruned"]
        saved = 1 - pruned["compute"] / base["compute"]
        worse = gap(pruned["best"], base["best"], base["direction"])
        met.append(saved >= TARGET_SAVED and worse <= TARGET_GAP)
        print(f"seed {row['seed']}: {pruned['label']} vs no pruning: {saved:.1%} less trainer compute "
              f"[target >= {TARGET_SAVED:.0%}], {1 - pruned['wall'] / base['wall']:.1%} less launch wall; best value "
              f"{worse:.2%} worse [target <= {TARGET_GAP:.0%}]{'' if met[-1] else '  NOT met'}")
    if met:
        print(f"target on every seed: {'met' if all(met) else 'NOT met'} ({sum(met)} of {len(met)} seeds)")
    if any("replay" in row for row in rows):
        replayed = [row for row in rows if "replay" in row]
        print("\nreplayed on the baseline curves, per seed: compute saved / best value worse / exact up to trial H "
              "(the real pruned study proposes the baseline's points before it); '*': the baseline's best trial ("
              + ", ".join(f"seed {row['seed']}: trial {next(iter(row['replay'].values()))['best_trial']}"
                          for row in replayed)
              + ") comes before H and runs to the end, a kept best the replay can vouch for")
        for label in replayed[0]["replay"]:
            cells = [row["replay"][label] for row in replayed]
            print(f"  {label:62s} " + "  ".join(f"{c['saved']:5.1%} / {c['gap']:5.2%} / H {c['horizon']:2d}"
                                             f"{'*' if c['vouched'] else ' '}" for c in cells)
                  + f"   mean saved {statistics.mean(c['saved'] for c in cells):.1%}, worst gap "
                  f"{max(c['gap'] for c in cells):.2%}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
