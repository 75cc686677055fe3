"""trainpipe_trainer.data: validation, query padding and the resumable sampler."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import TensorDataset

from trainpipe_trainer.config import CheckpointConfig, ModelConfig, TrainingConfig
from trainpipe_trainer.data.memory import EpochLoader, load_training_data
from trainpipe_trainer.data.splits import pad_queries, read_in_background, validation_mask
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import TrainerDataError


def _config(train: Path, **overrides: object) -> TrainingConfig:
    base = TrainingConfig(
        pipeline_id="p",
        task="binary_classification",
        train_data_uri=str(train),
        features=("a", "b"),
        label="label",
        checkpoint=CheckpointConfig(root_uri=str(train.parent / "ckpt")),
        output_uri=str(train.parent / "out"),
    )
    return dataclasses.replace(base, **overrides)


def test_missing_feature_column_names_column_and_file(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1]}).to_parquet(path)
    with pytest.raises(TrainerDataError, match=rf"{path}: missing feature column\(s\) 'b'"):
        load_training_data(_config(path))


def test_binary_labels_must_be_zero_or_one(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "b": [0.0, 1.0], "label": [0, 2]}).to_parquet(path)
    with pytest.raises(TrainerDataError, match=r"binary_classification needs labels 0/1 in 'label', found \[2.0\]"):
        load_training_data(_config(path))


def test_a_background_read_raises_its_data_error_where_the_data_is_taken(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "b": [0.0, 1.0], "label": [0, 2]}).to_parquet(path)
    pending = read_in_background(_config(path))
    with pytest.raises(TrainerDataError, match=r"binary_classification needs labels 0/1 in 'label', found \[2.0\]"):
        load_training_data(_config(path), pending)


def test_a_background_read_gives_the_same_tensors_as_a_direct_read(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    rng = np.random.default_rng(3)
    pd.DataFrame({"a": rng.normal(size=64), "b": rng.normal(size=64), "label": rng.integers(0, 2, 64)}).to_parquet(path)
    config = _config(path)
    direct, background = load_training_data(config), load_training_data(config, read_in_background(config))
    assert background.n_rows == direct.n_rows > 0
    for ours, theirs in zip(background.dataset.tensors, direct.dataset.tensors, strict=True):
        assert torch.equal(ours, theirs)


def test_missing_data_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TrainerDataError, match=r"train_data_uri: .*nope\.parquet does not exist"):
        load_training_data(_config(tmp_path / "nope.parquet"))


def test_listwise_data_is_padded_per_query(tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    pd.DataFrame(
        {"q": [7, 3, 7, 7], "a": [1.0, 2.0, 3.0, 4.0], "b": [0.0, 0.0, 1.0, 1.0], "label": [1, 4, 0, 2]}
    ).to_parquet(path)
    data = load_training_data(
        _config(path, task="ranking", group_column="q", model=ModelConfig(ranking_loss="listwise"))
    )
    features, labels, mask = data.dataset.tensors
    assert features.shape == (2, 3, 2)
    # Queries in sorted id order: q=3 (one document), then q=7 (three, in file order).
    assert mask.tolist() == [[True, False, False], [True, True, True]]
    assert labels.tolist() == [[4.0, 0.0, 0.0], [1.0, 0.0, 2.0]]


def test_pad_queries_keeps_rows_with_their_query() -> None:
    x, y, mask = pad_queries(pd.Series(["b", "a", "b"]), np.array([[1.0], [2.0], [3.0]]), np.array([5.0, 6.0, 7.0]))
    assert x[:, :, 0].tolist() == [[2.0, 0.0], [1.0, 3.0]]
    assert y.tolist() == [[6.0, 0.0], [5.0, 7.0]]
    assert mask.sum() == 3


def _env(rank: int, world_size: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"), backend="gloo")


def _micro_batches(dataset: TensorDataset, world_size: int, epoch: int, position: int = 0) -> list[list[list[int]]]:
    """Each micro-batch as every rank's rows, rank by rank."""
    loaders = [EpochLoader(dataset=dataset, batch_size=4, seed=5, env=_env(r, world_size)) for r in range(world_size)]
    per_rank = [[b[0].int().tolist() for b in loader.epoch(epoch, position=position)] for loader in loaders]
    return [list(batches) for batches in zip(*per_rank, strict=True)]


@pytest.mark.parametrize("rank", [0, 1])
def test_loader_from_a_global_position_replays_the_rest_of_the_epoch(rank: int) -> None:
    dataset = TensorDataset(torch.arange(23, dtype=torch.float32))
    full = EpochLoader(dataset=dataset, batch_size=4, seed=5, env=_env(rank, 2))
    resumed = EpochLoader(dataset=dataset, batch_size=4, seed=5, env=_env(rank, 2))
    assert full.batches_per_epoch == 3
    all_batches = [b[0].tolist() for b in full.epoch(1)]
    # Two micro-batches of 4 rows on each of the 2 ranks: global position 16.
    assert [b[0].tolist() for b in resumed.epoch(1, position=16)] == all_batches[2:]
    # Another epoch is another permutation.
    assert [b[0].tolist() for b in full.epoch(2)] != all_batches


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)])
def test_an_epoch_continued_at_another_world_size_sees_every_row_once(before: int, after: int) -> None:
    rows = 23
    dataset = TensorDataset(torch.arange(rows, dtype=torch.float32))
    done = _micro_batches(dataset, before, epoch=1)[:2]
    position = sum(len(share) for batch in done for share in batch)
    rest = _micro_batches(dataset, after, epoch=1, position=position)
    seen = [row for batch in done + rest for share in batch for row in share]
    # Each row once; only the epoch's last micro-batch may repeat first rows so that every rank gets as many.
    assert sorted(set(seen)) == list(range(rows))
    assert len(seen) - rows < after
    assert all(len({len(share) for share in batch}) == 1 for batch in done + rest)
    # The order is the epoch's: what the old size would have trained next, the new size trains next.
    uninterrupted = [row for batch in _micro_batches(dataset, 1, epoch=1) for share in batch for row in share]
    assert seen[:rows] == uninterrupted


@pytest.mark.parametrize(("rows", "world_size", "position"), [(23, 1, 0), (23, 2, 8), (23, 3, 0), (2, 3, 0)])
def test_each_batch_is_the_samplers_rows_gathered_at_once(rows: int, world_size: int, position: int) -> None:
    """The data path takes each batch by index from contiguous tensors (no per-row collate); the rows
    and their order are exactly the sampler's, as a DataLoader over it would give them."""
    from torch.utils.data import DataLoader

    features = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    labels = torch.arange(rows, dtype=torch.float32) * 10
    dataset = TensorDataset(features, labels)
    for rank in range(world_size):
        loader = EpochLoader(dataset=dataset, batch_size=4, seed=5, env=_env(rank, world_size))
        gathered = list(loader.epoch(2, position=position))
        reference = DataLoader(dataset, batch_size=4, sampler=loader.sampler)
        expected = list(reference)
        assert len(gathered) == len(expected) > 0
        for (x, y), (ref_x, ref_y) in zip(gathered, expected, strict=True):
            assert torch.equal(x, ref_x) and torch.equal(y, ref_y)
            assert x.is_contiguous()
    # The wait for batches is measured (the progress line's data-wait share).
    assert loader.wait_seconds > 0


def _multiclass_file(path: Path, labels: list[object]) -> Path:
    rng = np.random.default_rng(5)
    pd.DataFrame({"a": rng.normal(size=len(labels)), "b": rng.normal(size=len(labels)), "label": labels}).to_parquet(path)
    return path


def test_multiclass_labels_are_class_indices_in_both_splits(tmp_path: Path) -> None:
    labels = ["cat", "dog", "eel"] * 20
    path = _multiclass_file(tmp_path / "train.parquet", labels)
    # The config's order, not the text order: the index is the model's output.
    config = _config(path, task="multiclass_classification", label_classes=("eel", "cat", "dog"),
                     checkpoint=CheckpointConfig(root_uri="file:///unused", validation_fraction=0.25))
    data = load_training_data(config)
    assert data.classes == ("eel", "cat", "dog")
    held_out = validation_mask(pd.read_parquet(path), config)
    expected = np.array([{"eel": 0, "cat": 1, "dog": 2}[label] for label in labels])
    train_labels, validation_labels = data.dataset.tensors[1], data.validation.tensors[1]
    assert train_labels.dtype == validation_labels.dtype == torch.int64
    assert train_labels.tolist() == expected[~held_out].tolist()
    assert validation_labels.tolist() == expected[held_out].tolist()


def test_multiclass_without_configured_classes_takes_the_training_files_in_numeric_order(tmp_path: Path) -> None:
    path = _multiclass_file(tmp_path / "train.parquet", [10, 2, 7, 2, 10, 7])
    data = load_training_data(_config(path, task="multiclass_classification"))
    assert data.classes == ("2", "7", "10")
    assert sorted(set(data.dataset.tensors[1].tolist())) == [0, 1, 2]


def test_a_multiclass_label_outside_the_classes_is_named(tmp_path: Path) -> None:
    path = _multiclass_file(tmp_path / "train.parquet", ["cat", "dog", "yak", "cat"])
    config = _config(path, task="multiclass_classification", label_classes=("cat", "dog"))
    with pytest.raises(TrainerDataError, match=r"label column 'label' holds classes that are not in the run's "
                                               r"classes \(2: 'cat', 'dog'\): 'yak'; add them to training.label_classes"):
        load_training_data(config)


def test_a_multiclass_label_with_one_class_is_refused(tmp_path: Path) -> None:
    path = _multiclass_file(tmp_path / "train.parquet", ["cat"] * 4)
    with pytest.raises(TrainerDataError, match=r"multiclass label column 'label' holds one class only \('cat'\)"):
        load_training_data(_config(path, task="multiclass_classification"))
