"""Hyperband pruning against no pruning: the same study on the demo problem, the compute each spends.

    python benchmarks/hpo_pruning.py [--trials 12] [--rows 20000] [--trial-epochs 2]

Runs two studies of the fraud demo (dag_configs/fraud_detector_tuned.yaml: TPE with the same seed,
the same space, trials one at a time) through the trial runner the ``trials`` task uses
(``trainpipe.runtime.tuning.run_trial``: real torchrun trainers, a journal-file study, MLflow on
SQLite), once with ``pruner: hyperband`` and once with ``pruner: none`` (the baseline), in a
temporary TRAINPIPE_HOME. It prints, per study: the trainer's compute (CPU seconds the trainers
counted themselves, the ``trainer_cpu_hours`` metric, pruned trials included), the launches' wall seconds
(torchrun start to exit: process start-up and model export included, so less is saved there), the
best validation loss, and the trial states; then the compute saved by pruning and the gap between
the best values. Target: >= 40% less compute with a best value within 1% of the unpruned study's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
END = datetime(2026, 6, 30, tzinfo=timezone.utc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="trials per study")
    parser.add_argument("--rows", type=int, default=20000, help="demo transactions")
    parser.add_argument("--trial-epochs", type=int, default=2)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="trainpipe-hpo-bench-"))
    os.environ.update({
        "TRAINPIPE_HOME": str(home), "TRAINPIPE_STORAGE_ROOT": f"file://{home / 'storage'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}", "TRAINPIPE_MLFLOW_ARTIFACT_ROOT": str(home / "mlartifacts"),
        "TRAINPIPE_OPTUNA_STORAGE": str(home / "optuna" / "journal.log"), "MLFLOW_DISABLE_TELEMETRY": "true",
    })
    import yaml

    from trainpipe.demo.synthetic import generate_transactions
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.plan import build_plan
    from trainpipe.runtime.snapshot import take_snapshot
    from trainpipe.runtime.train import RunContext
    from trainpipe.runtime.tuning import create_study, load_study, pick_best, run_trial
    from trainpipe.settings import Settings
    from trainpipe.spec.loader import load_yaml_text
    from trainpipe.spec.validate import validate_loaded

    settings = Settings.from_env()
    data = home / "storage" / "demo" / "transactions"
    data.mkdir(parents=True)
    generate_transactions(rows=args.rows, days=25, end=END).to_parquet(data / "transactions.parquet", index=False)

    results = {}
    for pruner in ("none", "hyperband"):  # the baseline first
        spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_tuned.yaml").read_text())
        spec["pipeline_id"] = f"hpo_bench_{pruner}"
        spec["tuning"].update(n_trials=args.trials, max_parallel=1, pruner=pruner, trial_epochs=args.trial_epochs)
        text = yaml.safe_dump(spec, sort_keys=False)
        plan = build_plan(validate_loaded(load_yaml_text(text, "bench.yaml")), spec_file="bench.yaml", spec_text=text)
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END)
        run = RunContext(dag_id=plan.dag_id, airflow_run_id="bench", try_number=1, spec_sha256=plan.spec_sha256,
                         git_commit="bench")
        hook = MlflowHook(settings)
        study = create_study(plan, settings=settings, run=run, hook=hook)
        started = time.monotonic()
        for slot in range(args.trials):
            outcome = run_trial(plan, slot, snapshot, settings=settings, run=run, study=study, hook=hook,
                                on_line=lambda line: None)
            print(f"  {pruner:9s} trial {outcome.number:2d}: {outcome.state:8s} "
                  f"value {outcome.value if outcome.value is not None else float('nan'):.5f} "
                  f"compute {outcome.compute_seconds or 0:6.1f} s  wall {outcome.trainer_seconds:6.1f} s", flush=True)
        best = pick_best(plan, settings=settings, study=study, hook=hook, on_line=lambda line: None)
        trials = load_study(plan.tuning, settings, study["study_name"]).trials
        results[pruner] = {
            "compute": sum(t.user_attrs.get("compute_seconds") or 0.0 for t in trials),
            "wall": sum(t.user_attrs.get("trainer_seconds", 0.0) for t in trials),
            "best": best["value"], "elapsed": time.monotonic() - started,
            "states": {s: sum(1 for t in trials if t.state.name == s) for s in ("COMPLETE", "PRUNED", "FAIL")},
        }

    print(f"\n{args.trials} trials per study, {args.trial_epochs} epochs per trial, {args.rows} rows, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'study':10s} {'compute s':>10s} {'launch wall s':>14s} {'best validation_loss':>21s}  states")
    for pruner, r in results.items():
        states = ", ".join(f"{n} {s.lower()}" for s, n in r["states"].items() if n)
        print(f"{pruner:10s} {r['compute']:10.1f} {r['wall']:14.1f} {r['best']:21.5f}  {states}")
    base, pruned = results["none"], results["hyperband"]
    saved = 1 - pruned["compute"] / base["compute"]
    saved_wall = 1 - pruned["wall"] / base["wall"]
    gap = (pruned["best"] - base["best"]) / base["best"]
    print(f"\nhyperband vs no pruning (baseline): {saved:.0%} less trainer compute, {saved_wall:.0%} less launch "
          f"wall time; best value {gap:+.2%} vs the baseline's")
    target = saved >= 0.40 and gap <= 0.01
    print(f"target (>= 40% less compute, best within 1%): {'met' if target else 'NOT met'}")
    print(f"state kept in {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
