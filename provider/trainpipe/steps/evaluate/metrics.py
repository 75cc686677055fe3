"""Evaluation metrics a spec may name, per task type, and how to compute them.

=============================  =================================================================
task                           metric names
=============================  =================================================================
``binary_classification``      ``auc``, ``f1``, ``accuracy``, ``precision``, ``recall``,
                               ``log_loss``, ``pr_auc``
``multiclass_classification``  ``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``log_loss``
``regression``                 ``rmse``, ``mae``, ``r2``
``ranking``                    ``ndcg@K``, ``map@K``, ``mrr@K`` with K a positive integer
                               (``ndcg@10``)
=============================  =================================================================

Lower is better only for ``log_loss``, ``rmse`` and ``mae``.

Ranking metrics are computed per query (``groups`` holds the query id of each row) and averaged
over queries, every query weighing the same:

* a document is *relevant* when its relevance label is > 0 (``map`` and ``mrr``); ``ndcg`` uses the
  graded label as gain (``sklearn.metrics.ndcg_score``, ties in the scores averaged);
* queries with no relevant document are skipped: every ordering of them is equally good and
  nDCG is 0/0 there. If no query has a relevant document, :class:`MetricInputError` is raised;
* a query with a single document scores 1.0 (its only ordering is the ideal one);
* ``map@K`` divides by ``min(K, relevant documents in the query)``; ``mrr@K`` is 0 for a query
  whose first relevant document is below K;
* for ``map`` and ``mrr``, documents with equal scores are ordered worst first (pessimistic), so a
  constant scorer cannot look good.

Multiclass metrics take ``y_true`` as the label column (each value's text is its class name,
``trainpipe_trainer.preprocessing.label_texts``), ``y_score`` as the [N, K] matrix of class
probabilities and ``classes`` as the K class names of its columns. The predicted class is the most
probable one (the first in class order on a tie), as the served model's ``label`` column says:

* ``log_loss`` is over all K classes, whichever the rows hold;
* ``balanced_accuracy`` is the mean recall over the classes the rows hold;
* ``macro_f1`` is the mean F1 over the classes the rows hold or the model predicts: a class that is
  neither has no F1 (0/0) and is left out rather than counted as 0.

So a slice that lacks some classes still has every metric, judged on the classes it has.

sklearn and numpy are imported inside :func:`compute_metrics`: importing this module is cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

from trainpipe.spec.metric_names import (  # noqa: F401 - the metric API in one place
    MetricInputError,
    check_metric,
    check_task,
    higher_is_better,
    is_known_metric,
    metric_names,
    suggest_metric,
)


def _as_1d(label: str, values: ArrayLike, dtype: Any) -> np.ndarray:
    import numpy as np

    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise MetricInputError(f"{label}: cannot be read as numbers ({error})") from None
    if array.ndim != 1:
        raise MetricInputError(f"{label}: expected a 1-d array, got shape {array.shape}")
    if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
        raise MetricInputError(f"{label}: contains NaN or infinite values")
    return array


def compute_metrics(
    task: str,
    names: Sequence[str],
    *,
    y_true: ArrayLike,
    y_score: ArrayLike,
    groups: ArrayLike | None = None,
    threshold: float = 0.5,
    classes: Sequence[str] = (),
) -> dict[str, float]:
    """Compute every metric in ``names`` for ``task``; returns name -> value in the given order.

    * ``binary_classification``: ``y_true`` is 0/1, ``y_score`` the probability of class 1.
      ``f1``, ``accuracy``, ``precision`` and ``recall`` predict 1 when ``y_score >= threshold``
      (precision/recall/f1 are 0 when undefined). ``auc`` and ``pr_auc`` need both classes present.
    * ``multiclass_classification``: ``y_true`` the label values, ``y_score`` the [N, K] probabilities
      of ``classes`` (required; see the module docstring).
    * ``regression``: ``y_true`` and ``y_score`` are real values.
    * ``ranking``: ``y_true`` is the relevance (>= 0), ``y_score`` the model score and ``groups``
      the query id of each row (required; rows of a query need not be contiguous). See the module
      docstring for how queries are averaged.

    Unknown names raise :class:`~trainpipe.errors.SpecError`; inputs that cannot give a metric
    (length mismatch, one class only, no relevant document) raise :class:`MetricInputError`.
    """
    check_task(task)
    if isinstance(names, str):
        names = [names]
    for name in names:
        check_metric(task, name)
    import numpy as np

    if task == "multiclass_classification":
        return _multiclass(names, *class_inputs(y_true, y_score, classes))
    if task == "causal_lm":
        return _causal_lm(names, y_score)
    true = _as_1d("y_true", y_true, np.float64)
    score = _as_1d("y_score", y_score, np.float64)
    if true.shape != score.shape:
        raise MetricInputError(f"y_true has {true.size} values but y_score has {score.size}")
    if true.size == 0:
        raise MetricInputError("y_true and y_score are empty")

    if task == "binary_classification":
        return _binary(names, true, score, threshold)
    if task == "regression":
        return _regression(names, true, score)
    if groups is None:
        raise MetricInputError("ranking metrics need groups= (the query id of every row)")
    group_ids = np.asarray(groups)
    if group_ids.shape != true.shape:
        raise MetricInputError(f"groups has {group_ids.size} values but y_true has {true.size}")
    return _ranking(names, true, score, group_ids)


def _binary(names: Sequence[str], true: np.ndarray, score: np.ndarray, threshold: float) -> dict[str, float]:
    import numpy as np
    from sklearn import metrics as skm

    if not np.all((true == 0) | (true == 1)):
        raise MetricInputError("y_true: binary classification labels must be 0 or 1")
    if np.any((score < 0) | (score > 1)):
        raise MetricInputError("y_score: binary classification scores must be probabilities in [0, 1]")
    if not 0.0 <= threshold <= 1.0:
        raise MetricInputError(f"threshold: must be in [0, 1], got {threshold}")
    labels = true.astype(np.int64)
    predicted = (score >= threshold).astype(np.int64)
    both_classes = np.unique(labels).size == 2
    results: dict[str, float] = {}
    for name in names:
        if name in ("auc", "pr_auc") and not both_classes:
            raise MetricInputError(f"{name}: y_true holds only class {labels[0]}; it needs both 0 and 1")
        match name:
            case "auc":
                value = skm.roc_auc_score(labels, score)
            case "pr_auc":
                value = skm.average_precision_score(labels, score)
            case "log_loss":
                value = skm.log_loss(labels, score, labels=[0, 1])
            case "accuracy":
                value = skm.accuracy_score(labels, predicted)
            case "precision":
                value = skm.precision_score(labels, predicted, zero_division=0)
            case "recall":
                value = skm.recall_score(labels, predicted, zero_division=0)
            case "f1":
                value = skm.f1_score(labels, predicted, zero_division=0)
        results[name] = float(value)
    return results


# How far a row of class probabilities may sum from 1 (float32 softmax outputs); rows are then rescaled.
_PROBABILITY_SUM_TOLERANCE = 1e-3


def _causal_lm(names: Sequence[str], token_scores: ArrayLike) -> dict[str, float]:
    """Token-weighted over every row's target tokens: ``token_scores`` is [N, 3], per row the summed token
    cross-entropy, the number of target tokens and how many the model ranked first (what the served model
    answers, ``evaluate.token_scores``). ``loss`` is the mean token cross-entropy, ``perplexity`` its exp,
    ``token_accuracy`` the share of tokens predicted right; rows without a target token weigh nothing."""
    import numpy as np

    try:
        scores = np.asarray(token_scores, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise MetricInputError(f"y_score: cannot be read as token scores ({error})") from None
    if scores.ndim != 2 or scores.shape[1] != 3:
        raise MetricInputError(f"y_score: causal_lm takes [N, 3] token scores (loss_sum, tokens, correct), got shape "
                               f"{scores.shape}")
    loss_sum, tokens, correct = scores.sum(axis=0)
    if tokens <= 0:
        raise MetricInputError("no target token in these rows: a causal_lm metric is per token")
    loss = float(loss_sum / tokens)
    values = {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "token_accuracy": float(correct / tokens)}
    return {name: values[name] for name in names}


def class_inputs(y_true: ArrayLike, y_score: ArrayLike, classes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The class index of each row of ``y_true`` in ``classes`` and the checked [N, K] probabilities
    (each row summing to exactly 1). Raises :class:`MetricInputError` naming what does not fit."""
    import numpy as np
    import pandas as pd

    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import label_texts

    classes = tuple(classes)
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise MetricInputError(f"classes: multiclass metrics need two or more distinct class names, got {classes!r}")
    try:
        probabilities = np.asarray(y_score, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise MetricInputError(f"y_score: cannot be read as numbers ({error})") from None
    if probabilities.ndim != 2 or probabilities.shape[1] != len(classes):
        raise MetricInputError(f"y_score: expected one column per class ({len(classes)}), got shape "
                               f"{probabilities.shape}")
    if not np.all(np.isfinite(probabilities)) or np.any((probabilities < 0) | (probabilities > 1)):
        raise MetricInputError("y_score: class probabilities must be finite and in [0, 1]")
    sums = probabilities.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > _PROBABILITY_SUM_TOLERANCE):
        row = int(np.argmax(np.abs(sums - 1.0)))
        raise MetricInputError(f"y_score: each row's class probabilities must sum to 1; row {row} sums to "
                               f"{sums[row]:.6f}")
    try:
        # A Series keeps its dtype: whole floats (a label column read back with missing values) are "2", not "2.0".
        texts = label_texts(y_true if isinstance(y_true, pd.Series) else pd.Series(np.asarray(y_true)),
                            label="y_true", source="multiclass metrics")
    except TrainerDataError as error:
        raise MetricInputError(str(error)) from None
    if texts.shape[0] != probabilities.shape[0]:
        raise MetricInputError(f"y_true has {texts.shape[0]} values but y_score has {probabilities.shape[0]} rows")
    if texts.size == 0:
        raise MetricInputError("y_true and y_score are empty")
    index = {name: position for position, name in enumerate(classes)}
    unknown = sorted({text for text in texts.tolist() if text not in index})
    if unknown:
        raise MetricInputError(f"y_true holds classes the model gives no probability for: "
                               f"{', '.join(map(repr, unknown[:10]))}{' ...' if len(unknown) > 10 else ''}; "
                               f"its classes are {', '.join(map(repr, classes[:10]))}{' ...' if len(classes) > 10 else ''}")
    true = np.fromiter((index[text] for text in texts.tolist()), dtype=np.int64, count=texts.size)
    return true, probabilities / sums[:, None]


def _multiclass(names: Sequence[str], true: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    import numpy as np
    from sklearn import metrics as skm

    predicted = probabilities.argmax(axis=1)
    held = np.unique(true).tolist()
    held_or_predicted = np.union1d(true, predicted).tolist()
    results: dict[str, float] = {}
    for name in names:
        match name:
            case "accuracy":
                value = skm.accuracy_score(true, predicted)
            case "balanced_accuracy":
                # sklearn's balanced_accuracy_score takes no labels=: the same mean recall, with them explicit.
                value = skm.recall_score(true, predicted, labels=held, average="macro", zero_division=0)
            case "macro_f1":
                value = skm.f1_score(true, predicted, labels=held_or_predicted, average="macro", zero_division=0)
            case "log_loss":
                value = skm.log_loss(true, probabilities, labels=list(range(probabilities.shape[1])))
        results[name] = float(value)
    return results


def per_class_metrics(y_true: ArrayLike, y_score: ArrayLike, classes: Sequence[str]) -> list[dict[str, Any]]:
    """Precision, recall, F1 and support of every class, in class order (the predicted class is the most
    probable one): ``[{"class", "precision", "recall", "f1", "support"}]``. A value that is 0/0 is None:
    precision of a class never predicted, recall of a class the rows lack, F1 of a class that is neither."""
    import numpy as np
    from sklearn import metrics as skm

    true, probabilities = class_inputs(y_true, y_score, classes)
    precision, recall, f1, support = skm.precision_recall_fscore_support(
        true, probabilities.argmax(axis=1), labels=list(range(len(classes))), zero_division=np.nan)

    def defined(value: float) -> float | None:
        return None if np.isnan(value) else float(value)

    return [{"class": name, "precision": defined(precision[i]), "recall": defined(recall[i]), "f1": defined(f1[i]),
             "support": int(support[i])} for i, name in enumerate(classes)]


def class_confusion_matrix(y_true: ArrayLike, y_score: ArrayLike, classes: Sequence[str]) -> np.ndarray:
    """The [K, K] counts of rows by actual class (row) and predicted class (column), in class order."""
    from sklearn import metrics as skm

    true, probabilities = class_inputs(y_true, y_score, classes)
    return skm.confusion_matrix(true, probabilities.argmax(axis=1), labels=list(range(len(classes))))


def _regression(names: Sequence[str], true: np.ndarray, score: np.ndarray) -> dict[str, float]:
    from sklearn import metrics as skm

    results: dict[str, float] = {}
    for name in names:
        match name:
            case "rmse":
                value = skm.root_mean_squared_error(true, score)
            case "mae":
                value = skm.mean_absolute_error(true, score)
            case "r2":
                if true.size < 2:
                    raise MetricInputError("r2: needs at least two samples")
                value = skm.r2_score(true, score)
        results[name] = float(value)
    return results


def _ranking(names: Sequence[str], true: np.ndarray, score: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    import numpy as np

    if np.any(true < 0):
        raise MetricInputError("y_true: relevance labels must be >= 0")
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    queries = [
        (true[idx], score[idx])
        for idx in np.split(order, starts[1:])
        if np.any(true[idx] > 0)  # queries without a relevant document are skipped
    ]
    if not queries:
        raise MetricInputError("ranking metrics: no query has a document with relevance > 0")
    results: dict[str, float] = {}
    for name in names:
        base, _, k_text = name.partition("@")
        k = int(k_text)
        per_query = {"ndcg": _ndcg_at_k, "map": _average_precision_at_k, "mrr": _reciprocal_rank_at_k}[base]
        results[name] = float(math.fsum(per_query(rel, sc, k) for rel, sc in queries) / len(queries))
    return results


def _ndcg_at_k(relevance: np.ndarray, score: np.ndarray, k: int) -> float:
    from sklearn.metrics import ndcg_score

    if relevance.size == 1:
        return 1.0
    return float(ndcg_score(relevance[None, :], score[None, :], k=k))


def _pessimistic_order(relevance: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Relevance of the documents by descending score; among equal scores, least relevant first."""
    import numpy as np

    return relevance[np.lexsort((relevance, -score))]


def _average_precision_at_k(relevance: np.ndarray, score: np.ndarray, k: int) -> float:
    import numpy as np

    hits = (_pessimistic_order(relevance, score) > 0)[:k]
    relevant_total = int(np.count_nonzero(relevance > 0))
    precision_at_hits = np.cumsum(hits)[hits] / (np.flatnonzero(hits) + 1)
    return float(precision_at_hits.sum() / min(k, relevant_total))


def _reciprocal_rank_at_k(relevance: np.ndarray, score: np.ndarray, k: int) -> float:
    import numpy as np

    hits = np.flatnonzero(_pessimistic_order(relevance, score)[:k] > 0)
    return 1.0 / (hits[0] + 1) if hits.size else 0.0


# ---------------------------------------------------------------------------------------------
# slices

MISSING_SLICE = "(missing)"
"""The slice of the rows whose slice column is empty (None or NaN)."""


def slice_labels(values: ArrayLike) -> np.ndarray:
    """The slice of each row as text: ``str(value)``, or :data:`MISSING_SLICE` for a missing value."""
    import pandas as pd

    series = pd.Series(values, dtype=object) if not isinstance(values, pd.Series) else values.astype(object)
    return series.astype(str).where(series.notna(), MISSING_SLICE).to_numpy()


def slice_metrics(
    task: str,
    names: Sequence[str],
    *,
    y_true: ArrayLike,
    y_score: ArrayLike,
    slice_values: ArrayLike,
    groups: ArrayLike | None = None,
    threshold: float = 0.5,
    classes: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Every metric in ``names`` on the rows of each slice value, sorted by the value's text.

    Returns ``[{"value": str, "rows": int, "metrics": {name: float | None}, "undefined": {name: reason}}]``.
    A metric that a slice cannot give (``auc`` on a slice holding one class, ``r2`` on one row, a
    ranking slice without a relevant document) is None there, with the reason in ``undefined``.
    A multiclass slice that lacks some classes has every metric (see the module docstring);
    ``y_score`` is then the [N, K] probabilities of ``classes``. Ranking slices keep the rows of the
    value and average over the queries among them, so a slice column should be constant within a query.
    """
    import numpy as np

    labels = slice_labels(slice_values)
    true, score = np.asarray(y_true), np.asarray(y_score)
    group_ids = np.asarray(groups) if groups is not None else None
    if labels.shape != true.shape:
        raise MetricInputError(f"slice_values has {labels.size} values but y_true has {true.size}")
    results = []
    for value in sorted(set(labels.tolist())):
        rows = labels == value
        values: dict[str, float | None] = {}
        undefined: dict[str, str] = {}
        inputs = dict(y_true=true[rows], y_score=score[rows],
                      groups=group_ids[rows] if group_ids is not None else None, threshold=threshold,
                      classes=classes)
        try:
            values = dict(compute_metrics(task, names, **inputs))
        except MetricInputError:
            # One metric the slice cannot give: the others still can, one by one.
            for name in names:
                try:
                    values[name] = compute_metrics(task, [name], **inputs)[name]
                except MetricInputError as error:
                    values[name] = None
                    undefined[name] = str(error)
        results.append({"value": value, "rows": int(rows.sum()), "metrics": values, "undefined": undefined})
    return results


def worst_slice(name: str, slices: dict[str, list[dict[str, Any]]], model: str = "metrics") -> tuple[str, dict[str, Any]] | None:
    """``(column, slice)`` with the worst value of metric ``name`` over every slice of every column:
    the lowest, or the highest where lower is better (:func:`higher_is_better`). Slices where the
    metric is undefined are left out; None when it is undefined everywhere. ``model`` is the key of a
    slice's metrics (``"metrics"`` as :func:`slice_metrics` returns them, or e.g. ``"candidate"``)."""
    defined = [(column, entry) for column, entries in slices.items() for entry in entries
               if (entry.get(model) or {}).get(name) is not None]
    if not defined:
        return None
    pick = min if higher_is_better(name) else max
    return pick(defined, key=lambda item: item[1][model][name])


def ndcg_curve(y_true: ArrayLike, y_score: ArrayLike, groups: ArrayLike, ks: Sequence[int]) -> list[float]:
    """``ndcg@k`` for every k of ``ks`` at once, equal to :func:`compute_metrics`' values (same query
    rules, sklearn's tie averaging) at a fraction of the cost: one sort per query for all k."""
    import numpy as np

    true = _as_1d("y_true", y_true, np.float64)
    score = _as_1d("y_score", y_score, np.float64)
    group_ids = np.asarray(groups)
    positions = np.asarray(ks, dtype=np.int64) - 1
    order = np.argsort(group_ids, kind="stable")
    sorted_groups = group_ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    totals = np.zeros(positions.size)
    queries = 0
    for idx in np.split(order, starts[1:]):
        relevance, scores = true[idx], score[idx]
        if not np.any(relevance > 0):
            continue  # as in compute_metrics: no relevant document, no nDCG
        queries += 1
        if relevance.size == 1:
            totals += 1.0
            continue
        ranked = np.argsort(-scores, kind="stable")
        # Tied scores share the mean gain of their group (sklearn's ignore_ties=False).
        _, tie_group, tie_sizes = np.unique(-scores[ranked], return_inverse=True, return_counts=True)
        gains = (np.bincount(tie_group, weights=relevance[ranked]) / tie_sizes)[tie_group]
        discounts = 1.0 / np.log2(np.arange(2, relevance.size + 2))
        dcg = np.cumsum(gains * discounts)
        ideal = np.cumsum(np.sort(relevance)[::-1] * discounts)
        at = np.minimum(positions, relevance.size - 1)
        totals += dcg[at] / ideal[at]
    if not queries:
        raise MetricInputError("ranking metrics: no query has a document with relevance > 0")
    return (totals / queries).tolist()
