"""Process-group setup and the few collectives the trainer needs.

Works under torchrun (reads RANK/WORLD_SIZE/LOCAL_RANK) and as a plain single process, where an
in-memory store stands in for the rendezvous so the rest of the code never special-cases it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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
    tensor = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [float(v) for v in tensor.cpu()]
