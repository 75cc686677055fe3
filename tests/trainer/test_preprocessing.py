"""trainpipe_trainer.preprocessing: the feature handling shared by training and serving."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.preprocessing import Standardizer, feature_matrix


def test_standardizer_centres_scales_and_keeps_constant_columns_finite() -> None:
    matrix = np.array([[1.0, 5.0, 100.0], [3.0, 5.0, 300.0]])
    standardizer = Standardizer.fit(matrix, ("a", "b", "c"))
    assert standardizer.stds == (1.0, 1.0, 100.0)
    np.testing.assert_allclose(standardizer.transform(matrix), [[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]])
    assert Standardizer.from_dict(standardizer.to_dict()) == standardizer


def test_feature_matrix_keeps_config_order() -> None:
    frame = pd.DataFrame({"b": [1, 2], "a": [3.5, 4.5], "other": ["x", "y"]})
    np.testing.assert_array_equal(feature_matrix(frame, ("a", "b"), source="f.parquet"), [[3.5, 1.0], [4.5, 2.0]])


def test_missing_feature_names_column_and_file() -> None:
    frame = pd.DataFrame({"a": [1.0]})
    with pytest.raises(TrainerDataError, match=r"s3://bucket/train\.parquet: missing feature column\(s\) 'b'"):
        feature_matrix(frame, ("a", "b"), source="s3://bucket/train.parquet")


def test_non_numeric_and_missing_values_are_rejected() -> None:
    with pytest.raises(TrainerDataError, match="feature column 'a' must be numeric"):
        feature_matrix(pd.DataFrame({"a": ["x"]}), ("a",), source="f")
    with pytest.raises(TrainerDataError, match="feature column 'a' has 1 missing value"):
        feature_matrix(pd.DataFrame({"a": [1.0, None]}), ("a",), source="f")
