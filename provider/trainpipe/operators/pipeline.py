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

    def lineage_tags(self, context: Context, trained: dict[str, Any]) -> dict[str, str]:
        snapshot = self.snapshot_info(context)
        tags = {
            "dag_id": self.dag_id,
            "airflow_run_id": context["run_id"],
            "dataset_digest": snapshot.digest,
            "spec_file_sha256": self.plan.spec_sha256,
            # Relative to the configs root: the same wherever the folder is deployed.
            "spec_file": self.plan.spec_relative_path,
            "seed": str(self.run_plan(context).trainer.seed),  # the run's, with a trigger's override
            "weights_sha256": trained["weights_sha256"],
        }
        commit = git_commit(self.plan.source_path)
        if commit is not None:  # left out, never made up, when the specs are not a git checkout
            tags["git_commit"] = commit
        return tags


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
    """Holdout metrics of the new model and of the current champion, on the same rows."""

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.runtime.evaluate import evaluate

        trained = context["ti"].xcom_pull(task_ids="train")
        plan = self.run_plan(context)
        return evaluate(plan.evaluation, plan.registration, holdout_uri=self.snapshot_info(context).holdout_uri, model_uri=trained["model_uri"],
                        mlflow_run_id=trained["mlflow_run_id"], hook=self.hook)


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
    """The DAG run's MLflow model version (one, however often the task runs) with lineage tags and
    the challenger alias."""

    ui_color = "#dff5e1"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.registry import register_candidate

        trained = context["ti"].xcom_pull(task_ids="train")
        evaluation = context["ti"].xcom_pull(task_ids="evaluate")
        return register_candidate(self.plan.registration, model_uri=trained["model_uri"],
                                  mlflow_run_id=trained["mlflow_run_id"], tags=self.lineage_tags(context, trained),
                                  evaluation=evaluation, hook=self.hook)


class PromoteOperator(_PipelineStepOperator):
    """Moves the production alias (champion) to the registered version and the replaced version to the
    previous alias, tagging who, when and why (the gate results). Once per version: a re-run moves nothing."""

    ui_color = "#c8ecd0"

    def promotion_reason(self, context: Context) -> tuple[str, str, dict[str, Any]]:
        """Who promotes, a one-line why, and the details (JSON on the version)."""
        from trainpipe.registry import dag_actor, gate_summary

        evaluation = context["ti"].xcom_pull(task_ids="evaluate")
        details = {"dag_id": self.dag_id, "airflow_run_id": context["run_id"], "gates": evaluation["gates"],
                   "gates_passed": evaluation["gates_passed"]}
        return dag_actor(self.dag_id, context["run_id"]), gate_summary(evaluation["gates"]), details

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from trainpipe.registry import promote_once

        registered = context["ti"].xcom_pull(task_ids="register")
        if not context["ti"].xcom_pull(task_ids="evaluate")["gates_passed"]:
            # The gate task skips this one; run on its own (`airflow tasks test`), it must not promote either.
            raise AirflowSkipException("a gate failed: nothing is promoted")
        actor, reason, details = self.promotion_reason(context)
        registration = self.plan.registration
        promotion = promote_once(self.hook.client, registration.model_name, registered["version"], actor=actor,
                                 reason=reason, details=details, champion_alias=registration.alias,
                                 previous_alias=registration.previous_alias)
        if promotion.moved:
            self.log.info("%s version %s is now %s (%s: %s)", promotion.model_name, promotion.version, promotion.alias,
                          promotion.previous_alias, promotion.replaced_version or "none")
        elif promotion.at:
            self.log.info("%s version %s was promoted before (%s by %s): nothing moved", promotion.model_name,
                          promotion.version, promotion.at, promotion.actor)
        else:
            self.log.info("%s version %s was rejected: nothing moved", promotion.model_name, promotion.version)
        return promotion.to_dict()
