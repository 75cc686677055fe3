"""Streamed feature statistics: one pass over a split in frames gives the in-memory fit's transforms."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainpipe_trainer.config import CheckpointConfig, FeatureTransform, ModelConfig, TrainingConfig
from trainpipe_trainer.data.manifest import DataManifest, ManifestFile, holdout_row_groups
from trainpipe_trainer.data.statistics import (
    StatisticsPass,
    fitted_from_statistics,
    load_or_compute_statistics,
    statistics_uri,
)
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler

TRANSFORMS = (
    FeatureTransform(feature="income", impute="mean", missing_indicator=True, clip_min=0.0, transform="log1p"),
    FeatureTransform(feature="country", type="categorical", encode="one_hot", max_categories=3),
    FeatureTransform(feature="device", type="categorical", encode="hashing", hash_buckets=8),
    FeatureTransform(feature="age", impute="constant", fill_value=-1.0, standardize=False),
)
FEATURES = ("amount", "income", "country", "device", "age")


def _frame(n: int, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    income = rng.lognormal(10, 1, n)
    income[rng.random(n) < 0.15] = np.nan
    income[:3] = -5.0
    country = rng.choice(np.asarray(["FR", "DE", "US", "IT", "ES"], dtype=object), n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    country[rng.random(n) < 0.1] = None
    age = rng.integers(18, 90, n).astype(float)
    age[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({"amount": rng.normal(50, 20, n), "income": income, "country": country,
                         "device": rng.choice(np.asarray(["ios", "android", "web"], dtype=object), n), "age": age,
                         "label": rng.normal(300, 40, n), "kind": rng.choice(np.asarray(["a", "b", "c"]), n)})


def _config(tmp_path: Path, **overrides: object) -> TrainingConfig:
    values: dict = dict(pipeline_id="stats", task="regression", train_data_uri=str(tmp_path / "m.json"),
                        features=FEATURES, transforms=TRANSFORMS, label="label", model=ModelConfig(hidden_layers=(8,)),
                        checkpoint=CheckpointConfig(root_uri=(tmp_path / "ckpt").as_uri()),
                        output_uri=str(tmp_path / "out"))
    values.update(overrides)
    return TrainingConfig(**values)


def _streamed(config: TrainingConfig, frame: pd.DataFrame, parts: int) -> dict:
    statistics = StatisticsPass(config, source="split")
    for part in np.array_split(np.arange(len(frame)), parts):
        statistics.update(frame.iloc[part].reset_index(drop=True))
    return statistics.result()


def test_a_pass_in_frames_gives_the_in_memory_fit(tmp_path: Path) -> None:
    frame = _frame(5_000)
    config = _config(tmp_path)
    transformer, target, classes = fitted_from_statistics(config, _streamed(config, frame, parts=7))
    expected = FeatureTransformer.fit(frame, config.feature_transforms(), source="split")
    for streamed, whole in zip(transformer.to_dict()["encoders"], expected.to_dict()["encoders"], strict=True):
        assert streamed.keys() == whole.keys()
        for key, value in whole.items():
            if isinstance(value, float):
                assert streamed[key] == pytest.approx(value, rel=1e-12), (whole["feature"], key)
            else:
                assert streamed[key] == value, (whole["feature"], key)
    np.testing.assert_allclose(transformer.transform(frame, source="s"), expected.transform(frame, source="s"),
                               rtol=1e-10, atol=1e-12)
    whole_target = TargetScaler.fit(frame["label"].to_numpy())
    assert (target.mean, target.std) == (pytest.approx(whole_target.mean), pytest.approx(whole_target.std))
    assert classes == ()


def test_median_impute_comes_from_a_bounded_sample_close_to_the_median(tmp_path: Path) -> None:
    frame = _frame(20_000)
    config = _config(tmp_path, features=("amount", "income"),
                     transforms=(FeatureTransform(feature="income", impute="median"),))
    encoder = fitted_from_statistics(config, _streamed(config, frame, parts=5))[0].encoders[1]
    present = frame["income"].dropna()
    # Every value is sampled while fewer than MEDIAN_SAMPLE are present: the exact median.
    assert encoder.fill_value == pytest.approx(float(np.median(present)))


def test_multiclass_classes_are_those_of_every_frame(tmp_path: Path) -> None:
    frame = _frame(600)
    frame["label"] = np.where(np.arange(600) < 590, "common", "rare")  # only the last frame holds "rare"
    config = _config(tmp_path, task="multiclass_classification")
    assert fitted_from_statistics(config, _streamed(config, frame, parts=6))[2] == ("common", "rare")


def test_missing_values_without_impute_are_the_in_memory_error(tmp_path: Path) -> None:
    frame = _frame(400)
    config = _config(tmp_path, features=("amount", "income"), transforms=())
    with pytest.raises(TrainerDataError, match=r"'income' has \d+ missing value\(s\); declare how to fill them"):
        _streamed(config, frame, parts=3)


def test_statistics_are_stored_beside_the_manifest_and_read_back(tmp_path: Path) -> None:
    frame = _frame(800)
    folder = tmp_path / "source"
    folder.mkdir()
    fs = fsspec.filesystem("file")
    entries = []
    halves = np.array_split(np.arange(len(frame)), 2)
    for index, rows in enumerate(halves):
        path = folder / f"part-{index}.parquet"
        pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False), path, row_group_size=100)
        info = fs.info(str(path))
        groups = tuple(pq.ParquetFile(path).metadata.row_group(g).num_rows for g in range(4))
        entries.append((path, info, groups))
    held = holdout_row_groups([(p.name, len(g)) for p, _, g in entries], 0.25)
    manifest = DataManifest(source_uri=folder.as_uri(), schema=(("amount", "double"),), holdout_fraction=0.25,
                            files=tuple(ManifestFile(uri=p.as_uri(), path=p.name, size=info["size"], rows=sum(g),
                                                     row_groups=g, holdout_row_groups=h, schema_hash="s",
                                                     mtime=info["mtime"])
                                        for (p, info, g), h in zip(entries, held, strict=True)))
    manifest_uri = (tmp_path / "version" / "data_manifest.json").as_uri()
    config = _config(tmp_path, train_data_uri=manifest_uri)
    computed = load_or_compute_statistics(config, manifest, fs)
    assert computed["rows"] == manifest.rows("train") < len(frame)
    stored = Path(fsspec.core.url_to_fs(statistics_uri(manifest_uri, config))[1])
    assert stored.exists()
    stored.write_text(stored.read_text().replace(f'"rows": {computed["rows"]}', '"rows": -1'))
    # Read back, not recomputed (the edited row count shows it).
    assert load_or_compute_statistics(config, manifest, fs)["rows"] == -1
    # Other transforms: another file, computed anew.
    other = _config(tmp_path, train_data_uri=manifest_uri, features=("amount", "age"), transforms=())
    assert statistics_uri(manifest_uri, other) != statistics_uri(manifest_uri, config)


def test_the_runs_classes_share_the_statistics_of_a_pass_that_found_them(tmp_path: Path) -> None:
    frame = _frame(300)
    frame["label"] = frame["kind"]
    found = _config(tmp_path, task="multiclass_classification")
    pinned = _config(tmp_path, task="multiclass_classification", label_classes=("c", "b", "a", "d"))
    # The validate step's pass (no classes given) serves a run whose classes were pinned or found by the train step.
    assert statistics_uri("file:///v/data_manifest.json", found) == statistics_uri("file:///v/data_manifest.json",
                                                                                   pinned)
    statistics = _streamed(found, frame, parts=3)
    assert fitted_from_statistics(found, statistics)[2] == ("a", "b", "c")
    assert fitted_from_statistics(pinned, statistics)[2] == ("c", "b", "a", "d")
