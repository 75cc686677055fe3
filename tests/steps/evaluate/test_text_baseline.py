"""The baseline of a model with text columns: TF-IDF of words and word pairs, then the task's linear model, named so
in the evaluation's result and report. Real scikit-learn on small tables where the words decide the label."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.steps.evaluate.test_evaluate_multiclass import CANDIDATE_URI, REGISTRATION, _hook
from trainpipe.plan.model import EvaluationPlan
from trainpipe.settings import Settings
from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.baseline import baseline_model, baseline_scores
from trainpipe.steps.evaluate.evaluate import evaluate

GOOD = ["great", "lovely", "excellent", "superb", "wonderful"]
BAD = ["awful", "broken", "terrible", "refund", "useless"]
FILLER = ["the", "a", "product", "arrived", "box", "it", "was", "and", "my", "order", "this", "item"]


def _reviews(n: int, seed: int, *, classes: tuple[str, ...] = ("0", "1")) -> pd.DataFrame:
    """Each review: filler words and one or two words of its class's list (the third class: both lists' words
    together, so only a pair of words or their mix tells it); an unrelated numeric column; some missing texts."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(classes), n)
    texts = []
    for label in labels:
        words = list(rng.choice(FILLER, 6))
        if label == 2:
            words += [rng.choice(GOOD), rng.choice(BAD)]
        else:
            words += list(rng.choice(GOOD if label == 1 else BAD, rng.integers(1, 3)))
        rng.shuffle(words)
        texts.append(" ".join(words).capitalize() + ".")
    frame = pd.DataFrame({"review": texts, "noise": rng.normal(size=n)})
    frame.loc[rng.random(n) < 0.02, "review"] = None
    frame["label"] = labels if len(classes) == 2 else np.asarray(classes)[labels]
    return frame


def test_the_binary_baseline_reads_the_words_and_beats_chance_clearly():
    train, holdout = _reviews(600, 1), _reviews(300, 2)

    scores = baseline_scores("binary_classification", ("review", "noise"), "label", train, holdout,
                             text_features=("review",))

    found = metrics.compute_metrics("binary_classification", ["auc", "accuracy"],
                                    y_true=holdout["label"].to_numpy(), y_score=scores)
    assert found["auc"] > 0.9 and found["accuracy"] > 0.85
    # Without the declaration the column is one-hot over its 20 most frequent texts: no better than chance.
    plain = baseline_scores("binary_classification", ("review", "noise"), "label", train, holdout)
    assert metrics.compute_metrics("binary_classification", ["auc"], y_true=holdout["label"].to_numpy(),
                                   y_score=plain)["auc"] < 0.65


def test_the_multiclass_baseline_reads_the_words_in_the_candidate_s_class_order():
    classes = ("pos", "neg", "mixed")
    train, holdout = _reviews(900, 3, classes=classes), _reviews(300, 4, classes=classes)

    scores = baseline_scores("multiclass_classification", ("review",), "label", train, holdout, classes,
                             text_features=("review",))

    assert scores.shape == (300, 3) and np.allclose(scores.sum(axis=1), 1.0)
    found = metrics.compute_metrics("multiclass_classification", ["accuracy"], y_true=holdout["label"],
                                    y_score=scores, classes=classes)
    assert found["accuracy"] > 0.8


def test_a_text_column_without_a_word_adds_no_input():
    train, holdout = _reviews(200, 5), _reviews(50, 6)
    train["review"], holdout["review"] = "", None

    scores = baseline_scores("regression", ("review", "noise"), "label", train, holdout, text_features=("review",))
    assert scores.shape == (50,) and np.isfinite(scores).all()


@pytest.mark.parametrize(("task", "name"), [
    ("binary_classification", "TF-IDF + logistic regression"),
    ("multiclass_classification", "TF-IDF + multinomial logistic regression"),
    ("regression", "TF-IDF + ridge"),
])
def test_the_baseline_s_name_says_tf_idf_when_a_feature_is_text(task, name):
    assert baseline_model(task, ("review",)) == name
    assert baseline_model(task) == name.removeprefix("TF-IDF + ")


def test_evaluate_fits_the_tf_idf_baseline_for_the_plan_s_text_features(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    train, holdout = _reviews(600, 7), _reviews(200, 8)
    train.to_parquet(tmp_path / "train.parquet")
    holdout.to_parquet(tmp_path / "holdout.parquet")
    # A candidate that knows nothing: the baseline is the better model.
    hook = _hook({CANDIDATE_URI: np.full(len(holdout), 0.5)})
    plan = EvaluationPlan(task="binary_classification", features=("review", "noise"), label="label",
                          group_column=None, metrics=("auc",), decision_threshold=0.5, gates=(),
                          text_features=("review",))

    result = evaluate(plan, REGISTRATION, holdout_uri=str(tmp_path / "holdout.parquet"), model_uri=CANDIDATE_URI,
                      mlflow_run_id="run-1", hook=hook, settings=Settings.from_env(),  # type: ignore[arg-type]
                      train_uri=str(tmp_path / "train.parquet"))

    assert result["baseline_model"] == "TF-IDF + logistic regression"
    assert result["baseline"]["auc"] > 0.9 and result["below_baseline"] == ["auc"]
    assert hook.client.metrics["baseline_holdout_auc"] == result["baseline"]["auc"]
    report = b"".join(hook.client.artifacts.values()).decode(errors="replace")
    assert "TF-IDF + logistic regression" in report
