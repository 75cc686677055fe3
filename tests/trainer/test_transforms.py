"""Declared feature transforms: fitted on the rows trained on, applied by the same code when serving."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from trainpipe_trainer.config import (
    CheckpointConfig,
    FeatureTransform,
    ModelConfig,
    TrainerConfigError,
    TrainingConfig,
)
from trainpipe_trainer.data.memory import load_training_data
from trainpipe_trainer.data.splits import validation_mask
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models.mlp.export import write_serving_artifacts
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.models.mlp.scorer import MLPScorer
from trainpipe_trainer.preprocessing import FeatureTransformer, stable_bucket
from trainpipe_trainer.resume import resume_identity

COUNTRIES = ("FR", "DE", "US", "IT", "ES", "NL")
TRANSFORMS = (
    FeatureTransform(feature="income", impute="median", missing_indicator=True, clip_min=0.0, transform="log1p"),
    FeatureTransform(feature="country", type="categorical", encode="one_hot", max_categories=3),
    FeatureTransform(feature="device", type="categorical", encode="hashing", hash_buckets=8),
    FeatureTransform(feature="age", impute="constant", fill_value=-1.0, standardize=False),
)
FEATURES = ("amount", "income", "country", "device", "age")


def _frame(n: int = 400, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = rng.lognormal(10, 1, n)
    income[rng.random(n) < 0.15] = np.nan
    income[:3] = -5.0  # clipped to 0 before log1p
    country = rng.choice(np.asarray(COUNTRIES, dtype=object), n, p=[0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    country[rng.random(n) < 0.1] = None
    age = rng.integers(18, 90, n).astype(float)
    age[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({
        "amount": rng.normal(50, 20, n),
        "income": income,
        "country": country,
        "device": rng.choice(np.asarray(["ios", "android", "web"], dtype=object), n),
        "age": age,
        "label": (rng.random(n) < 0.3).astype(np.int64),
    })


def _config(train_uri: Path, tmp_path: Path, **overrides: object) -> TrainingConfig:
    values: dict = dict(
        pipeline_id="transforms", task="binary_classification", train_data_uri=str(train_uri), features=FEATURES,
        transforms=TRANSFORMS, label="label", model=ModelConfig(hidden_layers=(8,)),
        checkpoint=CheckpointConfig(root_uri=(tmp_path / "ckpt").as_uri(), validation_fraction=0.25),
        output_uri=str(tmp_path / "out"),
    )
    values.update(overrides)
    return TrainingConfig(**values)


def test_numeric_pipeline_imputes_clips_log1p_standardises_with_indicator() -> None:
    frame = pd.DataFrame({"x": [np.nan, -3.0, 0.0, 99.0, 9.0]})
    transform = FeatureTransform(feature="x", impute="mean", missing_indicator=True, clip_min=0.0, clip_max=9.0,
                                 transform="log1p")
    transformer = FeatureTransformer.fit(frame, (transform,), source="f")
    # mean of the present values (-3, 0, 99, 9) = 26.25; then clip to [0, 9], log1p, standardise.
    value = np.log1p(np.clip([26.25, -3.0, 0.0, 99.0, 9.0], 0.0, 9.0))
    expected = (value - value.mean()) / value.std()
    matrix = transformer.transform(frame, source="f")
    np.testing.assert_allclose(matrix[:, 0], expected)
    np.testing.assert_array_equal(matrix[:, 1], [1.0, 0.0, 0.0, 0.0, 0.0])
    assert transformer.output_names == ("x", "x__missing")


def test_impute_strategies_and_their_errors() -> None:
    frame = pd.DataFrame({"x": [1.0, np.nan, 2.0, 10.0]})
    fill = lambda **kw: FeatureTransformer.fit(  # noqa: E731
        frame, (FeatureTransform(feature="x", standardize=False, **kw),), source="f").transform(frame, source="f")[1, 0]
    assert fill(impute="mean") == pytest.approx(13 / 3)
    assert fill(impute="median") == 2.0
    assert fill(impute="constant", fill_value=-7.0) == -7.0
    with pytest.raises(TrainerDataError, match="'x' has no values to take the median of; impute a constant instead"):
        FeatureTransformer.fit(pd.DataFrame({"x": [np.nan, np.nan]}),
                               (FeatureTransform(feature="x", impute="median"),), source="f")
    with pytest.raises(TrainerDataError, match=r"'x' has values <= -1 \(smallest -2\), where log1p is undefined; clip"):
        FeatureTransformer.fit(pd.DataFrame({"x": [-2.0, 1.0]}), (FeatureTransform(feature="x", transform="log1p"),),
                               source="f")


NUMERIC_TRANSFORMS = (
    FeatureTransform(feature="a", impute="mean", clip_min=-1.0, clip_max=2.0),
    FeatureTransform(feature="b", impute="constant", fill_value=3.5, transform="log1p", clip_min=0.0),
    FeatureTransform(feature="c"),
    FeatureTransform(feature="d", impute="median", standardize=False),
)


def _numeric_frame(rows: int = 500) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    frame = pd.DataFrame({"a": rng.normal(size=rows) * 3, "b": rng.exponential(size=rows) * 40,
                          "c": rng.normal(size=rows) * 1e4 + 7, "d": rng.integers(-5, 5, size=rows).astype(float)})
    for name in ("a", "b", "d"):
        frame.loc[rng.choice(rows, size=25, replace=False), name] = np.nan
    return frame


def test_numeric_columns_transform_a_block_to_the_encoders_values_bit_for_bit() -> None:
    frame = _numeric_frame()
    transformer = FeatureTransformer.fit(frame, NUMERIC_TRANSFORMS, source="f")
    numeric = transformer.numeric_columns()
    assert numeric is not None and numeric.features == ("a", "b", "c", "d")
    block = frame[list(numeric.features)].to_numpy(dtype=np.float64).copy()
    transformed = numeric.transform(block, source="f")
    # The encoders' own values, column by column, and the float32 matrix the model takes: equal, not close.
    np.testing.assert_array_equal(transformed, transformer.transform(frame, source="f"))
    np.testing.assert_array_equal(transformed.astype(np.float32), transformer.transform_float32(frame, source="f"))


def test_numeric_columns_name_the_column_a_block_cannot_take() -> None:
    frame = _numeric_frame()
    numeric = FeatureTransformer.fit(frame, NUMERIC_TRANSFORMS, source="f").numeric_columns()
    assert numeric is not None
    unfilled = frame[list(numeric.features)].to_numpy(dtype=np.float64).copy()
    unfilled[[3, 9], 2] = np.nan  # "c" has no impute
    with pytest.raises(TrainerDataError, match=r"^part-3.parquet: feature column 'c' has 2 missing value\(s\); declare "
                                               r"how to fill them \(training.transforms.c.impute"):
        numeric.transform(unfilled, source="part-3.parquet")
    logged = FeatureTransformer.fit(pd.DataFrame({"x": [1.0, 2.0], "y": [0.0, 5.0]}),
                                    (FeatureTransform(feature="x"), FeatureTransform(feature="y", transform="log1p")),
                                    source="f").numeric_columns()
    assert logged is not None
    with pytest.raises(TrainerDataError, match=r"'y' has values <= -1 \(smallest -4\), where log1p is undefined"):
        logged.transform(np.array([[1.0, 0.5], [-9.0, -4.0]]), source="f")


def test_only_plain_numeric_transformers_have_numeric_columns() -> None:
    frame = pd.DataFrame({"x": [1.0, np.nan, 3.0], "c": ["a", "b", "a"]})
    with_indicator = (FeatureTransform(feature="x", impute="mean", missing_indicator=True),)
    categorical = (FeatureTransform(feature="x", impute="mean"), FeatureTransform(feature="c", type="categorical"))
    assert FeatureTransformer.fit(frame, with_indicator, source="f").numeric_columns() is None
    assert FeatureTransformer.fit(frame, categorical, source="f").numeric_columns() is None


def test_one_hot_keeps_most_frequent_categories_and_sends_the_rest_unseen_to_other() -> None:
    train = pd.DataFrame({"c": ["b", "a", "a", None, "b", "c", None, "d", "a"]})
    transformer = FeatureTransformer.fit(
        train, (FeatureTransform(feature="c", type="categorical", max_categories=3),), source="f")
    # a: 3, then b and <missing>: 2 each (tie broken by name: "<" sorts before "b"), c and d left out.
    assert transformer.output_names == ("c=a", "c=<missing>", "c=b", "c=<other>")
    serving = pd.DataFrame({"c": ["b", "zz", None, "d", "a"]})
    np.testing.assert_array_equal(transformer.transform(serving, source="f"),
                                  [[0, 0, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]])


def test_hashing_buckets_are_stable_and_take_unseen_values() -> None:
    transformer = FeatureTransformer.fit(
        pd.DataFrame({"c": ["x"]}), (FeatureTransform(feature="c", type="categorical", encode="hashing",
                                                      hash_buckets=16),), source="f")
    values = ["x", "never seen", None]
    matrix = transformer.transform(pd.DataFrame({"c": values}), source="f")
    for row, value in zip(matrix, ["x", "never seen", "<missing>"], strict=True):
        # Computed independently of the implementation: blake2b-64 of the text, little-endian, mod 16.
        bucket = int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little") % 16
        assert row.tolist() == [1.0 if i == bucket else 0.0 for i in range(16)]
        assert stable_bucket(value, 16) == bucket


def test_transforms_are_fitted_on_the_rows_trained_on_only(tmp_path: Path) -> None:
    frame = _frame()
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    config = _config(tmp_path / "train.parquet", tmp_path)
    data = load_training_data(config)

    held_out = validation_mask(frame, config)
    assert 0 < held_out.sum() < len(frame)
    trained_on = frame.loc[~held_out]
    income, country = data.transformer.encoders[1], data.transformer.encoders[2]
    assert income.fill_value == float(np.median(trained_on["income"].dropna()))
    assert income.fill_value != float(np.median(frame["income"].dropna()))
    amount = data.transformer.encoders[0]
    assert amount.mean == pytest.approx(trained_on["amount"].mean(), rel=1e-12)
    assert amount.mean != pytest.approx(frame["amount"].mean(), rel=1e-12)
    counts = trained_on["country"].fillna("<missing>").value_counts()
    assert country.categories == tuple(counts.index[:3])
    assert data.transformer.width == 1 + 2 + 4 + 8 + 1


def test_serving_computes_the_training_matrix_bit_for_bit(tmp_path: Path) -> None:
    """The trainer's tensors and the served model's input matrix for the same rows are identical."""
    frame = _frame()
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    config = _config(tmp_path / "train.parquet", tmp_path)
    data = load_training_data(config)
    model = build_mlp(n_features=data.transformer.width, config=config.model).eval()
    artifacts = write_serving_artifacts(model, transformer=data.transformer, task=config.task,
                                        directory=str(tmp_path))
    scorer = MLPScorer.from_artifacts(artifacts)
    assert scorer.transformer == data.transformer  # the fitted parameters survive the JSON round trip

    held_out = validation_mask(frame, config)
    for rows, tensors in ((frame.loc[~held_out], data.dataset), (frame.loc[held_out], data.validation)):
        served = scorer.feature_matrix(rows.drop(columns="label").reset_index(drop=True))
        np.testing.assert_array_equal(served.astype(np.float32), tensors.tensors[0].numpy())
    with torch.no_grad():
        expected = torch.sigmoid(model(data.dataset.tensors[0]).squeeze(-1)).numpy()
    np.testing.assert_allclose(scorer.score(frame.loc[~held_out]), expected, rtol=1e-5, atol=1e-6)


def test_served_model_takes_unseen_categories_and_missing_values(tmp_path: Path) -> None:
    frame = _frame()
    frame.to_parquet(tmp_path / "train.parquet", index=False)
    config = _config(tmp_path / "train.parquet", tmp_path)
    data = load_training_data(config)
    model = build_mlp(n_features=data.transformer.width, config=config.model).eval()
    scorer = MLPScorer.from_artifacts(write_serving_artifacts(model, transformer=data.transformer, task=config.task,
                                                              directory=str(tmp_path)))
    rows = pd.DataFrame({"amount": [10.0, 60.0], "income": [None, 5e4], "country": ["Atlantis", None],
                         "device": ["smart_fridge", None], "age": [None, 30.0]})
    matrix = scorer.feature_matrix(rows)
    names = scorer.transformer.output_names
    assert matrix[0, names.index("country=<other>")] == 1.0
    assert matrix[0, names.index("income__missing")] == 1.0 and matrix[1, names.index("income__missing")] == 0.0
    assert matrix[0, names.index("age")] == -1.0  # constant fill, not standardised
    scores = scorer.score(rows)
    assert scores.shape == (2,) and np.isfinite(scores).all() and ((scores > 0) & (scores < 1)).all()
    with pytest.raises(TrainerDataError, match=r"model input: feature column 'amount' has 1 missing value\(s\)"):
        scorer.score(rows.assign(amount=[None, 1.0]))


def test_transform_declarations_are_checked_by_the_config() -> None:
    with pytest.raises(TrainerConfigError, match=r"transforms: \['nope'\] are not in features"):
        TrainingConfig.from_dict({**json.loads(_json_config()), "transforms": [{"feature": "nope"}]})
    with pytest.raises(TrainerConfigError, match="fill_value: set exactly when impute is 'constant'"):
        FeatureTransform(feature="x", impute="constant")
    with pytest.raises(TrainerConfigError, match="apply to numeric features"):
        FeatureTransform(feature="x", type="categorical", impute="mean")


def _json_config() -> str:
    return TrainingConfig(pipeline_id="p", task="regression", train_data_uri="t.parquet", features=("a",),
                          label="y", checkpoint=CheckpointConfig(root_uri="file:///c"), output_uri="o").to_json()


def test_a_changed_transform_refuses_resume_and_is_named(tmp_path: Path) -> None:
    config = _config(tmp_path / "train.parquet", tmp_path)
    recorded = resume_identity(config, world_size=2)
    changed = TrainingConfig.from_json(config.to_json().replace('"max_categories": 3', '"max_categories": 5'))
    assert TrainingConfig.from_json(config.to_json()) == config
    assert recorded.differences(resume_identity(changed, world_size=2)) == ["transforms (of ['country'])"]
