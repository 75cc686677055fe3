"""trainpipe_trainer.serving.scorer (+ export): the numpy pyfunc scores exactly like the torch model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.probes import probe
from trainpipe_trainer.config import FeatureTransform, ModelConfig
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.model import build_mlp
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.serving.export import weights_sha256, write_serving_artifacts
from trainpipe_trainer.serving.scorer import MLPScorer

FEATURES = ("x1", "x2", "x3")


def _transformer(frame: pd.DataFrame) -> FeatureTransformer:
    return FeatureTransformer.fit(frame, tuple(FeatureTransform(feature=f) for f in FEATURES), source="train")


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame(rng.normal(loc=[0.0, 5.0, -2.0], scale=[1.0, 10.0, 0.1], size=(n, 3)), columns=FEATURES)


@pytest.mark.parametrize("task", ["binary_classification", "regression", "ranking"])
def test_numpy_scorer_matches_torch_forward(task: str, tmp_path: Path) -> None:
    frame = _frame(50)
    transformer = _transformer(frame)
    torch.manual_seed(0)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(8, 4), dropout=0.3)).eval()
    artifacts = write_serving_artifacts(model, transformer=transformer, task=task, directory=str(tmp_path))
    scorer = MLPScorer.load(weights_path=artifacts["weights"], preprocessing_path=artifacts["preprocessing"])

    with torch.no_grad():
        inputs = torch.tensor(transformer.transform(frame, source="test"), dtype=torch.float32)
        expected = model(inputs).squeeze(-1)
    if task == "binary_classification":
        expected = torch.sigmoid(expected)
    # Extra and reordered columns are fine: the scorer selects the features by name.
    scores = scorer.score(frame[["x3", "x1", "x2"]].assign(extra=1))
    assert scores.shape == (50,)
    np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_scorer_names_missing_feature(tmp_path: Path) -> None:
    frame = _frame(5)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(2,)))
    artifacts = write_serving_artifacts(
        model, transformer=_transformer(frame), task="regression", directory=str(tmp_path)
    )
    scorer = MLPScorer.load(weights_path=artifacts["weights"], preprocessing_path=artifacts["preprocessing"])
    with pytest.raises(TrainerDataError, match="model input: missing feature column\\(s\\) 'x2'"):
        scorer.score(frame.drop(columns="x2"))


def test_weights_sha256_tracks_every_bit() -> None:
    torch.manual_seed(0)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,)))
    torch.manual_seed(0)
    same = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,)))
    assert weights_sha256(model) == weights_sha256(same)
    with torch.no_grad():
        same[0].bias[0] = torch.nextafter(same[0].bias[0], torch.tensor(1.0))
    assert weights_sha256(model) != weights_sha256(same)


def test_import_boundaries() -> None:
    """The provider imports the config without torch; serving needs neither torch nor mlflow;
    only rank 0 imports mlflow (when it starts tracking), so the training modules must not."""
    code = (
        "import sys, trainpipe_trainer, trainpipe_trainer.config, trainpipe_trainer.serving.scorer, "
        "trainpipe_trainer.preprocessing, trainpipe_trainer.__main__\n"
        "assert not {'torch', 'mlflow', 'airflow'} & set(sys.modules), 'heavy import'\n"
        "import trainpipe_trainer.trainer\n"
        "assert 'mlflow' not in sys.modules and 'airflow' not in sys.modules, 'heavy import'\n"
    )
    probe(code, check=True)
