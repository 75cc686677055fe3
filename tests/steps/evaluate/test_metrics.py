"""trainpipe.steps.evaluate.metrics against small hand-computed cases (real sklearn)."""

from __future__ import annotations

import math

import pytest

from tests.probes import probe
from trainpipe.errors import SpecError
from trainpipe.steps.evaluate.metrics import (
    MetricInputError,
    check_metric,
    class_confusion_matrix,
    compute_metrics,
    higher_is_better,
    is_known_metric,
    metric_names,
    per_class_metrics,
    slice_metrics,
    suggest_metric,
    worst_slice,
)


def test_metric_names_per_task() -> None:
    assert metric_names("binary_classification") == [
        "auc", "f1", "accuracy", "precision", "recall", "log_loss", "pr_auc",
    ]  # fmt: skip
    assert metric_names("multiclass_classification") == ["accuracy", "balanced_accuracy", "macro_f1", "log_loss"]
    assert metric_names("regression") == ["rmse", "mae", "r2"]
    assert metric_names("ranking") == ["ndcg@K", "map@K", "mrr@K"]


@pytest.mark.parametrize(
    ("task", "name", "known"),
    [
        ("binary_classification", "auc", True),
        ("binary_classification", "rmse", False),
        ("regression", "r2", True),
        ("ranking", "ndcg@10", True),
        ("ranking", "mrr@1", True),
        ("ranking", "ndcg", False),
        ("ranking", "ndcg@0", False),
        ("ranking", "ndcg@K", False),
        ("ranking", "ndcg@-3", False),
        ("ranking", "auc", False),
        ("binary_classification", "AUC", False),
        ("multiclass_classification", "macro_f1", True),
        ("multiclass_classification", "balanced_accuracy", True),
        ("multiclass_classification", "auc", False),
        ("binary_classification", "macro_f1", False),
    ],
)
def test_is_known_metric(task: str, name: str, known: bool) -> None:
    assert is_known_metric(task, name) is known


def test_unknown_task_is_a_spec_error_with_suggestion() -> None:
    with pytest.raises(SpecError, match=r"unknown task type 'rankng'.*did you mean 'ranking'\?"):
        metric_names("rankng")


@pytest.mark.parametrize(
    ("task", "name", "expected"),
    [
        ("binary_classification", "acuracy", "accuracy"),
        ("binary_classification", "AUC", "auc"),
        ("binary_classification", "logloss", "log_loss"),
        ("binary_classification", "pr-auc", "pr_auc"),
        ("regression", "rmes", "rmse"),
        ("ranking", "ndgc@5", "ndcg@5"),
        ("ranking", "ndcg", "ndcg@10"),
        ("ranking", "map@0", "map@10"),
        ("ranking", "ndcg@10", "ndcg@10"),
        ("binary_classification", "bleu", None),
        ("multiclass_classification", "f1", "macro_f1"),
        ("multiclass_classification", "recall", "balanced_accuracy"),
        ("multiclass_classification", "balanced-accuracy", "balanced_accuracy"),
    ],
)
def test_suggest_metric(task: str, name: str, expected: str | None) -> None:
    assert suggest_metric(task, name) == expected


def test_check_metric_names_field_suggestion_and_other_task() -> None:
    with pytest.raises(SpecError, match=r"evaluate\.metric: unknown binary_classification metric 'acu'.*did you mean 'auc'\?"):
        check_metric("binary_classification", "acu", field_path="evaluate.metric")
    with pytest.raises(SpecError, match=r"'rmse' is a regression metric"):
        check_metric("binary_classification", "rmse")
    with pytest.raises(SpecError, match=r"unknown multiclass_classification metric 'auc'; valid: accuracy, "
                                        r"balanced_accuracy, macro_f1, log_loss; 'auc' is a binary_classification"):
        check_metric("multiclass_classification", "auc")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("auc", True), ("r2", True), ("ndcg@10", True), ("log_loss", False), ("rmse", False), ("mae", False),
     ("macro_f1", True), ("balanced_accuracy", True)],
)
def test_higher_is_better(name: str, expected: bool) -> None:
    assert higher_is_better(name) is expected


def test_higher_is_better_rejects_unknown() -> None:
    with pytest.raises(SpecError, match="unknown metric 'ndcg'"):
        higher_is_better("ndcg")


def test_binary_metrics_hand_computed() -> None:
    # The textbook ROC example: 3 of the 4 (positive, negative) pairs are ordered right.
    got = compute_metrics(
        "binary_classification", ["auc"], y_true=[0, 0, 1, 1], y_score=[0.1, 0.4, 0.35, 0.8]
    )
    assert got == {"auc": pytest.approx(0.75)}

    got = compute_metrics("binary_classification", ["log_loss"], y_true=[1, 0], y_score=[0.9, 0.2])
    assert got["log_loss"] == pytest.approx(-(math.log(0.9) + math.log(0.8)) / 2)

    names = ["accuracy", "precision", "recall", "f1"]
    y_true, y_score = [0, 1, 1, 0], [0.2, 0.6, 0.4, 0.7]
    # threshold 0.5 -> predictions [0, 1, 0, 1]: tp=1 fp=1 fn=1 tn=1
    assert compute_metrics("binary_classification", names, y_true=y_true, y_score=y_score) == pytest.approx(
        {"accuracy": 0.5, "precision": 0.5, "recall": 0.5, "f1": 0.5}
    )
    # threshold 0.35 -> predictions [0, 1, 1, 1]: tp=2 fp=1 fn=0 tn=1
    got = compute_metrics("binary_classification", names, y_true=y_true, y_score=y_score, threshold=0.35)
    assert got == pytest.approx({"accuracy": 0.75, "precision": 2 / 3, "recall": 1.0, "f1": 0.8})

    # Average precision: positives ranked 1st and 3rd -> (1/1 + 2/3) / 2.
    got = compute_metrics("binary_classification", ["pr_auc"], y_true=[1, 0, 1, 0], y_score=[0.9, 0.8, 0.7, 0.1])
    assert got["pr_auc"] == pytest.approx((1 + 2 / 3) / 2)


def test_binary_metrics_keep_requested_order() -> None:
    got = compute_metrics("binary_classification", ["f1", "auc"], y_true=[0, 1], y_score=[0.2, 0.9])
    assert list(got) == ["f1", "auc"]


def test_binary_input_errors() -> None:
    with pytest.raises(MetricInputError, match="needs both 0 and 1"):
        compute_metrics("binary_classification", ["auc"], y_true=[1, 1], y_score=[0.2, 0.9])
    with pytest.raises(MetricInputError, match=r"probabilities in \[0, 1\]"):
        compute_metrics("binary_classification", ["f1"], y_true=[0, 1], y_score=[-2.0, 3.0])
    with pytest.raises(MetricInputError, match="must be 0 or 1"):
        compute_metrics("binary_classification", ["f1"], y_true=[0, 2], y_score=[0.1, 0.9])
    with pytest.raises(MetricInputError, match="y_true has 2 values but y_score has 3"):
        compute_metrics("binary_classification", ["f1"], y_true=[0, 1], y_score=[0.1, 0.9, 0.5])


# Five rows of three classes; the most probable class of each row is a, b, b, c, a:
# a: predicted twice (rows 0, 4), right once, 2 rows -> precision 1/2, recall 1/2, F1 1/2
# b: predicted twice (rows 1, 2), right once, 2 rows -> precision 1/2, recall 1/2, F1 1/2
# c: predicted once (row 3), right, 1 row            -> precision 1,   recall 1,   F1 1
CLASSES = ("a", "b", "c")
Y_TRUE = ["a", "a", "b", "c", "b"]
PROBABILITIES = [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.7, 0.2], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]]


def test_multiclass_metrics_hand_computed() -> None:
    got = compute_metrics("multiclass_classification", ["accuracy", "balanced_accuracy", "macro_f1", "log_loss"],
                          y_true=Y_TRUE, y_score=PROBABILITIES, classes=CLASSES)

    assert got == pytest.approx({
        "accuracy": 3 / 5,
        "balanced_accuracy": (1 / 2 + 1 / 2 + 1) / 3,
        "macro_f1": (1 / 2 + 1 / 2 + 1) / 3,
        # The probability each row gives its own class: 0.6, 0.2, 0.7, 0.4, 0.4.
        "log_loss": -(math.log(0.6) + math.log(0.2) + math.log(0.7) + math.log(0.4) + math.log(0.4)) / 5,
    })


def test_per_class_metrics_and_confusion_matrix_hand_computed() -> None:
    assert per_class_metrics(Y_TRUE, PROBABILITIES, CLASSES) == [
        {"class": "a", "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2},
        {"class": "b", "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2},
        {"class": "c", "precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
    ]
    # Rows: actual a, b, c; columns: predicted a, b, c.
    assert class_confusion_matrix(Y_TRUE, PROBABILITIES, CLASSES).tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1]]


def test_a_class_the_rows_lack_has_no_recall_and_one_never_predicted_no_precision() -> None:
    rows = per_class_metrics(["a", "a", "b"], [[0.9, 0.1, 0.0], [0.1, 0.9, 0.0], [0.2, 0.8, 0.0]], CLASSES)

    assert rows[2] == {"class": "c", "precision": None, "recall": None, "f1": None, "support": 0}
    never_predicted = per_class_metrics(["a", "c"], [[0.9, 0.1, 0.0], [0.9, 0.1, 0.0]], CLASSES)[2]
    assert never_predicted == {"class": "c", "precision": None, "recall": 0.0, "f1": 0.0, "support": 1}


def test_a_multiclass_slice_lacking_classes_is_judged_on_the_classes_it_has() -> None:
    slices = slice_metrics("multiclass_classification", ["accuracy", "balanced_accuracy", "macro_f1", "log_loss"],
                           y_true=Y_TRUE, y_score=PROBABILITIES, classes=CLASSES, slice_values=["x", "x", "y", "y", "y"])

    x, y = slices
    # Slice x: rows 0, 1 (both a), predicted a, b. Recall is over a only; F1 over a and b (b was predicted):
    # a: precision 1, recall 1/2 -> F1 2/3; b: a false positive -> F1 0. c is neither and left out.
    assert (x["value"], x["rows"], x["undefined"]) == ("x", 2, {})
    assert x["metrics"] == pytest.approx({"accuracy": 1 / 2, "balanced_accuracy": 1 / 2, "macro_f1": (2 / 3 + 0) / 2,
                                          "log_loss": -(math.log(0.6) + math.log(0.2)) / 2})
    # Slice y: rows 2, 3, 4 (b, c, b), predicted b, c, a.
    assert y["metrics"] == pytest.approx({"accuracy": 2 / 3, "balanced_accuracy": (1 / 2 + 1) / 2,
                                          "macro_f1": (0 + 2 / 3 + 1) / 3,
                                          "log_loss": -(math.log(0.7) + math.log(0.4) + math.log(0.4)) / 3})
    column, worst = worst_slice("log_loss", {"segment": slices})
    assert (column, worst["value"]) == ("segment", "x")  # log_loss: lower is better, so the worst is the highest


def test_multiclass_labels_are_read_as_class_names() -> None:
    # A label column read back as float (it had missing values elsewhere) still names classes "1" and "2".
    got = compute_metrics("multiclass_classification", ["accuracy"], y_true=[1.0, 2.0, 2.0],
                          y_score=[[0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], classes=("1", "2"))
    assert got == {"accuracy": pytest.approx(2 / 3)}
    # float32 probabilities that sum to 1 only approximately are accepted (and rescaled for log_loss).
    import numpy as np

    got = compute_metrics("multiclass_classification", ["log_loss"], y_true=["a", "b"], classes=("a", "b"),
                          y_score=np.asarray([[0.7, 0.3], [0.1, 0.9]], dtype=np.float32))
    assert got["log_loss"] == pytest.approx(-(math.log(0.7) + math.log(0.9)) / 2, rel=1e-6)


def test_multiclass_input_errors() -> None:
    def metrics(y_true, y_score, classes=("a", "b")):
        return compute_metrics("multiclass_classification", ["accuracy"], y_true=y_true, y_score=y_score,
                               classes=classes)

    with pytest.raises(MetricInputError, match="y_true holds classes the model gives no probability for: 'z'; "
                                               "its classes are 'a', 'b'"):
        metrics(["a", "z"], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(MetricInputError, match=r"expected one column per class \(2\), got shape \(2,\)"):
        metrics(["a", "b"], [0.5, 0.5])
    with pytest.raises(MetricInputError, match="row 1 sums to 0.800000"):
        metrics(["a", "b"], [[0.5, 0.5], [0.4, 0.4]])
    with pytest.raises(MetricInputError, match="two or more distinct class names"):
        metrics(["a"], [[1.0]], classes=("a",))
    with pytest.raises(MetricInputError, match="label column 'y_true' has missing values"):
        metrics(["a", None], [[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(MetricInputError, match="y_true has 1 values but y_score has 2 rows"):
        metrics(["a"], [[0.5, 0.5], [0.5, 0.5]])


def test_unknown_metric_in_compute_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"did you mean 'ndcg@10'\?"):
        compute_metrics("ranking", ["ndgc@10"], y_true=[1, 0], y_score=[0.3, 0.1], groups=[1, 1])


def test_regression_metrics_hand_computed() -> None:
    got = compute_metrics("regression", ["rmse", "mae", "r2"], y_true=[1, 2, 3], y_score=[1, 2, 5])
    # errors 0, 0, 2; variance of y_true around its mean is 2 -> r2 = 1 - 4/2
    assert got == pytest.approx({"rmse": math.sqrt(4 / 3), "mae": 2 / 3, "r2": -1.0})


def test_perfect_ranking_scores_one() -> None:
    got = compute_metrics(
        "ranking",
        ["ndcg@10", "map@10", "mrr@10"],
        y_true=[3, 2, 0, 1, 0, 2],
        y_score=[0.9, 0.8, 0.1, 0.5, 0.2, 0.7],
        groups=[1, 1, 1, 2, 2, 2],
    )
    assert got == pytest.approx({"ndcg@10": 1.0, "map@10": 1.0, "mrr@10": 1.0})


def test_ndcg_hand_computed() -> None:
    # Ranked relevance [0, 2, 1]; ideal [2, 1, 0]; gain = relevance, discount = log2(rank + 1).
    dcg = 0 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    got = compute_metrics("ranking", ["ndcg@3"], y_true=[0, 2, 1], y_score=[3.0, 2.0, 1.0], groups=[7, 7, 7])
    assert got["ndcg@3"] == pytest.approx(dcg / idcg)
    # At k=1 only the top document counts, and it is irrelevant.
    got = compute_metrics("ranking", ["ndcg@1"], y_true=[0, 2, 1], y_score=[3.0, 2.0, 1.0], groups=[7, 7, 7])
    assert got["ndcg@1"] == 0.0


def test_map_and_mrr_hand_computed() -> None:
    y_true, y_score, groups = [1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1], ["q"] * 4
    got = compute_metrics("ranking", ["map@4", "map@2", "mrr@4"], y_true=y_true, y_score=y_score, groups=groups)
    # map@4: hits at ranks 1 and 3 -> (1/1 + 2/3) / 2; map@2: one hit of min(2, 2) -> 1/2
    assert got == pytest.approx({"map@4": (1 + 2 / 3) / 2, "map@2": 0.5, "mrr@4": 1.0})
    got = compute_metrics("ranking", ["mrr@3", "mrr@2"], y_true=[0, 0, 2], y_score=[3, 2, 1], groups=[1, 1, 1])
    assert got == pytest.approx({"mrr@3": 1 / 3, "mrr@2": 0.0})


def test_ranking_averages_queries_and_skips_those_without_relevant_docs() -> None:
    # Rows of a query need not be contiguous. Query 1: mrr 1; query 2: mrr 1/2; query 3 has no
    # relevant document and is skipped; query 4 has a single (relevant) document and scores 1.
    got = compute_metrics(
        "ranking",
        ["mrr@5", "ndcg@5"],
        y_true=[1, 0, 0, 0, 1, 0, 0, 3],
        y_score=[0.9, 0.5, 0.8, 0.1, 0.7, 0.3, 0.2, 0.4],
        groups=[1, 2, 2, 1, 2, 3, 3, 4],
    )
    assert got["mrr@5"] == pytest.approx((1 + 1 / 2 + 1) / 3)
    ndcg_q2 = (1 / math.log2(3)) / 1.0
    assert got["ndcg@5"] == pytest.approx((1 + ndcg_q2 + 1) / 3)


def test_ranking_ties_are_pessimistic_for_map_and_mrr() -> None:
    got = compute_metrics("ranking", ["mrr@3", "map@3"], y_true=[1, 0, 0], y_score=[0.5, 0.5, 0.5], groups=[1, 1, 1])
    assert got == pytest.approx({"mrr@3": 1 / 3, "map@3": 1 / 3})


def test_ranking_input_errors() -> None:
    with pytest.raises(MetricInputError, match="need groups="):
        compute_metrics("ranking", ["ndcg@10"], y_true=[1, 0], y_score=[0.3, 0.1])
    with pytest.raises(MetricInputError, match="no query has a document with relevance > 0"):
        compute_metrics("ranking", ["ndcg@10"], y_true=[0, 0], y_score=[0.3, 0.1], groups=[1, 1])
    with pytest.raises(MetricInputError, match="groups has 1 values but y_true has 2"):
        compute_metrics("ranking", ["ndcg@10"], y_true=[1, 0], y_score=[0.3, 0.1], groups=[1])


def test_module_import_does_not_load_sklearn() -> None:

    code = (
        "import sys, trainpipe.steps.evaluate.metrics, trainpipe.demo, trainpipe.demo.synthetic; "
        "print([m for m in ('sklearn', 'numpy', 'pandas', 'airflow', 'torch') if m in sys.modules])"
    )
    out = probe(code, check=True).stdout
    assert out.strip() == "[]"
