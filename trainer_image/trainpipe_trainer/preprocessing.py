"""Feature transforms shared by training and serving (numpy/pandas only).

One implementation for both sides, so the served model sees features exactly as training did:
the trainer fits a ``FeatureTransformer`` on the rows it trains on, the fitted parameters travel
inside the logged model as JSON, and the served model rebuilds the same object from them and calls
the same ``transform``.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from trainpipe_trainer.config import FeatureTransform
from trainpipe_trainer.errors import TrainerDataError

# A missing categorical value is a category of its own; values the train rows did not have (or had
# too rarely for one_hot's max_categories) share the "other" input.
MISSING_CATEGORY = "<missing>"
OTHER_CATEGORY = "<other>"


def require_columns(frame: pd.DataFrame, columns: tuple[str, ...] | list[str], *, source: str, role: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        present = ", ".join(map(str, frame.columns[:20]))
        raise TrainerDataError(
            f"{source}: missing {role} column(s) {', '.join(map(repr, missing))}; columns present: {present}"
        )


def label_texts(column: pd.Series, *, label: str, source: str) -> np.ndarray:
    """A multiclass label column as the text of each value: the class names (``str(value)``; whole floats
    such as 2.0 are ``"2"``, so a column read back with missing values as float keeps its names)."""
    if column.isna().any():
        raise TrainerDataError(f"{source}: label column {label!r} has missing values; a multiclass label needs "
                               "a class in every row (drop those rows, or give them a class of their own)")
    if pd.api.types.is_float_dtype(column):
        values = column.to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(values) & (values == np.round(values))):
            raise TrainerDataError(f"{source}: multiclass label column {label!r} holds fractional numbers; "
                                   "classes are whole numbers or text (is the task regression?)")
        return np.asarray([str(int(value)) for value in values], dtype=object)
    return np.asarray([value if isinstance(value, str) else str(value) for value in column.astype(object)],
                      dtype=object)


def label_class_names(column: pd.Series, *, label: str, source: str) -> tuple[str, ...]:
    """The classes of a multiclass label column in output order: numerically when every class name is a
    whole number (so 2 comes before 10), else by text."""
    names = set(label_texts(column, label=label, source=source).tolist())
    if all(_is_whole_number(name) for name in names):
        return tuple(sorted(names, key=int))
    return tuple(sorted(names))


def _is_whole_number(text: str) -> bool:
    return text.lstrip("-").isdigit()


def label_class_indices(column: pd.Series, classes: tuple[str, ...], *, label: str, source: str) -> np.ndarray:
    """Each row's class as its index in ``classes`` (int64); a label that is none of them is a data error."""
    texts = label_texts(column, label=label, source=source)
    index = {name: position for position, name in enumerate(classes)}
    unknown = sorted({text for text in texts.tolist() if text not in index})
    if unknown:
        shown = ", ".join(repr(name) for name in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5
                                                                 else "")
        raise TrainerDataError(
            f"{source}: label column {label!r} holds classes that are not in the run's classes "
            f"({len(classes)}: {', '.join(repr(name) for name in classes[:10])}"
            f"{' ...' if len(classes) > 10 else ''}): {shown}; add them to training.label_classes, or drop those rows"
        )
    return np.fromiter((index[text] for text in texts.tolist()), dtype=np.int64, count=len(texts))


def label_values(frame: pd.DataFrame, *, label: str, task: str, source: str,
                 classes: tuple[str, ...] = ()) -> np.ndarray:
    """The label column as float64, checked for the task (numeric, no missing values, 0/1 for binary,
    >= 0 for ranking); for multiclass the class indices in ``classes`` (int64). Torch-free: the provider
    runs the same check before it launches the trainer."""
    require_columns(frame, [label], source=source, role="label")
    column = frame[label]
    if task == "multiclass_classification":
        return label_class_indices(column, classes, label=label, source=source)
    if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)) or column.isna().any():
        raise TrainerDataError(f"{source}: label column {label!r} must be numeric without missing values")
    labels = column.to_numpy(dtype=np.float64)
    if task == "binary_classification" and not np.isin(labels, (0.0, 1.0)).all():
        bad = sorted(set(labels[~np.isin(labels, (0.0, 1.0))].tolist()))[:5]
        raise TrainerDataError(f"{source}: binary_classification needs labels 0/1 in {label!r}, found {bad}")
    if task == "ranking" and (labels < 0).any():
        raise TrainerDataError(f"{source}: ranking needs graded relevance >= 0 in {label!r}")
    return labels


def _numeric_values(frame: pd.DataFrame, name: str, *, source: str) -> np.ndarray:
    """A numeric column as float64, missing values as NaN."""
    column = frame[name]
    if not (pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column)):
        # Object columns holding numbers and None (JSON input at serving) are numeric too.
        try:
            column = pd.to_numeric(column, errors="raise") if column.dtype == object else None
        except (TypeError, ValueError):
            column = None
        if column is None:
            raise TrainerDataError(
                f"{source}: feature column {name!r} must be numeric, got dtype {frame[name].dtype}; "
                "declare it categorical (transforms: {type: categorical}) if it holds categories"
            )
    return column.to_numpy(dtype=np.float64, na_value=np.nan)


def _category_values(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A categorical column as text, missing values as ``MISSING_CATEGORY``."""
    column = frame[name]
    text = column.astype(object).where(column.notna(), MISSING_CATEGORY)
    return np.asarray([value if isinstance(value, str) else str(value) for value in text], dtype=object)


@dataclass(kw_only=True, slots=True, frozen=True)
class NumericEncoder:
    """impute -> clip -> log1p -> standardise; plus a 0/1 missing indicator when asked."""

    feature: str
    fill_value: float | None = None
    missing_indicator: bool = False
    clip_min: float | None = None
    clip_max: float | None = None
    log1p: bool = False
    mean: float = 0.0
    std: float = 1.0

    @property
    def output_names(self) -> tuple[str, ...]:
        return (self.feature, f"{self.feature}__missing") if self.missing_indicator else (self.feature,)

    @classmethod
    def fit(cls, frame: pd.DataFrame, transform: FeatureTransform, *, source: str) -> NumericEncoder:
        values = _numeric_values(frame, transform.feature, source=source)
        fill_value = None
        if transform.impute is not None:
            present = values[~np.isnan(values)]
            if transform.impute == "constant":
                fill_value = float(transform.fill_value)
            elif present.size == 0:
                raise TrainerDataError(
                    f"{source}: feature column {transform.feature!r} has no values to take the {transform.impute} "
                    "of; impute a constant instead"
                )
            else:
                fill_value = float(present.mean() if transform.impute == "mean" else np.median(present))
        unscaled = cls(feature=transform.feature, fill_value=fill_value, missing_indicator=transform.missing_indicator,
                       clip_min=transform.clip_min, clip_max=transform.clip_max,
                       log1p=transform.transform == "log1p")
        if not transform.standardize:
            return unscaled
        scaled = unscaled._value(values, source=source)
        std = float(scaled.std())
        # A constant column would divide by zero; centring it to 0 is all that is useful.
        return cls(feature=unscaled.feature, fill_value=fill_value, missing_indicator=unscaled.missing_indicator,
                   clip_min=unscaled.clip_min, clip_max=unscaled.clip_max, log1p=unscaled.log1p,
                   mean=float(scaled.mean()), std=std if std > 1e-12 else 1.0)

    def _value(self, values: np.ndarray, *, source: str) -> np.ndarray:
        """impute -> clip -> log1p of one column (``NumericColumns.shape``, which defines them)."""
        return NumericColumns.of((self,)).shape(values[:, None], source=source)[:, 0]

    def encode(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        values = _numeric_values(frame, self.feature, source=source)
        scaled = (self._value(values, source=source) - self.mean) / self.std
        if not self.missing_indicator:
            return scaled[:, None]
        return np.column_stack([scaled, np.isnan(values).astype(np.float64)])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "numeric", "feature": self.feature, "fill_value": self.fill_value,
                "missing_indicator": self.missing_indicator, "clip_min": self.clip_min, "clip_max": self.clip_max,
                "log1p": self.log1p, "mean": self.mean, "std": self.std}


@dataclass(frozen=True, slots=True)
class NumericColumns:
    """Numeric encoders as column vectors: impute, clip, log1p and standardise a ``[rows, k]`` float64 block in
    place, each column with its encoder's parameters. The one definition of those steps: ``NumericEncoder``
    shapes its column through it, and the streamed path transforms whole blocks of rows with it."""

    encoders: tuple[NumericEncoder, ...]
    fill: np.ndarray
    low: np.ndarray
    high: np.ndarray
    log1p: np.ndarray
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, encoders: tuple[NumericEncoder, ...]) -> NumericColumns:
        def vector(values: list[float | None], default: float) -> np.ndarray:
            return np.array([default if v is None else v for v in values], dtype=np.float64)

        return cls(encoders=encoders,
                   fill=vector([e.fill_value for e in encoders], np.nan),
                   low=vector([e.clip_min for e in encoders], -np.inf),
                   high=vector([e.clip_max for e in encoders], np.inf),
                   log1p=np.array([e.log1p for e in encoders], dtype=bool),
                   mean=vector([e.mean for e in encoders], 0.0),
                   std=vector([e.std for e in encoders], 1.0))

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(e.feature for e in self.encoders)

    def shape(self, block: np.ndarray, *, source: str) -> np.ndarray:
        """impute -> clip -> log1p; ``block`` is left as it is (a step that changes values makes a new array, and
        none is made where no step applies). Raises ``TrainerDataError`` naming the column and the fix."""
        missing = np.isnan(block)
        if missing.any():
            unfilled = missing.any(axis=0) & np.isnan(self.fill)
            if unfilled.any():
                column = int(np.flatnonzero(unfilled)[0])
                raise TrainerDataError(
                    f"{source}: feature column {self.encoders[column].feature!r} has "
                    f"{int(missing[:, column].sum())} missing value(s); declare how to fill them "
                    f"(training.transforms.{self.encoders[column].feature}.impute: mean, median or constant)"
                )
            block = np.where(missing, self.fill, block)
        if np.isfinite(self.low).any() or np.isfinite(self.high).any():
            block = np.clip(block, self.low, self.high)
        if self.log1p.any():
            logged = block[:, self.log1p]
            below = (logged <= -1).any(axis=0)
            if below.any():
                column = int(np.flatnonzero(self.log1p)[np.flatnonzero(below)[0]])
                feature = self.encoders[column].feature
                raise TrainerDataError(
                    f"{source}: feature column {feature!r} has values <= -1 (smallest {block[:, column].min():g}), "
                    f"where log1p is undefined; clip them first (training.transforms.{feature}.clip: {{min: 0}})"
                )
            if self.log1p.all():
                block = np.log1p(block)
            else:
                block = block.copy()
                block[:, self.log1p] = np.log1p(logged)
        return block

    def transform(self, block: np.ndarray, *, source: str) -> np.ndarray:
        """``shape`` then standardise: per value the float64 operations of ``NumericEncoder.encode``. The shaped
        values are standardised in place, so ``block`` may be overwritten: pass one the caller owns."""
        shaped = self.shape(block, source=source)
        shaped -= self.mean
        shaped /= self.std
        return shaped


@dataclass(kw_only=True, slots=True, frozen=True)
class OneHotEncoder:
    """One 0/1 input per kept category (most frequent first), then one for every other value."""

    feature: str
    categories: tuple[str, ...]

    @property
    def output_names(self) -> tuple[str, ...]:
        return (*(f"{self.feature}={c}" for c in self.categories), f"{self.feature}={OTHER_CATEGORY}")

    @classmethod
    def fit(cls, frame: pd.DataFrame, transform: FeatureTransform) -> OneHotEncoder:
        counts = pd.Series(_category_values(frame, transform.feature)).value_counts()
        # Most frequent first; ties by name, so the order never depends on row order.
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        return cls(feature=transform.feature, categories=tuple(c for c, _ in ranked[: transform.max_categories]))

    def encode(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        codes = pd.Categorical(_category_values(frame, self.feature), categories=list(self.categories)).codes
        # Code -1 (not a kept category) -> the last input, "other".
        index = np.where(codes < 0, len(self.categories), codes)
        out = np.zeros((len(index), len(self.categories) + 1), dtype=np.float64)
        out[np.arange(len(index)), index] = 1.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "one_hot", "feature": self.feature, "categories": list(self.categories)}


def stable_bucket(value: str, buckets: int) -> int:
    """The hashing bucket of a category: the same on every machine and Python (``hash()`` is salted)."""
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


@dataclass(kw_only=True, slots=True, frozen=True)
class HashingEncoder:
    """``buckets`` 0/1 inputs; a category sets the one its hash picks (nothing to fit)."""

    feature: str
    buckets: int

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(f"{self.feature}#{i}" for i in range(self.buckets))

    def encode(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        codes, uniques = pd.factorize(_category_values(frame, self.feature))
        index = np.asarray([stable_bucket(u, self.buckets) for u in uniques], dtype=np.int64)[codes]
        out = np.zeros((len(index), self.buckets), dtype=np.float64)
        out[np.arange(len(index)), index] = 1.0
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hashing", "feature": self.feature, "buckets": self.buckets}


# A word: a run of letters, digits or underscores in any script (after NFKC and lower-casing).
_WORD = re.compile(r"\w+")
# Token id 0 pads a text's inputs; a hashed token is 1 + its bucket.
PAD_TOKEN_ID = 0
# causal_lm: the next-token target of a position that is not trained on (a prompt's, the padding).
IGNORED_TARGET = -1


def text_tokens(text: str, *, ngrams: int) -> list[str]:
    """A text's tokens in reading order: each word, then (ngrams 2) the pair it ends; deterministic."""
    words = _WORD.findall(unicodedata.normalize("NFKC", text).lower())
    if ngrams == 1:
        return words
    tokens: list[str] = []
    for index, word in enumerate(words):
        tokens.append(word)
        if index:
            tokens.append(f"{words[index - 1]} {word}")
    return tokens


@dataclass(kw_only=True, slots=True, frozen=True)
class TextEncoder:
    """``max_tokens`` inputs: the ids (``1 + stable_bucket``) of a text's first tokens, 0 after its end.

    Nothing to fit: the hash replaces a vocabulary, so a word first seen at serving has an id too. The ids
    are whole numbers below 2**24, exact in the float32 input matrix; only a family that reads token ids
    (``ModelFamily.reads_token_ids``) is given a text column.
    """

    feature: str
    buckets: int
    max_tokens: int
    ngrams: int

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(f"{self.feature}@{i}" for i in range(self.max_tokens))

    @property
    def vocabulary_size(self) -> int:
        """Ids a module must embed: the buckets and the padding id."""
        return self.buckets + 1

    def encode(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        column = frame[self.feature]
        out = np.zeros((len(column), self.max_tokens), dtype=np.float64)
        ids: dict[str, int] = {}  # a token's id, hashed once per call
        for row, value in enumerate(column.to_numpy(dtype=object)):
            if value is None or (isinstance(value, float) and np.isnan(value)):
                continue  # a missing text has no tokens
            tokens = text_tokens(value if isinstance(value, str) else str(value), ngrams=self.ngrams)
            for position, token in enumerate(tokens[:self.max_tokens]):
                token_id = ids.get(token)
                if token_id is None:
                    token_id = ids[token] = 1 + stable_bucket(token, self.buckets)
                out[row, position] = token_id
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "text", "feature": self.feature, "buckets": self.buckets, "max_tokens": self.max_tokens,
                "ngrams": self.ngrams}


class TextTokenizer(Protocol):
    """A model family's own tokenizer (``ModelFamily.text_tokenizer``): a text column's inputs are the ids + 1 of
    its first ``max_length`` tokens (0 pads), deterministic; used instead of the hashed ``TextEncoder``."""

    max_length: int
    # sha256 over the tokenizer's files ("" when unknown): what a cache of its ids is keyed by.
    sha256: str

    @property
    def vocabulary_size(self) -> int: ...

    def encode(self, texts: np.ndarray) -> np.ndarray: ...

    def sequences(self, texts: np.ndarray, completions: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(kw_only=True, slots=True, frozen=True)
class PretrainedTextEncoder:
    """``max_length`` inputs: a text's token ids + 1 from its family's tokenizer (0 after its end).

    Its tokenizer comes with the pretrained weights (a file of the run, not JSON): a model with such a column
    is served by its family's own export, which ships the tokenizer (``to_dict`` records what it was)."""

    feature: str
    tokenizer: TextTokenizer = field(compare=False, repr=False)

    @property
    def max_tokens(self) -> int:
        return self.tokenizer.max_length

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(f"{self.feature}@{i}" for i in range(self.max_tokens))

    @property
    def vocabulary_size(self) -> int:
        return self.tokenizer.vocabulary_size

    def encode(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        return self.tokenizer.encode(frame[self.feature].to_numpy(dtype=object))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "pretrained_text", "feature": self.feature, "max_tokens": self.max_tokens}


Encoder = NumericEncoder | OneHotEncoder | HashingEncoder | TextEncoder | PretrainedTextEncoder


def _encoder_from_dict(raw: dict[str, Any]) -> Encoder:
    fields = {k: v for k, v in raw.items() if k != "kind"}
    if raw["kind"] == "numeric":
        return NumericEncoder(**fields)
    if raw["kind"] == "one_hot":
        return OneHotEncoder(feature=fields["feature"], categories=tuple(fields["categories"]))
    if raw["kind"] == "hashing":
        return HashingEncoder(**fields)
    if raw["kind"] == "text":
        return TextEncoder(**fields)
    if raw["kind"] == "pretrained_text":
        raise ValueError(f"feature {raw['feature']!r} was tokenised by its model family's own tokenizer: the model is "
                         "served by that family's export, which ships the tokenizer")
    raise ValueError(f"unknown feature encoder {raw['kind']!r}")


@dataclass(kw_only=True, slots=True, frozen=True)
class FeatureTransformer:
    """Raw feature columns -> the model's input matrix, one encoder per feature in config order."""

    encoders: tuple[Encoder, ...]

    @property
    def features(self) -> tuple[str, ...]:
        """The raw columns it reads."""
        return tuple(e.feature for e in self.encoders)

    @property
    def output_names(self) -> tuple[str, ...]:
        """One name per input column of the model, e.g. ``amount``, ``income__missing``, ``country=FR``."""
        return tuple(name for e in self.encoders for name in e.output_names)

    @property
    def output_features(self) -> tuple[str, ...]:
        """The raw feature column of each input column, in the same order."""
        return tuple(e.feature for e in self.encoders for _ in e.output_names)

    @property
    def width(self) -> int:
        return len(self.output_names)

    @property
    def vocabularies(self) -> dict[str, int]:
        """Each text feature's number of token ids (padding included), in feature order."""
        return {e.feature: e.vocabulary_size for e in self.encoders
                if isinstance(e, TextEncoder | PretrainedTextEncoder)}

    @property
    def text_tokenizer(self) -> TextTokenizer | None:
        """The family's tokenizer its text columns were encoded with (None: hashed words, or no text)."""
        return next((e.tokenizer for e in self.encoders if isinstance(e, PretrainedTextEncoder)), None)

    def numeric_columns(self) -> NumericColumns | None:
        """The transform as ``NumericColumns`` when every encoder is numeric without a missing indicator (its
        output is then one column per feature, in order); None otherwise."""
        if not self.encoders or not all(isinstance(e, NumericEncoder) and not e.missing_indicator
                                        for e in self.encoders):
            return None
        return NumericColumns.of(self.encoders)  # type: ignore[arg-type]

    @classmethod
    def fit(cls, frame: pd.DataFrame, transforms: tuple[FeatureTransform, ...], *, source: str,
            text_tokenizer: TextTokenizer | None = None) -> FeatureTransformer:
        """Fitted on ``frame``: the trainer passes the rows it trains on, never validation or holdout rows.
        ``text_tokenizer``: the model family's (``ModelFamily.text_tokenizer``), for its text columns."""
        require_columns(frame, [t.feature for t in transforms], source=source, role="feature")
        encoders: list[Encoder] = []
        for transform in transforms:
            if transform.type == "numeric":
                encoders.append(NumericEncoder.fit(frame, transform, source=source))
            elif transform.type == "text" and text_tokenizer is not None:
                encoders.append(PretrainedTextEncoder(feature=transform.feature, tokenizer=text_tokenizer))
            elif transform.type == "text":
                encoders.append(TextEncoder(feature=transform.feature, buckets=transform.hash_buckets,
                                            max_tokens=transform.max_tokens, ngrams=transform.ngrams))
            elif transform.encode == "one_hot":
                encoders.append(OneHotEncoder.fit(frame, transform))
            else:
                encoders.append(HashingEncoder(feature=transform.feature, buckets=transform.hash_buckets))
        return cls(encoders=tuple(encoders))

    def transform(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        """float64 ``[rows, width]``; raises ``TrainerDataError`` naming the column and the fix."""
        return np.ascontiguousarray(self._columns(frame, source=source).T)

    def transform_float32(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        """``transform`` cast to float32 (what the model takes), in one pass from the column buffer: the same
        values, without a float64 matrix in row order between (the data path's main cost per row)."""
        return np.asarray(self._columns(frame, source=source).T, dtype=np.float32, order="C")

    def _columns(self, frame: pd.DataFrame, *, source: str) -> np.ndarray:
        """float64 ``[width, rows]``: each encoder writes whole rows of it (contiguous), where gluing its
        ``[rows, k]`` blocks side by side would copy every value with a stride."""
        require_columns(frame, self.features, source=source, role="feature")
        columns = np.empty((self.width, len(frame)))
        at = 0
        for encoder in self.encoders:
            block = encoder.encode(frame, source=source)
            columns[at:at + block.shape[1]] = block.T
            at += block.shape[1]
        return columns

    def to_dict(self) -> dict[str, Any]:
        return {"encoders": [e.to_dict() for e in self.encoders]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FeatureTransformer:
        return cls(encoders=tuple(_encoder_from_dict(e) for e in raw["encoders"]))

    @classmethod
    def from_standardizer(cls, raw: dict[str, Any]) -> FeatureTransformer:
        """A model logged before transforms (serving format 1): every feature numeric and standardised."""
        return cls(encoders=tuple(NumericEncoder(feature=f, mean=m, std=s)
                                  for f, m, s in zip(raw["features"], raw["means"], raw["stds"], strict=True)))


@dataclass(kw_only=True, slots=True, frozen=True)
class TargetScaler:
    """A regression label <-> the standardised target the network is trained on.

    Fitted on the train split's labels like the feature transforms, and shipped in the model beside
    them, so the served model answers in the label's units (an MSE on labels in the hundreds would
    otherwise need its own learning rate and many epochs before the output even reaches their mean).
    """

    mean: float
    std: float

    @classmethod
    def fit(cls, labels: np.ndarray) -> TargetScaler:
        std = float(labels.std())
        # A constant label would divide by zero; centring it is all that is useful.
        return cls(mean=float(labels.mean()), std=std if std > 1e-12 else 1.0)

    def scale(self, labels: np.ndarray) -> np.ndarray:
        return (labels - self.mean) / self.std

    def unscale(self, outputs: np.ndarray) -> np.ndarray:
        return outputs * self.std + self.mean

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std}

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> TargetScaler | None:
        return cls(mean=float(raw["mean"]), std=float(raw["std"])) if raw else None
