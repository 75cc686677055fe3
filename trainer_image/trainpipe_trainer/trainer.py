"""The training loop and the components it is built from (one ``Trainer`` per process).

One optimizer step: ``gradient_accumulation_steps`` micro-batches (fewer at the end of an epoch),
the global gradient norm (clipped when configured), the guard, the update. Then, in this order:
step flags shared by all ranks (SIGTERM, checkpoint due by the clock), metrics, end of epoch,
checkpoint. Checkpoints are taken only between optimizer steps, so no gradient is ever in one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from array import array
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainpipe_trainer import storage
from trainpipe_trainer.checkpoint import rng
from trainpipe_trainer.checkpoint.manager import CheckpointManager, CheckpointStore
from trainpipe_trainer.checkpoint.state import TrainState
from trainpipe_trainer.config import CHECKPOINT_METRICS, TrainingConfig
from trainpipe_trainer.data.memory import Batches, TrainingData, resident_fits
from trainpipe_trainer.data.splits import Splits, StreamSource
from trainpipe_trainer.data.streamed import StreamedData, load_data
from trainpipe_trainer.distributed import (
    DistEnv,
    StepFlags,
    all_reduce_sums,
    barrier,
    cpu_group,
    destroy_distributed,
    init_distributed,
)
from trainpipe_trainer.errors import (
    CudaOutOfMemoryError,
    PreemptedError,
    StoppedAtStepError,
    TrainingDivergedError,
    TrialPrunedError,
)
from trainpipe_trainer.losses import LossFn, make_loss_fn
from trainpipe_trainer.models import (
    DataDescription,
    ModelFamily,
    check_family_inputs,
    family_provenance,
    load_family,
)
from trainpipe_trainer.models.family import ExportContext
from trainpipe_trainer.optim import apply_tf32
from trainpipe_trainer.outcomes import (
    WORLD_SIZE_HISTORY_TAG,
    TrainingResult,
    model_family_tags,
    preempted_message,
    trial_pruned_message,
)
from trainpipe_trainer.preemption import PreemptionWatcher
from trainpipe_trainer.resume import DATA_ORDER, IN_MEMORY_ORDER, STREAMED_ORDER, ResumeIdentity, resume_identity
from trainpipe_trainer.run_layout import RESULT_FILE
from trainpipe_trainer.serving.export import weights_sha256
from trainpipe_trainer.strategies import Strategy, build_strategy
from trainpipe_trainer.tracking.launch_timing import LaunchPhases
from trainpipe_trainer.tracking.progress import Progress
from trainpipe_trainer.tracking.system_metrics import ComputeClock, LoopCounters, SystemMonitor
from trainpipe_trainer.tracking.tracker import Tracker, flatten_params
from trainpipe_trainer.validation_metrics import task_metrics

if TYPE_CHECKING:
    from trainpipe_trainer.tuning import TrialReporter

# Step flags every rank must agree on (see distributed.StepFlags).
_STOP, _CLOCK = 0, 1
# Exit code of crash_after_step (fault injection): what the retry tests look for.
CRASH_EXIT_CODE = 3


def bf16_autocast_applies(config: TrainingConfig, env: DistEnv) -> bool:
    """Whether the loop wraps forward passes in bf16 autocast (DeepSpeed does it inside its engine)."""
    if config.optimization.precision != "bf16" or config.strategy == "deepspeed":
        return False
    return env.device.type != "cuda" or torch.cuda.is_bf16_supported()


# Columns of Trainer.step_values: a step's loss and global gradient norm.
_LOSS, _NORM = 0, 1
# Waiting for checkpoint writes above this share of the step loop's time is reported at the end.
WAIT_WARNING_SHARE = 0.05


@dataclass(kw_only=True, slots=True)
class LoopStats:
    """What the loop measured about itself (the overhead benchmark reads it)."""

    steps: int = 0
    # Wall time of the step loop: every optimizer step after the first (the first is launch cost).
    loop_seconds: float = 0.0
    # Samples (all ranks) done by the end of the first step, and the loop's rate after it.
    first_step_samples: int = 0
    samples_per_second: float = 0.0
    # Wall time of every optimizer step (data, compute, metrics, checkpoint); kept only when a
    # caller (the overhead benchmark) sets it to an empty array before ``fit``.
    step_seconds: array | None = None
    # Checkpoints saved in the step loop, and the loop time they held: their snapshots, plus the
    # time each first waited for the previous save to be written (storage slower than the saves).
    checkpoint_saves: int = 0
    checkpoint_held_seconds: float = 0.0
    checkpoint_wait_seconds: float = 0.0

    def count_checkpoint(self, *, blocked: float, waited: float) -> None:
        self.checkpoint_saves += 1
        self.checkpoint_held_seconds += blocked + waited
        self.checkpoint_wait_seconds += waited

    def checkpoint_summary(self) -> str:
        """The launch line's account of the loop's checkpoints ("" when none was saved in it)."""
        if not self.checkpoint_saves:
            return ""
        return (f"; checkpoints in the loop: {self.checkpoint_saves}, holding it {self.checkpoint_held_seconds:.2f} s "
                f"({self.checkpoint_wait_seconds:.2f} s of it waiting for the previous write)")

    def checkpoint_wait_warning(self, *, longest_write: float) -> str | None:
        """A warning when waiting for checkpoint writes took a noticeable share of the loop."""
        if self.loop_seconds <= 0 or self.checkpoint_wait_seconds < WAIT_WARNING_SHARE * self.loop_seconds:
            return None
        return (
            f"warning: the step loop waited {self.checkpoint_wait_seconds:.1f} s "
            f"({self.checkpoint_wait_seconds / self.loop_seconds:.0%} of its time) for checkpoint writes: "
            f"{self.checkpoint_saves} saves were due about every {self.loop_seconds / self.checkpoint_saves:.2f} s, "
            f"and one took up to {longest_write:.2f} s to write and commit; training went on, slower. Checkpoint "
            "less often (checkpoint.every_n_steps or checkpoint.every_seconds) or to faster storage"
        )


@dataclass(kw_only=True, slots=True)
class Trainer:
    config: TrainingConfig
    env: DistEnv
    tracker: Tracker
    # Read from the config's snapshot unless given: a trial worker reads it once for all its trials. In
    # memory, or streamed by row group (data.streamed: a manifest too large for the host, data_placement: stream).
    data: TrainingData | StreamedData | None = None
    # The launch's read of the split, started before torch loaded (used when ``data`` is not given).
    splits: Future[Splits | StreamSource] | None = None
    # The model family and its checked parameters (models.family): resolved first, before the data is awaited.
    family: tuple[ModelFamily, dict[str, Any]] = field(init=False)
    strategy: Strategy = field(init=False)
    loss_fn: LossFn = field(init=False)
    batches: Batches = field(init=False)
    steps_per_epoch: int = field(init=False)
    checkpoints: CheckpointManager = field(init=False)
    flags: StepFlags = field(init=False)
    progress: Progress = field(init=False)
    counters: LoopCounters = field(init=False, default_factory=LoopCounters)
    clock: ComputeClock = field(init=False)
    stats: LoopStats = field(init=False, default_factory=LoopStats)
    state: TrainState = field(init=False, default_factory=TrainState)
    total_steps: int = field(init=False)
    # Rank 0 of a hyperparameter-search trial: reports at each evaluation point (trainpipe_trainer.tuning).
    trial: TrialReporter | None = field(init=False, default=None)
    # Installed by run_training before anything slow (imports, data, rendezvous), so a SIGTERM at
    # any moment stops training at the end of a step; fit installs its own when none is given.
    watcher: PreemptionWatcher | None = None
    # Where the launch's fixed time goes (run_training's); the trainer marks its own phases in it.
    phases: LaunchPhases = field(default_factory=LaunchPhases)
    # One row per step since the last sync point (loss, gradient norm; float64, on the device): a step
    # writes its row and reads nothing back; _sync reads the rows at once. Sync points come at least
    # every log_every_n_steps steps, so that many rows are enough.
    step_values: torch.Tensor = field(init=False)
    unsynced_steps: int = field(init=False, default=0)
    autocast: contextlib.AbstractContextManager = field(init=False)
    # Early stopping: a CPU copy of the weights at the best epoch end so far (what is exported).
    best_weights: dict[str, torch.Tensor] | None = field(init=False, default=None)
    # Device- or CPU-hours over all ranks, as last logged (``trainer_*_hours``): a trial's compute.
    compute_hours: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        config, env = self.config, self.env
        family = load_family(config.model.type)
        self.family = (family, family.validate_params(config.model.params))
        check_family_inputs(family, config)
        self.clock = ComputeClock(device=env.device)
        if self.data is None:
            self.data = load_data(config, self.splits)
            self.splits = None
        accumulation = config.optimization.gradient_accumulation_steps
        streamed = not isinstance(self.data, TrainingData)
        if streamed:
            # Host batches, copied to a CUDA device one batch ahead; the validation split stays on the host.
            self.batches = self.data.loader(batch_size=config.batch_size, seed=config.seed, env=env)
            if env.is_main:
                print(self.data.summary, flush=True)
        else:
            placement = self._data_device()
            self.batches = self.data.loader(batch_size=config.batch_size, seed=config.seed, env=env, device=placement)
            if self.data.validation is not None:
                self.data.validation.tensors = tuple(t.to(placement) for t in self.data.validation.tensors)
            if env.is_main and config.train_data_format == "manifest":
                print(f"data: in memory, {self.data.n_rows} rows of the manifest's train split "
                      f"(data_placement: {config.data_placement})", flush=True)
        self.phases.mark("data read")
        apply_tf32(config.optimization.tf32, env.device)
        self.autocast = (
            torch.autocast(device_type=env.device.type, dtype=torch.bfloat16)
            if bf16_autocast_applies(config, env) else contextlib.nullcontext()
        )
        self.steps_per_epoch = math.ceil(self.batches.batches_per_epoch / accumulation)
        total_steps = self.total_steps = config.epochs * self.steps_per_epoch
        if config.tuning is not None and env.is_main:
            from trainpipe_trainer.tuning import TrialReporter

            self.trial = TrialReporter.open(config.tuning)
        # Same seed on every rank: identical initial weights (DDP would broadcast rank 0's anyway).
        rng.seed_all(config.seed)
        # The model family builds the module; everything around it is this harness's (models.family).
        family, params = self.family
        transformer = self.data.transformer
        description = DataDescription.of(config.task, transformer, self.data.classes)
        self.strategy = build_strategy(
            config,
            env=env,
            build_module=lambda: family.build(config.model, params, description),
            total_steps=total_steps,
        )
        self.loss_fn = family.loss(config.task) or make_loss_fn(config)
        self.tracker.set_tags(family.run_tags(config.model, params, description))
        self.step_values = torch.zeros((config.tracking.log_every_n_steps, 2), dtype=torch.float64, device=env.device)
        self.phases.mark("model build")
        # Then one stream per rank, so dropout masks differ between ranks but not between runs.
        rng.seed_all(config.seed + env.rank)
        # Collective, same order on every rank: the checkpoint writer's group, then the flags'.
        checkpoint_group = cpu_group()
        self.flags = StepFlags(env=env, size=2, group=cpu_group())
        store = CheckpointStore(root_uri=config.checkpoint.root_uri, storage_options=config.storage_options)
        self.checkpoints = CheckpointManager(
            config=config.checkpoint,
            env=env,
            store=store,
            backend=self.strategy.checkpoint_backend(
                store, group=checkpoint_group, async_save=config.checkpoint.async_save
            ),
            identity=self._resume_identity(streamed),
            shape={
                "world_size": env.world_size,
                "batch_size": config.batch_size,
                "gradient_accumulation_steps": accumulation,
                **self.strategy.checkpoint_shape,
            },
            scheduler=self.strategy.checkpoint_scheduler,
        )
        self.progress = Progress(total_steps=total_steps, epochs=config.epochs, enabled=env.is_main)
        bf16 = config.optimization.precision == "bf16"
        if bf16 and env.is_main and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            print("warning: precision bf16 is not supported by this GPU; training in fp32", file=sys.stderr)
        # Where the family came from, as installed where it trains (the only record on Kubernetes).
        self.tracker.set_tags(model_family_tags(family_provenance(config.model.type)))
        self.tracker.log_params(
            {
                "train_rows": str(self.data.n_rows),
                "validation_rows": str(self.data.n_validation_rows),
                "steps_per_epoch": str(self.steps_per_epoch),
            }
        )

    # -- the run ---------------------------------------------------------------------------------

    def fit(self) -> TrainingResult | None:
        """Train (resuming if a committed checkpoint exists), export; the result on rank 0 only."""
        restored = self.checkpoints.restore()
        resumed = None
        if restored is not None:
            self.state, resumed = restored, restored.global_step
            self.best_weights = self.checkpoints.restored_best_weights
            if self.env.is_main:
                print(f"resumed from step {resumed}", flush=True)
                written_by = self.checkpoints.resharded_from
                if written_by is not None:
                    print(f"resharded: checkpoint step-{resumed} was written by {written_by} processes, this run has "
                          f"{self.env.world_size}; model and optimizer state loaded across them, and epoch "
                          f"{self.state.epoch + 1} continues at its row {self.state.sample_in_epoch} of "
                          f"{self.data.n_rows} (nothing skipped or repeated)", flush=True)
                # A tag, not a param: each retry may resume from another step, and params are immutable.
                self.tracker.set_tags({"resumed_from_step": str(resumed)})
                self.tracker.log_metric("resumed_from_step", float(resumed), step=resumed)
        if self.state.record_world_size(self.env.world_size) or resumed is None:
            self.tracker.set_tags({WORLD_SIZE_HISTORY_TAG: json.dumps(self.state.world_size_history)})
        self.unsynced_steps = 0
        self.phases.mark("checkpoint restore")
        # Waited for here, not beside the loop: the opening thread's Python work would hold the GIL
        # the step loop needs between its ops (measured: a third of the loop's rate on 2 cores).
        self.tracker.join()
        self.phases.mark("tracking wait")
        self.counters.step = self.state.global_step
        self.progress.start(self.state.global_step)
        monitor = None
        if self.tracker.enabled:
            monitor = SystemMonitor(
                log=lambda name, value, step: self.tracker.log_metric(name, value, step=step),
                every_seconds=self.config.tracking.system_metrics_every_seconds,
                counters=self.counters,
                device=self.env.device,
            ).start()
            self.tracker.attach_monitor(monitor)
        try:
            with contextlib.nullcontext(self.watcher) if self.watcher is not None else PreemptionWatcher() as watcher:
                start_step = self.state.global_step
                while self.state.epoch < self.config.epochs and not self.state.stopped_early:
                    self._run_epoch(watcher)
                self._time_loop()
                self.phases.skip()
                self.stats.steps += self.state.global_step - start_step
                self.flags.drain()
                self._save(wait=True)
            self.checkpoints.close()
        finally:
            # The streamed loader's read threads end here, not with the process (a failed read included).
            self.batches.close()
            if monitor is not None:
                monitor.stop()
        self._log_compute_hours()
        self.phases.mark("final checkpoint")
        self._log_throughput()
        return self._export(resumed)

    def _run_epoch(self, watcher: PreemptionWatcher) -> None:
        loader = self.batches.epoch(self.state.epoch, position=self.state.sample_in_epoch)
        if self.state.sample_in_epoch >= self.batches.epoch_end:
            # Nothing left of this epoch at this world size (a checkpoint at its very end): close it.
            self._end_epoch()
            return
        self.strategy.train()
        durations = self.stats.step_seconds
        last = time.perf_counter()
        for group in self.step_groups(loader):
            self.train_step(group, watcher)
            now = time.perf_counter()
            if self.phases.loop_started is None:
                # The first step (allocations, kernel selection, the first gathers) is launch cost;
                # the step loop, what samples/s describes, starts after it.
                self.phases.mark("first step")
                if self.env.device.type == "cuda":
                    # Pinned snapshot buffers (a second or more for a large model), once per launch.
                    self.checkpoints.reserve()
                    self.phases.mark("checkpoint buffers")
                    now = time.perf_counter()
                self.phases.loop_started, self.stats.first_step_samples = now, self.counters.samples
            if durations is not None:
                durations.append(now - last)
            last = now

    def train_step(self, group: list[list[torch.Tensor]], watcher: PreemptionWatcher) -> None:
        """One optimizer step and everything that follows it: flags, metrics, epoch end, checkpoint.

        The step itself reads nothing back from the device. Loss sums and the non-finite guard are
        read at the sync points only: a log interval, an epoch's end and a checkpoint (``_sync``).
        """
        self._optimizer_step(group)
        stop, by_clock = self.flags.exchange([watcher.requested, self.env.is_main and self.checkpoints.clock_due()])
        step = self.state.global_step
        self.counters.step = step
        fault = self.config.fault_injection
        crash = fault is not None and fault.crash_after_step == step
        asked = self.config.stop_after_step == step
        log_due = step % self.config.tracking.log_every_n_steps == 0
        epoch_done = self.state.sample_in_epoch >= self.batches.epoch_end
        save_due = self.checkpoints.due(step) or by_clock or stop or crash or asked
        if log_due or epoch_done or save_due:
            self._sync()
        if log_due:
            self._log_interval()
        if epoch_done:
            self._end_epoch()
        # After _end_epoch, so a save at an epoch boundary resumes at the next epoch's start.
        if stop:
            # Counted in the checkpoint, so it survives the relaunch (MLflow metric "preemptions").
            self.state.preemptions += 1
        if save_due and self._save(wait=stop or crash or asked):
            checkpoints = self.checkpoints
            self.stats.count_checkpoint(blocked=checkpoints.blocked_seconds[-1], waited=checkpoints.waited_seconds[-1])
        if stop:
            self._stop_for_preemption(watcher)
        if asked:
            self._stop_as_asked()
        if crash:
            self._crash()
        if fault is not None and fault.step_delay_seconds:
            time.sleep(fault.step_delay_seconds)

    def step_groups(self, loader: Iterable[list[torch.Tensor]]) -> Iterator[list[list[torch.Tensor]]]:
        """Micro-batches grouped per optimizer step; the last group of an epoch may be shorter."""
        accumulation = self.config.optimization.gradient_accumulation_steps
        group: list[list[torch.Tensor]] = []
        for batch in loader:
            group.append(batch)
            if len(group) == accumulation:
                yield group
                group = []
        if group:
            yield group

    def _optimizer_step(self, group: list[list[torch.Tensor]]) -> None:
        step = self.state.global_step + 1
        fault = self.config.fault_injection
        inject_nan = fault is not None and fault.nan_loss_at_step == step
        losses = []
        for index, batch in enumerate(group):
            features, labels, *rest = batch
            mask = rest[0] if rest else None

            # The batch is bound as defaults: each micro-step's closure keeps its own batch.
            def loss_of(module: torch.nn.Module, features: torch.Tensor = features, labels: torch.Tensor = labels,
                        mask: torch.Tensor | None = mask) -> torch.Tensor:
                if fault is not None and fault.cuda_oom_at_step == step and (
                        fault.oom_above_batch_size is None or len(features) > fault.oom_above_batch_size):
                    # Fault injection: the error a real CUDA OOM raises here (none can happen on a CPU-only machine).
                    raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (fault injection at step {step})")
                with self.autocast:
                    scores = module(features).squeeze(-1)
                loss = self.loss_fn(scores.float(), labels, mask)
                return loss * math.nan if inject_nan else loss

            losses.append(
                self.strategy.micro_step(loss_of, scale=1.0 / len(group), boundary=index == len(group) - 1)
            )
        grad_norm = self.strategy.optimizer_step()
        loss = torch.stack(losses).mean() if len(losses) > 1 else losses[0]
        self._record_step(loss, grad_norm)
        # Every rank's micro-batch has as many rows (data.GlobalOrderSampler).
        samples = sum(len(batch[0]) for batch in group) * self.env.world_size
        self.state.finish_step(micro_batches=len(group), samples=samples)
        self.counters.samples += samples
        self.progress.add_samples(samples)

    def _record_step(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Write the step's loss and gradient norm to its row on the device (two copies; nothing is read
        back here: ``_sync`` reads them)."""
        if self.unsynced_steps == len(self.step_values):
            self._sync()  # not reached between the loop's sync points; kept so no row is ever overwritten
        row = self.step_values[self.unsynced_steps]
        row[_LOSS].copy_(loss.detach())
        row[_NORM].copy_(grad_norm.detach())
        self.unsynced_steps += 1

    def _sync(self) -> None:
        """Read the steps' rows since the last sync point (one read), add their losses to the state's
        running sums in step order, in float64 (what the checkpoint keeps: a resumed run adds the same
        numbers); stop if a step was non-finite.

        Steps after a non-finite one have trained on garbage, but none of them was saved (every save
        comes after a sync): training stops here and the last checkpoint, of a step before it, stays.
        """
        count, self.unsynced_steps = self.unsynced_steps, 0
        if count == 0:
            return
        first_step = self.state.global_step - count + 1
        state = self.state
        interval, epoch = state.interval_loss_sum, state.epoch_loss_sum
        diverged: tuple[int, float, float] | None = None
        for offset, (loss, grad_norm) in enumerate(self.step_values[:count].tolist()):
            interval += loss
            epoch += loss
            if diverged is None and not (math.isfinite(loss) and math.isfinite(grad_norm)):
                diverged = (first_step + offset, loss, grad_norm)
        state.interval_loss_sum, state.epoch_loss_sum = interval, epoch
        if diverged is not None:
            step, loss, grad_norm = diverged
            self._diverged(step, loss=loss, grad_norm=grad_norm)

    # -- guards and stops ------------------------------------------------------------------------

    def _diverged(self, step: int, *, loss: float, grad_norm: float) -> None:
        # The gradient norm is global, so every rank gets here at the same step.
        what = f"non-finite loss ({loss})" if not math.isfinite(loss) else f"non-finite gradient norm ({grad_norm})"
        kept = self.checkpoints.last_saved_step
        # A save in flight is of an earlier, valid step: let it commit, then touch nothing.
        self.checkpoints.wait()
        message = (
            f"{what} at step {step}: training stopped; "
            + (f"the last checkpoint (step-{kept}) is kept unchanged" if kept is not None else "no checkpoint exists")
            + "; lower learning_rate, set optimization.gradient_clip_norm or check the data"
        )
        if self.env.is_main:
            self.tracker.failed(message, step=step)
        raise TrainingDivergedError(message, step=step)

    def _stop_for_preemption(self, watcher: PreemptionWatcher) -> None:
        step = self.state.global_step
        # Every rank's save is done and rank 0 committed before anyone exits.
        barrier(self.env)
        name = watcher.received.name if watcher.received is not None else "SIGTERM"
        message = preempted_message(name, step)
        if self.env.is_main:
            print(message, flush=True)
            self.tracker.log_metric("preemptions", float(self.state.preemptions), step=step)
            self.tracker.failed(message, step=step, status="KILLED")
        raise PreemptedError(message, step=step)

    def _stop_as_asked(self) -> None:
        step = self.state.global_step
        barrier(self.env)
        message = f"stopped after step {step} as asked (stop_after_step): committed checkpoint step-{step}"
        if self.env.is_main:
            print(message, flush=True)
            self.tracker.failed(message, step=step, status="KILLED")
        raise StoppedAtStepError(message, step=step)

    def _crash(self) -> None:
        step = self.state.global_step
        barrier(self.env)
        if self.env.is_main:
            print(
                f"fault injection: checkpoint step-{step} committed, exiting abruptly (os._exit({CRASH_EXIT_CODE}))",
                flush=True,
            )
            # Metrics logged so far reach the run; nothing else is cleaned up (the run stays RUNNING).
            self.tracker.flush(timeout=30)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    # -- metrics, validation, checkpoints ------------------------------------------------------

    def _log_interval(self) -> None:
        total, count = all_reduce_sums([self.state.interval_loss_sum, self.state.interval_loss_count], self.env)
        self.state.interval_loss_sum, self.state.interval_loss_count = 0.0, 0
        loss = total / max(count, 1)
        step = self.state.global_step
        self.tracker.log_metric("train_loss", loss, step=step)
        self.tracker.log_metric("learning_rate", self.strategy.learning_rate(), step=step)
        rate = self.progress.report(
            step=step, epoch=self.state.epoch, loss=loss, data_wait_seconds=self.batches.wait_seconds,
            peak_memory_gb=self._peak_memory_gb(),
        )
        self.tracker.log_metric("samples_per_second", rate.samples_per_second, step=step)
        self.tracker.log_metric("data_wait_share", rate.data_wait_share, step=step)
        if rate.peak_memory_gb is not None:
            self.tracker.log_metric("gpu_peak_memory_gb", rate.peak_memory_gb, step=step)

    def _peak_memory_gb(self) -> float | None:
        # The caching allocator's own counter: host-side, no device sync.
        if self.env.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.env.device) / 2**30

    def _time_loop(self) -> None:
        """The step loop's wall time so far (from the end of its first step): where it ends, or is pruned."""
        if self.phases.loop_started is not None:
            self.stats.loop_seconds = time.perf_counter() - self.phases.loop_started

    def _log_throughput(self) -> None:
        """The step loop's rate over the whole run (first step excluded), for the run note and report."""
        if self.stats.loop_seconds <= 0:
            return
        samples = self.counters.samples - self.stats.first_step_samples
        self.stats.samples_per_second = samples / self.stats.loop_seconds
        self.tracker.log_metric("train_samples_per_second", self.stats.samples_per_second, step=self.state.global_step)
        # The loop's own wall time: what a study's set-up share is taken against (a trial's launch
        # phases say where the rest went).
        self.tracker.log_metric("step_loop_seconds", self.stats.loop_seconds, step=self.state.global_step)
        self.tracker.log_metric("checkpoint_wait_seconds", self.stats.checkpoint_wait_seconds, step=self.state.global_step)
        warning = self.stats.checkpoint_wait_warning(longest_write=max(self.checkpoints.write_seconds, default=0.0))
        if warning is not None and self.env.is_main:
            print(warning, file=sys.stderr, flush=True)

    def _end_epoch(self) -> None:
        total, count = all_reduce_sums([self.state.epoch_loss_sum, self.state.epoch_loss_count], self.env)
        epoch_loss = total / max(count, 1)
        self.tracker.log_metric("epoch_loss", epoch_loss, step=self.state.global_step)
        self.state.next_epoch(epoch_loss)
        if self.config.early_stopping is not None:
            self._judge_epoch()

    def _judge_epoch(self) -> None:
        """Early stopping at an epoch end: keep the weights if the validation metric improved by more than
        ``min_delta``, else count the epoch; ``patience`` such epochs in a row stop training.

        Every rank scores the whole validation split (same value, no collective) and draws no random
        numbers, so judging changes nothing of the training that follows.
        """
        rule, state = self.config.early_stopping, self.state
        value = self.validation_metrics()[rule.metric]
        step = state.global_step
        self.tracker.log_metric(f"epoch_end_{rule.metric}", value, step=step)
        # A loss or error improves downwards, an accuracy, AUC or F1 upwards.
        sign = 1.0 if CHECKPOINT_METRICS[self.config.task][rule.metric] == "minimize" else -1.0
        if state.best_value is None or sign * value < sign * state.best_value - rule.min_delta:
            state.best_value, state.best_epoch, state.best_step = value, state.epoch, step
            state.epochs_without_improvement = 0
            # Collective under ZeRO-3 (the parameters are gathered): every rank is here.
            module = self.strategy.full_module()
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
            return
        state.epochs_without_improvement += 1
        if state.epochs_without_improvement < rule.patience or state.epoch >= self.config.epochs:
            return
        state.stopped_early = True
        if self.env.is_main:
            print(f"early stopping after epoch {state.epoch} of {self.config.epochs} (step {step}): {rule.metric} has "
                  f"not improved by more than {rule.min_delta:g} for {rule.patience} epoch(s); the model is the "
                  f"weights of epoch {state.best_epoch} (step {state.best_step}, {rule.metric} {state.best_value:.6g})",
                  flush=True)

    @torch.no_grad()
    def validation_metrics(self) -> dict[str, float] | None:
        """Loss and the task's metrics on the held-out split (``config.CHECKPOINT_METRICS``); every
        rank scores all of it (no collective, same values).

        Draws no random numbers (eval mode, plain slices rather than a DataLoader, whose iterator
        seeds itself from the global generator): a checkpoint must not change the training that follows.
        """
        validation = self.data.validation
        if validation is None:
            return None
        if self.config.task == "causal_lm":
            return self._token_validation_metrics()
        self.strategy.eval()
        module = self.strategy.forward_module()
        size = max(self.config.batch_size, 256)
        losses = []
        all_scores, all_labels = [], []
        try:
            for begin in range(0, len(validation), size):
                batch = [t[begin : begin + size] for t in validation.tensors]
                features, labels, *rest = (t.to(self.env.device) for t in batch)
                with self.autocast:
                    scores = module(features).squeeze(-1)
                loss = self.loss_fn(scores.float(), labels, rest[0] if rest else None)
                losses.append(loss.to(torch.float64) * len(features))
                if not rest:  # row-wise scores (listwise ranking has padded query lists: its loss only)
                    all_scores.append(scores.float())
                    all_labels.append(labels.float())
        finally:
            self.strategy.train()
        # One read back of all batches' values (the sum in batch order, as a running float sum would).
        total = 0.0
        for value in torch.stack(losses).tolist():
            total += value
        metrics = {"validation_loss": total / max(len(validation), 1)}
        if all_scores:
            scores, labels = torch.cat(all_scores).cpu().double(), torch.cat(all_labels).cpu().double()
            target = self.data.target
            if target is not None:
                # The loss stays on the scaled target (what is trained); rmse and mae in the label's units.
                scores, labels = scores * target.std + target.mean, labels * target.std + target.mean
            metrics.update(task_metrics(self.config.task, scores, labels))
        return metrics

    @torch.no_grad()
    def _token_validation_metrics(self) -> dict[str, float]:
        """causal_lm, token-weighted: each target token's cross-entropy and whether it was the most probable
        token, in batches of ``batch_size`` rows (the logits are ``[rows, length, vocabulary]``)."""
        validation = self.data.validation
        self.strategy.eval()
        module = self.strategy.forward_module()
        losses, hits = [], []
        try:
            for begin in range(0, len(validation), self.config.batch_size):
                features, targets = (t[begin : begin + self.config.batch_size].to(self.env.device)
                                     for t in validation.tensors)
                with self.autocast:
                    logits = module(features)
                trained = targets >= 0
                logits, targets = logits[trained].float(), targets[trained]
                losses.append(torch.nn.functional.cross_entropy(logits, targets, reduction="none").double())
                hits.append((logits.argmax(dim=-1) == targets).double())
        finally:
            self.strategy.train()
        token_losses, token_hits = torch.cat(losses).cpu(), torch.cat(hits).cpu()
        # Summed in float64 in token order, as a running sum would.
        metrics = {"validation_loss": float(token_losses.sum()) / max(token_losses.numel(), 1)}
        metrics.update(task_metrics("causal_lm", token_losses, token_hits))
        return metrics

    def _resume_identity(self, streamed: bool) -> ResumeIdentity:
        """The config's identity plus the data path's order, which the launch decided (``resume.DATA_ORDER``)."""
        identity = resume_identity(self.config, world_size=self.env.world_size)
        order = STREAMED_ORDER if streamed else IN_MEMORY_ORDER
        return dataclasses.replace(identity, settings={**identity.settings, DATA_ORDER: order})

    def _data_device(self) -> torch.device:
        """Where the training and validation splits are kept (``data_placement``)."""
        device, placement = self.env.device, self.config.data_placement
        if device.type != "cuda" or placement == "device":
            return device
        tensors = list(self.data.dataset.tensors)
        if self.data.validation is not None:
            tensors += self.data.validation.tensors
        if placement == "auto" and resident_fits(tensors, device):
            return device
        return torch.device("cpu")

    def _save(self, *, wait: bool) -> bool:
        """Checkpoint this step (False if it already was)."""
        step = self.state.global_step
        if step == self.checkpoints.last_saved_step:
            if wait:
                self.checkpoints.wait()
            return False
        metrics = self.validation_metrics() if self.config.checkpoint.keep_best else None
        validation_loss = metrics["validation_loss"] if metrics else None
        self.state.compute_seconds += self.clock.seconds()
        self.clock = ComputeClock(device=self.env.device)
        self.checkpoints.save(self.state, validation_loss=validation_loss, wait=wait, best_weights=self.best_weights)
        for name, value in (metrics or {}).items():
            self.tracker.log_metric(name, value, step=step)
        self.tracker.log_metric("checkpoint_blocked_ms", 1000 * self.checkpoints.blocked_seconds[-1], step=step)
        self.tracker.log_metric("checkpoint_wait_ms", 1000 * self.checkpoints.waited_seconds[-1], step=step)
        if self.config.tuning is not None:
            self._report_trial(metrics or {}, step)
        return True

    def _report_trial(self, metrics: dict[str, float], step: int) -> None:
        """A trial's evaluation point is its checkpoint: report the tuned metric, stop if pruned.

        Rank 0 asks the study; every rank learns its answer (one all-reduce) and stops at the same step.
        """
        from trainpipe_trainer.tuning import progress_percent

        metric = self.config.tuning.metric
        value = metrics.get(metric)
        prune = False
        if self.trial is not None and value is not None:
            prune = self.trial.report(value, progress=progress_percent(step, self.total_steps))
        (votes,) = all_reduce_sums([1.0 if prune else 0.0], self.env)
        if votes == 0 or step >= self.total_steps:
            return
        # The checkpoint just taken is the trial's last: let it commit, record the compute spent, stop.
        self._time_loop()
        self._log_throughput()
        self.checkpoints.wait()
        self.checkpoints.close()
        self._log_compute_hours()
        message = trial_pruned_message(self.config.tuning.trial_number, step=step, total_steps=self.total_steps,
                                       metric=metric, value=value)
        if self.env.is_main:
            print(message, flush=True)
            self.tracker.set_tags({"trainpipe.trial_state": "pruned", "trainpipe.pruned_at_step": str(step)})
            self.tracker.failed(message, step=step, status="KILLED")
        raise TrialPrunedError(message, step=step)

    def _log_compute_hours(self) -> None:
        self.state.compute_seconds += self.clock.seconds()
        self.clock = ComputeClock(device=self.env.device)
        (total,) = all_reduce_sums([self.state.compute_seconds], self.env)
        self.compute_hours = total / 3600
        self.tracker.log_metric(self.clock.metric_name, self.compute_hours, step=self.state.global_step)

    # -- export ----------------------------------------------------------------------------------

    def _export(self, resumed: int | None) -> TrainingResult | None:
        # Collective under ZeRO-3 (parameters are sharded): every rank takes part.
        module = self.strategy.full_module()
        result = None
        if self.env.is_main:
            if self.state.last_epoch_loss is None:
                raise RuntimeError("training ended without completing an epoch")
            best = self.checkpoints.best
            if best is not None:
                self.tracker.set_tags({"best_checkpoint_step": str(best[0])})
            if self.best_weights is not None:
                # Early stopping: the best epoch end's weights are the model (and its weights hash).
                module.load_state_dict(self.best_weights)
                self.tracker.set_tags({"trainpipe.early_stopping": json.dumps({
                    "stopped": self.state.stopped_early, "epochs_trained": self.state.epoch,
                    "best_epoch": self.state.best_epoch, "best_step": self.state.best_step,
                    "best_value": self.state.best_value})})
            model_uri = None
            if self.config.tuning is None:
                # Every queued metric is in the run before the model (a server outage ends here, or fails).
                self.tracker.flush()
                family, params = self.family
                context = ExportContext(config=self.config, transformer=self.data.transformer, target=self.data.target,
                                        classes=self.data.classes, sample_frame=self.data.sample_frame,
                                        tracker=self.tracker)
                model_uri = family.export(module, params, context)
                if model_uri is None:
                    from trainpipe_trainer.models.torch_serving import log_torch_model

                    model_uri = log_torch_model(module, params=params, context=context)
            # A tuning trial logs no model: nothing loads it (the final training retrains the best
            # parameters and logs that model), and it cost 0.2-0.5 s of every complete trial. Its
            # weights stay in its final checkpoint, its hash in result.json and the study.
            result = TrainingResult(
                mlflow_run_id=self.tracker.run_id or "",
                model_uri=model_uri,
                weights_sha256=weights_sha256(module),
                world_size=self.env.world_size,
                global_step=self.state.global_step,
                final_loss=self.state.last_epoch_loss,
                resumed_from_step=resumed,
                world_size_history=self.state.world_size_history,
                samples_per_second=round(self.stats.samples_per_second, 1) or None,
            )
            storage.write_text(
                storage.join(self.config.output_uri, RESULT_FILE), result.to_json(), self.config.storage_options
            )
        # Other ranks wait, so the job ends only once the model and result.json exist.
        barrier(self.env)
        return result


def run_training(
    config: TrainingConfig, watcher: PreemptionWatcher | None = None, phases: LaunchPhases | None = None, *,
    splits: Future[Splits] | None = None,
) -> TrainingResult | None:
    phases = phases if phases is not None else LaunchPhases()
    env = init_distributed()
    phases.mark("rendezvous")
    try:
        with Tracker(config=config.tracking, enabled=env.is_main) as tracker:
            tracker.log_params(flatten_params(config, world_size=env.world_size))
            tracker.set_tags(config.tags)
            phases.mark("tracking start")
            trainer = Trainer(config=config, env=env, tracker=tracker, watcher=watcher, phases=phases, splits=splits)
            try:
                result = trainer.fit()
            except torch.cuda.OutOfMemoryError as err:
                # Its own outcome (exit code CUDA_OOM_EXIT_CODE): a retry may train with a smaller batch.
                step = trainer.state.global_step + 1
                message = (f"CUDA out of memory in step {step} (batch_size {config.batch_size}, "
                           f"gradient_accumulation_steps {config.optimization.gradient_accumulation_steps}): {err}")
                if env.is_main:
                    tracker.failed(message, step=step)
                raise CudaOutOfMemoryError(message, step=step) from err
            phases.mark("export")
            for name, seconds in phases.metrics().items():
                tracker.log_metric(name, seconds, step=trainer.state.global_step)
        phases.mark("tracking flush")
    finally:
        destroy_distributed()
    phases.mark("shutdown")
    if result is not None:
        stats = trainer.stats
        print(phases.summary(loop_steps=max(stats.steps - 1, 0), loop_seconds=stats.loop_seconds,
                             samples_per_second=stats.samples_per_second) + stats.checkpoint_summary(), flush=True)
        # Last: launchers and scripts read the weights hash from the final line.
        print(f"result: {storage.join(config.output_uri, RESULT_FILE)}", flush=True)
        print(f"weights sha256: {result.weights_sha256}", flush=True)
    return result
