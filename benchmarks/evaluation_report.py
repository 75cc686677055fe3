"""What the evaluation report, the slices and the dataset inputs add to the ``evaluate`` task.

    python benchmarks/evaluation_report.py [--rows 20000] [--repeats 3]

Runs the real ``trainpipe.steps.evaluate.evaluate.evaluate`` in this process against a temporary MLflow
store (sqlite) on the demo's transactions (``--rows`` over 60 days, the fraud example's 30-day
window and 20% holdout, sliced by region), with a candidate and a registered champion that are
MLflow pyfunc models (a fixed logistic formula over the features: loading and predicting stand in
for the trained MLP's). The steps this change added are timed inside the same call:
``holdout_slices`` (every metric per region, both models), ``log_report`` (plots, HTML, upload
under ``evaluation/``) and ``log_snapshot_inputs``.

Baseline: the rest of the same ``evaluate`` call (reading the holdout, loading and scoring both
models, the whole-holdout metrics, the gates, the metric batch): what the task did before. The
first call pays the one-off imports (matplotlib, sklearn.calibration) a task process pays unless
``trainpipe.dags.preload`` imported them; the best of the later calls is the steady figure.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, module, name: str) -> None:
        original = getattr(module, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(module, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="demo transactions over 60 days")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="trainpipe-bench-report-"))
    os.environ.update(TRAINPIPE_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home}/mlflow.db",
                      TRAINPIPE_MLFLOW_ARTIFACT_ROOT=str(home / "mlartifacts"), MLFLOW_DISABLE_TELEMETRY="true",
                      TRAINPIPE_STORAGE_ROOT=f"file://{home}/storage")
    os.environ.pop("TRAINPIPE_STORAGE_CONN_ID", None)
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")

    import mlflow
    import mlflow.pyfunc
    import numpy as np

    from trainpipe.compile.compiler import compile_file
    from trainpipe.demo.synthetic import TRANSACTION_FEATURES, generate_transactions
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings
    from trainpipe.state import datasets
    from trainpipe.steps.evaluate import evaluate as evaluate_module
    from trainpipe.steps.snapshot import take_snapshot

    class Logistic(mlflow.pyfunc.PythonModel):
        def __init__(self, weights: list[float]) -> None:
            self.weights = weights

        def predict(self, context, model_input, params=None):
            features = (model_input - model_input.mean()) / (model_input.std() + 1e-9)
            return 1 / (1 + np.exp(-(features.to_numpy() @ np.asarray(self.weights) - 2.5)))

    settings = Settings.from_env()
    end = datetime(2026, 6, 30, tzinfo=UTC)
    demo = home / "storage" / "demo" / "transactions"
    demo.mkdir(parents=True)
    generate_transactions(rows=args.rows, end=end).to_parquet(demo / "transactions.parquet", index=False)
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "dag_configs/fraud_detector.yaml",
                        settings=settings)
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=end)
    hook = MlflowHook(settings)
    experiment = hook.experiment_id(plan.dag_id)

    def logged_model(weights: list[float]) -> tuple[str, str]:
        with mlflow.start_run(experiment_id=experiment) as run:
            info = mlflow.pyfunc.log_model(name="model", python_model=Logistic(weights))
        return info.model_uri, run.info.run_id

    champion_uri, champion_run = logged_model([0.2, 1.0, -0.3, 0.4, 0.6, -0.5, 0.8])
    client = hook.client
    client.create_registered_model(plan.registration.model_name)
    version = client.create_model_version(plan.registration.model_name, champion_uri, run_id=champion_run,
                                          model_id=champion_uri.removeprefix("models:/"))
    client.set_registered_model_alias(plan.registration.model_name, plan.registration.alias, version.version)

    timer = _Timer()
    for name in ("holdout_slices", "log_report"):
        timer.wrap(evaluate_module, name)
    timer.wrap(datasets, "log_snapshot_inputs")
    rows = []
    for attempt in range(args.repeats):
        candidate_uri, run_id = logged_model([0.3, 1.1, -0.2, 0.5, 0.7, -0.6, 0.9])
        timer.seconds.clear()
        start = time.perf_counter()
        evaluate_module.evaluate(plan.evaluation, plan.registration, holdout_uri=snapshot.holdout_uri,
                                 model_uri=candidate_uri, mlflow_run_id=run_id, hook=hook, snapshot=snapshot,
                                 pipeline_id=plan.dag_id, settings=settings)
        total = time.perf_counter() - start
        added = sum(timer.seconds.values())
        rows.append((attempt, total, total - added, dict(timer.seconds)))

    print(f"evaluate() on {snapshot.holdout_rows:,} holdout rows ({len(TRANSACTION_FEATURES)} features, sliced by "
          f"{', '.join(plan.evaluation.slices)}), candidate and champion, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'call':<6}{'total s':>9}{'baseline s':>12}{'slices s':>10}{'report s':>10}{'datasets s':>12}{'added s':>9}"
          f"{'added/baseline':>16}")
    for attempt, total, baseline, parts in rows:
        added = total - baseline
        print(f"{attempt + 1:<6}{total:>9.2f}{baseline:>12.2f}{parts.get('holdout_slices', 0):>10.2f}"
              f"{parts.get('log_report', 0):>10.2f}{parts.get('log_snapshot_inputs', 0):>12.2f}{added:>9.2f}"
              f"{added / baseline:>16.2f}")
    steady = min(rows[1:] or rows, key=lambda r: r[1] - r[2])
    print(f"steady (best of calls 2..{len(rows)}): +{steady[1] - steady[2]:.2f} s over a baseline of {steady[2]:.2f} s "
          f"(ratio {(steady[1] - steady[2]) / steady[2]:.2f}); first call +{rows[0][1] - rows[0][2]:.2f} s "
          "(one-off imports included)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "provider"))
    sys.exit(main())
