"""``trainpipe init``: a valid, commented starter spec for each task type, fitted to a table when given one."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainpipe.errors import SpecError
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

if TYPE_CHECKING:
    import pandas as pd

_TASK_PARTS = {
    "binary_classification": {
        "features": "[feature_a, feature_b, feature_c]",
        "label": "label                      # 0/1",
        "extra_training": "",
        "metrics": "[auc, f1, precision, recall]",
        "gates": '    - auc >= baseline - 0.05   # within 0.05 of logistic regression on the same split\n'
                 '    - auc >= -1%               # and at most 1% below the current champion (passes when there is none)',
    },
    "multiclass_classification": {
        "features": "[feature_a, feature_b, feature_c]",
        "label": "species                    # one class per row; the classes come from the data",
        "extra_training": "  # label_classes: [setosa, versicolor, virginica]   # pin them (and their order) if a "
                          "snapshot may lack one\n",
        "metrics": "[accuracy, macro_f1, balanced_accuracy, log_loss]",
        "gates": '    - accuracy >= baseline - 0.02   # within 0.02 of multinomial logistic regression on the same '
                 'split\n'
                 '    - macro_f1 >= -1%               # and at most 1% below the current champion',
    },
    "regression": {
        "features": "[feature_a, feature_b, feature_c]",
        "label": "target",
        "extra_training": "",
        "metrics": "[rmse, mae, r2]",
        "gates": '    - r2 >= baseline - 0.05    # within 0.05 of ridge regression on the same split\n'
                 '    - rmse >= -1%              # relative gates follow the metric\'s direction: at most 1% worse '
                 'than the champion',
    },
    "ranking": {
        "features": "[bm25, doc_quality, click_rate_prior]",
        "label": "relevance                  # graded 0..4",
        "extra_training": "  group_column: query_id     # one list per query\n",
        "metrics": "[ndcg@10, mrr@10]",
        "gates": "    - ndcg@10 > +0.5%          # improve on the champion by more than half a percent",
    },
    "causal_lm": {
        "features": "[prompt]            # one text column: the prompt (or the whole text, without a label)",
        "label": "completion             # the loss is on these tokens; leave label out to learn every next "
                 "token",
        "extra_training": "",
        "metrics": "[perplexity, token_accuracy, loss]",
        "gates": "    - perplexity >= +0%        # no worse than the champion's holdout perplexity (+ is better)",
    },
}
# A causal language model fine-tunes pretrained weights: the transformer family, its text column, a smaller step.
_CAUSAL_LM_MODEL = ("    type: transformer\n"
                    "    pretrained: models/base-lm      # a save_pretrained folder (weights + tokenizer) under the "
                    "storage root, or s3://\n"
                    "    params: {max_length: 256}       # prompt and completion together; trainable: lora for large "
                    "models")
_CAUSAL_LM_TRANSFORMS = "  transforms:\n    prompt: {type: text}\n"
# Fine-tuning: a few passes at a small step, in batches a GPU holds at max_length 256.
_FINE_TUNING_BATCH_SIZE, _FINE_TUNING_LEARNING_RATE, _FINE_TUNING_EPOCHS, _FINE_TUNING_PATIENCE = 32, 0.0001, 3, 2

_TEMPLATE = """\
# yaml-language-server: $schema={schema}
# Starter spec written by `trainpipe init`. Check it with `trainpipe validate`, preview the DAG with
# `trainpipe render`. Every key is documented in the JSON Schema above (your editor shows it).
pipeline_id: {name}
description: Retrain {name} on a rolling window of data.
owner: ml-platform
tags: [{task}]
schedule: "@daily"              # cron ("0 2 * * *"), a preset, none, or {{assets: [...]}}
retries: 1

data:
  uri: {data_uri}      # relative to the storage root, or file:// / s3:// (+ conn_id)
{window}
validation:
  expectations:                 # Great Expectations 1.x, by name; feature/label columns must exist anyway
    - expect_column_values_to_not_be_null: {{column: {not_null}}}
  max_volume_change: 0.5        # fail when the row count moves by more than 50% vs the last snapshot

training:
  task: {task}
  model:
{model}
  features: {features}
{transforms}  label: {label}
{extra_training}  # {sizing}
  epochs: {epochs}                     # an upper bound: early stopping ends training when the validation loss stalls
  batch_size: {batch_size}
  learning_rate: {learning_rate}
  early_stopping: {{metric: validation_loss, patience: {patience}, min_delta: 0}}
  seed: 0
  distributed:
    nproc_per_node: 2           # processes (GPUs on a cluster) per node
    nnodes: 1
    strategy: ddp
  checkpoint:
    every_n_steps: 100
    every: 20m
    keep_last: 3

evaluation:
  metrics: {metrics}
  gates:
{gates}

registration:
  model_name: {name}
  alias: champion

params:                         # shown in "Trigger DAG w/ config"; override for one run only
  learning_rate:
    description: Learning rate for this run
  epochs:
    description: Passes over the data for this run
    minimum: 1
"""


_PLACEHOLDER_TRANSFORMS = """\
  # transforms:                 # features are numeric and standardised unless declared here; fitted on the
  #                             # train split only, shipped inside the model
  #   feature_a: {impute: median, missing_indicator: true, transform: log1p}
  #   feature_b: {type: categorical, encode: one_hot, max_categories: 20}
"""
_MLP_MODEL = "    type: mlp\n    hidden_layers: [64, 32]"
_TEXT_MODEL = ("    type: text_bag              # free text: each text's hashed words and word pairs, embedded and "
               "pooled (fastText-style)\n"
               "    params: {embedding_dim: 64, hidden_layers: []}   # an empty list: a linear head")
# A string column is free text when its values average at least this many words and this share of them differ
# (a category repeats; a sentence seldom does). Judged on at most TEXT_SAMPLE present values.
TEXT_MIN_WORDS = 4
TEXT_MIN_DISTINCT = 0.5
TEXT_SAMPLE = 10_000
# Without a table the sizing assumes this many rows.
_ASSUMED_ROWS = 100_000
PATIENCE = 5
# Early stopping waits at least this many optimizer steps (the rule's count) without an improvement: on a
# small table an epoch is a few steps and its validation split a few rows, so 5 epochs of noise would stop a
# model that is still learning (iris: 0.92 holdout accuracy at patience 5, 0.96 at 50, against 1.00).
PATIENCE_STEPS = 100
MAX_PATIENCE = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    """The starter's batch size, learning rate and epoch bound for a table of ``rows`` rows."""

    rows: int
    batch_size: int
    learning_rate: float
    epochs: int
    patience: int = PATIENCE

    @classmethod
    def for_table(cls, rows: int, task: str) -> Sizing:
        """The documented rule (docs/cli.md, "trainpipe init"):

        * batch size: the power of two nearest rows / 200, kept within 32..1024 (about 200 optimizer
          steps per epoch on mid-sized tables; small tables keep batches of 32, large ones 1024);
        * learning rate (Adam): 0.003 at batch 32, times sqrt(batch / 32) (the usual square-root scaling
          for Adam), at most 0.01; classification and regression alike, since the trainer standardises
          the features and a regression target;
        * epochs: enough for about 3,000 optimizer steps, between 20 and 200, as an upper bound:
          early stopping ends the training when the validation loss stops improving;
        * patience: 5 epochs, or as many as make 100 optimizer steps when epochs are shorter, at most 50.

        Ranking batches count queries: the rule sees the rows divided by 10 (documents per query, roughly).
        """
        units = max(rows // 10 if task == "ranking" else rows, 1)
        batch = 2 ** round(math.log2(max(units / 200, 1)))
        batch = min(max(batch, 32), 1024)
        learning_rate = min(0.003 * math.sqrt(batch / 32), 0.01)
        # The trainer trains on about 80% (holdout) x 90% (validation) of the rows.
        steps_per_epoch = max(math.ceil(units * 0.72 / batch), 1)
        epochs = min(max(math.ceil(3000 / steps_per_epoch), 20), 200)
        patience = min(max(PATIENCE, math.ceil(PATIENCE_STEPS / steps_per_epoch)), MAX_PATIENCE)
        return cls(rows=rows, batch_size=batch, learning_rate=float(f"{learning_rate:.2g}"), epochs=epochs,
                   patience=patience)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableProfile:
    """What ``init`` reads off a table: its rows, features (by kind), label and time column."""

    rows: int
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    with_missing: tuple[str, ...]
    label: str
    time_column: str | None
    # String columns of free text (is_free_text): type: text, and the text_bag family.
    text: tuple[str, ...] = ()

    @classmethod
    def of(cls, frame: pd.DataFrame, *, label: str, task: str, source: str) -> TableProfile:
        import pandas as pd

        if label not in frame.columns:
            raise SpecError(f"--label: {source} has no column {label!r}; its columns are "
                            f"{', '.join(map(str, frame.columns[:30]))}")
        if task == "ranking":
            raise SpecError("--data: a ranking starter needs its query column named by hand; run init without "
                            "--data and fill in the features, label and group_column")
        times = [c for c in frame.columns if pd.api.types.is_datetime64_any_dtype(frame[c]) and c != label]
        numeric: list[str] = []
        categorical: list[str] = []
        for column in frame.columns:
            if column == label or column in times:
                continue
            kind = frame[column]
            (numeric if pd.api.types.is_numeric_dtype(kind) or pd.api.types.is_bool_dtype(kind)
             else categorical).append(str(column))
        missing = tuple(c for c in numeric if frame[c].isna().any())
        text = tuple(c for c in categorical if is_free_text(frame[c]))
        return cls(rows=len(frame), numeric=tuple(numeric), categorical=tuple(c for c in categorical if c not in text),
                   with_missing=missing, label=label, time_column=str(times[0]) if times else None, text=text)


def is_free_text(column: pd.Series) -> bool:
    """Strings that average ``TEXT_MIN_WORDS`` words and are mostly distinct (``TEXT_MIN_DISTINCT``)."""
    present = column.dropna()
    if present.empty or not all(isinstance(value, str) for value in present.head(100)):
        return False
    sample = present.sample(n=TEXT_SAMPLE, random_state=0) if len(present) > TEXT_SAMPLE else present
    words = sample.astype("string").str.count(r"\w+")
    return bool(words.mean() >= TEXT_MIN_WORDS and sample.nunique() >= TEXT_MIN_DISTINCT * len(sample))


def _yaml_name(name: str) -> str:
    """A column name as YAML text: plain when it is a plain word, quoted (JSON string) otherwise."""
    import json

    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else json.dumps(name)


def starter_spec_text(name: str, *, task: str, schema_ref: str, profile: TableProfile | None = None,
                      data_uri: str | None = None) -> str:
    parts = dict(_TASK_PARTS[task])
    sizing = Sizing.for_table(profile.rows if profile else _ASSUMED_ROWS, task)
    if task == "causal_lm" and profile is not None:
        raise SpecError("trainpipe init --task causal_lm: --data is not supported yet; run it without --data and name "
                        "the prompt and completion columns (features, label) and the pretrained folder yourself")
    window = ("  time_column: event_time\n  window: 30d                   # rows in (logical_date - 30d, "
              "logical_date]\n")
    not_null = "event_time"
    transforms = _PLACEHOLDER_TRANSFORMS
    model = _MLP_MODEL
    if profile is not None:
        parts["features"] = "[" + ", ".join(_yaml_name(c) for c in (*profile.numeric, *profile.categorical,
                                                                     *profile.text)) + "]"
        parts["label"] = _yaml_name(profile.label)
        window = (f"  time_column: {_yaml_name(profile.time_column)}\n  window: 30d                   # rows in "
                  "(logical_date - 30d, logical_date]\n") if profile.time_column else \
            "  # no timestamp column found: every run reads the whole table (add time_column and window to cut one)\n"
        not_null = _yaml_name(profile.label)
        declared = [f"    {_yaml_name(c)}: {{impute: median, missing_indicator: true}}" for c in profile.with_missing]
        declared += [f"    {_yaml_name(c)}: {{type: categorical, encode: one_hot, max_categories: 20}}"
                     for c in profile.categorical]
        declared += [f"    {_yaml_name(c)}: {{type: text}}" for c in profile.text]
        said = "missing values imputed, text columns one-hot" + (", free text as hashed words" if profile.text else "")
        transforms = (f"  transforms:                   # from the table: {said}\n"
                      + "\n".join(declared) + "\n") if declared else ""
        if profile.text:
            model = _TEXT_MODEL
    if task == "causal_lm":
        model, transforms = _CAUSAL_LM_MODEL, _CAUSAL_LM_TRANSFORMS
        sizing = dataclasses.replace(sizing, batch_size=_FINE_TUNING_BATCH_SIZE, learning_rate=_FINE_TUNING_LEARNING_RATE,
                                     epochs=_FINE_TUNING_EPOCHS, patience=_FINE_TUNING_PATIENCE)
    sizing_note = "fine-tuning: a few passes at a small learning rate (adjust batch_size to your GPUs' memory)" \
        if task == "causal_lm" else (f"sized for {sizing.rows:,} rows (trainpipe init's rule, docs/cli.md)" if profile is not None
                   else f"sized for about {sizing.rows:,} rows; `trainpipe init --data` sizes it from the table")
    return _TEMPLATE.format(name=name, task=task, schema=schema_ref, data_uri=data_uri or f"{name}/data.parquet",
                            window=window, not_null=not_null, transforms=transforms, model=model, sizing=sizing_note,
                            epochs=sizing.epochs, batch_size=sizing.batch_size, learning_rate=sizing.learning_rate,
                            patience=sizing.patience, **parts)


def write_starter_spec(name: str, *, task: str, directory: Path, data: str | None = None,
                       label: str | None = None, table: pd.DataFrame | None = None) -> Path:
    """``data`` (the URI the spec reads), its rows as ``table`` (the CLI reads them: the spec stage
    touches no storage) and its ``label`` column: the columns become features (text columns one-hot, free text
    ``type: text`` with the text_bag family, numeric columns with missing values imputed) and the rows size the
    training."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]*", name):
        raise SpecError(f"name: {name!r} must start with a letter and use only letters, digits, '_' and '-'")
    if (data is None) != (label is None) or (data is None) != (table is None):
        raise SpecError("--data and --label go together: the table, and the column the model predicts")
    path = directory / f"{name}.yaml"
    if path.exists():
        raise FileExistsError(f"{path} already exists; choose another name or edit that file")
    schema = Path(__file__).with_name("schema.json").resolve()
    try:
        schema_ref = str(Path(*[".."] * len(directory.resolve().relative_to(Path.cwd().resolve()).parts),
                              schema.relative_to(Path.cwd().resolve())))
    except ValueError:
        schema_ref = schema.as_uri()
    profile = None
    if data is not None and label is not None:
        profile = TableProfile.of(table, label=label, task=task, source=data)
    text = starter_spec_text(name, task=task, schema_ref=schema_ref, profile=profile, data_uri=data)
    validate_loaded(load_yaml_text(text, str(path)))  # a starter that does not validate is a bug
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
