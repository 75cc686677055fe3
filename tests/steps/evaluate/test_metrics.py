"""trainpipe.steps.evaluate.metrics against small hand-computed cases (real sklearn)."""

from __future__ import annotations

import math

import pytest

from tests.probes import probe
from trainpipe.errors import SpecError
from trainpipe.steps.evaluate.metrics import (
    MetricInputError,
    check_metric,
    compute_metrics,
    higher_is_better,
    is_known_metric,
    metric_names,
    suggest_metric,
)


def test_metric_names_per_task() -> None:
    assert metric_names("binary_classification") == [
        "auc", "f1", "accuracy", "precision", "recall", "log_loss", "pr_auc",
    ]  # fmt: skip
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
    ],
)
def test_suggest_metric(task: str, name: str, expected: str | None) -> None:
    assert suggest_metric(task, name) == expected


def test_check_metric_names_field_suggestion_and_other_task() -> None:
    with pytest.raises(SpecError, match=r"evaluate\.metric: unknown binary_classification metric 'acu'.*did you mean 'auc'\?"):
        check_metric("binary_classification", "acu", field_path="evaluate.metric")
    with pytest.raises(SpecError, match=r"'rmse' is a regression metric"):
        check_metric("binary_classification", "rmse")


@pytest.mark.parametrize(
    ("name", "expected"),
    [("auc", True), ("r2", True), ("ndcg@10", True), ("log_loss", False), ("rmse", False), ("mae", False)],
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
