"""A trial of a hyperparameter search, seen from the trainer: report, ask the pruner, stop cleanly.

Optuna is imported here only (``pip install trainpipe-trainer[tuning]``), and only by a training
whose config has a ``tuning`` block. The study lives in a storage every process opens by URL (the
provider's tasks, each trial's trainer, on this machine or in a pod), so the pruner reads the other
trials' reports through it. ``open_storage`` and ``make_pruner`` are the one definition the provider
uses too: a study's pruner is not kept in its storage, so every process must build the same one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.config import OPTUNA_STORAGE_ENV, TUNING_MAX_RESOURCE, SearchDimension, TuningTrial

if TYPE_CHECKING:
    import optuna

INSTALL_HINT = "hyperparameter search needs optuna: pip install 'trainpipe-trainer[tuning]'"

# What the provider's study tasks and the trial workers record, one name each. MLflow tags:
STUDY_TAG = "trainpipe.study"
TRIAL_TAG = "trainpipe.trial_number"
STATE_TAG = "trainpipe.trial_state"
# Optuna user attributes: of a trial (the worker that ran it, where it came from), of the study.
WORKER_ATTR = "worker"
WARM_START_ATTR = "warm_start"
STARTED_ATTR = "started_at"


def import_optuna():
    try:
        import optuna
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ImportError(INSTALL_HINT) from err
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def is_journal(url: str) -> bool:
    """A journal file (a path, or file://path) rather than a database URL."""
    return url.startswith("file://") or "://" not in url


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The study storage at ``url``: ``sqlite:///...``, ``postgresql://...`` (any SQLAlchemy URL), or a
    journal file (a path or ``file://`` URI; one machine, safe across processes through its lock file)."""
    optuna = import_optuna()
    if is_journal(url):
        from optuna.storages.journal import JournalFileBackend

        path = url.removeprefix("file://")
        import os

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    # A pool per process, kept small: many short-lived task and trainer processes share the database.
    return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True}, heartbeat_interval=None)


def storage_for_config(url: str) -> str:
    """What a trainer config may hold of the storage URL: all of it, unless it carries a password
    (then nothing: the trainer reads it from its environment, never from a file in storage)."""
    from urllib.parse import urlsplit

    return "" if not is_journal(url) and urlsplit(url).password else url


def make_pruner(name: str, options: dict[str, Any]) -> optuna.pruners.BasePruner:
    """The study's pruner from the plan's name and keyword arguments (``PRUNER_ARGUMENTS``); the
    resource is the percent of a trial done, so Hyperband's maximum is ``TUNING_MAX_RESOURCE``."""
    optuna = import_optuna()
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(max_resource=TUNING_MAX_RESOURCE, **options)
    if name == "successive_halving":
        # Asynchronous: a trial is judged at a rung against the trials that reached it so far, so
        # trials running side by side never wait for each other.
        return optuna.pruners.SuccessiveHalvingPruner(**options)
    if name == "median":
        return optuna.pruners.MedianPruner(**options)
    return optuna.pruners.NopPruner()


def progress_percent(step: int, total_steps: int) -> int:
    """The resource a trial reports at: the percent of its training done (1..100)."""
    return max(1, min(TUNING_MAX_RESOURCE, round(TUNING_MAX_RESOURCE * step / max(total_steps, 1))))


# The studies trials report into, by (storage URL, study, pruner, its options): see TrialReporter.open.
_REPORTER_STUDIES: dict[tuple[str, str, str, str], optuna.Study] = {}


@dataclass(slots=True)
class TrialReporter:
    """Rank 0's handle on its trial: ``report`` stores a value and says whether the pruner stops it."""

    tuning: TuningTrial
    trial: optuna.Trial
    storage: optuna.storages.BaseStorage
    trial_id: int

    @classmethod
    def open(cls, tuning: TuningTrial) -> TrialReporter:
        import os

        optuna = import_optuna()
        url = tuning.storage or os.environ.get(OPTUNA_STORAGE_ENV, "")
        if not url:
            raise ValueError(f"tuning.storage is empty and {OPTUNA_STORAGE_ENV} is not set: the trial cannot "
                             "reach its study")
        key = (url, tuning.study_name, tuning.pruner, json.dumps(tuning.pruner_options, sort_keys=True))
        if key not in _REPORTER_STUDIES:
            # Once per process: a trial worker's trials share it (a fresh storage replayed the journal,
            # and a fresh pruner its brackets, for every trial).
            storage = open_storage(url)
            _REPORTER_STUDIES[key] = optuna.load_study(study_name=tuning.study_name, storage=storage,
                                                       pruner=make_pruner(tuning.pruner, tuning.pruner_options))
        study = _REPORTER_STUDIES[key]
        storage = study._storage  # the storage load_study was given: Study keeps no public handle on it
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(tuning.study_name), tuning.trial_number)
        return cls(tuning=tuning, trial=optuna.Trial(study, trial_id), storage=storage, trial_id=trial_id)

    def report(self, value: float, *, progress: int) -> bool:
        """Store ``value`` at ``progress`` (a retry may report a step again: Optuna keeps the first),
        then True when the pruner says stop."""
        if progress not in self.storage.get_trial(self.trial_id).intermediate_values:
            self.trial.report(value, progress)
        return self.trial.should_prune()


def build_sampler(sampler: str, *, seed: int, n_trials: int, stream: int) -> optuna.samplers.BaseSampler:
    """The study's sampler as one process asks it: seeded per ``stream`` (a worker), so workers asking
    at the same time, each with its own sampler, draw different startup points."""
    optuna = import_optuna()
    seed = seed * 10_000 + stream
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup_trials(n_trials))


def tpe_startup_trials(n_trials: int) -> int:
    """The random trials TPE starts a study with: fewer than Optuna's 10 for small studies, so TPE has
    trials to learn from."""
    return max(2, min(10, n_trials // 3))


def suggest(trial: optuna.Trial, space: tuple[SearchDimension, ...]) -> dict[str, Any]:
    """This trial's value of every dimension of the space (an enqueued trial's fixed values as given)."""
    params: dict[str, Any] = {}
    for d in space:
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


def fits_space(params: dict[str, Any], space: tuple[SearchDimension, ...]) -> dict[str, Any]:
    """The values of ``params`` that today's space can take (a warm start from yesterday's space, or from
    a champion trained before the space changed): out-of-range or unknown values are left to the sampler."""
    kept: dict[str, Any] = {}
    for d in space:
        if d.name not in params:
            continue
        value = params[d.name]
        if d.distribution == "choice":
            encoded = value if isinstance(value, str) and value in d.choices else json.dumps(
                list(value) if isinstance(value, tuple | list) else value)
            if encoded in d.choices:
                decoded = [json.loads(c) for c in d.choices]
                kept[d.name] = encoded if any(isinstance(c, list) for c in decoded) else json.loads(encoded)
        elif isinstance(value, int | float) and not isinstance(value, bool) and d.low <= value <= d.high:
            kept[d.name] = int(value) if d.distribution == "int" else float(value)
    return kept


def state_name(trial: optuna.trial.FrozenTrial) -> str:
    return {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}.get(trial.state.name, trial.state.name.lower())


# The study's progress on its MLflow parent run, updated by the workers after each trial (the fleet
# view reads it): finished (complete + pruned), pruned, running and failed trials, the best value so far.
PROGRESS_METRICS: tuple[str, ...] = ("study_trials_done", "study_trials_pruned", "study_trials_running",
                                     "study_trials_failed", "study_best_value")


def study_progress(study: optuna.Study) -> dict[str, Any]:
    """Trials done (complete or pruned), pruned, running and failed, and the best complete trial so far."""
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(1 for t in trials if state_name(t) == s) for s in ("complete", "pruned", "failed", "running")}
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    best = (min if study.direction.name == "MINIMIZE" else max)(complete, key=lambda t: t.value) if complete else None
    return {"done": counts["complete"] + counts["pruned"], **counts, "metric": study.user_attrs.get("metric", "value"),
            "best_value": best.value if best else None, "best_trial": best.number if best else None}


def progress_metrics(progress: dict[str, Any]) -> dict[str, float]:
    values = dict(zip(PROGRESS_METRICS, (progress["done"], progress["pruned"], progress["running"],
                                         progress["failed"], progress["best_value"]), strict=True))
    return {k: float(v) for k, v in values.items() if v is not None}


def progress_line(study: optuna.Study, n_trials: int) -> str:
    """Trials done, pruned and running, and the best value so far: the worker's log line after each trial."""
    p = study_progress(study)
    line = (f"study {study.study_name}: {p['done']} of {n_trials} trials done ({p['complete']} complete, "
            f"{p['pruned']} pruned), {p['failed']} failed, {p['running']} running")
    if p["best_value"] is not None:
        line += f"; best {p['metric']} {p['best_value']:.6g} (trial {p['best_trial']})"
    return line
