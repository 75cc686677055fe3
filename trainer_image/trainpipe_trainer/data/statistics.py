"""The feature statistics of a train split in one streamed pass, so no rank holds the split or refits it.

``StatisticsPass`` takes the split one frame at a time (a row group) and keeps, per feature, what the
in-memory fit (``preprocessing.FeatureTransformer.fit``) would compute from the whole split: the count,
mean and sum of squared deviations of each numeric feature after its impute/clip/log1p (merged across frames
with Chan's formula), the category counts of a one-hot feature, the label's classes or its mean and standard
deviation. ``fitted_from_statistics`` turns them into the same ``FeatureTransformer``/``TargetScaler``:
equal to the in-memory fit up to floating-point summation order, except ``impute: median``, whose median
is that of a seeded sample of at most ``MEDIAN_SAMPLE`` present values (its rank error is about
1/sqrt(sample) of the rows).

The validate step runs the pass over a manifest version's train split (it reads every row group anyway) and
stores the result beside the manifest (``statistics/<key>.json``, keyed by what the statistics depend on);
the trainer reads that file, or makes it with the same pass when it is absent (``load_or_compute_statistics``).

numpy and pandas only (no torch): the provider imports it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from trainpipe_trainer import storage
from trainpipe_trainer.config import FeatureTransform, TrainingConfig
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.preprocessing import (
    FeatureTransformer,
    HashingEncoder,
    NumericEncoder,
    OneHotEncoder,
    TargetScaler,
    TextEncoder,
    _category_values,
    _numeric_values,
    label_class_names,
    label_values,
    require_columns,
)

if TYPE_CHECKING:
    import fsspec

    from trainpipe_trainer.data.manifest import DataManifest

STATISTICS_FOLDER = "statistics"
STATISTICS_FORMAT = 1
# impute: median takes the median of a seeded sample of this many present values.
MEDIAN_SAMPLE = 100_000
# A one-hot feature counts each distinct value; beyond this many the column is an identifier, not categories.
MAX_DISTINCT_CATEGORIES = 1_000_000


@dataclass(slots=True)
class Moments:
    """count, mean and the sum of squared deviations (M2) of a stream of float64 values."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        count, mean = values.size, float(values.mean())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta * delta * self.count * count / total
        self.count = total

    def add_repeated(self, value: float, times: int) -> None:
        if times:
            self.add(np.full(times, value, dtype=np.float64))

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}


@dataclass(slots=True)
class _NumericColumn:
    transform: FeatureTransform
    seed: int
    raw: Moments = field(default_factory=Moments)
    # After clip and log1p, present values only: the missing ones are added once the fill value is known.
    shaped: Moments = field(default_factory=Moments)
    missing: int = 0
    sample: np.ndarray = field(default_factory=lambda: np.empty(0))
    sample_keys: np.ndarray = field(default_factory=lambda: np.empty(0))
    seen: int = 0

    def update(self, frame: pd.DataFrame, *, source: str) -> None:
        values = _numeric_values(frame, self.transform.feature, source=source)
        present = values[~np.isnan(values)]
        self.missing += values.size - present.size
        self.raw.add(present)
        self.shaped.add(self._shaper()._value(present, source=source))
        if self.transform.impute == "median":
            self._sample(present)

    def _shaper(self) -> NumericEncoder:
        t = self.transform
        return NumericEncoder(feature=t.feature, clip_min=t.clip_min, clip_max=t.clip_max, log1p=t.transform == "log1p")

    def _sample(self, present: np.ndarray) -> None:
        """A seeded uniform sample of the present values: each gets a random key, the smallest keys are kept."""
        keys = np.random.default_rng([self.seed, self.seen]).random(present.size)
        values, keys = np.concatenate([self.sample, present]), np.concatenate([self.sample_keys, keys])
        if values.size > MEDIAN_SAMPLE:
            keep = np.argpartition(keys, MEDIAN_SAMPLE)[:MEDIAN_SAMPLE]
            values, keys = values[keep], keys[keep]
        self.sample, self.sample_keys = values, keys
        self.seen += present.size

    def encoder(self, *, source: str) -> NumericEncoder:
        t = self.transform
        fill_value = None
        if t.impute == "constant":
            fill_value = float(t.fill_value)
        elif t.impute is not None:
            if self.raw.count == 0:
                raise TrainerDataError(f"{source}: feature column {t.feature!r} has no values to take the {t.impute} "
                                       "of; impute a constant instead")
            fill_value = self.raw.mean if t.impute == "mean" else float(np.median(self.sample))
        elif self.missing:
            raise TrainerDataError(
                f"{source}: feature column {t.feature!r} has {self.missing} missing value(s); declare how to fill "
                f"them (training.transforms.{t.feature}.impute: mean, median or constant)")
        unscaled = NumericEncoder(feature=t.feature, fill_value=fill_value, missing_indicator=t.missing_indicator,
                                  clip_min=t.clip_min, clip_max=t.clip_max, log1p=t.transform == "log1p")
        if not t.standardize:
            return unscaled
        shaped = Moments(self.shaped.count, self.shaped.mean, self.shaped.m2)
        if self.missing:
            shaped.add_repeated(float(unscaled._value(np.array([fill_value]), source=source)[0]), self.missing)
        std = shaped.std
        return NumericEncoder(feature=t.feature, fill_value=fill_value, missing_indicator=t.missing_indicator,
                              clip_min=t.clip_min, clip_max=t.clip_max, log1p=unscaled.log1p, mean=shaped.mean,
                              std=std if std > 1e-12 else 1.0)


def statistics_key(config: TrainingConfig) -> dict[str, Any]:
    """Everything the statistics depend on besides the data (the manifest they sit beside)."""
    # Not the run's label classes: pinned or found by the train step, they are the run's, whatever the pass found
    # (``fitted_from_statistics``); the transforms do not depend on them.
    return {"format": STATISTICS_FORMAT, "task": config.task, "label": config.label,
            "scale_target": config.scale_target, "seed": config.seed,
            "transforms": [_transform_dict(t) for t in config.feature_transforms()]}


def _transform_dict(transform: FeatureTransform) -> dict[str, Any]:
    return {name: getattr(transform, name) for name in transform.__dataclass_fields__}


def statistics_uri(manifest_uri: str, config: TrainingConfig) -> str:
    digest = hashlib.sha256(json.dumps(statistics_key(config), sort_keys=True).encode()).hexdigest()
    return storage.join(manifest_uri.rsplit("/", 1)[0], STATISTICS_FOLDER, f"{digest[:32]}.json")


class StatisticsPass:
    """Feed it the train split's frames in any order; ``result()`` is a JSON-able record."""

    def __init__(self, config: TrainingConfig, *, source: str) -> None:
        if config.task in ("ranking", "causal_lm"):
            raise TrainerDataError(f"{source}: streamed statistics cover tabular and hashed-text features for "
                                   f"classification and regression, not task {config.task!r}")
        self.config, self.source, self.rows = config, source, 0
        transforms = config.feature_transforms()
        self.numeric = {t.feature: _NumericColumn(t, seed=config.seed + i)
                        for i, t in enumerate(transforms) if t.type == "numeric"}
        self.categories = {t.feature: Counter() for t in transforms if t.type == "categorical" and t.encode == "one_hot"}
        self.label = Moments()
        self.classes: set[Any] = set()

    @property
    def columns(self) -> list[str]:
        """The columns the pass reads."""
        return [*self.config.features, self.config.label]

    def update(self, frame: pd.DataFrame) -> None:
        config, source = self.config, self.source
        require_columns(frame, list(config.features), source=source, role="feature")
        require_columns(frame, [config.label], source=source, role="label")
        self.rows += len(frame)
        for column in self.numeric.values():
            column.update(frame, source=source)
        for name, counts in self.categories.items():
            counts.update(_category_values(frame, name).tolist())
            if len(counts) > MAX_DISTINCT_CATEGORIES:
                raise TrainerDataError(
                    f"{source}: categorical feature {name!r} has more than {MAX_DISTINCT_CATEGORIES:,} distinct "
                    f"values; one-hot needs a bounded set: use training.transforms.{name}.encode: hashing")
        if config.task == "multiclass_classification":
            if config.label_classes:  # checks each row's class
                label_values(frame, label=config.label, task=config.task, source=source, classes=config.label_classes)
            else:
                self.classes.update(label_class_names(frame[config.label], label=config.label, source=source))
        else:
            labels = label_values(frame, label=config.label, task=config.task, source=source)
            if config.task == "regression" and config.scale_target:
                self.label.add(labels)

    def result(self) -> dict[str, Any]:
        if self.rows == 0:
            raise TrainerDataError(f"{self.source}: the training split has no rows")
        encoders = []
        for transform in self.config.feature_transforms():
            if transform.type == "numeric":
                encoders.append(self.numeric[transform.feature].encoder(source=self.source).to_dict())
            elif transform.type == "categorical" and transform.encode == "one_hot":
                ranked = sorted(self.categories[transform.feature].items(), key=lambda item: (-item[1], item[0]))
                encoders.append(OneHotEncoder(feature=transform.feature, categories=tuple(
                    c for c, _ in ranked[: transform.max_categories])).to_dict())
            elif transform.type == "categorical":
                encoders.append(HashingEncoder(feature=transform.feature, buckets=transform.hash_buckets).to_dict())
            else:
                encoders.append(TextEncoder(feature=transform.feature, buckets=transform.hash_buckets,
                                            max_tokens=transform.max_tokens, ngrams=transform.ngrams).to_dict())
        classes: tuple[str, ...] = self.config.label_classes
        if self.config.task == "multiclass_classification" and not classes:
            classes = label_class_names(pd.Series(sorted(self.classes)), label=self.config.label, source=self.source)
            if len(classes) < 2:
                raise TrainerDataError(f"{self.source}: multiclass label column {self.config.label!r} holds one class "
                                       f"only ({', '.join(map(repr, classes))}); a classifier needs at least two")
        target = None
        if self.config.task == "regression" and self.config.scale_target:
            std = self.label.std
            target = {"mean": self.label.mean, "std": std if std > 1e-12 else 1.0}
        return {"key": statistics_key(self.config), "rows": self.rows, "transformer": {"encoders": encoders},
                "target": target, "classes": list(classes)}


def fitted_from_statistics(config: TrainingConfig, statistics: dict[str, Any]
                           ) -> tuple[FeatureTransformer, TargetScaler | None, tuple[str, ...]]:
    """The transforms, target scale and classes (the config's when it names them, else the pass's)."""
    classes = ()
    if config.task == "multiclass_classification":
        classes = config.label_classes or tuple(statistics["classes"])
    return FeatureTransformer.from_dict(statistics["transformer"]), TargetScaler.from_dict(statistics["target"]), classes


def compute_statistics(config: TrainingConfig, manifest: DataManifest, fs: fsspec.AbstractFileSystem, *,
                       source: str) -> dict[str, Any]:
    """One pass over the manifest's train split."""
    from trainpipe_trainer.data.reading import iter_units

    statistics = StatisticsPass(config, source=source)
    for _, table in iter_units(fs, manifest, "train", columns=statistics.columns):
        statistics.update(table.to_pandas())
    return statistics.result()


def write_statistics(manifest_uri: str, config: TrainingConfig, statistics: dict[str, Any],
                     storage_options: dict[str, Any] | None = None) -> str:
    uri = statistics_uri(manifest_uri, config)
    storage.write_text(uri, json.dumps(statistics, sort_keys=True), storage_options)
    return uri


def read_statistics(manifest_uri: str, config: TrainingConfig,
                    storage_options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    uri = statistics_uri(manifest_uri, config)
    fs, path = storage.url_to_fs(uri, storage_options)
    if not fs.exists(path):
        return None
    try:
        statistics = json.loads(storage.read_text(uri, storage_options))
    except (OSError, ValueError):
        return None  # a partial write: computed again
    return statistics if statistics.get("key") == statistics_key(config) else None


def load_or_compute_statistics(config: TrainingConfig, manifest: DataManifest, fs: fsspec.AbstractFileSystem
                               ) -> dict[str, Any]:
    """The statistics the validate step stored with the version, else computed now (and stored for the next run)."""
    stored = read_statistics(config.train_data_uri, config, config.storage_options)
    if stored is not None:
        return stored
    statistics = compute_statistics(config, manifest, fs, source=config.train_data_uri)
    write_statistics(config.train_data_uri, config, statistics, config.storage_options)
    return statistics
