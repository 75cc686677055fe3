"""The training split read into arrays: parquet -> checked columns -> fitted feature transforms -> float32.

numpy, pandas and pyarrow only, no torch: ``read_in_background`` starts it in a thread as soon as the
config is read, so the parquet decode and the array work (which release the GIL) overlap the torch
imports of the launch (``data`` then wraps the arrays as tensors without a copy).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from trainpipe_trainer import storage
from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.data.manifest import DataManifest, ManifestFile
from trainpipe_trainer.errors import TrainerDataError, TrainerInputError
from trainpipe_trainer.preprocessing import (
    FeatureTransformer,
    TargetScaler,
    TextTokenizer,
    label_class_names,
    label_values,
    require_columns,
)

# The model family's tokenizer for a config's text columns, or None (``models.text_tokenizer_of``).
TokenizerOf = Callable[[TrainingConfig], TextTokenizer | None]
# A family tokenizer's ids of both splits, kept beside the snapshot (``<snapshot>/tokenized/<key>.npz``): a retry,
# a resumed run, a rerun or a tuning trial reads them instead of tokenising again. The key holds everything the
# arrays depend on; the snapshot's garbage collection removes them with it.
TOKENIZED_FOLDER = "tokenized"


@dataclass(kw_only=True, slots=True, frozen=True)
class Splits:
    # (features, labels) rows, or (features, labels, mask) padded queries for listwise ranking; float32,
    # except a multiclass label: int64 class indices (what cross-entropy takes).
    train: tuple[np.ndarray, ...]
    # Held out of training for the validation loss that picks the best checkpoint (None: no split).
    validation: tuple[np.ndarray, ...] | None
    # Fitted on the rows trained on (not the validation rows); shipped inside the logged model.
    transformer: FeatureTransformer
    n_rows: int
    n_validation_rows: int
    # A few raw feature rows: the logged model's input example for its signature.
    sample_frame: pd.DataFrame
    # Regression with scale_target: the labels of both splits are standardised with the train split's
    # mean and std (fitted like the transformer, shipped in the model); None: labels as they are.
    target: TargetScaler | None = None
    # Multiclass: the classes in output order (the model's outputs, the served columns); () otherwise.
    classes: tuple[str, ...] = ()


# data_placement: auto streams a manifest's train split when the in-memory path's estimated peak (rows x
# columns x 8 bytes x IN_MEMORY_COPIES, per local rank) exceeds HOST_SHARE of the host's available memory.
# The in-memory path holds the decoded table, its pandas frame, the transformed float64 and float32 arrays,
# the validation split's copies and the tensors' views: about 6 copies of the data at its peak.
IN_MEMORY_COPIES = 6
HOST_SHARE = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSource:
    """The streamed path's input: the train split's row groups, read as the loop goes (``data.streamed``)."""

    manifest: DataManifest
    # Why the split is streamed, for the launch's one line ("data_placement: stream", the memory estimate).
    reason: str


def read_in_background(config: TrainingConfig, text_tokenizer: TokenizerOf | None = None
                       ) -> Future[Splits | StreamSource]:
    """``read_data`` in a daemon thread; its error (a ``TrainerDataError``) is raised where the result
    is taken, as if read there. Daemon: a launch that fails before taking it does not wait for it.

    A family's tokenizer (``text_tokenizer``) is loaded in the thread too: its folder's copy overlaps the
    launch's imports (it imports torch itself, only for a family that has one)."""
    future: Future[Splits | StreamSource] = Future()

    def read() -> None:
        try:
            future.set_result(read_data(config, text_tokenizer))
        except BaseException as err:  # handed to the thread that takes the result
            future.set_exception(err)

    threading.Thread(target=read, name="trainpipe-data-read", daemon=True).start()
    return future


def read_data(config: TrainingConfig, text_tokenizer: TokenizerOf | None = None) -> Splits | StreamSource:
    """The split in memory (``read_splits``), or, where it is to be streamed, what to stream. The ranks torchrun
    started on this host (``LOCAL_WORLD_SIZE``; 1 without it) share its memory: the auto choice counts them."""
    streamed = stream_source(config, local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return streamed if streamed is not None else read_splits(config, text_tokenizer)


def stream_source(config: TrainingConfig, *, local_ranks: int, available: int | None = None) -> StreamSource | None:
    """The streamed path's input when the split is streamed: ``data_placement: stream`` (a parquet copy: a
    manifest of its one file, made now), or ``auto`` with a manifest whose train split would not fit
    (``IN_MEMORY_COPIES``, ``HOST_SHARE``); None: the in-memory path, as for every copy under auto."""
    if config.data_placement == "stream":
        manifest = read_manifest(config) if config.train_data_format == "manifest" else manifest_of_copy(config)
        return StreamSource(manifest=manifest, reason="data_placement: stream")
    if config.data_placement != "auto" or config.train_data_format != "manifest":
        return None
    manifest = read_manifest(config)
    columns = len({*config.features, config.label, *([config.group_column] if config.group_column else [])} - {""})
    needed = manifest.rows("train") * columns * 8 * IN_MEMORY_COPIES * local_ranks
    available = available_memory() if available is None else available
    if available is None or needed <= HOST_SHARE * available:
        return None
    return StreamSource(manifest=manifest, reason=(
        f"data_placement: auto; in memory it would take about {needed / 2**30:.1f} GiB on this host ({local_ranks} "
        f"rank(s)), over {HOST_SHARE:.0%} of the {available / 2**30:.1f} GiB available"))


def available_memory() -> int | None:
    """The host's available memory in bytes (psutil where installed, else /proc/meminfo); None if unknown."""
    try:
        import psutil
    except ImportError:
        try:
            with open("/proc/meminfo") as meminfo:
                for line in meminfo:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    return int(psutil.virtual_memory().available)


def read_manifest(config: TrainingConfig) -> DataManifest:
    uri = config.train_data_uri
    fs, path = storage.url_to_fs(uri, config.storage_options)
    try:
        with fs.open(path, "rb") as handle:
            return DataManifest.loads(handle.read())
    except FileNotFoundError:
        raise TrainerDataError(f"train_data_uri: {uri} does not exist (train_data_format: manifest names a "
                               "data_manifest.json)") from None
    except (ValueError, KeyError, TypeError) as err:
        raise TrainerDataError(f"train_data_uri: {uri} is not a readable data manifest ({err}); with "
                               "train_data_format: manifest it names the snapshot's data_manifest.json") from None


def manifest_of_copy(config: TrainingConfig) -> DataManifest:
    """A manifest of the one parquet copy at ``train_data_uri``, made now from its footer (its row groups, all
    trained on): what the streamed path reads a copy through, checked the same way."""
    import pyarrow.parquet as pq

    uri = config.train_data_uri
    fs, path = storage.url_to_fs(uri, config.storage_options)
    if not fs.exists(path):
        raise TrainerDataError(f"train_data_uri: {uri} does not exist")
    info = fs.info(path)
    with fs.open(path, "rb") as handle:
        metadata = pq.ParquetFile(handle).metadata
        schema = metadata.schema.to_arrow_schema()
        groups = tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
    columns = tuple((field.name, str(field.type)) for field in schema)
    entry = ManifestFile(uri=uri, path=path.rsplit("/", 1)[-1], size=int(info["size"]), rows=sum(groups),
                         row_groups=groups, holdout_row_groups=(),
                         schema_hash=hashlib.sha256(json.dumps(columns).encode()).hexdigest(),
                         etag=(info.get("ETag") or info.get("etag")), mtime=info.get("mtime"))
    return DataManifest(source_uri=uri, files=(entry,), schema=columns, holdout_fraction=0.0)


def manifest_fs(config: TrainingConfig, manifest: DataManifest) -> Any:
    """The filesystem of the manifest's files: the storage's options where they live in the same store as the
    manifest (the provider refuses a manifest read through another connection), none for another scheme (a local
    folder beside S3 storage)."""
    same_store = manifest.source_uri.split("://", 1)[0] == config.train_data_uri.split("://", 1)[0]
    fs, _ = storage.url_to_fs(manifest.source_uri, config.storage_options if same_store else None)
    return fs


def read_manifest_frame(config: TrainingConfig, manifest: DataManifest) -> pd.DataFrame:
    """A manifest's whole train split as one frame, its row groups in manifest order (the in-memory path)."""
    import pyarrow as pa

    from trainpipe_trainer.data.reading import iter_units

    fs = manifest_fs(config, manifest)
    # Only the columns trained on (one missing is left to require_columns, which names it).
    wanted = {*config.features, config.label, config.group_column}
    columns = [name for name in manifest.columns if name in wanted]
    tables = [table for _, table in iter_units(fs, manifest, "train", columns=columns)]
    if not tables:
        raise TrainerDataError(f"{config.train_data_uri}: the manifest's train split has no row groups")
    return pa.concat_tables(tables).to_pandas()


def is_listwise(config: TrainingConfig) -> bool:
    return config.task == "ranking" and config.model.ranking_loss == "listwise"


def read_parquet(uri: str, storage_options: dict[str, Any]) -> pd.DataFrame:
    fs, path = storage.url_to_fs(uri, storage_options)
    if not fs.exists(path):
        raise TrainerDataError(f"train_data_uri: {uri} does not exist")
    # Open through fsspec ourselves (pandas refuses storage_options for local paths) and decode from
    # Arrow's own buffer without its thread pool: reading via a Python file object can abort the
    # process at exit (apache/arrow#34314).
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open(path, "rb") as handle:
        raw = handle.read()
    return pq.read_table(pa.BufferReader(raw), use_threads=False).to_pandas()


def label_vector(frame: pd.DataFrame, config: TrainingConfig, *, source: str,
                 classes: tuple[str, ...] = ()) -> np.ndarray:
    return label_values(frame, label=config.label, task=config.task, source=source, classes=classes)


def label_classes(frame: pd.DataFrame, config: TrainingConfig, *, source: str) -> tuple[str, ...]:
    """A multiclass run's classes: the config's, or (none given) those of the whole training file, so a
    class only the validation rows hold still has an output; () for the other tasks."""
    if config.task != "multiclass_classification":
        return ()
    if config.label_classes:
        return config.label_classes
    require_columns(frame, [config.label], source=source, role="label")
    classes = label_class_names(frame[config.label], label=config.label, source=source)
    if len(classes) < 2:
        raise TrainerDataError(f"{source}: multiclass label column {config.label!r} holds one class only "
                               f"({', '.join(map(repr, classes))}); a classifier needs at least two")
    return classes


def pad_queries(
    groups: pd.Series, features: np.ndarray, labels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows -> ``[queries, max_docs, F]`` features, ``[queries, max_docs]`` labels and mask."""
    codes, _ = pd.factorize(groups, sort=True)
    position = pd.Series(codes).groupby(codes).cumcount().to_numpy()
    n_queries, max_docs = codes.max() + 1, int(np.bincount(codes).max())
    x = np.zeros((n_queries, max_docs, features.shape[1]), dtype=features.dtype)
    y = np.zeros((n_queries, max_docs), dtype=labels.dtype)
    mask = np.zeros((n_queries, max_docs), dtype=bool)
    x[codes, position], y[codes, position], mask[codes, position] = features, labels, True
    return x, y, mask


def validation_mask(frame: pd.DataFrame, config: TrainingConfig) -> np.ndarray:
    """Rows held out for validation: ``validation_fraction`` of the rows (of the queries for ranking).

    Drawn from the run's seed, so every rank and every attempt of a run holds out the same rows.
    Empty when ``keep_best`` is off or the fraction rounds down to nothing.
    """
    checkpoint = config.checkpoint
    if not checkpoint.keep_best or checkpoint.validation_fraction <= 0:
        return np.zeros(len(frame), dtype=bool)
    if config.task == "ranking":
        units, _ = pd.factorize(frame[config.group_column], sort=True)
    else:
        units = np.arange(len(frame))
    n_units = int(units.max()) + 1 if len(units) else 0
    n_validation = int(n_units * checkpoint.validation_fraction)
    if n_validation == 0:
        return np.zeros(len(frame), dtype=bool)
    chosen = np.random.default_rng(config.seed).permutation(n_units)[:n_validation]
    return np.isin(units, chosen)


def lm_sequences(frame: pd.DataFrame, config: TrainingConfig, tokenizer: TextTokenizer,
                 source: str) -> tuple[np.ndarray, np.ndarray]:
    """causal_lm: one token sequence per row, the text (prompt) then the completion (``label``; none: every next
    token is a target), cut to the tokenizer's ``max_length``: float32 inputs (ids + 1, 0 pads) and int64
    next-token targets (``IGNORED_TARGET`` at the prompt's positions and the padding)."""
    columns = [*config.features, *([config.label] if config.label else [])]
    require_columns(frame, columns, source=source, role="text")
    completions = frame[config.label].to_numpy(dtype=object) if config.label else None
    inputs, targets = tokenizer.sequences(frame[config.features[0]].to_numpy(dtype=object), completions)
    if not (targets >= 0).any():
        raise TrainerDataError(
            f"{source}: no row has a token to train on within model.params.max_length ({tokenizer.max_length}): "
            + ("the completions are empty or the prompts fill every position; raise max_length or shorten the "
               f"prompts in {config.features[0]!r}" if config.label else "the texts are empty"))
    return inputs.astype(np.float32), targets.astype(np.int64)


def split_arrays(frame: pd.DataFrame, config: TrainingConfig, transformer: FeatureTransformer, source: str,
            target: TargetScaler | None = None, classes: tuple[str, ...] = ()) -> tuple[np.ndarray, ...]:
    if config.task == "causal_lm":
        return lm_sequences(frame, config, transformer.text_tokenizer, source)
    features = transformer.transform_float32(frame, source=source)
    labels = label_array(frame, config, source, target, classes)
    if is_listwise(config):
        return pad_queries(frame[config.group_column], features, labels)
    return features, labels


def label_array(frame: pd.DataFrame, config: TrainingConfig, source: str, target: TargetScaler | None = None,
                classes: tuple[str, ...] = ()) -> np.ndarray:
    """The label column as the model's targets: class indices (multiclass), else float32."""
    labels = label_vector(frame, config, source=source, classes=classes)
    if config.task != "multiclass_classification":
        # Scaled in float64, then cast: the same float32 labels whatever the label column's own dtype.
        labels = (target.scale(labels) if target is not None else labels).astype(np.float32)
    return labels


def read_splits(config: TrainingConfig, text_tokenizer: TokenizerOf | None = None) -> Splits:
    """The training (and validation) split as arrays, with the transforms fitted on the rows trained on.

    ``text_tokenizer``: how to find the model family's own tokenizer for text columns
    (``models.text_tokenizer_of``, passed in by the caller: this module imports no family, as no torch); None
    or its None: the hashed words of ``preprocessing.TextEncoder``."""
    source = config.train_data_uri
    frame = (read_manifest_frame(config, read_manifest(config)) if config.train_data_format == "manifest"
             else read_parquet(source, config.storage_options))
    if frame.empty:
        raise TrainerDataError(f"{source}: the training split has no rows")
    transforms = config.feature_transforms()
    if config.task == "ranking":
        require_columns(frame, [config.group_column], source=source, role="group")
        if frame[config.group_column].isna().any():
            raise TrainerDataError(f"{source}: group column {config.group_column!r} has missing query ids")
    classes = label_classes(frame, config, source=source)
    # A family's own tokenizer for its text columns (None: hashed words).
    tokenizer = text_tokenizer(config) if text_tokenizer is not None else None
    if config.task == "causal_lm" and tokenizer is None:
        raise TrainerInputError(f"task: causal_lm needs a model family that tokenises text (model.type: "
                                f"transformer); the {config.model.type!r} family does not")
    held_out = validation_mask(frame, config)
    if not held_out.any():
        # Nothing held out: the split is the whole file, fitted and checked in one pass.
        train_frame, validation_frame = frame, frame.iloc[:0]
    else:
        train_frame = frame.loc[~held_out].reset_index(drop=True)
        validation_frame = frame.loc[held_out].reset_index(drop=True)
    try:
        # Fitted on the rows trained on; the validation rows are transformed the way serving will transform them.
        transformer = FeatureTransformer.fit(train_frame, transforms, source=source, text_tokenizer=tokenizer)
        target = (TargetScaler.fit(label_vector(train_frame, config, source=source))
                  if config.task == "regression" and config.scale_target else None)
        cache = tokenized_cache_uri(config, tokenizer, classes) if tokenizer is not None else None
        cached = _read_tokenized(cache, config) if cache is not None else None
        if cached is not None:
            train, validation = cached
            if os.environ.get("RANK", "0") == "0":
                print(f"tokenised splits read from {cache} (tokenised by an earlier try, run or trial)", flush=True)
        else:
            train = split_arrays(train_frame, config, transformer, source, target, classes)
            validation = (split_arrays(validation_frame, config, transformer, source, target, classes)
                          if len(validation_frame) else None)
            if cache is not None:
                _write_tokenized(cache, config, train, validation)
    except TrainerDataError:
        if train_frame is frame:
            raise
        # Say it of the whole file (counts, values), not of one split of it: check the file as one.
        FeatureTransformer.fit(frame, transforms, source=source, text_tokenizer=tokenizer).transform(frame, source=source)
        if config.task != "causal_lm":
            label_vector(frame, config, source=source, classes=classes)
        raise
    sample = serving_sample(frame, transforms)
    return Splits(
        train=train,
        validation=validation,
        transformer=transformer,
        n_rows=len(train_frame),
        n_validation_rows=len(validation_frame),
        sample_frame=sample,
        target=target,
        classes=classes,
    )


def tokenized_cache_uri(config: TrainingConfig, tokenizer: TextTokenizer, classes: tuple[str, ...]) -> str | None:
    """Where the tokenised splits of this config and tokenizer are kept; None when the snapshot has no digest or
    the tokenizer no hash (a hand-written config: nothing to key a cache by)."""
    if not config.dataset_digest or not getattr(tokenizer, "sha256", ""):
        return None
    key = {"dataset": config.dataset_digest, "train": config.train_data_uri, "tokenizer": tokenizer.sha256,
           "max_length": tokenizer.max_length, "task": config.task, "features": config.features,
           "label": config.label, "classes": classes, "scale_target": config.scale_target,
           "validation": [config.checkpoint.validation_fraction, config.seed, config.group_column]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return storage.join(config.train_data_uri.rsplit("/", 1)[0], TOKENIZED_FOLDER, f"{digest}.npz")


def _read_tokenized(uri: str, config: TrainingConfig) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...] | None] | None:
    fs, path = storage.url_to_fs(uri, config.storage_options)
    try:
        if not fs.exists(path):
            return None
        with np.load(io.BytesIO(fs.cat_file(path)), allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except (OSError, ValueError) as err:  # unreadable (a partial object store write): tokenise again
        if os.environ.get("RANK", "0") == "0":
            print(f"warning: {uri}: the tokenised splits could not be read ({err}); tokenising again", flush=True)
        return None
    train = tuple(arrays[f"train_{i}"] for i in range(sum(name.startswith("train_") for name in arrays)))
    count = sum(name.startswith("validation_") for name in arrays)
    validation = tuple(arrays[f"validation_{i}"] for i in range(count)) if count else None
    return train, validation


def _write_tokenized(uri: str, config: TrainingConfig, train: tuple[np.ndarray, ...],
                     validation: tuple[np.ndarray, ...] | None) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **{f"train_{i}": array for i, array in enumerate(train)},
             **{f"validation_{i}": array for i, array in enumerate(validation or ())})
    # Every rank may write it (the same bytes): each write is whole (a rename, or one PUT).
    storage.write_bytes(uri, buffer.getvalue(), config.storage_options)


def serving_sample(frame: pd.DataFrame, transforms: tuple) -> pd.DataFrame:
    """A few raw feature rows as the served model takes them: numeric columns as float64 (so integer
    input is accepted too), categorical ones as text (missing values stay missing)."""
    sample = frame.loc[:, [t.feature for t in transforms]].head(20).reset_index(drop=True)
    numeric = [t.feature for t in transforms if t.type == "numeric"]
    categorical = {t.feature: object for t in transforms if t.type == "categorical"}
    sample = sample.astype({**dict.fromkeys(numeric, "float64"), **categorical})
    for name in categorical:
        sample[name] = sample[name].where(sample[name].isna(), sample[name].astype(str))
    return sample
