"""Process-group setup and the few collectives the trainer needs.

Works under torchrun (reads RANK/WORLD_SIZE/LOCAL_RANK) and as a plain single process, where an
in-memory store stands in for the rendezvous so the rest of the code never special-cases it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(kw_only=True, slots=True, frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(*, timeout: timedelta = timedelta(minutes=30)) -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        backend, device = "nccl", torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        backend, device = "gloo", torch.device("cpu")
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    else:
        # Started without torchrun: one process, no network rendezvous needed.
        if world_size != 1:
            raise RuntimeError("WORLD_SIZE > 1 without MASTER_ADDR; launch with torchrun")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device, backend=backend)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.backend == "nccl":
        dist.barrier(device_ids=[env.local_rank])
    else:
        dist.barrier()


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's value on every rank (rank 0 decides, e.g. what to resume from or whether to save)."""
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0, device=env.device if env.backend == "nccl" else None)
    return box[0]


def broadcast_flag(flag: bool, env: DistEnv) -> bool:
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32, device=env.device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())


def all_reduce_sums(values: list[float], env: DistEnv) -> list[float]:
    if env.world_size == 1:
        # The sums are the values: no device tensor, collective and copy back (a host sync on CUDA)
        # at every log interval of a one-process run.
        return [float(v) for v in values]
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.cpu()]


def cpu_group(*, timeout: timedelta = timedelta(minutes=10)) -> dist.ProcessGroup:
    """A dedicated gloo group (collective: every rank calls it in the same order).

    Work that runs beside the training loop (the async checkpoint thread, the step flags) gets its
    own group: collectives issued from two threads on one group would interleave differently on
    each rank, and ``dcp.async_save`` on the DDP group failed with gloo "connection reset".
    """
    return dist.new_group(backend="gloo", timeout=timeout)


@dataclass(kw_only=True, slots=True)
class StepFlags:
    """Per-step booleans every rank must agree on (stop requested, checkpoint due by the clock).

    ``exchange`` starts an asynchronous MAX all-reduce of this step's flags and returns the result
    of the previous step's: the loop never waits for the network, and every rank acts on the same
    flags at the same step, one step after they were raised. World size 1 needs no collective and
    answers with this step's flags at once.
    """

    env: DistEnv
    size: int
    group: dist.ProcessGroup | None = None
    _pending: tuple[Any, torch.Tensor] | None = field(init=False, default=None)

    def exchange(self, flags: list[bool]) -> list[bool]:
        if len(flags) != self.size:
            raise ValueError(f"StepFlags: expected {self.size} flags, got {len(flags)}")
        if self.env.world_size == 1:
            return list(flags)
        previous = self._collect()
        tensor = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, tensor)
        return previous

    def drain(self) -> list[bool]:
        """Wait for the exchange in flight (call on every rank before other collectives end the job)."""
        return self._collect()

    def _collect(self) -> list[bool]:
        if self._pending is None:
            return [False] * self.size
        work, tensor = self._pending
        self._pending = None
        work.wait()
        return [bool(v) for v in tensor.tolist()]
