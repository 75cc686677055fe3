"""``trainpipe init``: a valid, commented starter spec for each task type."""

from __future__ import annotations

import re
from pathlib import Path

from trainpipe.errors import SpecError
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

_TASK_PARTS = {
    "binary_classification": {
        "features": "[feature_a, feature_b, feature_c]",
        "label": "label                      # 0/1",
        "extra_training": "",
        "metrics": "[auc, f1, precision, recall]",
        "gates": '    - auc >= 0.75              # absolute threshold\n    - auc >= +0.1%             # and beat the current champion by 0.1% (passes when there is none)',
    },
    "regression": {
        "features": "[feature_a, feature_b, feature_c]",
        "label": "target",
        "extra_training": "",
        "metrics": "[rmse, mae, r2]",
        "gates": '    - r2 >= 0.5\n    - rmse <= +0%              # relative gates follow the metric\'s direction: no worse than the champion',
    },
    "ranking": {
        "features": "[bm25, doc_quality, click_rate_prior]",
        "label": "relevance                  # graded 0..4",
        "extra_training": "  group_column: query_id     # one list per query\n",
        "metrics": "[ndcg@10, mrr@10]",
        "gates": "    - ndcg@10 > +0.5%          # improve on the champion by more than half a percent",
    },
}

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
  uri: {name}/data.parquet      # relative to the storage root, or file:// / s3:// (+ conn_id)
  time_column: event_time
  window: 30d                   # rows in (logical_date - 30d, logical_date]

validation:
  expectations:                 # Great Expectations 1.x, by name; feature/label columns must exist anyway
    - expect_column_values_to_not_be_null: {{column: event_time}}
  max_volume_change: 0.5        # fail when the row count moves by more than 50% vs the last snapshot

training:
  task: {task}
  model:
    type: mlp
    hidden_layers: [64, 32]
  features: {features}
  # transforms:                 # features are numeric and standardised unless declared here; fitted on the
  #                             # train split only, shipped inside the model
  #   feature_a: {{impute: median, missing_indicator: true, transform: log1p}}
  #   feature_b: {{type: categorical, encode: one_hot, max_categories: 20}}
  label: {label}
{extra_training}  epochs: 5
  batch_size: 256
  learning_rate: 0.001
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


def starter_spec_text(name: str, *, task: str, schema_ref: str) -> str:
    return _TEMPLATE.format(name=name, task=task, schema=schema_ref, **_TASK_PARTS[task])


def write_starter_spec(name: str, *, task: str, directory: Path) -> Path:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]*", name):
        raise SpecError(f"name: {name!r} must start with a letter and use only letters, digits, '_' and '-'")
    path = directory / f"{name}.yaml"
    if path.exists():
        raise FileExistsError(f"{path} already exists; choose another name or edit that file")
    schema = Path(__file__).with_name("schema.json").resolve()
    try:
        schema_ref = str(Path(*[".."] * len(directory.resolve().relative_to(Path.cwd().resolve()).parts),
                              schema.relative_to(Path.cwd().resolve())))
    except ValueError:
        schema_ref = schema.as_uri()
    text = starter_spec_text(name, task=task, schema_ref=schema_ref)
    validate_loaded(load_yaml_text(text, str(path)))  # a starter that does not validate is a bug
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
