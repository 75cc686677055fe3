"""The hyperparameter search of one DAG run: ``create_study``, ``trials`` (one task per slot), ``pick_best``.

One Optuna study per DAG run, in the storage the environment names (``TRAINPIPE_OPTUNA_STORAGE``;
a journal file under ``TRAINPIPE_HOME`` by default). Trials use ask-and-tell across processes: a
trial task asks the study for its parameters, runs the very launch the ``train`` task runs
(``trainpipe.runtime.train.run_training``) with them, and tells the study the outcome; the trainer
reports its validation loss at each checkpoint through the same storage and stops when the pruner
says so. A slot is recorded on its trial (user attribute ``slot``), so running a slot's task again
finds its trial instead of asking for a second one. Optuna's heartbeats only run under
``Study.optimize``, so a trial left RUNNING by a process that died is failed here: by the slot's next
try, and by ``pick_best`` for any left over.

MLflow: the study is a parent run (its settings, best value and plots), each trial a child run
(``mlflow.parentRunId``) that the trainer logs into; the final training's run is tagged with the
trial and parameters it came from.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe.errors import TrainingFailedError, TrainpipeError, TuningFailedError
from trainpipe.plan import PipelinePlan, TuningPlan, run_key, with_trial_params
from trainpipe.runtime.train import RunContext, TrialLaunch, run_dir_for, run_training
from trainpipe.settings import Settings
from trainpipe_trainer.config import TuningTrial, is_trial_pruned
from trainpipe_trainer.tuning import import_optuna as _import_optuna
from trainpipe_trainer.tuning import make_pruner, open_storage, storage_for_config

if TYPE_CHECKING:
    import optuna

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.runtime.snapshot import SnapshotInfo

log = logging.getLogger(__name__)

STUDY_TAG = "trainpipe.study"
TRIAL_TAG = "trainpipe.trial_number"
STATE_TAG = "trainpipe.trial_state"
SLOT_ATTR = "slot"
STARTED_ATTR = "started_at"


TUNING_INSTALL_HINT = "pip install 'airflow-provider-trainpipe[tuning]'"


def import_optuna():  # noqa: ANN201 - the optuna module
    """optuna, an extra of the provider: a tuned spec parses without it, its tasks need it."""
    try:
        return _import_optuna()
    except ImportError as err:
        raise TrainpipeError(f"a tuning: spec's study tasks need optuna on this worker: {TUNING_INSTALL_HINT}") from err


def study_name(dag_id: str, airflow_run_id: str) -> str:
    return f"{dag_id}.{run_key(airflow_run_id)}"


def make_sampler(tuning: TuningPlan, slot: int) -> optuna.samplers.BaseSampler:
    """The study's sampler as the trial of ``slot`` asks it: seeded per slot, so trials asking at the
    same time (each in its own process, each with a fresh sampler) draw different startup points."""
    optuna = import_optuna()
    seed = tuning.seed * 10_000 + slot
    if tuning.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Random points first, fewer than Optuna's 10 for small studies, so TPE has trials to learn from.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, tuning.n_trials // 3)))


def load_study(tuning: TuningPlan, settings: Settings, name: str, *, slot: int = 0) -> optuna.Study:
    optuna = import_optuna()
    return optuna.load_study(study_name=name, storage=open_storage(settings.optuna_storage),
                             sampler=make_sampler(tuning, slot), pruner=make_pruner(tuning.pruner, tuning.pruner_options))


# -- create_study -------------------------------------------------------------------------------


def create_study(plan: PipelinePlan, *, settings: Settings, run: RunContext, hook: MlflowHook) -> dict[str, str]:
    """The run's study (found again on a retry) and its MLflow parent run."""
    tuning = _tuning(plan)
    optuna = import_optuna()
    name = study_name(plan.dag_id, run.airflow_run_id)
    study = optuna.create_study(storage=open_storage(settings.optuna_storage), study_name=name,
                                direction=tuning.direction, sampler=make_sampler(tuning, 0),
                                pruner=make_pruner(tuning.pruner, tuning.pruner_options), load_if_exists=True)
    if STARTED_ATTR not in study.user_attrs:
        study.set_user_attr(STARTED_ATTR, datetime.now(timezone.utc).isoformat())
        study.set_user_attr("metric", tuning.metric)
    parent = _parent_run(hook, plan, run, name)
    return {"study_name": name, "parent_run_id": parent}


def _parent_run(hook: MlflowHook, plan: PipelinePlan, run: RunContext, name: str) -> str:
    experiment_id = hook.experiment_id(plan.dag_id)
    found = hook.client.search_runs([experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{name}' and "
                                    f"tags.`{TRIAL_TAG}` = 'study'", max_results=1)
    if found:
        return found[0].info.run_id
    tuning = _tuning(plan)
    parent = hook.client.create_run(experiment_id, run_name=f"study {run.airflow_run_id}", tags={
        STUDY_TAG: name, TRIAL_TAG: "study", "trainpipe.dag_id": run.dag_id,
        "trainpipe.study_airflow_run_id": run.airflow_run_id, "trainpipe.spec_sha256": run.spec_sha256,
    }).info.run_id
    from mlflow.entities import Param

    settings = {"metric": tuning.metric, "direction": tuning.direction, "n_trials": tuning.n_trials,
                "max_parallel": tuning.max_parallel, "sampler": tuning.sampler, "seed": tuning.seed,
                "pruner": tuning.pruner, "pruner_options": json.dumps(tuning.pruner_options, sort_keys=True),
                "trial_epochs": tuning.trial_epochs,
                "timeout_seconds": tuning.timeout.total_seconds() if tuning.timeout else None}
    params = [Param(f"tuning.{k}", str(v)) for k, v in settings.items()]
    params += [Param(f"space.{d.name}", json.dumps({d.distribution: list(d.choices) or [d.low, d.high]}))
               for d in tuning.space]
    hook.client.log_batch(parent, params=params)
    return parent


# -- trials -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialOutcome:
    slot: int
    number: int | None
    state: str  # complete | pruned | failed | skipped
    value: float | None
    params: dict[str, Any]
    # Wall seconds of the trial's launch (torchrun start to exit), and the trainer's own compute count.
    trainer_seconds: float
    mlflow_run_id: str | None
    compute_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "number": self.number, "state": self.state, "value": self.value,
                "params": self.params, "trainer_seconds": self.trainer_seconds,
                "compute_seconds": self.compute_seconds, "mlflow_run_id": self.mlflow_run_id}


def _outcome(slot: int, trial: optuna.trial.FrozenTrial) -> TrialOutcome:
    return TrialOutcome(slot=slot, number=trial.number, state=_state_name(trial), value=trial.value,
                        params=dict(trial.params), trainer_seconds=float(trial.user_attrs.get("trainer_seconds", 0.0)),
                        compute_seconds=trial.user_attrs.get("compute_seconds"),
                        mlflow_run_id=trial.user_attrs.get("mlflow_run_id"))


def _state_name(trial: optuna.trial.FrozenTrial) -> str:
    return {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}.get(trial.state.name, trial.state.name.lower())


def trial_of_slot(study: optuna.Study, slot: int) -> optuna.trial.FrozenTrial | None:
    return next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(SLOT_ATTR) == slot), None)


def run_trial(plan: PipelinePlan, slot: int, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
              study: dict[str, str], hook: MlflowHook, on_line: Callable[[str], None] | None = None) -> TrialOutcome:
    """The trial of ``slot``: asked once per slot, trained by the same launch as ``train``, told its state.

    Runs again for a slot (an Airflow retry or clear) return the slot's trial instead of asking for
    another; one left RUNNING there (its process died with its task) is failed first.
    """
    tuning = _tuning(plan)
    optuna = import_optuna()
    emit = on_line or (lambda line: log.info("%s", line))
    name = study["study_name"]
    live = load_study(tuning, settings, name, slot=slot)
    existing = trial_of_slot(live, slot)
    if existing is not None:
        if existing.state == optuna.trial.TrialState.RUNNING:
            reason = "its process died with an earlier try of this task; the slot keeps this trial, failed"
            _fail(live, existing.number, reason)
            existing = live.trials[existing.number]
            emit(f"trial {existing.number} of slot {slot}: {reason}")
        else:
            emit(f"slot {slot} already ran trial {existing.number} ({_state_name(existing)}): not asking for another")
        return _outcome(slot, existing)
    if tuning.timeout is not None:
        started = datetime.fromisoformat(live.user_attrs[STARTED_ATTR])
        if datetime.now(timezone.utc) - started > tuning.timeout:
            emit(f"slot {slot}: the study is older than its timeout ({tuning.timeout}); no trial started")
            return TrialOutcome(slot=slot, number=None, state="skipped", value=None, params={}, trainer_seconds=0.0,
                                mlflow_run_id=None)

    trial = live.ask()
    # Recorded first: from here on, this slot's trial is this one, whatever happens to this process.
    trial.set_user_attr(SLOT_ATTR, slot)
    params = suggest(trial, tuning)
    emit(f"slot {slot}: trial {trial.number} with {json.dumps(params, sort_keys=True)}")
    child = _child_run(hook, plan, run, name, study["parent_run_id"], trial.number, params)
    trial.set_user_attr("mlflow_run_id", child)
    trial_plan = with_trial_params(plan, params, trial_epochs=True)
    launch = TrialLaunch(mlflow_run_id=child, tuning=TuningTrial(
        storage=storage_for_config(settings.optuna_storage), study_name=name, trial_number=trial.number, metric=tuning.metric,
        direction=tuning.direction, pruner=tuning.pruner, pruner_options=dict(tuning.pruner_options)))
    run_dir = run_dir_for(plan.dag_id, settings, run.airflow_run_id) / "trials" / f"trial-{trial.number}"
    started = time.monotonic()
    state, reason = "complete", None
    try:
        run_training(trial_plan, snapshot, settings=settings, run=run, hook=hook, on_line=emit, run_dir=run_dir,
                     trial=launch)
    except TrainingFailedError as err:
        pruned = any(is_trial_pruned(trial.number, reason) for reason in err.reasons)
        state, reason = ("pruned", None) if pruned else ("failed", str(err))
    except BaseException as err:
        # Killed or timed out (run_local took torchrun down): never leave the trial running.
        _record(live, trial.number, time.monotonic() - started)
        _fail(live, trial.number, f"the trial task stopped: {type(err).__name__}: {err}")
        raise
    seconds = time.monotonic() - started
    _record(live, trial.number, seconds)
    compute = _trainer_compute_seconds(hook, child)
    if compute is not None:
        _set_attr(live, trial.number, "compute_seconds", round(compute, 3))
    frozen = live.trials[trial.number]
    values = frozen.intermediate_values
    if state == "complete" and not values:
        state, reason = "failed", f"the trainer reported no {tuning.metric} (no checkpoint with a validation split)"
    if state == "complete":
        # The trial's value: its metric at the end of its training (the last evaluation point).
        live.tell(trial.number, values[max(values)])
    elif state == "pruned":
        live.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
    else:
        _fail(live, trial.number, reason or "failed")
    outcome = _outcome(slot, live.trials[trial.number])
    _log_child(hook, child, outcome, values)
    emit(f"trial {trial.number}: {outcome.state}"
         + (f", {tuning.metric} {outcome.value:.6g}" if outcome.value is not None else "")
         + f", {seconds:.1f} trainer-seconds" + (f"; {reason}" if reason else ""))
    return outcome


def suggest(trial: optuna.Trial, tuning: TuningPlan) -> dict[str, Any]:
    """This trial's value of every dimension of the space."""
    params: dict[str, Any] = {}
    for d in tuning.space:
        if d.distribution == "log_uniform":
            params[d.name] = trial.suggest_float(d.name, d.low, d.high, log=True)
        elif d.distribution == "uniform":
            params[d.name] = trial.suggest_float(d.name, d.low, d.high)
        elif d.distribution == "int":
            params[d.name] = trial.suggest_int(d.name, int(d.low), int(d.high))
        else:
            decoded = [json.loads(c) for c in d.choices]
            # Scalars as themselves; a layer list as its JSON text (Optuna's choices are scalars).
            choices = decoded if all(not isinstance(c, list) for c in decoded) else list(d.choices)
            params[d.name] = trial.suggest_categorical(d.name, choices)
    return params


def _set_attr(study: optuna.Study, number: int, key: str, value: Any) -> None:
    """A user attribute of a trial that is still running (a finished trial's are frozen)."""
    storage = study._storage  # the storage load_study was given: Study keeps no public handle on it
    trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)
    storage.set_trial_user_attr(trial_id, key, value)


def _fail(study: optuna.Study, number: int, reason: str) -> None:
    optuna = import_optuna()
    _set_attr(study, number, "fail_reason", reason[:2000])
    study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


def _record(study: optuna.Study, number: int, seconds: float) -> None:
    """The compute a trial spent (pruned ones too): trainer wall-time seconds of its launch."""
    _set_attr(study, number, "trainer_seconds", round(seconds, 3))


def _trainer_compute_seconds(hook: MlflowHook, run_id: str) -> float | None:
    """The trainer's own count of the compute it used (CPU seconds, or device seconds on GPU), pruned
    trials included: the trainer logs it before it stops."""
    metrics = hook.client.get_run(run_id).data.metrics
    hours = metrics.get("trainer_gpu_hours", metrics.get("trainer_cpu_hours"))
    return None if hours is None else hours * 3600


def _child_run(hook: MlflowHook, plan: PipelinePlan, run: RunContext, name: str, parent: str, number: int,
               params: dict[str, Any]) -> str:
    experiment_id = hook.experiment_id(plan.dag_id)
    return hook.client.create_run(experiment_id, run_name=f"trial {number}", tags={
        "mlflow.parentRunId": parent, STUDY_TAG: name, TRIAL_TAG: str(number), "trainpipe.dag_id": run.dag_id,
        "trainpipe.study_airflow_run_id": run.airflow_run_id, "trainpipe.trial_params": json.dumps(params, sort_keys=True),
    }).info.run_id


def _log_child(hook: MlflowHook, child: str, outcome: TrialOutcome, values: dict[int, float]) -> None:
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    metrics = [Metric("trial_intermediate_value", v, now, step) for step, v in sorted(values.items())]
    metrics.append(Metric("trainer_seconds", outcome.trainer_seconds, now, 0))
    if outcome.compute_seconds is not None:
        metrics.append(Metric("compute_seconds", outcome.compute_seconds, now, 0))
    if outcome.value is not None:
        metrics.append(Metric("trial_value", outcome.value, now, 0))
    hook.client.log_batch(child, metrics=metrics, tags=[RunTag(STATE_TAG, outcome.state)])
    # The trainer ended the run (FINISHED, or KILLED when pruned); a failed trial's run says so too.
    if outcome.state == "failed":
        hook.client.set_terminated(child, status="FAILED")


# -- pick_best ----------------------------------------------------------------------------------


def pick_best(plan: PipelinePlan, *, settings: Settings, study: dict[str, str], hook: MlflowHook,
              on_line: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The best complete trial; no trial left running; the study's figures and totals on the parent run."""
    tuning = _tuning(plan)
    optuna = import_optuna()
    emit = on_line or (lambda line: log.info("%s", line))
    live = load_study(tuning, settings, study["study_name"])
    for trial in live.get_trials(states=(optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)):
        _fail(live, trial.number, "still running after every trial task ended: its process is gone")
        emit(f"trial {trial.number}: left running by a process that died; marked failed")
    trials = live.get_trials()
    counts = {state: sum(1 for t in trials if _state_name(t) == state) for state in ("complete", "pruned", "failed")}
    seconds = {state: sum(float(t.user_attrs.get("trainer_seconds", 0.0)) for t in trials if _state_name(t) == state)
               for state in counts}
    compute = sum(float(t.user_attrs.get("compute_seconds") or 0.0) for t in trials)
    emit(f"study {study['study_name']}: {len(trials)} trials, " + ", ".join(f"{n} {s}" for s, n in counts.items())
         + f"; {sum(seconds.values()):.1f} trainer-seconds ({seconds['pruned']:.1f} in pruned trials)")
    parent = study["parent_run_id"]
    _log_parent(hook, parent, live, counts, seconds, compute)
    if counts["complete"] == 0:
        hook.client.set_terminated(parent, status="FAILED")
        raise TuningFailedError(f"study {study['study_name']}: no trial completed ({counts['pruned']} pruned, "
                                f"{counts['failed']} failed; see the trials' logs); nothing to train with")
    best = live.best_trial
    emit(f"best: trial {best.number}, {tuning.metric} {best.value:.6g}, params {json.dumps(best.params, sort_keys=True)}")
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    hook.client.log_batch(parent, metrics=[Metric("best_value", best.value, now, 0)],
                          params=[Param(f"best.{k}", str(v)) for k, v in best.params.items()],
                          tags=[RunTag("trainpipe.best_trial", str(best.number))])
    _log_plots(hook, parent, live, emit)
    hook.client.set_terminated(parent, status="FINISHED")
    return {"study_name": study["study_name"], "parent_run_id": parent, "number": best.number, "value": best.value,
            "params": dict(best.params), "mlflow_run_id": best.user_attrs.get("mlflow_run_id")}


def _log_parent(hook: MlflowHook, parent: str, study: optuna.Study, counts: dict[str, int],
                seconds: dict[str, float], compute: float) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(f"trials_{state}", float(n), now, 0) for state, n in counts.items()]
    metrics += [Metric(f"trainer_seconds_{state}", s, now, 0) for state, s in seconds.items()]
    metrics.append(Metric("trainer_seconds_total", sum(seconds.values()), now, 0))
    metrics.append(Metric("compute_seconds_total", compute, now, 0))
    # The optimisation history as a metric too: trial number -> value.
    metrics += [Metric("trial_value", t.value, now, t.number) for t in study.trials if t.value is not None]
    hook.client.log_batch(parent, metrics=metrics)


# How Optuna's importance evaluators say they could not rank the parameters (they then return all equal).
_UNRANKED = "Parameter importances will be equal"


def _log_plots(hook: MlflowHook, parent: str, study: optuna.Study, emit: Callable[[str], None]) -> None:
    """optimisation history, intermediate values and parameter importances, as PNGs under ``study/``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.exceptions import ExperimentalWarning
    from optuna.visualization import matplotlib as plots

    with tempfile.TemporaryDirectory(prefix="trainpipe-study-") as folder:
        for name, draw in (("optimization_history", plots.plot_optimization_history),
                           ("intermediate_values", plots.plot_intermediate_values),
                           ("param_importances", plots.plot_param_importances)):
            try:
                with warnings.catch_warnings():
                    # Optuna marks its matplotlib plots experimental; their interface is pinned with optuna
                    # itself, and the warning said nothing to the run's reader, once per plot per study.
                    warnings.simplefilter("ignore", ExperimentalWarning)
                    # Too few (or too alike) complete trials: Optuna would warn and draw every importance
                    # equal; a flat chart would mislead, so the run says why it has none instead.
                    warnings.filterwarnings("error", message=f".*{_UNRANKED}")
                    axes = draw(study)
            except (ValueError, RuntimeError) as err:
                # Importances need two complete trials with varied parameters: say so, keep the rest.
                emit(f"study plot {name} skipped: {err}")
                continue
            except UserWarning:  # only the unranked importances are raised (the filter above)
                complete = sum(_state_name(t) == "complete" for t in study.trials)
                emit(f"study plot {name} skipped: too few complete trials to rank the parameters ({complete} complete)")
                continue
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            path = Path(folder) / f"{name}.png"
            figure.savefig(path, dpi=100, bbox_inches="tight")
            plt.close(figure)
            hook.client.log_artifact(parent, str(path), artifact_path="study")


def _tuning(plan: PipelinePlan) -> TuningPlan:
    if plan.tuning is None:
        raise TuningFailedError(f"{plan.spec_file}: the spec has no tuning section")
    return plan.tuning


def best_trial_tags(best: dict[str, Any]) -> dict[str, str]:
    """What the final training's MLflow run records about the trial it came from."""
    return {"trainpipe.tuning.study": best["study_name"], "trainpipe.tuning.best_trial": str(best["number"]),
            "trainpipe.tuning.best_value": repr(best["value"]),
            "trainpipe.tuning.best_params": json.dumps(best["params"], sort_keys=True),
            "trainpipe.tuning.parent_run_id": best["parent_run_id"]}
