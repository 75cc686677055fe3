"""Training data as tensors, and its batches: the split's arrays (``splits``) wrapped as tensors, batched.

Every rank reads the whole (small) file and computes the same statistics, so no collective is
needed; the ``GlobalOrderSampler`` then gives each rank its share of rows or, for listwise
ranking, of whole queries, by global sample position (so a checkpoint resumes at any world size).

``Data`` and ``Batches`` are what the trainer reads of either path: this one, or ``streamed``'s (a split too
large for memory, read by row group as the loop goes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import pandas as pd
import torch
from torch.utils.data import Sampler, TensorDataset

from trainpipe_trainer.config import TrainingConfig
from trainpipe_trainer.data.splits import Splits, read_splits
from trainpipe_trainer.distributed import DistEnv
from trainpipe_trainer.errors import TrainerDataError
from trainpipe_trainer.models import text_tokenizer_of
from trainpipe_trainer.preprocessing import FeatureTransformer, TargetScaler


class Batches(Protocol):
    """An epoch's micro-batches for this rank, resumable at a global sample position (either path)."""

    # Seconds the loop spent waiting for its next batch (host time), read by the progress line.
    wait_seconds: float

    @property
    def batches_per_epoch(self) -> int: ...

    @property
    def epoch_end(self) -> int: ...

    def epoch(self, epoch: int, *, position: int = 0) -> Iterator[list[torch.Tensor]]: ...

    def close(self) -> None: ...


@dataclass(kw_only=True, slots=True)
class TrainingData:
    """The split's arrays (``splits.Splits``: transforms, row counts, serving sample) as tensors that
    share their memory."""

    split: Splits
    # Items are (features, label) rows, or (features, labels, mask) padded queries for listwise.
    dataset: TensorDataset = field(init=False)
    validation: TensorDataset | None = field(init=False)

    def __post_init__(self) -> None:
        self.dataset = TensorDataset(*(torch.from_numpy(a) for a in self.split.train))
        validation = self.split.validation
        self.validation = TensorDataset(*(torch.from_numpy(a) for a in validation)) if validation else None
        if len(self.dataset) == 0:
            raise TrainerDataError("the training data has no rows")

    @property
    def transformer(self) -> FeatureTransformer:
        return self.split.transformer

    @property
    def target(self) -> TargetScaler | None:
        return self.split.target

    @property
    def classes(self) -> tuple[str, ...]:
        return self.split.classes

    @property
    def n_rows(self) -> int:
        return self.split.n_rows

    @property
    def n_validation_rows(self) -> int:
        return self.split.n_validation_rows

    @property
    def sample_frame(self) -> pd.DataFrame:
        return self.split.sample_frame

    def loader(self, *, batch_size: int, seed: int, env: DistEnv, device: torch.device) -> EpochLoader:
        return EpochLoader(dataset=self.dataset, batch_size=batch_size, seed=seed, env=env, device=device)


def load_training_data(config: TrainingConfig, pending: Future[Splits] | None = None) -> TrainingData:
    """The config's training data as tensors: from ``pending`` (read in the background since the launch
    began) or read now (``streamed.load_data`` takes either path)."""
    return TrainingData(split=pending.result() if pending is not None else read_splits(config, text_tokenizer_of))


class GlobalOrderSampler(Sampler[int]):
    """This rank's share of an epoch, keyed by the global sample position, so any world size can continue it.

    An epoch is one permutation of the rows, drawn from (seed, epoch) alone. Micro-batch ``m`` from a
    start position ``p`` is the global slice ``[p + m*W*B, p + (m+1)*W*B)`` of it (``W`` ranks, ``B``
    rows per rank), cut into ``W`` consecutive equal parts, rank ``r`` taking part ``r``. The epoch
    ends at ``p + ceil((n - p) / W) * W`` (wrapping to the first rows, as ``DistributedSampler``
    pads, so every rank gets as many rows); a checkpoint records the position reached, and a run with
    another world size starts there: no row of the epoch is skipped or seen twice.
    """

    def __init__(self, n: int, *, env: DistEnv, seed: int, batch_size: int) -> None:
        self.n, self.env, self.seed, self.batch_size = n, env, seed, batch_size
        self.epoch, self.position = 0, 0

    def start_epoch(self, epoch: int, *, position: int = 0) -> None:
        self.epoch, self.position = epoch, position

    @property
    def end(self) -> int:
        """The global position this epoch ends at, for this world size and start position."""
        world = self.env.world_size
        return self.position + max(math.ceil((self.n - self.position) / world), 0) * world

    def order(self) -> torch.Tensor:
        """The epoch's permutation, padded with its first rows for the wrap at the end (int64, CPU)."""
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=generator)
        # Position p of the epoch is row order[p % n]; the last micro-batch reaches at most W - 1 past n.
        wrap = order.repeat(math.ceil(self.env.world_size / self.n))[: self.env.world_size]
        return torch.cat([order, wrap])

    def slices(self) -> Iterator[slice]:
        """Per micro-batch, this rank's positions in ``order()``: plain slices, so taking a batch
        needs no host work per row and, with the order on the GPU, no host round trip."""
        world, end = self.env.world_size, self.end
        for start in range(self.position, end, world * self.batch_size):
            share = (min(start + world * self.batch_size, end) - start) // world
            first = start + self.env.rank * share
            yield slice(first, first + share)

    def __iter__(self) -> Iterator[int]:
        order = self.order().tolist()
        for positions in self.slices():
            yield from order[positions]

    def __len__(self) -> int:
        return (self.end - self.position) // self.env.world_size


@dataclass(kw_only=True, slots=True)
class EpochLoader:
    """Micro-batches of an epoch taken by index from contiguous tensors: one gather per tensor and
    batch, no per-row ``__getitem__`` or collate.

    The tensors live where ``device`` says (the accelerator when the split is resident there);
    with them on the host and the model on CUDA, each batch is gathered into pinned memory and
    copied on a side stream one batch ahead. The rows of every batch are those of the sampler's
    order, so the data path never changes what is trained on (``test_data``).
    """

    dataset: TensorDataset
    batch_size: int
    seed: int
    env: DistEnv
    # Where the tensors are kept: the training device, or the host (CPU) for a model on CUDA.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    sampler: GlobalOrderSampler = field(init=False)
    tensors: tuple[torch.Tensor, ...] = field(init=False)
    # Seconds the loop spent waiting for its next batch (host time), read by the progress line.
    wait_seconds: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.sampler = GlobalOrderSampler(len(self.dataset), env=self.env, seed=self.seed, batch_size=self.batch_size)
        self.tensors = tuple(t.to(self.device) for t in self.dataset.tensors)

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches of a whole epoch (from position 0) per rank."""
        return math.ceil(math.ceil(len(self.dataset) / self.env.world_size) / self.batch_size)

    @property
    def epoch_end(self) -> int:
        """The global position the epoch being iterated ends at."""
        return self.sampler.end

    def epoch(self, epoch: int, *, position: int = 0) -> Iterator[list[torch.Tensor]]:
        """The rest of ``epoch`` from global sample ``position`` (0: the whole epoch), as batches on
        the training device."""
        self.sampler.start_epoch(epoch, position=position)
        # One host-to-device copy of the order per epoch; each batch's indices are then a view of it.
        order = self.sampler.order().to(self.device)
        batches = ([t.index_select(0, order[positions]) for t in self.tensors] for positions in self.sampler.slices())
        if self.env.device.type == "cuda" and self.device.type != "cuda":
            batches = copied_ahead(batches, self.env.device)
        return timed(batches, self)

    def close(self) -> None:
        """Nothing to release: the tensors go with the loader (the streamed loader has read threads to end)."""


def timed(batches: Iterator[list[torch.Tensor]], loader: Batches) -> Iterator[list[torch.Tensor]]:
    """``batches``, the time spent waiting for each added to ``loader.wait_seconds``."""
    clock = time.perf_counter
    while True:
        started = clock()
        batch = next(batches, None)
        loader.wait_seconds += clock() - started
        if batch is None:
            return
        yield batch


def copied_ahead(batches: Iterator[list[torch.Tensor]], device: torch.device) -> Iterator[list[torch.Tensor]]:
    """Host batches on ``device``: pinned, copied on a side stream one batch ahead of the one in use."""
    stream = torch.cuda.Stream(device)
    pending: tuple[list[torch.Tensor], torch.cuda.Event] | None = None
    for batch in batches:
        with torch.cuda.stream(stream):
            moved = [t.pin_memory().to(device, non_blocking=True) for t in batch]
            copied = torch.cuda.Event()
            copied.record(stream)
        if pending is not None:
            yield _ready(*pending, device)
        pending = moved, copied
    if pending is not None:
        yield _ready(*pending, device)


def _ready(batch: list[torch.Tensor], copied: torch.cuda.Event, device: torch.device) -> list[torch.Tensor]:
    current = torch.cuda.current_stream(device)
    current.wait_event(copied)
    for tensor in batch:
        # Allocated on the side stream, used on this one: keep the memory until this stream is done.
        tensor.record_stream(current)
    return batch


def resident_fits(tensors: list[torch.Tensor], device: torch.device) -> bool:
    """``data_placement: auto``: keep the splits on the accelerator when they take under
    ``RESIDENT_SHARE`` of its free memory (the rest is left to the model, optimizer and activations)."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return sum(t.numel() * t.element_size() for t in tensors) < RESIDENT_SHARE * free


# Share of the accelerator's free memory the training and validation splits may take under `auto`.
RESIDENT_SHARE = 0.5
