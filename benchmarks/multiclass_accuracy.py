"""Multiclass accuracy: the trainer's MLP against multinomial logistic regression on public tables.

    python benchmarks/multiclass_accuracy.py [--tables wine,digits] [--nproc 2]   # about a minute on 2 cores

Each table ships with scikit-learn (no download): ``wine`` (178 rows, 13 features, 3 classes) and
``digits`` (1,797 rows, 64 pixels, 10 classes). A stratified 70/30 split (seed 0); the trainer runs as
the launchers run it (torchrun, 2 CPU ranks by default, tracking to a local sqlite store) with the
model and learning rate a spec gets when it names none, and an epoch count and batch size per table
size, nothing tuned per table. The holdout accuracy is taken from the logged pyfunc's ``label``
column; the reference is scikit-learn's LogisticRegression (lbfgs: the multinomial model) on the
same standardised features. ``tests/trainer/test_multiclass.py`` asserts wine's gap is at most 0.02.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

# name: (loader name in sklearn.datasets, epochs, batch size per rank)
TABLES = {"wine": ("load_wine", 30, 16), "digits": ("load_digits", 30, 32)}


def _split(loader: str, directory: Path) -> tuple[Path, pd.DataFrame, list[str], list[str]]:
    import sklearn.datasets
    from sklearn.model_selection import train_test_split

    bunch = getattr(sklearn.datasets, loader)(as_frame=True)
    features = [str(name) for name in bunch.feature_names]
    frame = bunch.frame.loc[:, list(bunch.feature_names)].astype("float64")
    frame.columns = features
    frame["label"] = bunch.target.to_numpy()
    train, holdout = train_test_split(frame, test_size=0.3, random_state=0, stratify=frame["label"])
    path = directory / "train.parquet"
    train.reset_index(drop=True).to_parquet(path)
    classes = [str(value) for value in sorted(frame["label"].unique())]
    return path, holdout.reset_index(drop=True), features, classes


def _logistic_regression(train_path: Path, holdout: pd.DataFrame, features: list[str]) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train = pd.read_parquet(train_path)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000)).fit(train[features], train["label"])
    return float((model.predict(holdout[features]) == holdout["label"]).mean())


def _trainer(name: str, train_path: Path, holdout: pd.DataFrame, features: list[str], classes: list[str],
             directory: Path, nproc: int) -> tuple[float, float]:
    import mlflow

    _, epochs, batch_size = TABLES[name]
    tracking_uri = f"sqlite:///{directory / 'mlflow.db'}"
    config = {
        "pipeline_id": f"multiclass-{name}", "task": "multiclass_classification", "train_data_uri": str(train_path),
        "features": features, "label": "label", "label_classes": classes, "epochs": epochs,
        "batch_size": batch_size, "seed": 0,
        "checkpoint": {"root_uri": (directory / "checkpoints").as_uri(), "every_n_steps": 1000},
        "tracking": {"tracking_uri": tracking_uri, "experiment_name": name},
        "output_uri": str(directory / "output"),
    }
    config_path = directory / "config.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    "-m", "trainpipe_trainer", "--config", config_path.as_uri()],
                   cwd=directory, env=env, check=True, capture_output=True)
    seconds = time.perf_counter() - started
    result = json.loads((directory / "output" / "result.json").read_text())
    mlflow.set_tracking_uri(tracking_uri)
    served = mlflow.pyfunc.load_model(result["model_uri"]).predict(holdout[features])
    return float((served["label"] == holdout["label"].astype(str)).mean()), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated, of {', '.join(TABLES)}")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"{'table':<8} {'rows':>6} {'classes':>7} {'trainer MLP':>12} {'logistic reg.':>14} {'gap':>7} {'train s':>8}")
    for name in args.tables.split(","):
        with tempfile.TemporaryDirectory(prefix=f"trainpipe-multiclass-{name}-") as tmp:
            directory = Path(tmp)
            train_path, holdout, features, classes = _split(TABLES[name][0], directory)
            reference = _logistic_regression(train_path, holdout, features)
            accuracy, seconds = _trainer(name, train_path, holdout, features, classes, directory, args.nproc)
            rows = len(pd.read_parquet(train_path)) + len(holdout)
            print(f"{name:<8} {rows:>6} {len(classes):>7} {accuracy:>12.4f} {reference:>14.4f} "
                  f"{accuracy - reference:>+7.4f} {seconds:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
