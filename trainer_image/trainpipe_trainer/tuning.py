"""A trial of a hyperparameter search, seen from the trainer: report, ask the pruner, stop cleanly.

Optuna is imported here only (``pip install trainpipe-trainer[tuning]``), and only by a training
whose config has a ``tuning`` block. The study lives in a storage every process opens by URL (the
provider's tasks, each trial's trainer, on this machine or in a pod), so the pruner reads the other
trials' reports through it. ``open_storage`` and ``make_pruner`` are the one definition the provider
uses too: a study's pruner is not kept in its storage, so every process must build the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe_trainer.config import OPTUNA_STORAGE_ENV, TUNING_MAX_RESOURCE, TuningTrial

if TYPE_CHECKING:
    import optuna

INSTALL_HINT = "hyperparameter search needs optuna: pip install 'trainpipe-trainer[tuning]'"


def import_optuna():  # noqa: ANN201 - the optuna module
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
        storage = open_storage(url)
        study = optuna.load_study(study_name=tuning.study_name, storage=storage,
                                  pruner=make_pruner(tuning.pruner, tuning.pruner_options))
        trial_id = storage.get_trial_id_from_study_id_trial_number(
            storage.get_study_id_from_name(tuning.study_name), tuning.trial_number)
        return cls(tuning=tuning, trial=optuna.Trial(study, trial_id), storage=storage, trial_id=trial_id)

    def report(self, value: float, *, progress: int) -> bool:
        """Store ``value`` at ``progress`` (a retry may report a step again: Optuna keeps the first),
        then True when the pruner says stop."""
        if progress not in self.storage.get_trial(self.trial_id).intermediate_values:
            self.trial.report(value, progress)
        return self.trial.should_prune()
