"""A model's raw outputs -> what is served, for every family: one definition of the task's post-processing.

numpy and pandas only (no torch): the MLP's numpy scorer and the torch scorer of other families share it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from trainpipe_trainer.config import PREDICTED_LABEL_COLUMN, probability_column
from trainpipe_trainer.preprocessing import TargetScaler


def scores_from_outputs(task: str, outputs: np.ndarray, *, target: TargetScaler | None = None) -> np.ndarray:
    """``outputs`` ``[rows, n_outputs]`` -> one score per row: P(label = 1) for binary, the prediction in the
    label's units for regression, the raw output for ranking; for multiclass the ``[rows, classes]``
    probability matrix."""
    if task == "multiclass_classification":
        # Stable softmax: the row's largest logit is subtracted first, so no exp overflows.
        shifted = np.exp(outputs - outputs.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)
    out = outputs[:, 0]
    if task == "binary_classification":
        # Stable sigmoid: never exponentiates a large positive number.
        decay = np.exp(-np.abs(out))
        return np.where(out >= 0, 1.0 / (1.0 + decay), decay / (1.0 + decay))
    if target is not None:
        return target.unscale(out)
    return out


def served_prediction(task: str, scores: np.ndarray, *, classes: tuple[str, ...],
                      index: pd.Index) -> np.ndarray | pd.DataFrame:
    """What the served model answers: ``scores`` for binary, regression and ranking; for multiclass a DataFrame
    of the predicted class (``label``) then each class's probability (``probability_<class>``, class order)."""
    if task != "multiclass_classification":
        return scores
    # Ties go to the first class in class order (numpy's argmax), as the trainer's accuracy counts them.
    predicted = np.asarray(classes, dtype=object)[scores.argmax(axis=1)]
    columns = {PREDICTED_LABEL_COLUMN: predicted}
    columns.update({probability_column(name): scores[:, position] for position, name in enumerate(classes)})
    return pd.DataFrame(columns, index=index)
