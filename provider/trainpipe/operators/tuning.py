"""The hyperparameter-search tasks of a tuned pipeline; the work is in ``trainpipe.steps.tuning``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainpipe.operators.context import train_inputs
from trainpipe.operators.pipeline import _PipelineStepOperator
from trainpipe.plan.steps import CREATE_STUDY

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan.model import PipelinePlan


class CreateStudyOperator(_PipelineStepOperator):
    """The DAG run's Optuna study (found again by a retry), its warm start, and its MLflow parent run."""

    def execute(self, context: Context) -> dict[str, str]:
        from trainpipe.steps.tuning import create_study

        inputs = train_inputs(self.plan, context)
        study = create_study(inputs.plan, settings=self.settings, run=inputs.run, hook=self.hook,
                             on_line=lambda line: self.log.info("%s", line))
        self.log.info("study %s (storage: TRAINPIPE_OPTUNA_STORAGE), MLflow parent run %s",
                      study["study_name"], study["parent_run_id"])
        return study


class TrialOperator(_PipelineStepOperator):
    """One trial worker (mapped over ``max_parallel`` workers, ``slot`` is the worker's index): one trainer
    launch that runs the study's trials back to back until it has ``n_trials``."""

    ui_color = "#fdf1c9"

    def __init__(self, *, plan: PipelinePlan, slot: int, **kwargs: Any) -> None:
        super().__init__(plan=plan, **kwargs)
        self.slot = slot

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.operators.context import failed_for_good_on_refused_resume
        from trainpipe.steps.tuning import run_worker

        inputs = train_inputs(self.plan, context)
        study = context["ti"].xcom_pull(task_ids=CREATE_STUDY.task_id)
        with failed_for_good_on_refused_resume():
            return run_worker(inputs.plan, self.slot, inputs.snapshot, settings=self.settings, run=inputs.run,
                              study=study, hook=self.hook, on_line=lambda line: self.log.info("%s", line))


class PickBestOperator(_PipelineStepOperator):
    """Runs once every trial task is done (whatever their state): fails leftovers, picks the best, plots."""

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.steps.tuning import pick_best

        study = context["ti"].xcom_pull(task_ids=CREATE_STUDY.task_id)
        return pick_best(self.run_plan(context), settings=self.settings, study=study, hook=self.hook,
                         on_line=lambda line: self.log.info("%s", line))
