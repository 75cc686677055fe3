"""Feature extraction and standardisation shared by training and serving (numpy/pandas only).

One implementation for both sides, so the served model sees features exactly as training did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainpipe_trainer.errors import TrainerDataError


def require_columns(frame: pd.DataFrame, columns: tuple[str, ...] | list[str], *, source: str, role: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        present = ", ".join(map(str, frame.columns[:20]))
        raise TrainerDataError(
            f"{source}: missing {role} column(s) {', '.join(map(repr, missing))}; columns present: {present}"
        )


def feature_matrix(frame: pd.DataFrame, features: tuple[str, ...], *, source: str) -> np.ndarray:
    """The feature columns, in config order, as float64; rejects missing, non-numeric and NaN columns."""
    require_columns(frame, features, source=source, role="feature")
    for name in features:
        column = frame[name]
        if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)):
            raise TrainerDataError(f"{source}: feature column {name!r} must be numeric, got dtype {column.dtype}")
        nulls = int(column.isna().sum())
        if nulls:
            raise TrainerDataError(
                f"{source}: feature column {name!r} has {nulls} missing value(s); impute them upstream"
            )
    return frame.loc[:, list(features)].to_numpy(dtype=np.float64)


@dataclass(kw_only=True, slots=True, frozen=True)
class Standardizer:
    """Per-feature mean/std fitted on the training data; a constant feature keeps std 1."""

    features: tuple[str, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.features) == len(self.means) == len(self.stds):
            raise ValueError("Standardizer: features, means and stds must have the same length")
        if any(s <= 0 for s in self.stds):
            raise ValueError("Standardizer: stds must be > 0")

    @classmethod
    def fit(cls, matrix: np.ndarray, features: tuple[str, ...]) -> Standardizer:
        means = matrix.mean(axis=0)
        stds = matrix.std(axis=0)
        # A constant column would divide by zero; centring it to 0 is all that is useful.
        stds = np.where(stds > 1e-12, stds, 1.0)
        return cls(features=features, means=tuple(map(float, means)), stds=tuple(map(float, stds)))

    def transform(self, matrix: np.ndarray) -> np.ndarray:
        return (matrix - np.asarray(self.means)) / np.asarray(self.stds)

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "means": list(self.means), "stds": list(self.stds)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Standardizer:
        return cls(features=tuple(raw["features"]), means=tuple(raw["means"]), stds=tuple(raw["stds"]))
