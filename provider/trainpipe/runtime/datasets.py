"""The snapshot's train and holdout splits as MLflow dataset inputs of the training run.

The run page's Datasets panel then names the data the model was trained and judged on: name
(``<pipeline>-train``, ``<pipeline>-holdout``), digest, source, schema and row count. Nothing is
read for it: the schema is the holdout's (both splits come from one frame), the row counts are the
snapshot's.

* digest: MLflow keeps at most 36 characters of a dataset digest, so it holds the first 36 hex
  digits of the snapshot's sha256; the profile carries the whole of it (``snapshot_sha256``), the
  same value as the run's ``trainpipe.dataset_digest`` tag.
* source: for local storage, the file's path relative to the trainpipe storage root
  (``snapshots/<pipeline>/<digest16>/train.parquet``), as no path of the machine belongs in MLflow;
  for a bucket, the full URI (``s3://bucket/prefix/snapshots/...``), which means the same
  everywhere.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.settings import Settings

if TYPE_CHECKING:
    import pandas as pd

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.runtime.snapshot import SnapshotInfo

# mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE
MLFLOW_DIGEST_LENGTH = 36
# MLflow's own context values of a dataset input (the Datasets panel shows them).
TRAIN_CONTEXT = "training"
HOLDOUT_CONTEXT = "evaluation"


def dataset_source_uri(uri: str, settings: Settings) -> str:
    """A snapshot file's URI as recorded in MLflow: relative to a local storage root, else as it is."""
    root = storage.fsspec_uri(storage.storage_root(settings)).rstrip("/") + "/"
    if uri.startswith("file://") and uri.startswith(root):
        return uri[len(root):]
    return uri


def snapshot_datasets(pipeline_id: str, snapshot: SnapshotInfo, holdout: pd.DataFrame, *,
                      settings: Settings) -> list[tuple[Any, str]]:
    """``(mlflow.entities.Dataset, context)`` of the train and the holdout split."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.entities import Dataset
    from mlflow.models import infer_signature

    with warnings.catch_warnings():
        # MLflow's hint that integer columns cannot hold missing values concerns model signatures.
        warnings.simplefilter("ignore", UserWarning)
        schema = json.dumps({"mlflow_colspec": infer_signature(holdout.head(0)).inputs.to_dict()})
    splits = (("train", snapshot.train_uri, snapshot.train_rows, TRAIN_CONTEXT),
              ("holdout", snapshot.holdout_uri, snapshot.holdout_rows, HOLDOUT_CONTEXT))
    datasets = []
    for split, uri, rows, context in splits:
        with warnings.catch_warnings():
            # A plain path matches MLflow's local source twice over and it warns that it picked one.
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(dataset_source_uri(uri, settings))
        profile = {"num_rows": rows, "num_elements": rows * len(holdout.columns),
                   "snapshot_sha256": snapshot.digest, "split": split}
        datasets.append((Dataset(name=f"{pipeline_id}-{split}", digest=snapshot.digest[:MLFLOW_DIGEST_LENGTH],
                                 source_type=source._get_source_type(), source=source.to_json(), schema=schema,
                                 profile=json.dumps(profile)), context))
    return datasets


def log_snapshot_inputs(hook: MlflowHook, mlflow_run_id: str, pipeline_id: str, snapshot: SnapshotInfo,
                        holdout: pd.DataFrame, *, settings: Settings) -> None:
    """Log both splits on the run; a retried task logs the same inputs again, which MLflow keeps once."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [DatasetInput(dataset=dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])
              for dataset, context in snapshot_datasets(pipeline_id, snapshot, holdout, settings=settings)]
    hook.client.log_inputs(mlflow_run_id, datasets=inputs)
