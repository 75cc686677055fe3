"""The streamed path: the train split's row groups read as the loop goes, never held whole.

The unit is one (file, row group) of the manifest's train split. An epoch's order is one global sample stream
per (manifest, seed, epoch), whatever the world size: the units shuffled by (seed, epoch), gathered in that
order into windows of at most ``WINDOW_ROWS`` rows (a larger unit is a window alone), each window's rows
permuted by (seed, epoch, window). Global sample ``k`` of each global batch (``W * batch_size`` samples) goes
to rank ``k mod W``; the epoch ends as ``memory.GlobalOrderSampler``'s does (padded by wrapping to the
stream's first samples, so every rank gets as many batches). A checkpoint's ``sample_in_epoch`` is the global
position reached: a run at any world size starts at the window holding it, so no row is skipped or seen
twice (same world size: the same batches, bit for bit).

Every rank reads every window of its epoch (the stream is global) and converts and transforms only its own
rows of it. Reads run on a small thread pool a few windows ahead of the loop (``PREFETCH_WINDOWS``), so the
loader holds at most that many windows, the one being cut into batches and less than a batch besides. The
feature transforms, target scaling and classes are inputs (the dataset version's statistics,
``data.statistics``): the ranks fit nothing.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import torch
from torch.utils.data import TensorDataset

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.data.manifest import (
    DataManifest,
    Unit,
)
from trainpipe_trainer.data.memory import TrainingData, copied_ahead, timed
from trainpipe_trainer.data.reading import UnitReader
from trainpipe_trainer.data.splits import (
    Splits,
    StreamSource,
    label_array,
    manifest_fs,
    read_data,
    serving_sample,
    split_arrays,
)
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import TrainerDataError, TrainerInputError
from trainpipe_trainer.preprocessing import FeatureTransformer, NumericColumns, TargetScaler

# Rows of one shuffle window: the bound on how far apart two rows of one row group can land in an epoch, and
# on what a window in flight holds (decoded, before this rank's share is taken).
WINDOW_ROWS = 65_536
# Windows read ahead of the loop (and so held at most), and the threads reading them.
PREFETCH_WINDOWS = 3
READ_THREADS = 2
# The validation split: whole train units, at most validation_fraction of the rows and at most this many.
VALIDATION_CAP_ROWS = 50_000
# The numeric path's buffers: rows gathered at a time (a [features, rows] buffer reused across a window), and
# rows transformed at a time (a [rows, features] float64 block that stays in a core's cache).
GATHER_ROWS = 8192
TRANSFORM_BLOCK_ROWS = 1024


def _rng(*keys: int) -> np.random.Generator:
    # SeedSequence takes non-negative entropy; a negative seed maps onto the 64-bit range.
    return np.random.default_rng([key % 2**64 for key in keys])


@dataclass(frozen=True, slots=True)
class Window:
    """Consecutive units of an epoch's unit order, read and permuted together."""

    index: int
    units: tuple[Unit, ...]
    # Global stream position of the window's first sample.
    start: int

    @property
    def rows(self) -> int:
        return sum(unit.rows for unit in self.units)


@dataclass(frozen=True, slots=True)
class Piece:
    """One rank's samples of one window: its positions ``offsets`` (into the window's permuted rows)."""

    window: Window
    offsets: np.ndarray


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleStream:
    """The global sample stream of an epoch over ``units`` (seed, epoch -> windows -> positions)."""

    units: tuple[Unit, ...]
    seed: int
    window_rows: int = WINDOW_ROWS

    @property
    def n(self) -> int:
        return sum(unit.rows for unit in self.units)

    def windows(self, epoch: int) -> list[Window]:
        order = _rng(self.seed, epoch).permutation(len(self.units))
        windows: list[Window] = []
        group: list[Unit] = []
        start = rows = 0
        for index in order:
            unit = self.units[index]
            if group and rows + unit.rows > self.window_rows:
                windows.append(Window(len(windows), tuple(group), start))
                start, group, rows = start + rows, [], 0
            group.append(unit)
            rows += unit.rows
        if group:
            windows.append(Window(len(windows), tuple(group), start))
        return windows

    def permutation(self, epoch: int, window: Window) -> np.ndarray:
        """Position ``o`` of the window holds its (units concatenated) row ``permutation[o]``."""
        return _rng(self.seed, epoch, window.index).permutation(window.rows)

    def end(self, start: int, world: int) -> int:
        """The global position an epoch begun at ``start`` ends at (``GlobalOrderSampler.end``)."""
        return start + max(math.ceil((self.n - start) / world), 0) * world

    def pieces(self, epoch: int, *, start: int, world: int, rank: int) -> Iterator[Piece]:
        """This rank's samples from global position ``start`` to the epoch's end, window by window, in order:
        the positions ``q`` with ``q = start + rank (mod world)``; a position past the stream's end wraps to
        its first samples (``q mod n``)."""
        n, end = self.n, self.end(start, world)
        if n == 0 or end <= start:
            return
        windows = self.windows(epoch)
        first = start + rank
        for lap in range(start // n, (end - 1) // n + 1):
            base = lap * n
            for window in windows:
                low = max(base + window.start, first)
                high = min(base + window.start + window.rows, end)
                if low >= high:
                    continue
                # The first position at or after `low` of this rank's residue.
                begin = low + (first - low) % world
                offsets = np.arange(begin, high, world) - (base + window.start)
                if len(offsets):
                    yield Piece(window, offsets)


@dataclass(kw_only=True, slots=True)
class StreamedData:
    """The streamed path's data: what the trainer reads of ``memory.TrainingData``, with a loader of its own."""

    config: TrainingConfig
    manifest: DataManifest
    fs: fsspec.AbstractFileSystem
    transformer: FeatureTransformer
    target: TargetScaler | None
    classes: tuple[str, ...]
    # Why it is streamed (the launch's one line).
    reason: str
    window_rows: int = WINDOW_ROWS
    # The train units of the stream: the manifest's train split less the validation units.
    units: tuple[Unit, ...] = field(init=False)
    validation_units: tuple[Unit, ...] = field(init=False)
    validation: TensorDataset | None = field(init=False)
    sample_frame: pd.DataFrame = field(init=False)
    # The transform as column vectors (every feature numeric): windows skip pandas; None: the frame path.
    numeric: NumericColumns | None = field(init=False)

    def __post_init__(self) -> None:
        refuse_unstreamable(self.config)
        train = self.manifest.units("train")
        if not train or sum(unit.rows for unit in train) == 0:
            raise TrainerDataError(f"{self.config.train_data_uri}: the training split has no rows")
        missing = [name for name in self.columns if name not in self.manifest.columns]
        if missing:
            raise TrainerDataError(
                f"{self.manifest.source_uri}: column(s) {missing} of the config (features, label) are not in the "
                f"dataset version's files (columns: {list(self.manifest.columns)}); fix training.features or "
                "training.label, or snapshot data that has them")
        self.numeric = self.transformer.numeric_columns()
        chosen = set(validation_units(self.config, train))
        self.validation_units = tuple(unit for unit in train if unit in chosen)
        self.units = tuple(unit for unit in train if unit not in chosen)
        if self.config.early_stopping is not None and not self.validation_units:
            raise TrainerInputError(
                f"early_stopping: {self.config.train_data_uri}: the streamed validation split is empty (it takes "
                f"whole row groups, at most checkpoint.validation_fraction of the rows and {VALIDATION_CAP_ROWS}, "
                "and every row group is larger); write smaller row groups, raise validation_fraction, or train "
                "in memory (data_placement: host)")
        with UnitReader(self.fs, self.manifest, columns=self.columns) as reader:
            first = reader.read(self.units[0]).to_pandas()
            self.sample_frame = serving_sample(first, self.config.feature_transforms())
            self.validation = None
            if self.validation_units:
                frame = pd.concat([reader.read(unit).to_pandas() for unit in self.validation_units],
                                  ignore_index=True)
                arrays = self.arrays(frame, source=self.source_of(self.validation_units))
                self.validation = TensorDataset(*(torch.from_numpy(a) for a in arrays))

    @property
    def columns(self) -> list[str]:
        config = self.config
        return [*config.features, config.label]

    @property
    def n_rows(self) -> int:
        return sum(unit.rows for unit in self.units)

    @property
    def n_validation_rows(self) -> int:
        return sum(unit.rows for unit in self.validation_units)

    @property
    def summary(self) -> str:
        files = len({unit.file for unit in self.units})
        return (f"data: streamed from {len(self.units)} row groups of {files} files, {self.n_rows} rows "
                f"({self.reason})")

    def source_of(self, units: Sequence[Unit]) -> str:
        """The files named in a data error about these rows."""
        return ", ".join(sorted({self.manifest.files[unit.file].uri for unit in units}))

    def arrays(self, frame: pd.DataFrame, *, source: str) -> tuple[np.ndarray, ...]:
        return split_arrays(frame, self.config, self.transformer, source, self.target, self.classes)

    def loader(self, *, batch_size: int, seed: int, env: DistEnv) -> StreamLoader:
        stream = SampleStream(units=self.units, seed=seed, window_rows=self.window_rows)
        return StreamLoader(data=self, stream=stream, batch_size=batch_size, env=env)


def refuse_unstreamable(config: TrainingConfig) -> None:
    """What the streamed path does not train: whole queries (listwise ranking) and a family's own tokenizer."""
    if config.task == "ranking":
        raise TrainerInputError(
            "data_placement: the streamed path does not train ranking (a query's rows may lie in several row "
            "groups, and its statistics pass covers classification and regression); use data_placement: host")
    if config.task == "causal_lm" or config.model.pretrained_uri is not None:
        raise TrainerInputError(
            f"data_placement: the streamed path does not train a pretrained model's tokenised text (model.type "
            f"{config.model.type!r}, task {config.task!r}); use data_placement: host")


def validation_units(config: TrainingConfig, units: Sequence[Unit]) -> list[Unit]:
    """The validation split of a streamed run: whole train units in a seeded order, taken while they keep
    within ``validation_fraction`` of the rows and ``VALIDATION_CAP_ROWS``; none without keep_best."""
    checkpoint = config.checkpoint
    if not checkpoint.keep_best or checkpoint.validation_fraction <= 0 or len(units) < 2:
        return []
    budget = min(int(sum(unit.rows for unit in units) * checkpoint.validation_fraction), VALIDATION_CAP_ROWS)
    chosen, rows = [], 0
    for index in _rng(config.seed).permutation(len(units)):
        unit = units[index]
        if rows + unit.rows <= budget and len(chosen) < len(units) - 1:
            chosen.append(unit)
            rows += unit.rows
    return chosen


@dataclass(kw_only=True, slots=True)
class StreamLoader:
    """Micro-batches of this rank's share of the stream, read and transformed on threads ahead of the loop.

    The interface of ``memory.EpochLoader``: ``epoch``, ``epoch_end``, ``batches_per_epoch``, ``wait_seconds``.
    """

    data: StreamedData
    stream: SampleStream
    batch_size: int
    env: DistEnv
    prefetch: int = PREFETCH_WINDOWS
    wait_seconds: float = field(init=False, default=0.0)
    # Rows the loader holds now: windows in flight (whole, as read) and this rank's rows not yet batched;
    # and the most it held (what the bounded-memory test reads).
    buffered_rows: int = field(init=False, default=0)
    peak_buffered_rows: int = field(init=False, default=0)
    _end: int = field(init=False, default=0)
    # The next epoch's first windows, read while this one ends: (epoch, reads in flight, the rest of its pieces).
    _ahead: tuple[int, deque[tuple[Future, int]], Iterator[Piece]] | None = field(init=False, default=None)
    _pool: ThreadPoolExecutor = field(init=False)
    _local: threading.local = field(init=False, default_factory=threading.local)
    _readers: list[UnitReader] = field(init=False, default_factory=list)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="trainpipe-stream")

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(math.ceil(self.stream.n / self.env.world_size) / self.batch_size)

    @property
    def epoch_end(self) -> int:
        return self._end

    def epoch(self, epoch: int, *, position: int = 0) -> Iterator[list[torch.Tensor]]:
        """The rest of ``epoch`` from global sample ``position``: its first windows are being read on return."""
        self._end = self.stream.end(position, self.env.world_size)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == epoch and position == 0:
            _, pending, pieces = ahead
        else:
            if ahead is not None:
                self._cancel(ahead[1])
            pieces = self._pieces(epoch, position)
            pending = deque()
        while len(pending) < self.prefetch:
            piece = next(pieces, None)
            if piece is None:
                break
            pending.append(self._submit(epoch, piece))
        batches = self._batches(epoch, pieces, pending)
        if self.env.device.type == "cuda":
            batches = copied_ahead(batches, self.env.device)
        return timed(batches, self)

    def _pieces(self, epoch: int, position: int) -> Iterator[Piece]:
        return self.stream.pieces(epoch, start=position, world=self.env.world_size, rank=self.env.rank)

    def _cancel(self, entries: deque[tuple[Future, int]]) -> None:
        # A read already running finishes; its result is dropped with the future.
        for future, window_rows in entries:
            future.cancel()
            self.buffered_rows -= window_rows
        entries.clear()

    def _submit(self, epoch: int, piece: Piece) -> tuple[Future, int]:
        self._hold(piece.window.rows)
        return self._pool.submit(self._read, epoch, piece), piece.window.rows

    def _hold(self, rows: int) -> None:
        self.buffered_rows += rows
        self.peak_buffered_rows = max(self.peak_buffered_rows, self.buffered_rows)

    def _batches(self, epoch: int, pieces: Iterator[Piece],
                 pending: deque[tuple[Future, int]]) -> Iterator[list[torch.Tensor]]:
        parts: list[tuple[np.ndarray, ...]] = []
        held = 0
        # Once this epoch's last window is asked for, each freed place reads one of the next epoch's (whose
        # start would otherwise wait for a read): at most ``prefetch`` windows in flight either way.
        following = epoch + 1 < self.data.config.epochs
        ahead: deque[tuple[Future, int]] = deque()
        ahead_pieces: Iterator[Piece] | None = None
        try:
            while pending:
                future, window_rows = pending.popleft()
                try:
                    arrays = future.result()
                finally:
                    self.buffered_rows -= window_rows
                self._hold(len(arrays[0]))
                parts.append(arrays)
                held += len(arrays[0])
                piece = next(pieces, None)
                if piece is not None:
                    pending.append(self._submit(epoch, piece))
                elif following:
                    ahead_pieces = ahead_pieces or self._pieces(epoch + 1, 0)
                    piece = next(ahead_pieces, None)
                    if piece is not None:
                        ahead.append(self._submit(epoch + 1, piece))
                while held >= self.batch_size or (held and not pending):
                    take = min(self.batch_size, held)
                    batch, parts = _cut(parts, take)
                    held -= take
                    self.buffered_rows -= take
                    yield [torch.from_numpy(array) for array in batch]
            if ahead_pieces is not None:
                self._ahead, ahead = (epoch + 1, ahead, ahead_pieces), deque()
        finally:
            self._cancel(pending)
            self._cancel(ahead)
            self.buffered_rows -= held

    def _read(self, epoch: int, piece: Piece) -> tuple[np.ndarray, ...]:
        """This rank's rows of one window, in stream order, as arrays (runs on a read thread)."""
        import pyarrow as pa

        reader = getattr(self._local, "reader", None)
        if reader is None:
            data = self.data
            reader = self._local.reader = UnitReader(data.fs, data.manifest, columns=data.columns)
            with self._lock:
                self._readers.append(reader)
        window = piece.window
        table = pa.concat_tables([self._read_unit(reader, unit) for unit in window.units])
        rows = self.stream.permutation(epoch, window)[piece.offsets]
        source = self.data.source_of(window.units)
        numeric = self.data.numeric
        columns = numeric_arrays(table, numeric.features) if numeric is not None else None
        if numeric is None or columns is None:
            return self.data.arrays(table.take(pa.array(rows)).to_pandas(), source=source)
        label = table.select([self.data.config.label]).take(pa.array(rows)).to_pandas()
        return (transformed_rows(numeric, columns, rows, source=source),
                label_array(label, self.data.config, source, self.data.target, self.data.classes))

    def _read_unit(self, reader: UnitReader, unit: Unit) -> Any:
        """One row group; a changed file is named by the reader (``DataChangedError``), any other failure here."""
        import pyarrow as pa

        try:
            return reader.read(unit)
        except (OSError, pa.ArrowException) as err:
            entry = self.data.manifest.files[unit.file]
            raise TrainerDataError(f"{entry.uri}: row group {unit.row_group} could not be read ({err}); the file "
                                   "is as the dataset version listed it, so check the store it is read from") from err

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for reader in self._readers:
            reader.close()


def numeric_arrays(table: Any, names: Sequence[str]) -> list[np.ndarray] | None:
    """The columns as numpy arrays, without pandas, where each is a float column (a null is NaN, as pandas reads
    it) or an integer column without nulls; None: the window takes the frame path."""
    import pyarrow as pa

    arrays = []
    for name in names:
        column = table.column(name)
        if not (pa.types.is_floating(column.type) or (pa.types.is_integer(column.type) and column.null_count == 0)):
            return None
        arrays.append(column.to_numpy())
    return arrays


def transformed_rows(numeric: NumericColumns, columns: Sequence[np.ndarray], rows: np.ndarray, *,
                     source: str) -> np.ndarray:
    """float32 ``[len(rows), k]``: rows ``rows`` of the columns, transformed, in that order; the values of
    ``FeatureTransformer.transform_float32`` on the same rows.

    The rows are taken in ascending order (each column read forwards, not at random), ``GATHER_ROWS`` at a time
    into a column-major buffer; transformed ``TRANSFORM_BLOCK_ROWS`` at a time in a float64 block, transposed to
    row-major on the way in; and each block's rows written to their places in stream order. The buffers are
    reused, so a window allocates its result and little else."""
    # The rows are distinct positions of one window: ascending order by a mask, not a sort.
    marked = np.zeros(int(rows.max()) + 1 if len(rows) else 0, dtype=bool)
    marked[rows] = True
    ascending = np.flatnonzero(marked)
    index_of = np.empty(len(marked), dtype=np.intp)
    index_of[rows] = np.arange(len(rows))
    order = index_of[ascending]
    dtype = np.float32 if all(column.dtype == np.float32 for column in columns) else np.float64
    gathered = np.empty((len(columns), min(GATHER_ROWS, len(rows))), dtype=dtype)
    block = np.empty((TRANSFORM_BLOCK_ROWS, len(columns)))
    transformed = np.empty((len(rows), len(columns)), dtype=np.float32)
    for first in range(0, len(rows), GATHER_ROWS):
        taken = ascending[first:first + GATHER_ROWS]
        part = gathered[:, :len(taken)]
        for j, column in enumerate(columns):
            if column.dtype == dtype:
                np.take(column, taken, out=part[j])
            else:
                part[j] = column[taken]
        for start in range(0, len(taken), TRANSFORM_BLOCK_ROWS):
            rows_here = block[:min(TRANSFORM_BLOCK_ROWS, len(taken) - start)]
            rows_here[...] = part[:, start:start + len(rows_here)].T
            at = first + start
            transformed[order[at:at + len(rows_here)]] = numeric.transform(rows_here, source=source)
    return transformed


def _cut(parts: list[tuple[np.ndarray, ...]], rows: int) -> tuple[tuple[np.ndarray, ...], list[tuple[np.ndarray, ...]]]:
    """The first ``rows`` rows of the parts, and what is left of them."""
    taken: list[tuple[np.ndarray, ...]] = []
    left = rows
    while left:
        head = parts[0]
        size = len(head[0])
        if size <= left:
            taken.append(head)
            parts = parts[1:]
            left -= size
        else:
            taken.append(tuple(a[:left] for a in head))
            parts = [tuple(a[left:] for a in head), *parts[1:]]
            left = 0
    batch = taken[0] if len(taken) == 1 else tuple(np.concatenate(columns) for columns in zip(*taken, strict=True))
    # Contiguous, so the tensors own plain memory (a slice's view would keep its whole window alive).
    return tuple(np.ascontiguousarray(a) for a in batch), parts


def load_data(config: TrainingConfig, pending: Future[Splits | StreamSource] | None = None
              ) -> TrainingData | StreamedData:
    """The config's training data, either path: from ``pending`` (read in the background since the launch
    began) or read now; the split as tensors, or streamed where ``splits.stream_source`` says so."""
    from trainpipe_trainer.models import text_tokenizer_of

    read = pending.result() if pending is not None else read_data(config, text_tokenizer_of)
    if isinstance(read, StreamSource):
        return open_streamed(config, read)
    return TrainingData(split=read)


def open_streamed(config: TrainingConfig, source: StreamSource, **transforms: Any) -> StreamedData:
    """The streamed data of ``source``: its transforms, target scaling and classes from the dataset version's
    statistics (``data.statistics``: the validate step's, or computed now in one streamed pass), unless given."""
    fs = manifest_fs(config, source.manifest)
    refuse_unstreamable(config)
    if not transforms:
        from trainpipe_trainer.data.statistics import fitted_from_statistics, load_or_compute_statistics

        statistics = load_or_compute_statistics(config, source.manifest, fs)
        transformer, target, classes = fitted_from_statistics(config, statistics)
        transforms = {"transformer": transformer, "target": target, "classes": classes}
    return StreamedData(config=config, manifest=source.manifest, fs=fs, reason=source.reason, **transforms)
