"""The metric names a spec may use, per task type, and which way each is better.

The spec stage checks gate and metric names against this catalogue; ``trainpipe.steps.evaluate.metrics``
computes them. Airflow-free and numpy-free: importing it is cheap.
"""

from __future__ import annotations

import difflib
import re

from trainpipe.errors import SpecError, TrainpipeError
from trainpipe_trainer.config import TASK_TYPES

_PLAIN_METRICS: dict[str, tuple[str, ...]] = {
    "binary_classification": ("auc", "f1", "accuracy", "precision", "recall", "log_loss", "pr_auc"),
    "multiclass_classification": ("accuracy", "balanced_accuracy", "macro_f1", "log_loss"),
    "regression": ("rmse", "mae", "r2"),
    "ranking": (),
    # Token-weighted over the holdout's target tokens (a completion's, or every next token): perplexity is
    # exp(loss), loss the mean cross-entropy, token_accuracy the share of tokens the model ranks first.
    "causal_lm": ("perplexity", "token_accuracy", "loss"),
}
_AT_K_METRICS: dict[str, tuple[str, ...]] = {
    "binary_classification": (),
    "multiclass_classification": (),
    "regression": (),
    "ranking": ("ndcg", "map", "mrr"),
    "causal_lm": (),
}
# A name of another task that has a counterpart here which spelling alone would not suggest: a binary
# classifier's f1 and recall are, averaged over the classes, macro_f1 and balanced_accuracy.
_COUNTERPARTS: dict[str, dict[str, str]] = {
    "multiclass_classification": {"f1": "macro_f1", "recall": "balanced_accuracy"},
}
_LOWER_IS_BETTER = frozenset({"log_loss", "rmse", "mae", "perplexity", "loss"})
_AT_K = re.compile(r"^(?P<base>[a-z_]+)@(?P<k>[1-9][0-9]*)$")
_DEFAULT_K = 10


class MetricInputError(TrainpipeError, ValueError):
    """The labels, scores or groups given to :func:`compute_metrics` cannot produce the metric."""


def check_task(task: str) -> None:
    """Raise :class:`~trainpipe.errors.SpecError` unless ``task`` is a known task type (naming the nearest)."""
    if task not in TASK_TYPES:
        close = difflib.get_close_matches(str(task), TASK_TYPES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpecError(f"task: unknown task type {task!r}, expected one of {', '.join(TASK_TYPES)}{hint}")


def _parse(task: str, name: str) -> tuple[str, int | None] | None:
    """``(base, k)`` for a valid name of ``task`` (k is None for plain metrics), else None."""
    if name in _PLAIN_METRICS[task]:
        return name, None
    match = _AT_K.match(name)
    if match and match["base"] in _AT_K_METRICS[task]:
        return match["base"], int(match["k"])
    return None


def metric_names(task: str) -> list[str]:
    """The metric names valid for ``task``; ranking names are patterns such as ``ndcg@K``."""
    check_task(task)
    return [*_PLAIN_METRICS[task], *(f"{base}@K" for base in _AT_K_METRICS[task])]


def is_known_metric(task: str, name: str) -> bool:
    """Whether ``name`` (exactly, e.g. ``ndcg@10``) is a metric of ``task``."""
    check_task(task)
    return isinstance(name, str) and _parse(task, name) is not None


def suggest_metric(task: str, name: str) -> str | None:
    """The valid metric name of ``task`` nearest to ``name``, or None when nothing is close.

    Returns ``name`` itself when it is already valid. A ranking name keeps its ``@K`` when K is a
    positive integer (``ndgc@5`` -> ``ndcg@5``) and gets ``@10`` otherwise (``ndcg`` -> ``ndcg@10``).
    """
    check_task(task)
    if is_known_metric(task, name):
        return name
    text = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    base, _, k_text = text.partition("@")
    k = int(k_text) if k_text.isdigit() and int(k_text) > 0 else _DEFAULT_K
    candidates = {**{m: m for m in _PLAIN_METRICS[task]}, **{b: f"{b}@{k}" for b in _AT_K_METRICS[task]}}
    if base in candidates:
        return candidates[base]
    if base in _COUNTERPARTS.get(task, {}):
        return _COUNTERPARTS[task][base]
    close = difflib.get_close_matches(base, list(candidates), n=1, cutoff=0.6)
    return candidates[close[0]] if close else None


def _task_of(name: str) -> str | None:
    for task in TASK_TYPES:
        if _parse(task, name) is not None:
            return task
    return None


def check_metric(task: str, name: str, *, field_path: str = "metric") -> None:
    """Raise :class:`~trainpipe.errors.SpecError` unless ``name`` is a metric of ``task``.

    The message names ``field_path``, the nearest valid name, and the task ``name`` belongs to
    when it is valid elsewhere (``rmse`` asked for a binary classifier).
    """
    if is_known_metric(task, name):
        return
    hints = []
    other_task = _task_of(name) if isinstance(name, str) else None
    if other_task is not None:
        hints.append(f"{name!r} is a {other_task} metric")
    suggestion = suggest_metric(task, name)
    if suggestion is not None:
        hints.append(f"did you mean {suggestion!r}?")
    hint = "; ".join(hints)
    raise SpecError(
        f"{field_path}: unknown {task} metric {name!r}; valid: {', '.join(metric_names(task))}"
        + (f"; {hint}" if hint else "")
    )


def higher_is_better(name: str) -> bool:
    """True unless ``name`` is ``log_loss``, ``rmse``, ``mae``, ``perplexity`` or ``loss``; any task's metric is
    accepted."""
    if _task_of(name) is None:
        every = sorted({m for task in TASK_TYPES for m in metric_names(task)})
        raise SpecError(f"unknown metric {name!r}; valid: {', '.join(every)}")
    return name not in _LOWER_IS_BETTER
