"""The streamed data path (trainpipe_trainer.data.streamed): one global sample stream per (manifest, seed,
epoch), any world size resumes it, reads checked against the manifest, bounded memory. Real parquet files
with small row groups, a real manifest, real torchrun."""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.trainer.helpers import BINARY_FEATURES, binary_frame, launch, resumes_to, untracked_trainer
from trainpipe_trainer.config import FeatureTransform, TrainingConfig
from trainpipe_trainer.data.manifest import DataManifest, ManifestFile, holdout_row_groups
from trainpipe_trainer.data.reading import UnitReader
from trainpipe_trainer.data.splits import StreamSource, read_splits, stream_source
from trainpipe_trainer.data.statistics import fitted_from_statistics, load_or_compute_statistics
from trainpipe_trainer.data.streamed import (
    SampleStream,
    StreamedData,
    load_data,
    numeric_arrays,
    open_streamed,
    transformed_rows,
)
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import DataChangedError, TrainerDataError, TrainerInputError
from trainpipe_trainer.preprocessing import FeatureTransformer
from trainpipe_trainer.resume import DATA_ORDER, ResumeIdentity

FILES, GROUPS, GROUP_ROWS = 6, 4, 100
# row_id is a feature, so a batch's rows can be told apart (standardised: inverted with its encoder).
FEATURES = (*BINARY_FEATURES, "row_id")


def write_version(root: Path, *, holdout_fraction: float = 0.2) -> Path:
    """FILES parquet files of GROUPS row groups each and their data_manifest.json; returns the manifest."""
    rng = np.random.default_rng(7)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"part-{i}.parquet" for i in range(FILES)]
    for i, name in enumerate(names):
        frame = binary_frame(rng, GROUPS * GROUP_ROWS)
        frame["row_id"] = np.arange(i * GROUPS * GROUP_ROWS, (i + 1) * GROUPS * GROUP_ROWS, dtype=np.float64)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / name, row_group_size=GROUP_ROWS)
    held = holdout_row_groups([(name, GROUPS) for name in names], holdout_fraction)
    return write_manifest(root, names, held)


def write_manifest(root: Path, names: list[str], held: list[tuple[int, ...]]) -> Path:
    fs = fsspec.filesystem("file")
    files = []
    for name, holdout in zip(names, held, strict=True):
        path = root / name
        metadata = pq.ParquetFile(path).metadata
        groups = tuple(metadata.row_group(g).num_rows for g in range(metadata.num_row_groups))
        info = fs.info(str(path))
        files.append(ManifestFile(uri=str(path), path=name, size=int(info["size"]), rows=sum(groups),
                                  row_groups=groups, holdout_row_groups=holdout, schema_hash="test",
                                  mtime=info["mtime"]))
    schema = pq.read_schema(root / names[0])
    manifest = DataManifest(source_uri=str(root), files=tuple(files), holdout_fraction=0.2,
                            schema=tuple((field.name, str(field.type)) for field in schema))
    (root / "data_manifest.json").write_bytes(manifest.dumps())
    return root / "data_manifest.json"


@pytest.fixture(scope="module")
def version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_version(tmp_path_factory.mktemp("version"))


def _config(manifest: Path, workdir: Path, **overrides: Any) -> TrainingConfig:
    raw: dict[str, Any] = {
        "pipeline_id": "streamed", "task": "binary_classification", "train_data_uri": str(manifest),
        "train_data_format": "manifest", "data_placement": "stream", "features": list(FEATURES), "label": "label",
        "batch_size": 32, "seed": 3, "output_uri": str(workdir / "output"),
        "checkpoint": {"root_uri": (workdir / "checkpoints").as_uri(), "keep_best": False},
    }
    return TrainingConfig.from_dict({**raw, **overrides})


def _data(manifest: Path, workdir: Path, **overrides: Any) -> StreamedData:
    config = _config(manifest, workdir, **overrides)
    loaded = load_data(config)
    assert isinstance(loaded, StreamedData)
    return loaded


def _env(rank: int, world: int) -> DistEnv:
    return DistEnv(rank=rank, local_rank=rank, world_size=world, device=torch.device("cpu"), backend="gloo")


def _row_ids(data: StreamedData, batch: list[torch.Tensor]) -> list[int]:
    encoder = data.transformer.encoders[FEATURES.index("row_id")]
    return np.rint(batch[0][:, FEATURES.index("row_id")].double().numpy() * encoder.std + encoder.mean).astype(
        int).tolist()


def _rows_seen(data: StreamedData, *, world: int, epoch: int, start: int = 0, stop: int | None = None,
               window_rows: int | None = None) -> tuple[list[int], int]:
    """The stream's rows from global position ``start`` as ``world`` ranks take them (ranks interleaved back
    into global order), up to position ``stop``; and the epoch's end."""
    per_rank = []
    end = 0
    for rank in range(world):
        loader = data.loader(batch_size=data.config.batch_size, seed=data.config.seed, env=_env(rank, world))
        if window_rows is not None:
            loader.stream = SampleStream(units=data.units, seed=data.config.seed, window_rows=window_rows)
        rows: list[list[int]] = []
        position = start
        for batch in loader.epoch(epoch, position=start):
            if stop is not None and position >= stop:
                break
            rows.append(_row_ids(data, batch))
            position += len(batch[0]) * world
        end = loader.epoch_end
        loader.close()
        per_rank.append(rows)
    # Global sample k of a global batch is rank k mod W's: interleave each micro-batch's parts back.
    order = [row for parts in zip(*per_rank, strict=True) for group in zip(*parts, strict=True) for row in group]
    return order, end


def test_each_epoch_is_a_permutation_of_the_train_rows_whatever_the_world_size(version: Path, tmp_path: Path) -> None:
    data = _data(version, tmp_path)
    train_rows = sorted(i for unit in data.units for i in _unit_row_ids(data, unit))
    one, end = _rows_seen(data, world=1, epoch=0)
    assert sorted(one) == train_rows and end == data.n_rows
    assert len(train_rows) == data.n_rows < FILES * GROUPS * GROUP_ROWS  # the holdout units are not trained on
    # Two and three ranks see the same stream; the epoch's end is padded with its first samples.
    for world in (2, 3):
        seen, end = _rows_seen(data, world=world, epoch=0)
        assert end == math.ceil(data.n_rows / world) * world
        assert seen == one + one[: end - data.n_rows]
    # Another epoch is another order of the same rows; the windows mix rows across row groups.
    other, _ = _rows_seen(data, world=1, epoch=1)
    assert sorted(other) == train_rows and other != one
    first_batch = set(one[:32])
    assert len({i // GROUP_ROWS for i in first_batch}) > 1


def _unit_row_ids(data: StreamedData, unit: Any) -> list[int]:
    entry = data.manifest.files[unit.file]
    table = pq.ParquetFile(entry.uri).read_row_group(unit.row_group, columns=["row_id"])
    return table.column("row_id").to_numpy().astype(int).tolist()


def test_a_resume_at_another_world_size_takes_exactly_the_rest_of_the_epoch(version: Path, tmp_path: Path) -> None:
    data = _data(version, tmp_path)
    whole, _ = _rows_seen(data, world=2, epoch=1)
    stop = 7 * 2 * 32  # seven steps of two ranks
    before, _ = _rows_seen(data, world=2, epoch=1, stop=stop)
    after, end = _rows_seen(data, world=1, epoch=1, start=stop)
    assert len(before) == stop and end == data.n_rows
    assert Counter(before + after) == Counter(whole[: data.n_rows])  # every row of the epoch exactly once
    assert before + after == whole[: data.n_rows]  # and in the order of one uninterrupted stream
    # Started mid-window (not at a batch boundary of any run): the same positions.
    odd, _ = _rows_seen(data, world=3, epoch=1, start=stop + 4)
    assert odd == whole[stop + 4: data.n_rows] + whole[: (-(data.n_rows - stop - 4)) % 3]


def test_the_loader_holds_only_its_windows(version: Path, tmp_path: Path) -> None:
    data = _data(version, tmp_path)
    window = GROUP_ROWS
    loader = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    loader.stream = SampleStream(units=data.units, seed=0, window_rows=window)
    rows = sum(len(batch[0]) for batch in loader.epoch(0))
    assert rows == data.n_rows
    # The windows in flight (whole, as read), the one being batched and a batch's remainder: never the split.
    assert 0 < loader.peak_buffered_rows <= (loader.prefetch + 1) * window + 16
    assert loader.peak_buffered_rows < data.n_rows / 3
    assert loader.buffered_rows == 0
    loader.close()
    # Stopped part way, it lets go of what it read ahead.
    loader = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    batches = loader.epoch(0)
    next(batches)
    batches.close()
    assert loader.buffered_rows == 0
    loader.close()


def test_a_streamed_run_ends_its_read_threads_with_its_loop(version: Path, tmp_path: Path, env: DistEnv,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from trainpipe_trainer.trainer import Trainer

    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("trainpipe-stream") and t.is_alive()]

    before = readers()
    trainer = untracked_trainer(_config(version, tmp_path, epochs=1), env)
    # The model's export needs tracking, which this in-process run has off; the loop is what is looked at.
    monkeypatch.setattr(Trainer, "_export", lambda self, resumed: None)
    trainer.fit()
    assert isinstance(trainer.data, StreamedData)
    assert trainer.state.global_step > 0
    # The loader's read threads ended with the loop (before: they lived until the process exited).
    assert readers() == before


def test_the_next_epoch_is_read_while_one_ends_within_the_same_bound(version: Path, tmp_path: Path) -> None:
    data = _data(version, tmp_path, epochs=3)
    loader = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    loader.stream = SampleStream(units=data.units, seed=0, window_rows=GROUP_ROWS)
    first = [row for batch in loader.epoch(0) for row in _row_ids(data, batch)]
    # The next epoch's first windows are in flight (and counted), nothing more than the bound.
    assert loader._ahead is not None and 0 < loader.buffered_rows <= loader.prefetch * GROUP_ROWS
    assert loader.peak_buffered_rows <= (loader.prefetch + 1) * GROUP_ROWS + 16
    second = [row for batch in loader.epoch(1) for row in _row_ids(data, batch)]
    fresh = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    fresh.stream = loader.stream
    assert second == [row for batch in fresh.epoch(1) for row in _row_ids(data, batch)] != first
    # Resumed elsewhere than the next epoch's start, the reads ahead are dropped.
    middle = [row for batch in loader.epoch(2, position=160) for row in _row_ids(data, batch)]
    assert middle == [row for batch in fresh.epoch(2, position=160) for row in _row_ids(data, batch)]
    assert loader.buffered_rows == 0  # the last epoch reads nothing ahead
    loader.close()
    fresh.close()


def test_the_validation_split_is_whole_units_kept_out_of_the_stream(version: Path, tmp_path: Path) -> None:
    data = _data(version, tmp_path, checkpoint={"root_uri": (tmp_path / "ck").as_uri(), "keep_best": True,
                                                "validation_fraction": 0.2})
    assert data.validation_units and not set(data.validation_units) & set(data.units)
    assert data.n_validation_rows == len(data.validation) <= 0.2 * (data.n_rows + data.n_validation_rows)
    assert data.n_validation_rows % GROUP_ROWS == 0
    seen, _ = _rows_seen(data, world=1, epoch=0)
    held = {i for unit in data.validation_units for i in _unit_row_ids(data, unit)}
    assert not held & set(seen)


def test_auto_streams_a_manifest_only_when_it_would_not_fit(version: Path, tmp_path: Path) -> None:
    config = _config(version, tmp_path, data_placement="auto")
    assert stream_source(config, local_ranks=2, available=2**40) is None
    streamed = stream_source(config, local_ranks=2, available=2**20)
    assert isinstance(streamed, StreamSource) and "data_placement: auto" in streamed.reason
    copy = _config(tmp_path / "x.parquet", tmp_path, data_placement="auto", train_data_format="parquet")
    assert stream_source(copy, local_ranks=8, available=1) is None  # a copy under auto stays in memory


def test_a_manifest_that_fits_is_read_whole_in_manifest_order(version: Path, tmp_path: Path) -> None:
    split = read_splits(_config(version, tmp_path, data_placement="auto"))
    manifest = DataManifest.loads(version.read_bytes())
    assert split.n_rows == manifest.rows("train")
    encoder = split.transformer.encoders[FEATURES.index("row_id")]
    ids = np.rint(split.train[0][:, FEATURES.index("row_id")] * encoder.std + encoder.mean).astype(int)
    expected = [u.file * GROUPS * GROUP_ROWS + u.row_group * GROUP_ROWS + r
                for u in manifest.units("train") for r in range(u.rows)]
    assert ids.tolist() == expected


def test_what_the_streamed_path_does_not_train_is_refused_naming_data_placement(version: Path, tmp_path: Path) -> None:
    config = _config(version, tmp_path, task="ranking", group_column="row_id",
                     features=list(BINARY_FEATURES))
    with pytest.raises(TrainerInputError, match=r"data_placement: the streamed path does not train ranking.*"
                                                r"data_placement: host"):
        open_streamed(config, StreamSource(manifest=DataManifest.loads(version.read_bytes()), reason="test"))


def test_a_column_missing_from_the_version_is_named_with_the_fix(version: Path, tmp_path: Path) -> None:
    config = _config(version, tmp_path, features=[*BINARY_FEATURES, "row_idx"])
    with pytest.raises(TrainerDataError, match=r"column\(s\) \['row_idx'\] of the config .* are not in the dataset "
                                               r"version's files .*fix training.features"):
        open_streamed(config, StreamSource(manifest=DataManifest.loads(version.read_bytes()), reason="test"),
                      transformer=None, target=None, classes=())


def test_a_streamed_checkpoint_is_not_resumed_in_memory_and_the_provider_does_not_judge_it() -> None:
    recorded = ResumeIdentity(snapshot="s", settings={"seed": 0, DATA_ORDER: "streamed"})
    in_memory = ResumeIdentity(snapshot="s", settings={"seed": 0, DATA_ORDER: "in_memory"})
    provider = ResumeIdentity(snapshot="s", settings={"seed": 0})
    assert recorded.differences(provider) == []
    (change,) = recorded.differences(in_memory)
    assert change.startswith("data order streamed -> in_memory") and "data_placement: stream" in change
    # A checkpoint from before the key was trained in memory.
    assert provider.differences(in_memory) == []
    assert provider.differences(recorded)[0].startswith("data order in_memory -> streamed")


# -- through real torchrun ----------------------------------------------------------------------------------


def _run_config(make_config: Callable[..., dict[str, Any]], workdir: Path, manifest: Path,
                **overrides: Any) -> dict[str, Any]:
    return make_config(workdir, train_data=manifest, features=FEATURES, train_data_format="manifest",
                       data_placement="stream", epochs=1, **overrides)


@pytest.mark.integration
def test_two_ranks_stopped_then_one_rank_train_each_row_once(
        make_config: Callable[..., dict[str, Any]], version: Path, tmp_path: Path) -> None:
    config = _run_config(make_config, tmp_path, version, checkpoint={"every_n_steps": 100, "keep_best": False})
    first = launch({**config, "stop_after_step": 9}, tmp_path, nproc=2)
    assert first.returncode == 0, first.describe()
    assert re.search(r"data: streamed from \d+ row groups of 6 files, \d+ rows \(data_placement: stream\)",
                     first.stdout)
    rest = launch(config, tmp_path, nproc=1)
    assert rest.returncode == 0, rest.describe()
    data = _data(version, tmp_path)
    position = 9 * 2 * 32
    match = re.search(r"continues at its row (\d+) of (\d+)", rest.stdout)
    assert match is not None, rest.describe()
    assert (int(match[1]), int(match[2])) == (position, data.n_rows)
    # The one rank takes the rest of the epoch, batch by batch: exactly the rows the two ranks left.
    assert rest.result()["global_step"] == 9 + math.ceil((data.n_rows - position) / 32)
    before, _ = _rows_seen(data, world=2, epoch=0, stop=position)
    after, _ = _rows_seen(data, world=1, epoch=0, start=position)
    assert sorted(before + after) == sorted(i for unit in data.units for i in _unit_row_ids(data, unit))


@pytest.mark.integration
def test_kill_9_mid_epoch_on_the_streamed_path_resumes_to_the_same_weights(
        make_config: Callable[..., dict[str, Any]], version: Path, tmp_path: Path) -> None:
    # Two epochs: the second's first windows are read while the first ends.
    config = {**_run_config(make_config, tmp_path / "reference", version), "epochs": 2}
    reference = launch(config, tmp_path / "reference", nproc=2)
    assert reference.returncode == 0, reference.describe()
    resumed = {**_run_config(make_config, tmp_path / "killed", version), "epochs": 2}
    resumes_to(reference, resumed, tmp_path / "killed", checkpoint_every=4, step_delay_seconds=0.2)


@pytest.mark.integration
def test_a_file_changed_after_the_snapshot_stops_training_naming_it(
        make_config: Callable[..., dict[str, Any]], tmp_path: Path) -> None:
    manifest = write_version(tmp_path / "version")
    config = _run_config(make_config, tmp_path / "run", manifest, checkpoint={"keep_best": False})
    # The statistics as the validate step leaves them, so the first read of the changed file is the loop's.
    typed = TrainingConfig.from_dict(config)
    parsed = DataManifest.loads(manifest.read_bytes())
    fitted_from_statistics(typed, load_or_compute_statistics(typed, parsed, fsspec.filesystem("file")))
    first_file = parsed.files[parsed.units("train")[0].file].path
    changed = next(f for f in parsed.files if f.path != first_file)
    frame = pd.read_parquet(changed.uri)
    frame["f_noise"] = frame["f_noise"] + 1.0
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), changed.uri, row_group_size=GROUP_ROWS)
    run = launch(config, tmp_path / "run", nproc=None)
    assert run.returncode == 2, run.describe()
    assert re.search(rf"trainpipe_trainer: error: {re.escape(changed.uri)}: changed since dataset version "
                     r"[0-9a-f]{16} listed it", run.stderr), run.describe()
    assert "run the DAG again for a new snapshot" in run.stderr
    assert not (tmp_path / "run" / "output" / "result.json").exists()


def test_a_parquet_copy_is_streamed_through_a_manifest_of_its_row_groups(tmp_path: Path) -> None:
    frame = binary_frame(np.random.default_rng(3), 1000)
    frame["row_id"] = np.arange(len(frame), dtype=np.float64)
    copy = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), copy, row_group_size=100)
    config = _config(copy, tmp_path, train_data_format="parquet",
                     checkpoint={"root_uri": (tmp_path / "ck").as_uri(), "keep_best": True,
                                 "validation_fraction": 0.25})
    data = load_data(config)
    assert isinstance(data, StreamedData) and data.reason == "data_placement: stream"
    # No holdout in a copy; the validation split is two whole row groups (a quarter of the rows, rounded down).
    assert (data.n_rows, data.n_validation_rows, len(data.units)) == (800, 200, 8)
    seen, _ = _rows_seen(data, world=2, epoch=0)
    assert sorted(seen) == sorted(i for unit in data.units for i in _unit_row_ids(data, unit))


def test_the_config_json_of_a_copy_is_unchanged_and_a_manifest_says_so(version: Path, tmp_path: Path) -> None:
    copy = _config(tmp_path / "train.parquet", tmp_path, train_data_format="parquet", data_placement="auto")
    assert "train_data_format" not in copy.to_dict()
    manifest = _config(version, tmp_path)
    assert manifest.to_dict()["train_data_format"] == "manifest"
    assert TrainingConfig.from_dict(manifest.to_dict()) == manifest
    with pytest.raises(ValueError, match=r"train_data_format: one of \('parquet', 'manifest'\), got 'csv'"):
        _config(version, tmp_path, train_data_format="csv")


def test_the_numeric_window_path_gives_the_frame_paths_values() -> None:
    """A window of float32, float64 with nulls and integer columns, taken in a shuffled order: the numeric path
    (no pandas) gives the same float32 matrix as the transformer on the taken rows' frame."""
    rng = np.random.default_rng(5)
    rows = 3000
    table = pa.table({
        "f32": rng.normal(size=rows).astype(np.float32) * 50,
        "f64": pa.array(np.where(rng.random(rows) < 0.1, np.nan, rng.exponential(size=rows)), from_pandas=True),
        "i64": rng.integers(-1000, 1000, size=rows),
    })
    assert table.column("f64").null_count > 0
    transforms = (FeatureTransform(feature="f32", clip_min=-60.0, clip_max=60.0),
                  FeatureTransform(feature="f64", impute="median", transform="log1p"),
                  FeatureTransform(feature="i64", standardize=False))
    transformer = FeatureTransformer.fit(table.to_pandas(), transforms, source="w")
    numeric = transformer.numeric_columns()
    assert numeric is not None
    # One rank's share of a permuted window: every other position, so not every row, in no sorted order.
    taken = rng.permutation(rows)[1::2]
    columns = numeric_arrays(table, numeric.features)
    assert columns is not None
    expected = transformer.transform_float32(table.take(pa.array(taken)).to_pandas(), source="w")
    np.testing.assert_array_equal(transformed_rows(numeric, columns, taken, source="w"), expected)


WINDOW_CASES = {
    "numeric path": {"features": list(BINARY_FEATURES)},
    "frame path": {"features": [*BINARY_FEATURES, "country"], "transforms": [{"feature": "country",
                                                                               "type": "categorical"}]},
    "numeric path, scaled target": {"task": "regression", "label": "f_noise", "features": list(BINARY_FEATURES[:3])},
}


@pytest.mark.parametrize("case", WINDOW_CASES)
def test_a_window_reads_as_the_frame_computation_of_its_rows(tmp_path: Path, case: str) -> None:
    root = tmp_path / "version"
    root.mkdir()
    rng = np.random.default_rng(2)
    frame = binary_frame(rng, 400)
    frame["country"] = rng.choice(["fr", "de", "us"], size=400)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / "part-0.parquet", row_group_size=100)
    manifest = write_manifest(root, ["part-0.parquet"], [()])
    data = _data(manifest, tmp_path, **WINDOW_CASES[case])
    assert (data.numeric is None) == (case == "frame path")
    assert (data.target is None) == (case != "numeric path, scaled target")
    loader = data.loader(batch_size=16, seed=0, env=_env(1, 2))
    loader.stream = SampleStream(units=data.units, seed=0, window_rows=250)
    for piece in loader.stream.pieces(0, start=0, world=2, rank=1):
        table = pa.concat_tables([pq.ParquetFile(root / "part-0.parquet").read_row_group(unit.row_group)
                                  for unit in piece.window.units])
        rows = loader.stream.permutation(0, piece.window)[piece.offsets]
        expected = data.arrays(table.take(pa.array(rows)).to_pandas(), source="w")
        for got, want in zip(loader._read(0, piece), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    loader.close()


def test_columns_the_numeric_path_cannot_read_take_the_frame_path() -> None:
    table = pa.table({"x": pa.array([1.0, 2.0]), "n": pa.array([1, None], type=pa.int64()),
                      "s": pa.array(["a", "b"])})
    assert numeric_arrays(table, ["x"]) is not None
    # An integer column with a null reads as float NaN through pandas; a text column holds no numbers.
    assert numeric_arrays(table, ["x", "n"]) is None
    assert numeric_arrays(table, ["s"]) is None


def test_a_file_replaced_mid_epoch_stops_the_loader_naming_it(tmp_path: Path) -> None:
    manifest = write_version(tmp_path / "version")
    data = _data(manifest, tmp_path)
    loader = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    loader.stream = SampleStream(units=data.units, seed=0, window_rows=GROUP_ROWS)
    # The file whose first row group comes latest in the epoch: not opened before the first batch is taken.
    windows = loader.stream.windows(0)
    first_seen = {}
    for window in windows:
        first_seen.setdefault(window.units[0].file, window.index)
    late, index = max(first_seen.items(), key=lambda item: item[1])
    assert index > loader.prefetch + 1
    batches = loader.epoch(0)
    next(batches)
    entry = data.manifest.files[late]
    replaced = pd.read_parquet(entry.uri)
    replaced["f_noise"] = -replaced["f_noise"]
    pq.write_table(pa.Table.from_pandas(replaced, preserve_index=False), f"{entry.uri}.new", row_group_size=GROUP_ROWS)
    Path(f"{entry.uri}.new").replace(entry.uri)
    with pytest.raises(DataChangedError, match=rf"^{re.escape(entry.uri)}: changed since dataset version"):
        for _ in batches:
            pass
    assert loader.buffered_rows == 0
    loader.close()


def test_a_file_cut_short_while_open_is_named_as_changed(tmp_path: Path) -> None:
    manifest = write_version(tmp_path / "version")
    data = _data(manifest, tmp_path)
    loader = data.loader(batch_size=16, seed=0, env=_env(0, 1))
    unit, *_ = (u for u in data.units if u.row_group == 0)
    later = next(u for u in data.units if u.file == unit.file and u.row_group > 0)
    with UnitReader(data.fs, data.manifest, columns=data.columns) as reader:
        reader.read(unit)  # the file is open, its footer read
        path = data.manifest.files[unit.file].uri
        with open(path, "r+b") as handle:
            handle.truncate(100)
        with pytest.raises(DataChangedError, match=rf"^{re.escape(path)}: changed since .* \(size \d+ -> 100 bytes"):
            loader._read_unit(reader, later)
    loader.close()


@pytest.mark.integration
def test_a_streamed_checkpoint_is_refused_by_an_in_memory_run_and_the_fitting_manifest_trains_in_memory(
        make_config: Callable[..., dict[str, Any]], version: Path, tmp_path: Path) -> None:
    config = _run_config(make_config, tmp_path, version, checkpoint={"keep_best": False})
    stopped = launch({**config, "stop_after_step": 3}, tmp_path, nproc=None)
    assert stopped.returncode == 0, stopped.describe()
    # auto: this small manifest fits, so it is read whole, and the streamed checkpoint's order is not its own.
    refused = launch({**config, "data_placement": "auto"}, tmp_path, nproc=None)
    assert refused.returncode == 2, refused.describe()
    data = DataManifest.loads(version.read_bytes())
    assert f"data: in memory, {data.rows('train')} rows of the manifest's train split (data_placement: auto)" \
        in refused.stdout
    assert re.search(r"cannot resume this checkpoint: .*data order streamed -> in_memory .*data_placement: stream "
                     r"resumes it as it was trained", refused.stderr), refused.describe()
    resumed = launch(config, tmp_path, nproc=None)
    assert resumed.returncode == 0, resumed.describe()
    assert "resumed from step 3" in resumed.stdout


def test_the_readers_change_messages_are_told_apart_from_other_trainer_errors() -> None:
    from trainpipe_trainer.data.manifest import changed_file_message, is_data_change, missing_file_message

    entry = ManifestFile(uri="s3://lake/p.parquet", path="p.parquet", size=1, rows=1, row_groups=(1,),
                         holdout_row_groups=(), schema_hash="s")
    assert is_data_change("error: " + changed_file_message(entry, "size 1 -> 2 bytes", "ab" * 32))
    assert is_data_change(missing_file_message(entry, "cd" * 32))
    assert not is_data_change("s3://lake/p.parquet: feature column 'x' has 3 missing value(s); declare how to fill "
                              "them (training.transforms.x.impute: mean, median or constant)")
