"""A spec with a categorical feature and missing values, end to end: real dag.test(), torchrun (2 processes),
GE, MLflow; the served model scores rows with an unseen category and missing values; then
`trainpipe reproduce` rebuilds the registered version from its lineage and gets the same weights."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support import REPO, load_dag, run_dag
from trainpipe.commands.main import main
from trainpipe.demo.synthetic import generate_transactions
from trainpipe.errors import ReproduceError
from trainpipe.settings import Settings
from trainpipe.steps.train.reproduce import parse_reference, snapshot_by_digest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 5, 31, tzinfo=UTC)
PIPELINE = "fraud_transforms"
FEATURES = ["amount", "merchant_risk", "hour_of_day", "account_age_days", "is_foreign", "merchant_category"]


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    frame = generate_transactions(rows=8000, days=20, end=END)
    # Missing numeric values too: about 10% of account ages, imputed by the spec.
    frame.loc[np.random.default_rng(3).random(len(frame)) < 0.1, "account_age_days"] = np.nan
    data = state_dir / "storage" / "demo" / PIPELINE / "transactions.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(data, index=False)

    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec.update(pipeline_id=PIPELINE, schedule="none", retries=0, params={})
    spec["data"]["uri"] = f"demo/{PIPELINE}/transactions.parquet"
    spec["validation"] = {"expectations": [{"expect_column_values_to_not_be_null": {"column": "merchant_category",
                                                                                    "mostly": 0.9}}]}
    spec["training"].update(features=FEATURES, epochs=3, transforms={
        "amount": {"transform": "log1p", "clip": {"min": 0}},
        "account_age_days": {"impute": "median", "missing_indicator": True},
        "merchant_category": {"type": "categorical", "encode": "one_hot", "max_categories": 6},
    })
    spec["evaluation"]["gates"] = ["auc >= 0.65"]  # a small, short training: the test is about transforms, not quality
    spec["registration"]["model_name"] = PIPELINE
    folder = tmp_path_factory.mktemp("dag_configs")
    (folder / f"{PIPELINE}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def registered(configs: Path, monkeypatch_module: pytest.MonkeyPatch):
    return run_dag(load_dag(configs, PIPELINE, monkeypatch_module), logical_date=END)[1]


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_pipeline_with_categorical_and_missing_values_trains_and_registers(registered) -> None:
    import mlflow

    assert set(registered.values()) == {"success"}, registered
    version = mlflow.MlflowClient().get_model_version_by_alias(PIPELINE, "champion")
    assert float(version.tags["holdout_auc"]) >= 0.65
    assert len(version.tags["weights_sha256"]) == 64


def test_served_model_scores_unseen_categories_and_missing_values(registered) -> None:
    import mlflow

    model = mlflow.pyfunc.load_model(f"models:/{PIPELINE}@champion")
    rows = pd.DataFrame({
        "amount": [12.5, 300.0, 45.0], "merchant_risk": [0.2, 0.7, 0.4], "hour_of_day": [3.0, 14.0, 23.0],
        "account_age_days": [np.nan, 30.0, np.nan], "is_foreign": [0.0, 1.0, 0.0],
        "merchant_category": ["crypto_atm", None, "grocery"],   # unseen in training, missing, known
    })
    scores = np.asarray(model.predict(rows), dtype=float)
    assert scores.shape == (3,)
    assert np.isfinite(scores).all() and ((scores > 0) & (scores < 1)).all()
    # The unseen category is scored as "other": the same as any other category outside the kept ones.
    scorer = model.unwrap_python_model()._scorer
    other = [c for c in ("travel", "pharmacy", "fuel", "apparel") if c not in scorer.transformer.encoders[-1].categories]
    assert other, scorer.transformer.encoders[-1].categories
    as_other = np.asarray(model.predict(rows.assign(merchant_category=[other[0], None, "grocery"])), dtype=float)
    assert as_other[0] == scores[0]


def test_reproduce_rebuilds_the_champion_with_identical_weights(registered, configs: Path, capsys) -> None:
    import mlflow

    version = mlflow.MlflowClient().get_model_version_by_alias(PIPELINE, "champion")
    assert main(["reproduce", f"{PIPELINE}@champion", "--configs", str(configs)]) == 0
    out = capsys.readouterr().out
    assert f"reproducing {PIPELINE} version {version.version} (alias champion)" in out
    assert f"registered weights sha256: {version.tags['weights_sha256']}" in out
    assert f"reproduced weights sha256: {version.tags['weights_sha256']}" in out
    assert "weights match: yes" in out
    runs = mlflow.search_runs(experiment_names=[f"trainpipe/{PIPELINE}"],
                              filter_string=f"tags.`trainpipe.reproduces` = '{PIPELINE}/{version.version}'")
    assert list(runs["tags.trainpipe.reproduced_weights_match"]) == ["true"]


def test_reproduce_refuses_what_it_cannot_rebuild(registered, configs: Path, state_dir: Path, capsys) -> None:
    with pytest.raises(ReproduceError, match=r"'fraud_transforms' names no model version; write MODEL@ALIAS"):
        parse_reference(PIPELINE)
    assert parse_reference(f"{PIPELINE}/2") == (PIPELINE, None, 2)
    assert main(["reproduce", f"{PIPELINE}/99", "--configs", str(configs)]) == 1
    assert f"trainpipe reproduce: {PIPELINE}/99: no such registered model version" in capsys.readouterr().err
    with pytest.raises(ReproduceError, match=r"snapshot 0000000000000000 of fraud_transforms is not in storage any more"):
        snapshot_by_digest(PIPELINE, "0" * 64, settings=Settings.from_env())
