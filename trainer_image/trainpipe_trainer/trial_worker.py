"""A trial worker: one trainer launch that runs a study's trials back to back (ask, train, tell).

The provider's ``trials`` task launches ``torchrun ... -m trainpipe_trainer --config URI`` once per
worker, with ``tuning.worker`` set. The launch pays its set-up once (interpreter, imports, rendezvous,
the data read; a trial with another ``max_length`` reads its own, ``TrialData``); each trial then builds
its model and optimizer from the trial's config, trains, reports at its checkpoints (the pruner may stop
it), and is told to the study, until the study has
``n_trials`` finished (complete or pruned) trials. Each trial keeps what a one-trial launch had: its
MLflow child run, its own folder (checkpoints, result), the spec's seed, so the same parameters give
the same weights whichever worker, or a fresh single run, trains them.

Rank 0 asks and tells; the other ranks learn each trial from it (one broadcast). A worker that dies
loses only the trial it was running: that trial stays RUNNING in the study until the provider marks it
failed (the worker's relaunch, its task's next try, or ``pick_best``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from trainpipe_trainer import storage
from trainpipe_trainer.config import TrainingConfig, TrialWorker, apply_trial_params
from trainpipe_trainer.distributed import DistEnv, broadcast_object, destroy_distributed, init_distributed
from trainpipe_trainer.errors import PreemptedError, TrainingDivergedError, TrialPrunedError
from trainpipe_trainer.run_layout import CHECKPOINTS_DIR, OUTPUT_DIR
from trainpipe_trainer.tracking.launch_timing import LaunchPhases
from trainpipe_trainer.tracking.mlflow_process import MlflowStore
from trainpipe_trainer.tracking.tracker import Tracker, flatten_params
from trainpipe_trainer.trainer import Trainer
from trainpipe_trainer.tuning import (
    STARTED_ATTR,
    STATE_TAG,
    STUDY_TAG,
    TRIAL_TAG,
    WARM_START_ATTR,
    WORKER_ATTR,
    build_sampler,
    import_optuna,
    make_pruner,
    open_storage,
    progress_line,
    progress_metrics,
    study_progress,
    suggest,
)

if TYPE_CHECKING:
    import optuna

    from trainpipe_trainer.data.memory import TrainingData
    from trainpipe_trainer.data.splits import Splits
    from trainpipe_trainer.preemption import PreemptionWatcher


def trial_folder(trials_root_uri: str, number: int) -> str:
    """A trial's own folder (checkpoints/, output/), the same whichever worker runs it."""
    return storage.join(trials_root_uri, f"trial-{number}")


@dataclass(frozen=True, slots=True)
class Assignment:
    """The trial rank 0 asked for, as every rank of the worker trains it."""

    number: int
    params: dict[str, Any]
    mlflow_run_id: str | None  # rank 0's child run (the other ranks do not log)


@dataclass(slots=True)
class _Study:
    """Rank 0's side: the study, its storage and the MLflow client the child runs are made with."""

    config: TrainingConfig
    worker: TrialWorker
    study: optuna.Study
    mlflow: MlflowStore

    @classmethod
    def open(cls, config: TrainingConfig) -> _Study:
        from trainpipe_trainer.config import OPTUNA_STORAGE_ENV
        tuning = config.tuning
        worker = tuning.worker
        optuna = import_optuna()
        url = tuning.storage or os.environ.get(OPTUNA_STORAGE_ENV, "")
        if not url:
            raise ValueError(f"tuning.storage is empty and {OPTUNA_STORAGE_ENV} is not set: the worker cannot "
                             "reach its study")
        study = optuna.load_study(
            study_name=tuning.study_name, storage=open_storage(url),
            sampler=build_sampler(worker.sampler, seed=worker.seed, n_trials=worker.n_trials, stream=worker.worker),
            pruner=make_pruner(tuning.pruner, tuning.pruner_options))
        return cls(config=config, worker=worker, study=study, mlflow=MlflowStore.open(config.tracking.tracking_uri))

    def _say(self, text: str) -> None:
        print(f"worker {self.worker.worker}: {text}", flush=True)

    def next_trial(self) -> Assignment | None:
        """Ask the study for the next trial, or None when it has its trials (or its time is up)."""
        optuna = import_optuna()
        worker, study = self.worker, self.study
        trials = study.get_trials(deepcopy=False)
        finished = sum(1 for t in trials if t.state.name in ("COMPLETE", "PRUNED"))
        running = sum(1 for t in trials if t.state.name == "RUNNING")
        failed = sum(1 for t in trials if t.state.name == "FAIL")
        if finished + running >= worker.n_trials:
            self._say(f"the study has {finished} finished and {running} running trials of {worker.n_trials}: "
                      "no more to ask")
            return None
        if failed >= worker.n_trials:
            # A trainer that fails every trial (diverging on every point) would otherwise never end.
            self._say(f"{failed} trials failed, as many as the study's n_trials: no more to ask")
            return None
        if worker.timeout_seconds is not None and STARTED_ATTR in study.user_attrs:
            age = datetime.now(UTC) - datetime.fromisoformat(study.user_attrs[STARTED_ATTR])
            if age.total_seconds() > worker.timeout_seconds:
                self._say(f"the study is older than its timeout ({worker.timeout_seconds:.0f} s): no trial started")
                return None
        trial = study.ask()
        trial.set_user_attr(WORKER_ATTR, worker.worker)
        # The launch's process: every trial of one launch shares it (one interpreter, one data read).
        trial.set_user_attr("worker_pid", os.getpid())
        # Two workers that counted at the same moment may both have asked: the later trial is not run.
        before = study.get_trials(deepcopy=False)
        kept = sum(1 for t in before if t.number < trial.number and t.state.name != "FAIL")
        if kept >= worker.n_trials:
            trial.set_user_attr("fail_reason", "not run: the study had its n_trials when this worker asked")
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            self._say(f"trial {trial.number} not run: the study already had its {worker.n_trials} trials")
            return None
        params = suggest(trial, worker.space)
        warm = trial.user_attrs.get(WARM_START_ATTR)
        child = self.mlflow.call("create_run", experiment_id=self.worker.experiment_id,
                                 run_name=f"trial {trial.number}", tags={
            **worker.child_tags, "mlflow.parentRunId": worker.parent_run_id, STUDY_TAG: study.study_name,
            TRIAL_TAG: str(trial.number), "trainpipe.trial_worker": str(worker.worker),
            "trainpipe.trial_params": json.dumps(params, sort_keys=True),
            **({"trainpipe.warm_start": str(warm)} if warm else {}),
        })
        trial.set_user_attr("mlflow_run_id", child)
        self._say(f"trial {trial.number} with {json.dumps(params, sort_keys=True)}"
                  + (f" (warm start: {warm})" if warm else ""))
        return Assignment(number=trial.number, params=params, mlflow_run_id=child)

    def _trial_id(self, number: int) -> int:
        storage_ = self.study._storage  # the storage load_study was given: Study keeps no public handle on it
        return storage_.get_trial_id_from_study_id_trial_number(storage_.get_study_id_from_name(self.study.study_name),
                                                                number)

    def tell(self, assignment: Assignment, outcome: TrialOutcome, *, seconds: float) -> None:
        """Record the trial's compute, tell the study its state and value, log both to its child run."""
        optuna = import_optuna()
        storage_, number = self.study._storage, assignment.number
        state, reason, weights_sha256, hours = outcome.state, outcome.reason, outcome.weights_sha256, outcome.compute_hours
        trial_id = self._trial_id(number)
        if hours is None:
            # The trainer stopped before it counted (preempted, say): what its run logged, if anything.
            metrics = self.mlflow.call("run_data", run_id=assignment.mlflow_run_id)["metrics"]
            hours = metrics.get("trainer_gpu_hours", metrics.get("trainer_cpu_hours"))
        values = storage_.get_trial(trial_id).intermediate_values
        metric = self.config.tuning.metric
        if state == "complete" and not values:
            state, reason = "failed", f"the trainer reported no {metric} (no checkpoint with a validation split)"
        # A finished trial's attributes are frozen: everything is recorded before it is told.
        storage_.set_trial_user_attr(trial_id, "trainer_seconds", round(seconds, 3))
        if hours is not None:
            storage_.set_trial_user_attr(trial_id, "compute_seconds", round(hours * 3600, 3))
        if weights_sha256:
            storage_.set_trial_user_attr(trial_id, "weights_sha256", weights_sha256)
        if reason and state == "failed":
            storage_.set_trial_user_attr(trial_id, "fail_reason", reason[:2000])
        value = values[max(values)] if state == "complete" else None
        if state == "complete":
            # The trial's value: its metric at the end of its training (the last evaluation point).
            self.study.tell(number, value)
        else:
            self.study.tell(number, state=optuna.trial.TrialState.PRUNED if state == "pruned"
                            else optuna.trial.TrialState.FAIL, skip_if_finished=True)
        now = int(time.time() * 1000)
        logged = [("trial_intermediate_value", v, now, step) for step, v in sorted(values.items())]
        logged.append(("trainer_seconds", seconds, now, 0))
        if hours is not None:
            logged.append(("compute_seconds", hours * 3600, now, 0))
        if value is not None:
            logged.append(("trial_value", value, now, 0))
        self.mlflow.call("log_batch", run_id=assignment.mlflow_run_id, metrics=logged,
                         tags={STATE_TAG: state})
        if state == "failed":
            self.mlflow.call("finish_run", run_id=assignment.mlflow_run_id, status="FAILED")
        self._say(f"trial {number}: {state}" + (f", {metric} {value:.6g}" if value is not None else "")
                  + f", {seconds:.1f} trainer-seconds" + (f"; {reason}" if reason else ""))
        print(progress_line(self.study, self.worker.n_trials), flush=True)
        progress = progress_metrics(study_progress(self.study))
        self.mlflow.call("log_batch", run_id=self.worker.parent_run_id, metrics=[
            (name, value, now, int(progress["study_trials_done"])) for name, value in progress.items()])


def trial_config(config: TrainingConfig, assignment: Assignment, *, first: bool) -> TrainingConfig:
    """The config of one trial: the worker's, with the trial's parameters, folder and child run.
    Fault injection (tests) applies to the launch's first trial only, as to a one-trial launch."""
    worker = config.tuning.worker
    folder = trial_folder(worker.trials_root_uri, assignment.number)
    trial = apply_trial_params(config, worker.space, assignment.params)
    return dataclasses.replace(
        trial,
        tuning=dataclasses.replace(config.tuning, trial_number=assignment.number, worker=None),
        checkpoint=dataclasses.replace(trial.checkpoint, root_uri=storage.join(folder, CHECKPOINTS_DIR)),
        output_uri=storage.join(folder, OUTPUT_DIR),
        tracking=dataclasses.replace(trial.tracking, run_id=assignment.mlflow_run_id),
        fault_injection=config.fault_injection if first else None,
    )


@dataclass(frozen=True, slots=True)
class TrialOutcome:
    """How one trial ended, on every rank."""

    state: str  # complete, pruned or failed
    reason: str | None
    weights_sha256: str | None
    compute_hours: float | None  # over all ranks, as its run logged it (None if it never got that far)
    data: TrainingData | None  # read once: the next trial's when its max_length is the same (TrialData)


def data_read_with(config: TrainingConfig) -> Any:
    """What the data read depends on, of what a search may change: the model's ``max_length`` (the length the
    transformer tokenises each text to; None where the params leave it out, as for a family without one). The
    other tuned settings (learning rate, LoRA rank, ...) leave the data as it is."""
    return config.model.params.get("max_length")


@dataclass(slots=True)
class TrialData:
    """The worker's data between trials: read once, and again only for a trial whose ``data_read_with`` differs
    from the one it was read with (another ``max_length``: its tokenised splits come from the cache beside the
    snapshot when a trial or launch wrote them, else it tokenises; the launch's background read is dropped too)."""

    read_with: Any
    data: TrainingData | None = None
    pending: Future[Splits] | None = None

    def for_trial(self, config: TrainingConfig) -> tuple[TrainingData | None, Future[Splits] | None]:
        """The data (or the read under way) a trial of ``config`` may use: both None when it reads its own."""
        wanted = data_read_with(config)
        if wanted != self.read_with:
            self.read_with, self.data, self.pending = wanted, None, None
        return self.data, self.pending if self.data is None else None

    def keep(self, data: TrainingData | None) -> None:
        """What the trial trained on (None if it stopped before reading): the next trial's, if its reads match."""
        if data is not None:
            self.data, self.pending = data, None


def _train_one(config: TrainingConfig, env: DistEnv, *, data: TrainingData | None, watcher: PreemptionWatcher,
               phases: LaunchPhases, splits: Future[Splits] | None = None) -> TrialOutcome:
    trainer = None
    state, reason, weights = "complete", None, None
    try:
        with Tracker(config=config.tracking, enabled=env.is_main) as tracker:
            tracker.log_params(flatten_params(config, world_size=env.world_size))
            tracker.set_tags(config.tags)
            trainer = Trainer(config=config, env=env, tracker=tracker, watcher=watcher, phases=phases, data=data,
                              splits=splits)
            result = trainer.fit()
            phases.mark("export")
            for name, seconds in phases.metrics().items():
                tracker.log_metric(name, seconds, step=trainer.state.global_step)
        weights = result.weights_sha256 if result is not None else None
    except TrialPrunedError:
        state = "pruned"
    except TrainingDivergedError as err:
        state, reason = "failed", str(err)
        if trainer is not None:
            # The worker goes on to the next trial: this one's checkpoint writer must not outlive it.
            trainer.checkpoints.close()
    return TrialOutcome(state=state, reason=reason, weights_sha256=weights,
                        compute_hours=trainer.compute_hours if trainer is not None else None,
                        data=trainer.data if trainer is not None else data)


def run_worker(config: TrainingConfig, watcher: PreemptionWatcher, phases: LaunchPhases, *,
               splits: Future[Splits] | None = None) -> int:
    """Run trials until the study has its ``n_trials``; the number of trials this worker ran."""
    env = init_distributed()
    phases.mark("rendezvous")
    ran = 0
    try:
        study = _Study.open(config) if env.is_main else None
        # The background read is the worker config's: a first trial with another max_length does not take it.
        held = TrialData(read_with=data_read_with(config), pending=splits)
        while True:
            assignment = broadcast_object(study.next_trial() if study is not None else None, env)
            if assignment is None:
                break
            # The launch's set-up is the first trial's; a later trial's own set-up is counted from its start.
            trial_phases = phases if ran == 0 else LaunchPhases()
            started = time.monotonic()
            trial = trial_config(config, assignment, first=ran == 0)
            data, pending = held.for_trial(trial)
            try:
                outcome = _train_one(trial, env, data=data, watcher=watcher, phases=trial_phases, splits=pending)
            except PreemptedError as err:
                if study is not None:
                    study.tell(assignment, TrialOutcome(state="failed", reason=f"its worker was preempted: {err}",
                                                        weights_sha256=None, compute_hours=None, data=None),
                               seconds=time.monotonic() - started)
                raise
            ran += 1
            if study is not None:
                study.tell(assignment, outcome, seconds=time.monotonic() - started)
            held.keep(outcome.data)
    finally:
        destroy_distributed()
    if env.is_main:
        print(f"worker {config.tuning.worker.worker}: ran {ran} trials in this launch", flush=True)
    return ran
