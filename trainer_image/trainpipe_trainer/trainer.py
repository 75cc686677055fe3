"""The training loop and the components it is built from (one ``Trainer`` per process)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Adam

from trainpipe_trainer import rng, storage
from trainpipe_trainer.checkpoint import CheckpointManager
from trainpipe_trainer.config import TrainerConfigError, TrainingConfig, TrainingResult
from trainpipe_trainer.data import EpochLoader, TrainingData, load_training_data
from trainpipe_trainer.distributed import DistEnv, all_reduce_sums, barrier, destroy_distributed, init_distributed
from trainpipe_trainer.export import log_pyfunc_model, weights_sha256
from trainpipe_trainer.losses import LossFn, make_loss_fn
from trainpipe_trainer.model import build_mlp
from trainpipe_trainer.progress import Progress
from trainpipe_trainer.state import TrainState
from trainpipe_trainer.tracking import Tracker, flatten_params


@dataclass(kw_only=True, slots=True)
class Trainer:
    config: TrainingConfig
    env: DistEnv
    tracker: Tracker
    data: TrainingData = field(init=False)
    model: DistributedDataParallel = field(init=False)
    optimizer: Adam = field(init=False)
    loss_fn: LossFn = field(init=False)
    batches: EpochLoader = field(init=False)
    checkpoints: CheckpointManager = field(init=False)
    progress: Progress = field(init=False)
    state: TrainState = field(init=False, default_factory=TrainState)

    def __post_init__(self) -> None:
        config, env = self.config, self.env
        self.data = load_training_data(config)
        # Same seed on every rank: identical initial weights (DDP would broadcast rank 0's anyway).
        rng.seed_all(config.seed)
        module = build_mlp(n_features=len(config.features), config=config.model).to(env.device)
        self.model = DistributedDataParallel(module, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
        self.optimizer = Adam(self.model.parameters(), lr=config.learning_rate)
        self.loss_fn = make_loss_fn(config)
        # Then one stream per rank, so dropout masks differ between ranks but not between runs.
        rng.seed_all(config.seed + env.rank)
        self.batches = EpochLoader(dataset=self.data.dataset, batch_size=config.batch_size, seed=config.seed, env=env)
        self.checkpoints = CheckpointManager(
            config=config.checkpoint, env=env, storage_options=config.storage_options, batch_size=config.batch_size
        )
        self.progress = Progress(
            total_steps=config.epochs * self.batches.batches_per_epoch, epochs=config.epochs, enabled=env.is_main
        )
        self.tracker.log_params(
            {"train_rows": str(self.data.n_rows), "steps_per_epoch": str(self.batches.batches_per_epoch)}
        )

    def fit(self) -> TrainingResult | None:
        """Train (resuming if a committed checkpoint exists), export; the result on rank 0 only."""
        restored = self.checkpoints.restore(model=self.model, optimizer=self.optimizer)
        resumed = None
        if restored is not None:
            self.state, resumed = restored, restored.global_step
            if self.env.is_main:
                print(f"resumed from step {resumed}", flush=True)
                # A tag, not a param: each retry may resume from another step, and params are immutable.
                self.tracker.set_tags({"resumed_from_step": str(resumed)})
        self.progress.start(self.state.global_step)
        while self.state.epoch < self.config.epochs:
            self._run_epoch()
        if self.checkpoints.last_saved_step != self.state.global_step:
            self.checkpoints.save(model=self.model, optimizer=self.optimizer, state=self.state)
        return self._export(resumed)

    def _run_epoch(self) -> None:
        loader = self.batches.epoch(self.state.epoch, skip_batches=self.state.batch_in_epoch)
        self.model.train()
        for batch in loader:
            self.state.add_loss(self._step(batch))
            self.progress.add_samples(len(batch[0]) * self.env.world_size)
            if self.state.global_step % self.config.tracking.log_every_n_steps == 0:
                self._log_interval()
            if self.state.batch_in_epoch == self.batches.batches_per_epoch:
                self._end_epoch()
            # After _end_epoch, so a save at an epoch boundary resumes at the next epoch's start.
            if self.checkpoints.due(self.state.global_step):
                self.checkpoints.save(model=self.model, optimizer=self.optimizer, state=self.state)

    def _step(self, batch: list[torch.Tensor]) -> float:
        features, labels, *rest = (t.to(self.env.device) for t in batch)
        mask = rest[0] if rest else None
        self.optimizer.zero_grad(set_to_none=True)
        scores = self.model(features).squeeze(-1)
        loss = self.loss_fn(scores, labels, mask)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def _log_interval(self) -> None:
        total, count = all_reduce_sums([self.state.interval_loss_sum, self.state.interval_loss_count], self.env)
        self.state.interval_loss_sum, self.state.interval_loss_count = 0.0, 0
        loss = total / max(count, 1)
        self.tracker.log_metric("train_loss", loss, step=self.state.global_step)
        self.progress.report(step=self.state.global_step, epoch=self.state.epoch, loss=loss)

    def _end_epoch(self) -> None:
        total, count = all_reduce_sums([self.state.epoch_loss_sum, self.state.epoch_loss_count], self.env)
        epoch_loss = total / max(count, 1)
        self.tracker.log_metric("epoch_loss", epoch_loss, step=self.state.global_step)
        self.state.next_epoch(epoch_loss)

    def _export(self, resumed: int | None) -> TrainingResult | None:
        result = None
        if self.env.is_main:
            module = self.model.module
            if self.state.last_epoch_loss is None:
                raise RuntimeError("training ended without completing an epoch")
            model_uri = log_pyfunc_model(
                module, standardizer=self.data.standardizer, config=self.config, sample_frame=self.data.sample_frame
            )
            result = TrainingResult(
                mlflow_run_id=self.tracker.run_id or "",
                model_uri=model_uri,
                weights_sha256=weights_sha256(module),
                world_size=self.env.world_size,
                global_step=self.state.global_step,
                final_loss=self.state.last_epoch_loss,
                resumed_from_step=resumed,
            )
            storage.write_text(
                storage.join(self.config.output_uri, "result.json"), result.to_json(), self.config.storage_options
            )
        # Other ranks wait, so the job ends only once the model and result.json exist.
        barrier(self.env)
        return result


def check_supported(config: TrainingConfig) -> None:
    """What the contract allows but this trainer version does not do yet."""
    if config.strategy != "ddp":
        raise TrainerConfigError(
            f"strategy: this trainer implements 'ddp' only, got {config.strategy!r} (deepspeed is not implemented yet)"
        )


def run_training(config: TrainingConfig) -> TrainingResult | None:
    check_supported(config)
    env = init_distributed()
    try:
        with Tracker(config=config.tracking, enabled=env.is_main) as tracker:
            tracker.log_params(flatten_params(config, world_size=env.world_size))
            tracker.set_tags(config.tags)
            result = Trainer(config=config, env=env, tracker=tracker).fit()
    finally:
        destroy_distributed()
    if result is not None:
        print(f"result: {storage.join(config.output_uri, 'result.json')}", flush=True)
        print(f"weights sha256: {result.weights_sha256}", flush=True)
    return result
