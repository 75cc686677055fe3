"""``strategy: deepspeed``: ZeRO stages 0-3 under the same torchrun command as DDP.

The DeepSpeed JSON config is generated from the training config (``deepspeed_config``): the same
per-process batch, accumulation and clipping as DDP, so both strategies train on the same batches.
The optimizer and LR schedule are the trainer's own (torch AdamW + LambdaLR), handed to DeepSpeed:
DeepSpeed's CPU Adam does not resume bit-identically. ``precision: bf16`` is DeepSpeed's
``torch_autocast`` section, so the engine runs its own forward under ``torch.autocast`` on whatever
device it has: an autocast around the engine would be switched off inside it on CUDA
(``deepspeed.runtime.torch_autocast.autocast_if_enabled`` asks ``torch.is_autocast_enabled()``,
which sees CUDA autocast only). Parameters, gradients and their reduction stay fp32, as under DDP
(DeepSpeed's own ``bf16`` mode keeps bf16 weights and does not cover stages 0 and 3 on CPU).

Checkpoints use DeepSpeed's ``save_checkpoint``/``load_checkpoint`` in the same layout and under the
same commit rule as DCP: ``<root>/step-<N>/`` (DeepSpeed's tag), every rank's RNG states and
counters next to its files (DeepSpeed keeps ``client_state`` from rank 0 only), every rank done,
then rank 0's ``manifest.json``. As under DDP, the loop waits only for a snapshot of the state;
a writer thread writes DeepSpeed's files (``DeepSpeedBackend``; ``checkpoint.async_save: false``
writes them in the loop).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainpipe_trainer.checkpoint.manager import (
    CheckpointBackend,
    CheckpointStore,
    ReusableCpuStager,
    rank_key,
    staging_threads,
)
from trainpipe_trainer.checkpoint.transfer import StagingProgress
from trainpipe_trainer.config import TrainerConfigError, TrainingConfig
from trainpipe_trainer.distributed import DistEnv, barrier
from trainpipe_trainer.errors import CheckpointMismatchError, CheckpointSaveError
from trainpipe_trainer.optim import build_optimizer, schedule
from trainpipe_trainer.run_layout import checkpoint_dir_name
from trainpipe_trainer.strategies.base import LossOf, poisoned


def deepspeed_config(config: TrainingConfig, *, world_size: int, cuda: bool = False) -> dict[str, Any]:
    """The DeepSpeed JSON config for this training config (pure: no DeepSpeed import)."""
    if config.deepspeed is None:
        raise TrainerConfigError("deepspeed: required when strategy is 'deepspeed' (zero_stage, offload)")
    ds, optimization = config.deepspeed, config.optimization
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    accumulation = optimization.gradient_accumulation_steps
    return {
        # Same meaning as DDP's: batch_size per process, accumulation micro-batches per step.
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": config.batch_size * accumulation * world_size,
        "gradient_clipping": optimization.gradient_clip_norm or 0.0,
        "zero_optimization": zero,
        # The client optimizer is torch's AdamW (bit-identical resume); DeepSpeed calls it untested.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        # Mixed precision is torch.autocast inside the engine's forward, the same for every stage;
        # no module is "lower-precision safe", so gradients are reduced in fp32 as DDP reduces them.
        "torch_autocast": {
            "enabled": optimization.precision == "bf16",
            "dtype": "bfloat16",
            "lower_precision_safe_modules": [],
        },
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer synchronizes the device at the start and end of every micro-step
        # to time it: the host could never run ahead of a GPU. The trainer measures samples/s itself.
        "timers": {"throughput": {"enabled": False}},
    }


def import_deepspeed(env: DistEnv) -> Any:
    if env.device.type == "cpu":
        # Skip accelerator auto-detection (and its warning): there is no GPU here.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as err:
        raise TrainerConfigError(
            "strategy: 'deepspeed' needs DeepSpeed in the trainer image: pip install 'trainpipe-trainer[deepspeed]'"
        ) from err
    # DeepSpeed logs its whole config at INFO on every rank: noise in the task log.
    deepspeed.utils.logger.setLevel(logging.WARNING)
    # DeepSpeed's ZeRO collectives call torch.distributed's all_gather_into_tensor and
    # reduce_scatter_tensor, which torch 2.13 deprecates; the warning names no code of ours and
    # came once per step and rank (about 1,800 lines in a ZeRO-3 run). Only these two messages, only
    # from torch's c10d wrapper that raises them.
    for collective in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        warnings.filterwarnings(
            "ignore",
            message=rf"`torch\.distributed\.{collective}` is deprecated",
            category=FutureWarning,
            module=r"torch\.distributed\.c10d_logger",
        )
    keep_zero_norm_checks_on_the_device()
    if env.device.type == "cpu":
        # On CPU DeepSpeed compiles a shared-memory all-reduce (g++, ~40 s on first use) that only its
        # inference all-reduce uses; training collectives go through torch.distributed (gloo).
        # Skipping it keeps a C++ toolchain out of the trainer's requirements.
        # (From sys.modules: the attribute ``deepspeed.comm.torch`` is the torch package itself.)
        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


def keep_zero_norm_checks_on_the_device() -> None:
    """Take ZeRO's per-step host reads of the gradient norm out of its optimizer step.

    ZeRO's step reads the global norm on the host to skip a non-finite update (stages 1-2 twice, stage 3
    once: ``is_invalid_grad_norm``) and masks it with a tensor built from a Python number
    (``mask_nan_or_inf_with_val_inplace``). On a GPU each is a wait for the device, every step, so the
    host never runs ahead. The trainer already reads every step's norm at its next sync point and stops
    there (``Trainer._sync``): as under DDP, the steps in between train on garbage and none of them is
    saved. So ZeRO is told a tensor norm is valid (the update is applied, finite or not; a non-finite
    norm still reaches the trainer as inf) and masks on the device. Numbers (offload paths) are checked
    as before. Idempotent; only the trainer's own process imports DeepSpeed.
    """
    from deepspeed.runtime import utils as deepspeed_utils
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    checked_on_host = deepspeed_utils.is_invalid_grad_norm

    def is_invalid_grad_norm(norm: Any) -> bool:
        return False if torch.is_tensor(norm) else bool(checked_on_host(norm))

    def mask_nan_or_inf_with_val_inplace(norm: torch.Tensor, device: Any = None, val: float = -1.0) -> None:
        norm.masked_fill_(~torch.isfinite(norm), val)

    for module in (stage_1_and_2, stage3):
        module.is_invalid_grad_norm = is_invalid_grad_norm
        module.mask_nan_or_inf_with_val_inplace = mask_nan_or_inf_with_val_inplace


@dataclass(kw_only=True, slots=True)
class DeepSpeedStrategy:
    config: TrainingConfig
    env: DistEnv
    build_module: Callable[[], nn.Module]
    total_steps: int
    name: str = field(init=False, default="deepspeed")
    engine: Any = field(init=False)
    scheduler: LambdaLR = field(init=False)
    _deepspeed: Any = field(init=False)

    def __post_init__(self) -> None:
        deepspeed = self._deepspeed = import_deepspeed(self.env)
        module = self.build_module().to(self.env.device)
        optimizer = build_optimizer(
            module.parameters(), learning_rate=self.config.learning_rate, config=self.config.optimization
        )
        factor = schedule(self.config.optimization, self.total_steps)
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=module,
            optimizer=optimizer,
            # A callable: DeepSpeed builds it on the optimizer it wraps, steps it and checkpoints it.
            lr_scheduler=lambda wrapped: LambdaLR(wrapped, factor),
            config=deepspeed_config(self.config, world_size=self.env.world_size, cuda=self.env.device.type == "cuda"),
            dist_init_required=False,
        )

    @property
    def zero_stage(self) -> int:
        return self.config.deepspeed.zero_stage if self.config.deepspeed else 0

    @property
    def checkpoint_shape(self) -> dict[str, Any]:
        return {"strategy": f"deepspeed-zero{self.zero_stage}"}

    @property
    def checkpoint_scheduler(self) -> LambdaLR | None:
        return None  # in DeepSpeed's own checkpoint

    def train(self) -> None:
        self.engine.train()

    def eval(self) -> None:
        self.engine.eval()

    def forward_module(self) -> nn.Module:
        return self.engine

    def micro_step(self, loss_of: LossOf, *, scale: float, boundary: bool) -> torch.Tensor:
        # We own the boundary (so a short last group of an epoch still steps) and the scaling.
        self.engine.set_gradient_accumulation_boundary(boundary)
        loss = loss_of(self.engine)
        self.engine.backward(poisoned(loss) * scale, scale_wrt_gas=False)
        if not boundary:
            self.engine.step()
        return loss.detach()

    def optimizer_step(self) -> torch.Tensor:
        if self.zero_stage == 0:
            # No ZeRO optimizer to compute the norm: the gradients are all-reduced and whole here.
            # Stepped whatever the norm, as DDP is: the loop stops at its next sync point.
            grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            self.engine.step()
            return norm
        # ZeRO computes the global norm in step(); a non-finite one is inf here and stops the loop at
        # its next sync point (keep_zero_norm_checks_on_the_device).
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        if isinstance(norm, torch.Tensor):
            return norm
        return torch.full((), norm if norm is not None else 0.0, dtype=torch.float64, device=self.env.device)

    def learning_rate(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def full_module(self) -> nn.Module:
        """A plain module with the full weights (collective under ZeRO-3, which shards parameters)."""
        module = self.engine.module
        if self.zero_stage == 3:
            with self._deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        else:
            state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        full = self.build_module()
        full.load_state_dict(state)
        return full

    def checkpoint_backend(self, store: CheckpointStore, *, group: Any, async_save: bool) -> CheckpointBackend:
        if not store.is_local:
            raise TrainerConfigError(
                f"checkpoint.root_uri: strategy 'deepspeed' writes checkpoints with DeepSpeed's file writer, "
                f"which needs a local or mounted path, got {store.root_uri}; use strategy 'ddp' for object storage"
            )
        return DeepSpeedBackend(store=store, env=self.env, engine=self.engine, async_save=async_save, group=group)


@dataclass(kw_only=True, slots=True)
class DeepSpeedBackend:
    """DeepSpeed's own checkpoint files, written off the loop.

    ``engine.save_checkpoint`` builds each file's state dict and hands it to its checkpoint engine's
    ``save``. For an asynchronous save that call is captured instead of writing: right after
    ``save_checkpoint`` returns (no step ran since), each state's tensors are copied into CPU buffers
    kept from one save to the next (pinned, and queued on the training stream, on a GPU), and the
    writer thread waits for those copies, writes the files with DeepSpeed's own ``torch.save``
    settings, then this rank's blob, then meets the other ranks on the writer's gloo group: every
    rank's files exist before rank 0 commits. The files are the ones the synchronous save writes.
    """

    format = "trainpipe-deepspeed/1"
    reads = frozenset({format})

    store: CheckpointStore
    env: DistEnv
    engine: Any
    async_save: bool = False
    # Dedicated gloo group for the writer thread's meeting of the ranks.
    group: Any = None
    _stager: ReusableCpuStager = field(init=False)
    _writer_thread: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._stager = ReusableCpuStager(threads=staging_threads())
        self._writer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")

    def _blob_path(self, step: int, rank: int) -> str:
        return f"{self.store.step_path(step)}/{rank_key(rank)}.pkl"

    def write(self, step: int, rank_blob: bytes) -> Future | None:
        tag = checkpoint_dir_name(step)
        if not self.async_save:
            self.engine.save_checkpoint(self.store.root, tag=tag, client_state={}, save_latest=False)
            self.store.fs.pipe_file(self._blob_path(step, self.env.rank), rank_blob)
            # Every rank's files exist before rank 0 writes the manifest.
            barrier(self.env)
            return None
        files: dict[str, Any] = {}
        writer = self.engine.checkpoint_engine
        writer.save = lambda state_dict, path: files.__setitem__(path, state_dict)
        try:
            self.engine.save_checkpoint(self.store.root, tag=tag, client_state={}, save_latest=False)
        finally:
            del writer.save  # the class's own save again
        # Keyed by file name, so the next save's same files reuse these buffers.
        return self._stager.stage_beside(
            {os.path.basename(path): state for path, state in files.items()},
            self._writer_thread,
            lambda staged, progress: self._write_files(
                writer, step, {path: staged[os.path.basename(path)] for path in files}, progress, rank_blob
            ),
        )

    def _write_files(
        self, writer: Any, step: int, files: dict[str, Any], progress: StagingProgress, rank_blob: bytes
    ) -> None:
        failure: BaseException | None = None
        try:
            progress.wait_all()
            for path, state in files.items():
                type(writer).save(writer, state, path)
            self.store.fs.pipe_file(self._blob_path(step, self.env.rank), rank_blob)
        except BaseException as err:
            failure = err
        # Every rank reports, so none waits for a rank that failed; then rank 0 may commit.
        failed = torch.tensor([0 if failure is None else 1])
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        if failure is not None:
            raise failure
        if int(failed) > 0:
            raise CheckpointSaveError(f"another rank failed to write its part of {self.store.step_path(step)}")

    def read(self, step: int, *, blob_rank: int) -> bytes:
        # Never another world size: the resume guard refuses it for DeepSpeed (config.RESHARDABLE_STRATEGIES).
        path, _ = self.engine.load_checkpoint(
            self.store.root, tag=checkpoint_dir_name(step), load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise CheckpointMismatchError(
                f"checkpoint {self.store.step_path(step)} has a manifest but DeepSpeed could not load it"
            )
        return self.store.fs.cat_file(self._blob_path(step, blob_rank))

    def reserve(self) -> None:
        """Nothing to allocate ahead: DeepSpeed builds its state dicts inside ``save_checkpoint``, so the
        first save allocates the buffers the later ones reuse."""

    def close(self) -> None:
        self._writer_thread.shutdown(wait=True)
        self._stager.close()
