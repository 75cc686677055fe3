"""What a trainpipe task reads from its Airflow context, in one place for every operator and launcher."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.plan.steps import PICK_BEST, SNAPSHOT, TRAIN
from trainpipe.settings import Settings

if TYPE_CHECKING:
    from trainpipe.plan.model import PipelinePlan
    from trainpipe.state.datasets import SnapshotInfo
    from trainpipe.steps.backtest import Backtest
    from trainpipe.steps.train.train import RunContext
    from trainpipe_trainer.outcomes import TrainingResult


def task_settings() -> Settings:
    """The platform's settings in a task process. An operator, or a callback Airflow runs beside it, is where a task
    enters trainpipe: the environment is read here (once per operator: ``TaskSettings.settings``) and passed down."""
    return Settings.from_env()


class TaskSettings:
    """Mixin of trainpipe's operators: ``self.settings``, read once per task."""

    @functools.cached_property
    def settings(self) -> Settings:
        return task_settings()


def run_plan(plan: PipelinePlan, context: Any) -> tuple[PipelinePlan, dict[str, Any]]:
    """The plan with this run's params applied (``Trigger DAG w/ config``), and what they changed."""
    from trainpipe.plan.params import apply_run_params

    return apply_run_params(plan, dict(context.get("params") or {}))


def snapshot_info(context: Any) -> SnapshotInfo:
    from trainpipe.state.datasets import SnapshotInfo

    return SnapshotInfo.from_dict(context["ti"].xcom_pull(task_ids=SNAPSHOT.task_id))


def backtest_of(context: Any) -> Backtest | None:
    """The snapshot task's verdict: this run is a backtest (``trainpipe.steps.backtest``), or None."""
    from trainpipe.steps.backtest import BACKTEST_XCOM, Backtest

    return Backtest.from_dict(context["ti"].xcom_pull(task_ids=SNAPSHOT.task_id, key=BACKTEST_XCOM))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainInputs:
    plan: PipelinePlan
    param_overrides: dict[str, Any]
    run: RunContext
    snapshot: SnapshotInfo
    # With tuning: the MLflow tags that name the trial the final training takes its parameters from.
    run_tags: dict[str, str] | None = None


def train_inputs(plan: PipelinePlan, context: Any) -> TrainInputs:
    """Everything the train step needs from Airflow, whatever the launcher."""
    from trainpipe.steps.register.lineage import git_commit
    from trainpipe.steps.train.train import RunContext

    plan, overrides = run_plan(plan, context)
    ti = context["ti"]
    run = RunContext(dag_id=ti.dag_id, airflow_run_id=context["run_id"], try_number=ti.try_number,
                     spec_sha256=plan.spec_sha256, git_commit=git_commit(plan.source_path))
    run_tags = None
    if plan.tuning is not None and ti.task_id == TRAIN.task_id:
        from trainpipe.plan.params import with_trial_params
        from trainpipe.steps.tuning import best_trial_tags

        # The final training: the search's best parameters over the plan's (and a trigger's) values.
        best = ti.xcom_pull(task_ids=PICK_BEST.task_id)
        plan, run_tags = with_trial_params(plan, best["params"]), best_trial_tags(best)
    if backtest_of(context) is not None:
        from trainpipe.plan.tracking import BACKTEST_TAG

        # The MLflow run says so from its start: the fleet view and the run list tell backtests apart.
        run_tags = {**(run_tags or {}), BACKTEST_TAG: "true"}
    return TrainInputs(plan=plan, param_overrides=overrides, run=run, snapshot=snapshot_info(context),
                       run_tags=run_tags)


@contextlib.contextmanager
def failed_for_good_on_refused_resume() -> Iterator[None]:
    """A refused resume fails the task without retries: a retry would find the same checkpoints. So does
    training data the spec cannot train on (a missing column, missing values without impute: the located
    error of ``steps.train.train.check_training_inputs``, raised before torchrun starts): a retry would read
    the same snapshot."""
    from airflow.sdk.exceptions import AirflowFailException

    from trainpipe.errors import DatasetChangedError, ResumeRefusedError, SpecError

    try:
        yield
    except DatasetChangedError as err:
        # A file of the dataset version changed since its snapshot: a retry reads the same file.
        raise AirflowFailException(str(err)) from None
    except ResumeRefusedError as err:
        raise AirflowFailException(str(err)) from err
    except SpecError as err:
        # The located message is the whole story: no chained traceback under it.
        raise AirflowFailException(str(err)) from None


@contextlib.contextmanager
def training_failure_noted(context: Any, retries: int | None) -> Iterator[None]:
    """A failed training leaves the run's note (the trainer's reason, in a few words) before failing the try;
    a later try that succeeds starts without it (Airflow clears a try's XComs)."""
    from trainpipe.errors import DatasetChangedError, TrainingFailedError
    from trainpipe.state.run_notes import leave_note, training_note

    try:
        yield
    except TrainingFailedError as err:
        ti = context["ti"]
        leave_note(ti, training_note(err.reasons, fallback=str(err), try_number=ti.try_number,
                                     tries=(retries or 0) + 1))
        raise
    except DatasetChangedError as err:  # found before the launch (the input checks read the version's files)
        ti = context["ti"]
        leave_note(ti, training_note([str(err)], fallback=str(err), try_number=ti.try_number,
                                     tries=(retries or 0) + 1))
        raise


def log_trained(log: Any, result: TrainingResult) -> None:
    log.info("trained: model %s, weights sha256 %s, %d steps on %d processes%s",
             result.model_uri, result.weights_sha256, result.global_step, result.world_size,
             f", {result.samples_per_second:,.0f} samples/s" if result.samples_per_second else "")


def leave_usage_note(context: Any, plan: PipelinePlan, settings: Settings, result: TrainingResult) -> None:
    """The run's note says what its training cost (every try's GPU and CPU hours, and the money) and
    the training throughput of the try that finished."""
    from trainpipe.state.run_folder import run_dir_for
    from trainpipe.state.run_notes import leave_note
    from trainpipe.state.usage import run_usage, usage_note

    usage = run_usage(run_dir_for(plan.dag_id, settings, context["run_id"]), plan.resources, settings=settings)
    if usage is not None and usage.tries:
        leave_note(context["ti"], usage_note(usage, samples_per_second=result.samples_per_second))


def run_training_key(inputs: TrainInputs) -> str:
    """The run's training key (``state.training_cache``), the pretrained weights' fingerprint included."""
    from trainpipe.state.training_cache import training_key
    from trainpipe.steps.train.train import pretrained_fingerprint

    return training_key(inputs.plan, inputs.snapshot, param_overrides=inputs.param_overrides,
                        pretrained=pretrained_fingerprint(inputs.plan, task_settings()))


def training_key_unless_cached(plan: PipelinePlan, context: Any, inputs: TrainInputs, *, client: Any, log: Any) -> str:
    """The run's training key (register tags the version with it); when a registered version already carries it
    (``training.cache``), leave the note and skip: evaluate, gate, register and promote follow. Every launcher
    calls it before anything is launched."""
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from trainpipe.errors import SpecError
    from trainpipe.state.run_notes import inputs_unchanged_note, leave_note
    from trainpipe.state.training_cache import cached_version, forced

    key = run_training_key(inputs)
    try:
        force = forced(getattr(context.get("dag_run"), "conf", None))
    except SpecError as err:
        raise AirflowFailException(str(err)) from err  # the same conf would be refused again
    if not plan.cache.enabled or force:
        log.info("training key %s; %s", key[:16],
                 "force: true in the run's conf, training anyway" if force else "training.cache.enabled: false")
        return key
    hit = cached_version(client, plan.registration.model_name, key, max_age=plan.cache.max_age)
    if hit is None:
        log.info("training key %s: no version registered within %s has it; training", key[:16], plan.cache.max_age)
        return key
    leave_note(context["ti"], inputs_unchanged_note(version=hit.version, trained_at=hit.trained_at))
    raise AirflowSkipException(
        f"inputs unchanged since {hit.model_name} version {hit.version} (trained {hit.trained_at}; training key "
        f'{key[:16]}): nothing trained; trigger with {{"force": true}} to train anyway')
