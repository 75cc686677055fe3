"""The operators of a trainpipe DAG. Each is thin: it reads its inputs from XCom and calls the
Airflow-free step in ``trainpipe.runtime``. Heavy libraries are imported in ``execute`` only, so
DAG parsing stays fast.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import BaseOperator

from trainpipe.lineage import git_commit
from trainpipe.operators.context import (
    failed_for_good_on_refused_resume,
    log_trained,
    run_plan,
    snapshot_info,
    train_inputs,
)
from trainpipe.settings import Settings

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan import PipelinePlan


class _PipelineStepOperator(BaseOperator):
    ui_color = "#e8f1fb"

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan

    def run_plan(self, context: Context) -> PipelinePlan:
        """The plan with this run's params applied (``Trigger DAG w/ config``)."""
        plan, overrides = run_plan(self.plan, context)
        if overrides:
            self.log.info("this run overrides %s", overrides)
        return plan

    @functools.cached_property
    def settings(self) -> Settings:
        return Settings.from_env()

    @functools.cached_property
    def hook(self):  # noqa: ANN201 - MlflowHook
        from trainpipe.hooks.mlflow import MlflowHook

        return MlflowHook(self.settings)

    def snapshot_info(self, context: Context):  # noqa: ANN201 - SnapshotInfo
        return snapshot_info(context)

    def lineage_tags(self, context: Context) -> dict[str, str]:
        snapshot = self.snapshot_info(context)
        return {
            "dag_id": self.dag_id,
            "airflow_run_id": context["run_id"],
            "dataset_digest": snapshot.digest,
            "spec_file_sha256": self.plan.spec_sha256,
            "spec_file": self.plan.spec_file,
            "seed": str(self.run_plan(context).trainer.seed),  # the run's, with a trigger's override
            "git_commit": git_commit(self.plan.source_path),
        }


class SnapshotOperator(_PipelineStepOperator):
    """Immutable, content-addressed copy of the input window, split into train and holdout."""

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.runtime.snapshot import take_snapshot

        logical_date = context.get("logical_date") or context["dag_run"].run_after
        return take_snapshot(self.plan.dag_id, self.plan.data, settings=self.settings, logical_date=logical_date,
                             dag_id=self.dag_id, run_id=context["run_id"]).to_dict()


class ValidateDataOperator(_PipelineStepOperator):
    """Great Expectations suite from the spec, the volume, schema and drift checks vs the baseline
    version; fails the run before training, else accepts the version as the next baseline."""

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from trainpipe.errors import ValidationFailedError
        from trainpipe.runtime.snapshot import validate_snapshot

        try:
            return validate_snapshot(self.plan.dag_id, self.plan.validation, self.snapshot_info(context),
                                     settings=self.settings, dag_id=self.dag_id, run_id=context["run_id"],
                                     hook=self.hook)
        except ValidationFailedError as err:
            # The snapshot is immutable: a retry would fail the same way, so fail now.
            raise AirflowFailException(str(err)) from err


class TrainOperator(_PipelineStepOperator):
    """Launch the trainer (torchrun) for this DAG run; retries resume from its latest checkpoint."""

    ui_color = "#fde9c9"

    def execute(self, context: Context) -> dict[str, Any]:
        from dataclasses import asdict

        from trainpipe.runtime.train import run_training

        inputs = train_inputs(self.plan, context)
        with failed_for_good_on_refused_resume():
            result = run_training(inputs.plan, inputs.snapshot, settings=self.settings, run=inputs.run,
                                  hook=self.hook, on_line=lambda line: self.log.info("%s", line),
                                  param_overrides=inputs.param_overrides)
        log_trained(self.log, result)
        return asdict(result)


class EvaluateOperator(_PipelineStepOperator):
    """Holdout metrics (whole and per slice) of the new model and of the current champion, on the same
    rows; the evaluation report and the snapshot's dataset inputs on the MLflow run."""

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.runtime.evaluate import evaluate

        trained = context["ti"].xcom_pull(task_ids="train")
        plan = self.run_plan(context)
        snapshot = self.snapshot_info(context)
        return evaluate(plan.evaluation, plan.registration, holdout_uri=snapshot.holdout_uri, model_uri=trained["model_uri"],
                        mlflow_run_id=trained["mlflow_run_id"], hook=self.hook, snapshot=snapshot,
                        pipeline_id=plan.dag_id, settings=self.settings)


def _all_gates_pass(ti: Any) -> bool:
    from trainpipe.runtime.evaluate import log_gate

    # evaluate checked the gates and tagged the MLflow run; this task acts on its verdict.
    evaluation = ti.xcom_pull(task_ids="evaluate")
    for outcome in evaluation["gates"]:
        log_gate(outcome)
    return bool(evaluation["gates_passed"])


class GateOperator(ShortCircuitOperator):
    """Every gate is logged with its value and threshold; if any fails, registration is skipped.
    The gates are checked by evaluate, which records the verdict on the MLflow run (no MLflow here)."""

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        super().__init__(python_callable=_all_gates_pass, **kwargs)
        self.plan = plan


class RegisterModelOperator(_PipelineStepOperator):
    """A new MLflow model version with lineage tags; the spec's alias (champion) moves to it."""

    ui_color = "#dff5e1"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.runtime.evaluate import register

        trained = context["ti"].xcom_pull(task_ids="train")
        evaluation = context["ti"].xcom_pull(task_ids="evaluate")
        return register(self.plan.registration, model_uri=trained["model_uri"], mlflow_run_id=trained["mlflow_run_id"],
                        tags=self.lineage_tags(context), evaluation=evaluation, hook=self.hook)
