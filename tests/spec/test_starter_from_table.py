"""`trainpipe init --data`: a starter spec fitted to a table (features, transforms, sizing, early stopping)
that trains and passes its own starter gates on the first run (real snapshot, trainer and MLflow)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
import yaml

from trainpipe.commands.main import main
from trainpipe.spec.starter import Sizing


def regression_table(n: int, seed: int) -> pd.DataFrame:
    """Labels around 150 (the issue's case), a categorical column and a column with missing values."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"age": rng.normal(48, 13, n), "bmi": rng.normal(26, 4.4, n), "bp": rng.normal(95, 14, n),
                          "sex": rng.choice(["f", "m"], n), "glucose": rng.normal(90, 12, n)})
    label = (150 + 0.8 * (frame["age"] - 48) + 9.0 * (frame["bmi"] - 26) + 1.5 * (frame["bp"] - 95)
             + np.where(frame["sex"] == "m", 10.0, -10.0) + 0.5 * (frame["glucose"] - 90) + rng.normal(0, 35, n))
    frame.loc[rng.random(n) < 0.05, "glucose"] = np.nan
    frame["progression"] = label
    return frame


def classification_table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"glucose": rng.normal(120, 30, n), "bmi": rng.normal(32, 7, n),
                          "age": rng.integers(21, 80, n), "pedigree": rng.lognormal(-0.8, 0.6, n)})
    logit = 0.035 * (frame["glucose"] - 120) + 0.08 * (frame["bmi"] - 32) + 0.02 * (frame["age"] - 40)
    frame["outcome"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    return frame


def test_sizing_rule_follows_the_table():
    small, large = Sizing.for_table(442, "regression"), Sizing.for_table(1_000_000, "binary_classification")
    assert (small.batch_size, small.learning_rate) == (32, 0.003) and small.epochs == 200
    assert (large.batch_size, large.learning_rate, large.epochs) == (1024, 0.01, 20)
    # Patience: 100 steps of the small table's 10-step epochs, 5 of the large one's 704-step epochs, and 25 of a
    # 150-row table's 4-step epochs.
    assert (small.patience, large.patience, Sizing.for_table(150, "multiclass_classification").patience) == (10, 5, 25)
    assert Sizing.for_table(20_000, "regression").batch_size == 128


def test_init_reads_the_table_into_the_spec(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", (tmp_path / "storage").as_uri())
    (tmp_path / "storage" / "diabetes").mkdir(parents=True)
    regression_table(442, 1).to_parquet(tmp_path / "storage" / "diabetes" / "table.parquet")

    code = main(["init", "diabetes", "--task", "regression", "--dir", str(tmp_path / "configs"),
                 "--data", "diabetes/table.parquet", "--label", "progression"])

    assert code == 0, capsys.readouterr()
    spec = yaml.safe_load((tmp_path / "configs" / "diabetes.yaml").read_text())
    training = spec["training"]
    assert training["features"] == ["age", "bmi", "bp", "glucose", "sex"] and training["label"] == "progression"
    assert training["transforms"] == {"glucose": {"impute": "median", "missing_indicator": True},
                                      "sex": {"type": "categorical", "encode": "one_hot", "max_categories": 20}}
    assert (training["batch_size"], training["learning_rate"], training["epochs"]) == (32, 0.003, 200)
    assert training["early_stopping"] == {"metric": "validation_loss", "patience": 10, "min_delta": 0}
    assert "time_column" not in spec["data"]
    assert spec["evaluation"]["gates"][0] == "r2 >= baseline - 0.05"


def test_init_names_a_missing_label_and_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", (tmp_path / "storage").as_uri())
    (tmp_path / "storage").mkdir()
    regression_table(10, 1).to_parquet(tmp_path / "storage" / "t.parquet")
    args = ["init", "x", "--task", "regression", "--dir", str(tmp_path / "c"), "--data"]

    assert main([*args, "t.parquet", "--label", "target"]) == 1
    assert "trainpipe init: --label: t.parquet has no column 'target'; its columns are age, bmi" in capsys.readouterr().err
    assert main([*args, "nope.parquet", "--label", "target"]) == 1
    assert "trainpipe init: --data: nope.parquet does not exist" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def digits_table(n: int, seed: int) -> pd.DataFrame:
    """A real 10-class table: ``n`` of scikit-learn's bundled handwritten digits (8x8 pixels), shuffled."""
    from sklearn.datasets import load_digits

    digits = load_digits(as_frame=True)
    frame = digits.data.rename(columns=lambda name: name.replace("pixel_", "p"))
    frame["digit"] = digits.target
    return frame.sample(n=n, random_state=seed).reset_index(drop=True)


@pytest.mark.integration
@pytest.mark.parametrize(("task", "label", "make"), [("regression", "progression", regression_table),
                                                     ("binary_classification", "outcome", classification_table),
                                                     ("multiclass_classification", "digit", digits_table)])
def test_a_starter_spec_passes_its_own_gates_on_the_first_run(task, label, make, tmp_path, monkeypatch):
    from trainpipe.compile.compiler import compile_file
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.settings import Settings
    from trainpipe.steps.evaluate.evaluate import evaluate
    from trainpipe.steps.register.lineage import git_commit
    from trainpipe.steps.snapshot import take_snapshot
    from trainpipe.steps.train.standalone import with_nproc_per_node
    from trainpipe.steps.train.train import RunContext, run_training
    from trainpipe.storage import storage_access

    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", (tmp_path / "storage").as_uri())
    (tmp_path / "storage" / "tables").mkdir(parents=True)
    make(1500, 7).to_parquet(tmp_path / "storage" / "tables" / f"{task}.parquet")
    name = f"starter_{task}"
    assert main(["init", name, "--task", task, "--dir", str(tmp_path / "configs"),
                 "--data", f"tables/{task}.parquet", "--label", label]) == 0

    # One process instead of the starter's two: the same training rule, lighter on a test machine.
    plan = with_nproc_per_node(compile_file(tmp_path / "configs" / f"{name}.yaml", settings=Settings.from_env()), 1)
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings,
                                 logical_date=datetime(2026, 11, 27, tzinfo=UTC), class_label=plan.class_label)
        trained = run_training(plan, snapshot, settings=settings, run=RunContext(
            dag_id=plan.dag_id, airflow_run_id="first", try_number=1, spec_sha256=plan.spec_sha256,
            git_commit=git_commit(plan.source_path)), run_dir=None)
        result = evaluate(plan.evaluation, plan.registration, holdout_uri=snapshot.holdout_uri,
                          model_uri=trained.model_uri, mlflow_run_id=trained.mlflow_run_id, hook=MlflowHook(settings),
                          snapshot=snapshot, pipeline_id=plan.dag_id, settings=settings)

    assert result["gates_passed"], (result["gates"], result["candidate"], result["baseline"])
    metric, within = {"regression": ("r2", 0.05), "binary_classification": ("auc", 0.05),
                      "multiclass_classification": ("accuracy", 0.02)}[task]
    assert result["candidate"][metric] >= result["baseline"][metric] - within
