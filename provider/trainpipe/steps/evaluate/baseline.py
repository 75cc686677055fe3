"""The baseline of every evaluation: a simple linear model fitted on the run's train split, scored on its holdout.

A candidate is worth registering only if it beats what a plain linear model gets from the same features:
ridge regression for regression, logistic regression for binary classification, multinomial logistic
regression for multiclass classification, and for ranking a linear scorer (ridge on the graded relevance).
The features are encoded the simple way (numeric columns imputed with the train median and standardised,
other columns one-hot over their most frequent train values; a column declared text becomes TF-IDF weights of
its words and word pairs), so the baseline needs nothing from the spec but its column names and which are
text, and it is fitted on the rows the candidate trained on, never the holdout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfVectorizer

# The model each task's baseline is, as the report and the run note name it.
BASELINE_MODELS = {"regression": "ridge", "binary_classification": "logistic regression",
                   "multiclass_classification": "multinomial logistic regression",
                   "ranking": "linear scorer (ridge on relevance)"}
# With a text column, the linear model reads TF-IDF (the classic text baseline) beside the other columns.
TEXT_BASELINE_PREFIX = "TF-IDF + "
# One-hot inputs per non-numeric column: its most frequent train values, the rest share none.
_MAX_CATEGORIES = 20
# TF-IDF terms kept per text column (the most frequent): bounds the baseline's memory on a wide vocabulary.
_MAX_TEXT_TERMS = 100_000
# Fitted on at most this many train rows (a sample drawn with a fixed seed): a baseline, not a second training.
_MAX_ROWS = 200_000


@dataclass(frozen=True, slots=True, kw_only=True)
class _Design:
    """How raw feature columns become the baseline's input matrix (fitted on the train split)."""

    numeric: dict[str, tuple[float, float, float]]  # column -> (fill, mean, std)
    categories: dict[str, tuple[str, ...]]
    texts: dict[str, TfidfVectorizer]

    @classmethod
    def fit(cls, frame: pd.DataFrame, features: tuple[str, ...], text_features: tuple[str, ...] = ()) -> _Design:
        import numpy as np
        import pandas as pd

        numeric, categories, texts = {}, {}, {}
        for name in features:
            column = frame[name]
            if name in text_features:
                vectorizer = _vectorizer()
                try:
                    vectorizer.fit(_texts(column))
                except ValueError:  # no word in any train row: the column adds no input
                    continue
                texts[name] = vectorizer
            elif pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
                values = column.to_numpy(dtype=np.float64, na_value=np.nan)
                present = values[~np.isnan(values)]
                fill = float(np.median(present)) if present.size else 0.0
                filled = np.where(np.isnan(values), fill, values)
                std = float(filled.std())
                numeric[name] = (fill, float(filled.mean()), std if std > 1e-12 else 1.0)
            else:
                counts = column.astype(str).value_counts()
                ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
                categories[name] = tuple(value for value, _ in ranked[:_MAX_CATEGORIES])
        return cls(numeric=numeric, categories=categories, texts=texts)

    def matrix(self, frame: pd.DataFrame) -> np.ndarray | sparse.csr_matrix:
        import numpy as np

        parts: list = []
        for name, (fill, mean, std) in self.numeric.items():
            values = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
            parts.append(((np.where(np.isnan(values), fill, values) - mean) / std)[:, None])
        for name, kept in self.categories.items():
            text = frame[name].astype(str).to_numpy()
            parts.append(np.stack([(text == value).astype(np.float64) for value in kept], axis=1)
                         if kept else np.zeros((len(frame), 0)))
        dense = np.concatenate(parts, axis=1) if parts else np.zeros((len(frame), 0))
        if not self.texts:
            return dense
        from scipy import sparse

        # Sparse: a text column has up to _MAX_TEXT_TERMS inputs, nearly all zero in each row.
        return sparse.hstack([sparse.csr_matrix(dense),
                              *(vectorizer.transform(_texts(frame[name])) for name, vectorizer in self.texts.items())],
                             format="csr")


def _vectorizer() -> TfidfVectorizer:
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer

    # Words as the trainer's text transform takes them (runs of letters, digits, _; lower-cased), and pairs.
    return TfidfVectorizer(lowercase=True, token_pattern=r"(?u)\w+", ngram_range=(1, 2), sublinear_tf=True,
                           max_features=_MAX_TEXT_TERMS, dtype=np.float64)


def _texts(column: pd.Series) -> list[str]:
    """A missing text has no words."""
    return column.astype(object).where(column.notna(), "").astype(str).tolist()


def baseline_model(task: str, text_features: tuple[str, ...] = ()) -> str:
    """The baseline's name in the report and the run note: with a text column, "TF-IDF + " the task's model."""
    return (TEXT_BASELINE_PREFIX if text_features else "") + BASELINE_MODELS[task]


def baseline_scores(task: str, features: tuple[str, ...], label: str, train: pd.DataFrame,
                    holdout: pd.DataFrame, classes: tuple[str, ...] = (),
                    text_features: tuple[str, ...] = ()) -> np.ndarray:
    """The baseline's scores on ``holdout`` (as the candidate's are: P(1) for binary classification, and for
    multiclass the [N, K] probabilities of ``classes``, the candidate's classes in its order). ``text_features``:
    the features declared text, read as TF-IDF of their words and word pairs."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression, Ridge

    if len(train) > _MAX_ROWS:
        train = train.sample(n=_MAX_ROWS, random_state=0)
    design = _Design.fit(train, features, text_features)
    x_train, x_holdout = design.matrix(train), design.matrix(holdout)
    if task == "multiclass_classification":
        return _multiclass_probabilities(x_train, train[label], x_holdout, classes, label=label)
    y = train[label].to_numpy(dtype=np.float64)
    if task == "binary_classification":
        if np.unique(y).size < 2:
            # One class in the train split: the best a model can say is that class's rate.
            return np.full(len(holdout), float(y.mean()))
        model = LogisticRegression(max_iter=1000).fit(x_train, y.astype(int))
        return model.predict_proba(x_holdout)[:, 1]
    return Ridge(alpha=1.0).fit(x_train, y).predict(x_holdout)


def _multiclass_probabilities(x_train: np.ndarray | sparse.csr_matrix, labels: pd.Series,
                              x_holdout: np.ndarray | sparse.csr_matrix,
                              classes: tuple[str, ...], *, label: str) -> np.ndarray:
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from trainpipe.steps.evaluate.metrics import MetricInputError
    from trainpipe_trainer.errors import TrainerDataError
    from trainpipe_trainer.preprocessing import label_class_indices

    try:
        y = label_class_indices(labels, classes, label=label, source="train split")
    except TrainerDataError as error:
        raise MetricInputError(str(error)) from None
    present = np.unique(y)
    probabilities = np.zeros((x_holdout.shape[0], len(classes)))
    if present.size < 2:
        # One class in the train split: the best a model can say is that class.
        probabilities[:, present] = 1.0
        return probabilities
    # lbfgs fits one softmax over the classes (multinomial); a class the train split lacks gets probability 0.
    model = LogisticRegression(max_iter=1000).fit(x_train, y)
    probabilities[:, model.classes_] = model.predict_proba(x_holdout)
    return probabilities
