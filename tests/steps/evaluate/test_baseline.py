"""The evaluation's baseline model, gates that name it, and how the gate table and the run note show it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.state.run_notes import below_baseline_note, is_outcome_line
from trainpipe.steps.evaluate import metrics
from trainpipe.steps.evaluate.baseline import baseline_scores
from trainpipe.steps.evaluate.evaluate import below_baseline, check_gate
from trainpipe.steps.evaluate.gate_table import as_text, gate_table


def _gate(text: str):
    return EvaluationSpec(metrics=["auc", "rmse", "r2"], gates=[text]).gates[0]


def _table(n: int, seed: int, *, binary: bool) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"x": rng.normal(100, 30, n), "y": rng.normal(0, 1, n),
                          "city": rng.choice(["a", "b", "c"], n), "gap": rng.normal(0, 1, n)})
    frame.loc[rng.random(n) < 0.1, "gap"] = np.nan
    signal = 0.05 * (frame["x"] - 100) - 1.0 * frame["y"] + frame["city"].map({"a": 1.0, "b": 0.0, "c": -1.0})
    noise = rng.normal(0, 0.5, n)
    frame["label"] = (signal + noise > 0).astype(int) if binary else 200 + 40 * signal + 20 * noise
    return frame


@pytest.mark.parametrize("binary", [False, True])
def test_the_baseline_learns_the_linear_signal_from_the_train_split(binary):
    train, holdout = _table(2000, 1, binary=binary), _table(500, 2, binary=binary)
    task = "binary_classification" if binary else "regression"
    scores = baseline_scores(task, ("x", "y", "city", "gap"), "label", train, holdout)
    found = metrics.compute_metrics(task, ["auc"] if binary else ["r2"], y_true=holdout["label"].to_numpy(),
                                    y_score=scores)
    assert found[("auc" if binary else "r2")] > (0.9 if binary else 0.8)
    if binary:
        assert ((scores >= 0) & (scores <= 1)).all()  # probabilities, like the served classifier's


def _multiclass_table(n: int, seed: int) -> pd.DataFrame:
    """Three classes by which of three linear scores is largest (text labels, as users' classes often are)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"x": rng.normal(0, 1, n), "y": rng.normal(0, 1, n), "city": rng.choice(["a", "b"], n)})
    scores = np.stack([frame["x"], frame["y"], -frame["x"] - frame["y"] + (frame["city"] == "a")], axis=1)
    frame["label"] = np.asarray(["cat", "dog", "owl"])[(scores + rng.normal(0, 0.3, scores.shape)).argmax(axis=1)]
    return frame


def test_the_multiclass_baseline_is_a_multinomial_logistic_regression_in_the_candidates_class_order():
    train, holdout = _multiclass_table(2000, 1), _multiclass_table(500, 2)
    classes = ("owl", "cat", "dog")  # the candidate's order, not sorted

    scores = baseline_scores("multiclass_classification", ("x", "y", "city"), "label", train, holdout, classes)

    assert scores.shape == (500, 3) and np.allclose(scores.sum(axis=1), 1.0)
    found = metrics.compute_metrics("multiclass_classification", ["accuracy", "macro_f1"],
                                    y_true=holdout["label"], y_score=scores, classes=classes)
    assert found["accuracy"] > 0.8 and found["macro_f1"] > 0.8
    # Column 0 is owl's: the rows labelled owl are where it is highest.
    assert scores[holdout["label"].to_numpy() == "owl", 0].mean() > 0.6


def test_a_class_the_train_split_lacks_gets_no_probability_and_one_class_gets_all():
    train, holdout = _multiclass_table(600, 3), _multiclass_table(50, 4)
    classes = ("cat", "dog", "owl", "yak")

    scores = baseline_scores("multiclass_classification", ("x", "y"), "label", train, holdout, classes)
    assert (scores[:, 3] == 0).all() and np.allclose(scores.sum(axis=1), 1.0)
    only_cats = baseline_scores("multiclass_classification", ("x",), "label", train.assign(label="cat"), holdout,
                                classes)
    assert (only_cats == [1.0, 0.0, 0.0, 0.0]).all()


def test_a_train_label_outside_the_classes_is_named():
    train = _multiclass_table(50, 5)
    with pytest.raises(metrics.MetricInputError, match="train split: label column 'label' holds classes that are "
                                                       "not in the run's classes"):
        baseline_scores("multiclass_classification", ("x",), "label", train, train, ("cat", "dog"))


def test_a_one_class_train_split_gives_its_rate():
    train = _table(50, 3, binary=True).assign(label=1)
    scores = baseline_scores("binary_classification", ("x",), "label", train, _table(10, 4, binary=True))
    assert (scores == 1.0).all()


@pytest.mark.parametrize(("text", "value", "passed"), [
    ("rmse <= baseline", 10.0, True),
    ("rmse <= baseline", 10.01, False),
    ("auc >= baseline + 0.01", 0.81, True),
    ("auc >= baseline + 0.01", 0.8099, False),
    ("auc >= baseline - 0.02", 0.781, True),
])
def test_a_baseline_gate_compares_with_the_baseline_plus_its_margin(text, value, passed):
    metric = text.split()[0]
    baseline = {"rmse": 10.0, "auc": 0.80}
    outcome = check_gate(_gate(text), {metric: value}, None, None, baseline)
    assert outcome.passed is passed
    assert outcome.baseline == baseline[metric] and outcome.reference == "baseline"
    assert str(_gate(text)) == text


def test_a_baseline_gate_without_a_baseline_fails_saying_why():
    outcome = check_gate(_gate("rmse <= baseline"), {"rmse": 1.0}, None, None, None)
    assert not outcome.passed and outcome.note == "no baseline was fitted (no train split)"


def test_below_baseline_follows_each_metrics_direction():
    assert below_baseline({"rmse": 11.0, "r2": 0.6}, {"rmse": 10.0, "r2": 0.5}) == ["rmse"]
    assert below_baseline({"rmse": 9.0, "r2": 0.4}, {"rmse": 10.0, "r2": 0.5}) == ["r2"]
    assert below_baseline({"rmse": 9.0}, None) == []


def test_the_gate_table_has_a_baseline_column_and_the_note_names_the_loss():
    evaluation = {"candidate": {"rmse": 11.0, "r2": 0.4}, "champion": None, "champion_version": None,
                  "baseline": {"rmse": 10.0, "r2": 0.5}, "baseline_model": "ridge", "gates_passed": True,
                  "gates": [{"gate": "rmse <= baseline", "metric": "rmse", "passed": False, "note": "+1.000000 vs baseline",
                             "value": 11.0, "baseline": 10.0, "reference": "baseline"}]}
    lines = as_text(gate_table(evaluation)).splitlines()
    assert lines[0].split() == ["metric", "candidate", "champion", "(none)", "change", "baseline", "(ridge)", "gates"]
    assert lines[1].split()[:5] == ["rmse", "11.000000", "-", "-", "10.000000"]
    note = below_baseline_note("ridge", [("rmse", 11.0, 10.0), ("r2", 0.4, 0.5)])
    assert note == "below baseline (ridge): rmse 11.000000 vs 10.000000; r2 0.400000 vs 0.500000"
    # An extra line of the note, never the run's outcome (a fleet page reads the first line).
    assert not is_outcome_line(note)
    assert gate_table({**evaluation, "baseline": None}).baseline_model is None


def test_the_ranking_baseline_is_a_linear_scorer_of_the_relevance():
    rng = np.random.default_rng(5)

    def queries(n: int, first: int) -> pd.DataFrame:
        z = rng.normal(size=(n * 8, 2))
        return pd.DataFrame({"qid": np.repeat(np.arange(first, first + n), 8), "a": z[:, 0], "b": z[:, 1],
                             "label": np.clip(np.round(2 + 1.2 * z[:, 0] - 0.8 * z[:, 1]), 0, 4)})

    train, holdout = queries(60, 0), queries(20, 100)
    scores = baseline_scores("ranking", ("a", "b"), "label", train, holdout)
    found = metrics.compute_metrics("ranking", ["ndcg@5"], y_true=holdout["label"].to_numpy(), y_score=scores,
                                    groups=holdout["qid"].to_numpy())
    assert found["ndcg@5"] > 0.9
