"""The hyperparameter search of one DAG run: ``create_study``, ``trials`` (one task per worker), ``pick_best``.

One Optuna study per DAG run, in the storage the environment names (``TRAINPIPE_OPTUNA_STORAGE``;
a journal file under ``TRAINPIPE_HOME`` by default). ``create_study`` enqueues the warm start's points
(``tuning.warm_start``) as the first trials. Each of ``max_parallel`` trial workers launches the very
trainer ``train`` launches once, as a trial worker (``trainpipe_trainer.trial_worker``): the trainer
asks the study, trains, reports at each checkpoint (the pruner may stop it) and tells, trial after
trial, until the study has ``n_trials`` finished trials. A trial records the worker that ran it (user
attribute ``worker``), so a trial a dead trainer left RUNNING is marked failed: by the worker's
relaunch, its task's next try, and ``pick_best`` for any left over (Optuna's heartbeats only run under
``Study.optimize``).

MLflow: the study is a parent run (its settings, best value and plots), each trial a child run
(``mlflow.parentRunId``) that the worker creates and logs into; the final training's run is tagged
with the trial and parameters it came from.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainpipe import storage
from trainpipe.errors import TrainingFailedError, TrainpipeError, TuningFailedError
from trainpipe.launchers.local import local_python, run_local
from trainpipe.plan.launch import LaunchValues, resolve
from trainpipe.plan.model import FaultPlan, PipelinePlan, TuningPlan, run_key
from trainpipe.plan.params import with_trial_params
from trainpipe.plan.tracking import (
    BEST_PARAMS_TAG,
    BEST_TRIAL_TAG,
    DAG_ID_TAG,
    SPEC_SHA256_TAG,
    STUDY_RUN_ID_TAG,
    TUNING_BEST_TRIAL_TAG,
    TUNING_BEST_VALUE_TAG,
    TUNING_PARENT_RUN_TAG,
    TUNING_STUDY_TAG,
)
from trainpipe.settings import Settings
from trainpipe.state.run_folder import run_dir_for
from trainpipe.state.usage import account_try
from trainpipe.steps.train.train import RunContext, TrainerReasons, TrialLaunch, prepare_training_run
from trainpipe_trainer.config import TrialWorker, TuningTrial
from trainpipe_trainer.tuning import (
    STARTED_ATTR,
    STUDY_TAG,
    TRIAL_TAG,
    WARM_START_ATTR,
    WORKER_ATTR,
    build_sampler,
    fits_space,
    make_pruner,
    open_storage,
    progress_line,
    state_name,
    storage_for_config,
)
from trainpipe_trainer.tuning import import_optuna as _import_optuna
from trainpipe_trainer.tuning import suggest as suggest_params

if TYPE_CHECKING:
    import optuna

    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.state.datasets import SnapshotInfo

log = logging.getLogger(__name__)



TUNING_INSTALL_HINT = "pip install 'airflow-provider-trainpipe[tuning]'"


def import_optuna():
    """optuna, an extra of the provider: a tuned spec parses without it, its tasks need it."""
    try:
        return _import_optuna()
    except ImportError as err:
        raise TrainpipeError(f"a tuning: spec's study tasks need optuna on this worker: {TUNING_INSTALL_HINT}") from err


def study_name(dag_id: str, airflow_run_id: str) -> str:
    return f"{dag_id}.{run_key(airflow_run_id)}"


def make_sampler(tuning: TuningPlan, slot: int) -> optuna.samplers.BaseSampler:
    """The study's sampler as worker ``slot`` asks it (``trainpipe_trainer.tuning.build_sampler``)."""
    import_optuna()
    return build_sampler(tuning.sampler, seed=tuning.seed, n_trials=tuning.n_trials, stream=slot)


def load_study(tuning: TuningPlan, settings: Settings, name: str, *, slot: int = 0) -> optuna.Study:
    optuna = import_optuna()
    return optuna.load_study(study_name=name, storage=open_storage(settings.optuna_storage),
                             sampler=make_sampler(tuning, slot), pruner=make_pruner(tuning.pruner, tuning.pruner_options))


# -- create_study -------------------------------------------------------------------------------


def create_study(plan: PipelinePlan, *, settings: Settings, run: RunContext, hook: MlflowHook,
                 on_line: Callable[[str], None] | None = None) -> dict[str, str]:
    """The run's study (found again on a retry), its warm start, and its MLflow parent run."""
    tuning = _tuning(plan)
    optuna = import_optuna()
    emit = on_line or (lambda line: log.info("%s", line))
    name = study_name(plan.dag_id, run.airflow_run_id)
    study = optuna.create_study(storage=open_storage(settings.optuna_storage), study_name=name,
                                direction=tuning.direction, sampler=make_sampler(tuning, 0),
                                pruner=make_pruner(tuning.pruner, tuning.pruner_options), load_if_exists=True)
    if not study.trials:
        # Before any worker asks, so the warm start's points are the study's first trials; once only.
        warm_start(study, plan, settings=settings, hook=hook, emit=emit)
    if STARTED_ATTR not in study.user_attrs:
        study.set_user_attr(STARTED_ATTR, datetime.now(UTC).isoformat())
        study.set_user_attr("metric", tuning.metric)
    parent = _parent_run(hook, plan, run, name)
    return {"study_name": name, "parent_run_id": parent}


# previous_study: how many of the previous study's best complete trials start the next one.
WARM_START_PREVIOUS_BEST = 3


def warm_start(study: optuna.Study, plan: PipelinePlan, *, settings: Settings, hook: MlflowHook,
               emit: Callable[[str], None]) -> list[int]:
    """Enqueue ``tuning.warm_start``'s points as the study's first trials; the trial numbers enqueued."""
    tuning = _tuning(plan)
    if tuning.warm_start == "none":
        return []
    if tuning.warm_start == "champion":
        points = _champion_point(plan, hook, emit)
    else:
        points = _previous_study_points(plan, settings, study.study_name, emit)
    numbers = []
    for label, params in points:
        study.enqueue_trial(params, user_attrs={WARM_START_ATTR: label})
        numbers.append(len(study.trials) - 1)
        emit(f"warm start ({tuning.warm_start}): trial {numbers[-1]} enqueued with the parameters of {label}: "
             f"{json.dumps(params, sort_keys=True)}")
    return numbers


def _champion_point(plan: PipelinePlan, hook: MlflowHook, emit: Callable[[str], None]) -> list[tuple[str, dict]]:
    """The parameters the champion model was trained with, those today's space can take."""
    from mlflow.exceptions import MlflowException

    model, alias = plan.registration.model_name, plan.registration.alias
    try:
        version = hook.client.get_model_version_by_alias(model, alias)
    except MlflowException:
        emit(f"warm start (champion): {model} has no {alias} yet; the search starts from the sampler")
        return []
    recorded = hook.client.get_run(version.run_id).data.params
    raw: dict[str, Any] = {}
    for dimension in _tuning(plan).space:
        text = recorded.get(".".join(dimension.target))
        if text is not None:
            try:
                raw[dimension.name] = json.loads(text)
            except ValueError:
                continue
    params = fits_space(raw, _tuning(plan).space)
    label = f"{model} version {version.version} ({alias})"
    if not params:
        emit(f"warm start (champion): none of {label}'s parameters is in today's search space; nothing enqueued")
        return []
    return [(label, params)]


def _previous_study_points(plan: PipelinePlan, settings: Settings, current: str,
                           emit: Callable[[str], None]) -> list[tuple[str, dict]]:
    """The best few complete trials of this pipeline's latest study before this one."""
    optuna = import_optuna()
    tuning = _tuning(plan)
    earlier = [s for s in optuna.get_all_study_summaries(open_storage(settings.optuna_storage))
               if s.study_name.startswith(f"{plan.dag_id}.") and s.study_name != current
               and STARTED_ATTR in s.user_attrs]
    if not earlier:
        emit(f"warm start (previous_study): {plan.dag_id} has no earlier study; the search starts from the sampler")
        return []
    previous = max(earlier, key=lambda s: s.user_attrs[STARTED_ATTR]).study_name
    loaded = optuna.load_study(study_name=previous, storage=open_storage(settings.optuna_storage))
    complete = [t for t in loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
    complete.sort(key=lambda t: t.value, reverse=tuning.direction == "maximize")
    points = []
    for trial in complete[:WARM_START_PREVIOUS_BEST]:
        params = fits_space(trial.params, tuning.space)
        if params:
            points.append((f"trial {trial.number} of study {previous}", params))
    if not points:
        emit(f"warm start (previous_study): study {previous} has no complete trial in today's search space")
    return points


def _parent_run(hook: MlflowHook, plan: PipelinePlan, run: RunContext, name: str) -> str:
    experiment_id = hook.experiment_id(plan.dag_id)
    found = hook.client.search_runs([experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{name}' and "
                                    f"tags.`{TRIAL_TAG}` = 'study'", max_results=1)
    if found:
        return found[0].info.run_id
    tuning = _tuning(plan)
    parent = hook.client.create_run(experiment_id, run_name=f"study {run.airflow_run_id}", tags={
        STUDY_TAG: name, TRIAL_TAG: "study", DAG_ID_TAG: run.dag_id,
        STUDY_RUN_ID_TAG: run.airflow_run_id, SPEC_SHA256_TAG: run.spec_sha256,
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


# -- trials: the workers ------------------------------------------------------------------------


# How many times a worker's task launches its trainer again in one try after it died mid-trial (each
# death costs one trial, marked failed); a trainer that keeps dying fails the task instead.
WORKER_RELAUNCHES = 2


def _state_name(trial: optuna.trial.FrozenTrial) -> str:
    return state_name(trial)


def trials_of_worker(study: optuna.Study, worker: int) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(WORKER_ATTR) == worker]


def fail_lost_trials(study: optuna.Study, worker: int, reason: str, emit: Callable[[str], None]) -> list[int]:
    """Mark the trials ``worker`` left RUNNING failed (its trainer died during them): only those are lost."""
    optuna = import_optuna()
    lost = [t.number for t in trials_of_worker(study, worker) if t.state == optuna.trial.TrialState.RUNNING]
    for number in lost:
        _fail(study, number, reason)
        emit(f"trial {number} of worker {worker}: {reason}; marked failed")
    return lost


def worker_config(plan: PipelinePlan, worker: int, *, settings: Settings, run: RunContext, study: dict[str, str],
                  hook: MlflowHook) -> tuple[PipelinePlan, TrialLaunch]:
    """The plan (each trial's epochs) and the trial launch of worker ``worker``."""
    tuning = _tuning(plan)
    name = study["study_name"]
    trials_root = run_dir_for(plan.dag_id, settings, run.airflow_run_id) / "trials"
    child_tags = {STUDY_TAG: name, DAG_ID_TAG: run.dag_id, STUDY_RUN_ID_TAG: run.airflow_run_id}
    launch = TrialLaunch(mlflow_run_id=study["parent_run_id"], tuning=TuningTrial(
        storage=storage_for_config(settings.optuna_storage), study_name=name, trial_number=-1, metric=tuning.metric,
        direction=tuning.direction, pruner=tuning.pruner, pruner_options=dict(tuning.pruner_options),
        worker=TrialWorker(worker=worker, n_trials=tuning.n_trials, sampler=tuning.sampler, seed=tuning.seed,
                           space=tuning.space, trials_root_uri=storage.fsspec_uri(trials_root),
                           parent_run_id=study["parent_run_id"], experiment_id=hook.experiment_id(plan.dag_id),
                           child_tags=child_tags,
                           timeout_seconds=tuning.timeout.total_seconds() if tuning.timeout else None)))
    return with_trial_params(plan, {}, trial_epochs=True), launch


def run_worker(plan: PipelinePlan, worker: int, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
               study: dict[str, str], hook: MlflowHook, on_line: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Trial worker ``worker``: one trainer launch that runs trials until the study has ``n_trials``.

    A trial this worker left RUNNING (its trainer died with an earlier try of this task, or during this
    launch) is marked failed; the worker then launches again, so a death costs one trial, not the study.
    """
    emit = on_line or (lambda line: log.info("%s", line))
    tuning = _tuning(plan)
    name = study["study_name"]
    live = load_study(tuning, settings, name, slot=worker)
    fail_lost_trials(live, worker, "its trainer died with an earlier try of this task", emit)
    finished = sum(1 for t in live.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED"))
    if finished >= tuning.n_trials:
        # The other workers ran them (trials run one task at a time under `airflow dags test`), or this
        # task runs again after the study ended: no launch.
        emit(f"worker {worker}: the study already has {finished} finished trials of {tuning.n_trials}; "
             "nothing to run")
        emit(progress_line(live, tuning.n_trials))
        return {"worker": worker, "trials": [{"number": t.number, "state": _state_name(t), "value": t.value}
                                             for t in trials_of_worker(live, worker)]}
    worker_plan, launch = worker_config(plan, worker, settings=settings, run=run, study=study, hook=hook)
    run_dir = run_dir_for(plan.dag_id, settings, run.airflow_run_id) / "trials" / f"worker-{worker}"
    for attempt in range(WORKER_RELAUNCHES + 1):
        try:
            launch_worker(worker_plan, snapshot, settings=settings, run=run, hook=hook, run_dir=run_dir,
                          trial=launch, on_line=emit)
            break
        except TrainingFailedError as err:
            lost = fail_lost_trials(load_study(tuning, settings, name, slot=worker), worker,
                                    f"lost: its worker's trainer died during it ({err})"[:500], emit)
            if not lost or attempt == WORKER_RELAUNCHES:
                raise
            emit(f"worker {worker}: launching the trainer again to run the study's remaining trials "
                 f"(relaunch {attempt + 1} of {WORKER_RELAUNCHES})")
            # As an Airflow retry does: the test-only crash is injected into the first launch only.
            worker_plan = dataclasses.replace(worker_plan, testing=FaultPlan())
    live = load_study(tuning, settings, name, slot=worker)
    mine = trials_of_worker(live, worker)
    emit(progress_line(live, tuning.n_trials))
    return {"worker": worker, "trials": [{"number": t.number, "state": _state_name(t), "value": t.value}
                                         for t in mine]}


def launch_worker(plan: PipelinePlan, snapshot: SnapshotInfo, *, settings: Settings, run: RunContext,
                  hook: MlflowHook, run_dir: Any, trial: TrialLaunch, on_line: Callable[[str], None]) -> None:
    """The one local launch (``torchrun ... -m trainpipe_trainer --config``) of a worker; its device
    time is accounted on the study's parent run, as each try's is."""
    prepared = prepare_training_run(plan, snapshot, settings=settings, run=run, hook=hook, run_dir=run_dir,
                                    trial=trial)
    command = resolve(plan.launch, LaunchValues(config_uri=prepared.config_uri,
                                                mlflow_tracking_uri=settings.mlflow_tracking_uri))
    env = {**command.env, **storage.trainer_storage_env(settings)}
    reasons = TrainerReasons(on_line)
    started_at = datetime.now(UTC)
    outcome = "failed"
    try:
        run_local(command.argv, env=env, on_line=reasons.line, executable=local_python(),
                  grace_seconds=plan.launch.shutdown_timeout_seconds)
        outcome = "succeeded"
    except TrainingFailedError as err:
        if reasons.messages:
            raise TrainingFailedError(f"the trainer stopped: {'; '.join(reasons.messages)}",
                                      reasons=tuple(reasons.messages), exit_code=err.exit_code) from err
        raise
    finally:
        account_try(prepared.run_dir, settings=settings, resources=plan.resources, pipeline_id=plan.dag_id,
                    try_number=run.try_number, started_at=started_at, outcome=outcome, client=hook.client,
                    mlflow_run_id=prepared.mlflow_run_id)


def suggest(trial: optuna.Trial, tuning: TuningPlan) -> dict[str, Any]:
    """This trial's value of every dimension of the space (the trainer's definition)."""
    return suggest_params(trial, tuning.space)


def _set_attr(study: optuna.Study, number: int, key: str, value: Any) -> None:
    """A user attribute of a trial that is still running (a finished trial's are frozen)."""
    storage_ = study._storage  # the storage load_study was given: Study keeps no public handle on it
    trial_id = storage_.get_trial_id_from_study_id_trial_number(storage_.get_study_id_from_name(study.study_name), number)
    storage_.set_trial_user_attr(trial_id, key, value)


def _fail(study: optuna.Study, number: int, reason: str) -> None:
    optuna = import_optuna()
    _set_attr(study, number, "fail_reason", reason[:2000])
    study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)


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
                          tags=[RunTag(BEST_TRIAL_TAG, str(best.number))])
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
    return {TUNING_STUDY_TAG: best["study_name"], TUNING_BEST_TRIAL_TAG: str(best["number"]),
            TUNING_BEST_VALUE_TAG: repr(best["value"]),
            BEST_PARAMS_TAG: json.dumps(best["params"], sort_keys=True),
            TUNING_PARENT_RUN_TAG: best["parent_run_id"]}
