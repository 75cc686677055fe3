"""trainpipe_trainer.preprocessing: the feature handling shared by training and serving."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainpipe_trainer.config import FeatureTransform
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.preprocessing import FeatureTransformer


def _plain(*features: str) -> tuple[FeatureTransform, ...]:
    return tuple(FeatureTransform(feature=f) for f in features)


def test_default_transform_centres_scales_and_keeps_constant_columns_finite() -> None:
    frame = pd.DataFrame({"a": [1.0, 3.0], "b": [5.0, 5.0], "c": [100.0, 300.0]})
    transformer = FeatureTransformer.fit(frame, _plain("a", "b", "c"), source="f")
    assert [e.std for e in transformer.encoders] == [1.0, 1.0, 100.0]
    np.testing.assert_allclose(transformer.transform(frame, source="f"), [[-1.0, 0.0, -1.0], [1.0, 0.0, 1.0]])
    assert FeatureTransformer.from_dict(transformer.to_dict()) == transformer


def test_feature_matrix_keeps_config_order() -> None:
    frame = pd.DataFrame({"b": [1, 2], "a": [3.5, 4.5], "other": ["x", "y"]})
    transformer = FeatureTransformer.fit(frame, tuple(FeatureTransform(feature=f, standardize=False) for f in "ab"),
                                         source="f")
    np.testing.assert_array_equal(transformer.transform(frame, source="f"), [[3.5, 1.0], [4.5, 2.0]])


def test_missing_feature_names_column_and_file() -> None:
    frame = pd.DataFrame({"a": [1.0]})
    with pytest.raises(TrainerDataError, match=r"s3://bucket/train\.parquet: missing feature column\(s\) 'b'"):
        FeatureTransformer.fit(frame, _plain("a", "b"), source="s3://bucket/train.parquet")


def test_non_numeric_and_undeclared_missing_values_are_rejected() -> None:
    with pytest.raises(TrainerDataError, match="feature column 'a' must be numeric.*declare it categorical"):
        FeatureTransformer.fit(pd.DataFrame({"a": ["x"]}), _plain("a"), source="f")
    with pytest.raises(TrainerDataError, match=r"feature column 'a' has 1 missing value\(s\); declare how to fill them "
                                               r"\(training.transforms.a.impute"):
        FeatureTransformer.fit(pd.DataFrame({"a": [1.0, None]}), _plain("a"), source="f")
