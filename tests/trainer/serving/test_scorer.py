"""trainpipe_trainer.serving.scorer (+ export): the numpy pyfunc scores exactly like the torch model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.probes import probe
from trainpipe_trainer.config import FeatureTransform, ModelConfig
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models.mlp.export import write_serving_artifacts
from trainpipe_trainer.models.mlp.network import build_mlp
from trainpipe_trainer.models.mlp.scorer import MLPScorer
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.serving.export import weights_sha256

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
        "import sys, trainpipe_trainer, trainpipe_trainer.config, trainpipe_trainer.models.mlp.scorer, "
        "trainpipe_trainer.preprocessing, trainpipe_trainer.__main__\n"
        "assert not {'torch', 'mlflow', 'airflow'} & set(sys.modules), 'heavy import'\n"
        "import trainpipe_trainer.trainer\n"
        "assert 'mlflow' not in sys.modules and 'airflow' not in sys.modules, 'heavy import'\n"
    )
    probe(code, check=True)


CLASSES = ("setosa", "versicolor", "virginica")


def _multiclass_scorer(tmp_path: Path, frame: pd.DataFrame) -> tuple[torch.nn.Module, MLPScorer]:
    torch.manual_seed(0)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(8,)), n_outputs=len(CLASSES)).eval()
    artifacts = write_serving_artifacts(model, transformer=_transformer(frame), task="multiclass_classification",
                                        directory=str(tmp_path), classes=CLASSES)
    return model, MLPScorer.from_artifacts(artifacts)


def test_multiclass_scorer_is_the_softmax_of_the_torch_forward(tmp_path: Path) -> None:
    frame = _frame(40)
    model, scorer = _multiclass_scorer(tmp_path, frame)
    with torch.no_grad():
        inputs = torch.tensor(scorer.feature_matrix(frame), dtype=torch.float32)
        expected = torch.softmax(model(inputs), dim=-1)
    probabilities = scorer.score(frame)
    assert probabilities.shape == (40, 3)
    np.testing.assert_allclose(probabilities, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_multiclass_softmax_stays_finite_for_huge_logits(tmp_path: Path) -> None:
    frame = _frame(5)
    _, scorer = _multiclass_scorer(tmp_path, frame)
    # Logits in the thousands: exp of them overflows unless the row's largest is subtracted first.
    weight, bias = scorer.layers[-1]
    loud = MLPScorer(task=scorer.task, transformer=scorer.transformer, classes=scorer.classes,
                     layers=(*scorer.layers[:-1], (weight * 1e4, bias)))
    probabilities = loud.score(frame)
    assert np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)


def test_multiclass_prediction_is_the_class_then_one_probability_per_class(tmp_path: Path) -> None:
    frame = _frame(30).set_index(pd.RangeIndex(100, 130))
    _, scorer = _multiclass_scorer(tmp_path, frame)
    served = scorer.prediction(frame)
    assert list(served.columns) == ["label", "probability_setosa", "probability_versicolor", "probability_virginica"]
    assert served.index.equals(frame.index)
    probabilities = served.iloc[:, 1:].to_numpy()
    np.testing.assert_array_equal(probabilities, scorer.score(frame))
    assert served["label"].tolist() == [CLASSES[i] for i in probabilities.argmax(axis=1)]


def test_other_tasks_serve_their_scores_unchanged(tmp_path: Path) -> None:
    frame = _frame(10)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,)))
    artifacts = write_serving_artifacts(model, transformer=_transformer(frame), task="binary_classification",
                                        directory=str(tmp_path))
    scorer = MLPScorer.from_artifacts(artifacts)
    np.testing.assert_array_equal(scorer.prediction(frame), scorer.score(frame))


def test_a_multiclass_scorer_needs_one_output_per_class(tmp_path: Path) -> None:
    frame = _frame(5)
    _, scorer = _multiclass_scorer(tmp_path, frame)
    with pytest.raises(ValueError, match=r"one score per class \(2\), it produces 3"):
        MLPScorer(task=scorer.task, transformer=scorer.transformer, layers=scorer.layers, classes=CLASSES[:2])


def test_a_serving_format_3_model_is_still_read(tmp_path: Path) -> None:
    frame = _frame(8)
    model = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,)))
    artifacts = write_serving_artifacts(model, transformer=_transformer(frame), task="regression",
                                        directory=str(tmp_path))
    meta = json.loads(Path(artifacts["preprocessing"]).read_text())
    current = MLPScorer.from_artifacts(artifacts).score(frame)
    del meta["classes"]
    meta["format_version"] = 3
    Path(artifacts["preprocessing"]).write_text(json.dumps(meta))
    np.testing.assert_array_equal(MLPScorer.from_artifacts(artifacts).score(frame), current)


def test_a_single_output_mlp_draws_the_same_initial_weights_as_before_multiclass() -> None:
    # The layout every single-output model had: its initial weights (and so the pinned weights hashes)
    # and what it consumes from the generator must not change.
    torch.manual_seed(0)
    before = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(4, 1))
    after_before = torch.rand(1)
    torch.manual_seed(0)
    now = build_mlp(n_features=3, config=ModelConfig(hidden_layers=(4,), dropout=0.1))
    assert weights_sha256(now) == weights_sha256(before)
    assert torch.equal(torch.rand(1), after_before)
