"""The operators of a trainpipe DAG. Each is thin: it reads its inputs from XCom and calls the
Airflow-free step in ``trainpipe.steps``. Heavy libraries are imported in ``execute`` only, so
DAG parsing stays fast.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import BaseOperator

from trainpipe.operators.context import (
    TaskSettings,
    backtest_of,
    failed_for_good_on_refused_resume,
    leave_usage_note,
    log_trained,
    run_plan,
    snapshot_info,
    train_inputs,
    training_failure_noted,
    training_key_unless_cached,
)
from trainpipe.operators.links import (
    DRIFT_RUN_XCOM,
    DriftReportLink,
    EvaluationReportLink,
    MlflowRunLink,
    ModelVersionLink,
)
from trainpipe.operators.openlineage import LineageFacets
from trainpipe.plan.steps import EVALUATE, REGISTER, TRAIN
from trainpipe.plan.tracking import (
    SEED_TAG,
    SPEC_FILE_SHA256_TAG,
    SPEC_FILE_TAG,
    TRAINING_KEY_TAG,
    VERSION_DAG_ID_TAG,
    VERSION_DATASET_DIGEST_TAG,
    VERSION_GIT_COMMIT_TAG,
    VERSION_RUN_ID_TAG,
    WEIGHTS_SHA256_TAG,
    WINDOW_END_TAG,
)
from trainpipe.steps.register.lineage import git_commit

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan.model import PipelinePlan


class _PipelineStepOperator(TaskSettings, BaseOperator):
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
    def hook(self):
        from trainpipe.hooks.mlflow import MlflowHook

        return MlflowHook(self.settings)

    def snapshot_info(self, context: Context):
        return snapshot_info(context)

    def lineage_tags(self, context: Context, trained: dict[str, Any]) -> dict[str, str]:
        snapshot = self.snapshot_info(context)
        tags = {
            VERSION_DAG_ID_TAG: self.dag_id,
            VERSION_RUN_ID_TAG: context["run_id"],
            VERSION_DATASET_DIGEST_TAG: snapshot.digest,
            SPEC_FILE_SHA256_TAG: self.plan.spec_sha256,
            # Relative to the configs root: the same wherever the folder is deployed.
            SPEC_FILE_TAG: self.plan.spec_relative_path,
            SEED_TAG: str(self.run_plan(context).trainer.seed),  # the run's, with a trigger's override
            WEIGHTS_SHA256_TAG: trained["weights_sha256"],
        }
        if trained.get("training_key"):  # what a later run with the same inputs finds (training.cache)
            tags[TRAINING_KEY_TAG] = trained["training_key"]
        if snapshot.window_end is not None:  # what tells a later run for an older window that it is a backtest
            tags[WINDOW_END_TAG] = snapshot.window_end
        commit = git_commit(self.plan.source_path)
        if commit is not None:  # left out, never made up, when the specs are not a git checkout
            tags[VERSION_GIT_COMMIT_TAG] = commit
        return tags


class SnapshotOperator(LineageFacets, _PipelineStepOperator):
    """Immutable, content-addressed copy of the input window, split into train and holdout."""

    lineage_step = "snapshot"

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.steps.snapshot import take_snapshot

        logical_date = context.get("logical_date") or context["dag_run"].run_after
        info = take_snapshot(self.plan.dag_id, self.plan.data, settings=self.settings, logical_date=logical_date,
                             dag_id=self.dag_id, run_id=context["run_id"], class_label=self.plan.class_label)
        self.keep_lineage(snapshot=info.to_dict())
        self.decide_backtest(context, info, logical_date)
        return info.to_dict()

    def decide_backtest(self, context: Context, info: Any, logical_date: Any) -> None:
        """Once per run, before anything is accepted or trained: is this a run for a past window? The verdict
        goes under ``BACKTEST_XCOM`` for validate, train, register, approve and promote."""
        from trainpipe.steps.backtest import BACKTEST_XCOM, champion_window_end, classify

        registration = self.plan.registration
        champion = champion_window_end(self.hook.client, registration.model_name, registration.alias,
                                       settings=self.settings, pipeline_id=self.plan.dag_id)
        run_type = getattr(context["dag_run"], "run_type", None)
        backtest = classify(run_type=getattr(run_type, "value", run_type), window_start=info.window_start,
                            window_end=info.window_end, champion=champion, logical_date=logical_date)
        if backtest is not None and registration.backtest.promote == "allow":
            self.log.info("a run for a past window (%s, %s); registration.backtest.promote: allow, so it is treated "
                          "as any run", backtest.window, backtest.reason)
            backtest = None
        elif backtest is not None:
            self.log.info("backtest for %s (%s): it trains and is evaluated, moves no alias and leaves the "
                          "validation baseline as it is", backtest.window, backtest.reason)
        context["ti"].xcom_push(key=BACKTEST_XCOM, value=backtest.to_dict() if backtest is not None else None)


class ValidateDataOperator(LineageFacets, _PipelineStepOperator):
    """Great Expectations suite from the spec, the volume, schema and drift checks vs the baseline
    version; fails the run before training, else accepts the version as the next baseline."""

    lineage_step = "validate"

    operator_extra_links = (MlflowRunLink(), DriftReportLink())

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from trainpipe.errors import ValidationFailedError
        from trainpipe.steps.validate.validate import validate_snapshot

        snapshot = self.snapshot_info(context)
        self.keep_lineage(snapshot=snapshot.to_dict())
        try:
            result = validate_snapshot(self.plan.dag_id, self.plan.validation, snapshot,
                                       settings=self.settings, dag_id=self.dag_id, run_id=context["run_id"],
                                       hook=self.hook, move_baseline=backtest_of(context) is None,
                                       trainer=self.plan.trainer)
        except ValidationFailedError as err:
            from trainpipe.state.run_notes import leave_note, validation_note

            if err.drift_mlflow_run_id:
                context["ti"].xcom_push(key=DRIFT_RUN_XCOM, value=err.drift_mlflow_run_id)
            leave_note(context["ti"], validation_note(list(err.note_parts) or [str(err)]))
            # The snapshot is immutable: a retry would fail the same way, so fail now.
            raise AirflowFailException(str(err)) from err
        # Kept once, under the key the buttons read, not also in the return value.
        drift_run = result.pop("drift_mlflow_run_id")
        if drift_run:
            context["ti"].xcom_push(key=DRIFT_RUN_XCOM, value=drift_run)
        self.keep_lineage(validation=result)
        return result


class TrainOperator(LineageFacets, _PipelineStepOperator):
    """Launch the trainer (torchrun) for this DAG run; retries resume from its latest checkpoint."""

    lineage_step = "train"

    ui_color = "#fde9c9"
    operator_extra_links = (MlflowRunLink(),)

    def execute(self, context: Context) -> dict[str, Any]:
        from dataclasses import asdict

        from trainpipe.steps.train.train import run_training

        inputs = train_inputs(self.plan, context)
        self.keep_lineage(snapshot=inputs.snapshot.to_dict())
        key = training_key_unless_cached(self.plan, context, inputs, client=self.hook.client, log=self.log)
        with failed_for_good_on_refused_resume(), training_failure_noted(context, self.retries):
            result = run_training(inputs.plan, inputs.snapshot, settings=self.settings, run=inputs.run,
                                  hook=self.hook, on_line=lambda line: self.log.info("%s", line),
                                  param_overrides=inputs.param_overrides, run_tags=inputs.run_tags)
        log_trained(self.log, result)
        leave_usage_note(context, self.plan, self.settings, result)
        return {**asdict(result), "training_key": key}


class EvaluateOperator(_PipelineStepOperator):
    """Holdout metrics (whole and per slice) of the new model and of the current champion, on the same
    rows; the evaluation report and the snapshot's dataset inputs on the MLflow run."""

    operator_extra_links = (MlflowRunLink(), EvaluationReportLink())

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.steps.evaluate.evaluate import evaluate

        trained = context["ti"].xcom_pull(task_ids=TRAIN.task_id)
        plan = self.run_plan(context)
        snapshot = self.snapshot_info(context)
        return evaluate(plan.evaluation, plan.registration, holdout_uri=snapshot.holdout_uri, model_uri=trained["model_uri"],
                        mlflow_run_id=trained["mlflow_run_id"], hook=self.hook, snapshot=snapshot,
                        pipeline_id=plan.dag_id, settings=self.settings)


class GateOperator(ShortCircuitOperator):
    """Acts on evaluate's verdict (no MLflow here: evaluate recorded it on the MLflow run). Every gate is
    logged; when one fails, the gate table (candidate vs champion per metric) is logged at WARNING, the run's
    note says which gates failed, ``notify`` sends the table, and ``evaluation.on_gate_failure`` decides:
    ``skip`` short-circuits registration (the run succeeds), ``fail`` fails the task and so the run."""

    # PythonOperator's templated op_args/op_kwargs are unused here: nothing of a spec is a template.
    template_fields = ()

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        super().__init__(python_callable=self._all_gates_pass, **kwargs)
        self.plan = plan

    def _all_gates_pass(self, **context: Any) -> bool:
        from trainpipe.steps.evaluate.evaluate import log_gate

        evaluation = context["ti"].xcom_pull(task_ids=EVALUATE.task_id)
        for outcome in evaluation["gates"]:
            log_gate(outcome, self.log)
        note_below_baseline(evaluation, context)
        if evaluation["gates_passed"]:
            return True
        on_failure_of_gates(self.plan, evaluation, context, self.log)
        return False


def note_below_baseline(evaluation: dict[str, Any], context: Any) -> None:
    """The run's note says when the candidate does worse than the baseline model, gated or not."""
    from trainpipe.state.run_notes import below_baseline_note, leave_note

    below = evaluation.get("below_baseline") or []
    if below:
        rows = [(name, evaluation["candidate"][name], evaluation["baseline"][name]) for name in below]
        leave_note(context["ti"], below_baseline_note(evaluation["baseline_model"], rows))


def on_failure_of_gates(plan: PipelinePlan, evaluation: dict[str, Any], context: Any, log: Any) -> None:
    """Make a failed gate impossible to miss: WARNING with the table, the run's note, ``notify``; then raise
    when the spec says ``on_gate_failure: fail`` (without retries: the same model would fail the same way)."""
    from airflow.sdk.exceptions import AirflowFailException

    from trainpipe.errors import GatesFailedError
    from trainpipe.notifications.channels import Message, send
    from trainpipe.plan.model import GATE_FAILURE
    from trainpipe.state.run_notes import leave_note
    from trainpipe.steps.evaluate.gate_table import as_html, as_text, gate_table, summary

    fail = plan.evaluation.on_gate_failure == "fail"
    table = gate_table(evaluation)
    text = as_text(table)
    model = plan.registration.model_name
    consequence = "nothing registered, run failed" if fail else "nothing registered"
    log.warning("gates failed: the candidate for %s is not registered%s\n%s", model,
                " and the run fails (evaluation.on_gate_failure: fail)" if fail else "", text)
    line = summary(table, consequence=consequence)
    ti = context["ti"]
    leave_note(ti, line)
    intro = (f"Run {ti.run_id} of {ti.dag_id}: the candidate for {model} failed {len(table.failed)} of "
             f"{table.gate_count} gates; {consequence}.")
    report = (evaluation.get("report") or {}).get("artifact_uri")
    if report:
        intro += f"\n\nEvaluation report: {report}"
    send(plan.notify, GATE_FAILURE,
         Message(subject=f"[trainpipe] {ti.dag_id}: gates failed, {consequence}", text=intro, table_text=text,
                 table_html=as_html(table)),
         context)
    if fail:
        error = GatesFailedError(f"{line}\n{text}")
        raise AirflowFailException(str(error)) from error


class RegisterModelOperator(LineageFacets, _PipelineStepOperator):
    """The DAG run's MLflow model version (one, however often the task runs) with lineage tags and
    the challenger alias."""

    lineage_step = "register"

    ui_color = "#dff5e1"
    operator_extra_links = (ModelVersionLink(), EvaluationReportLink())

    def execute(self, context: Context) -> dict[str, Any]:
        from trainpipe.state.run_notes import backtest_note, leave_note
        from trainpipe.steps.register.model_registry import register_candidate

        backtest = backtest_of(context)
        if backtest is not None and not self.plan.registration.backtest.register:
            from airflow.sdk.exceptions import AirflowSkipException

            leave_note(context["ti"], backtest_note(backtest.window))
            raise AirflowSkipException(f"backtest for {backtest.window} ({backtest.reason}): its metrics are on the "
                                       "MLflow run; nothing registered (registration.backtest.register: false)")
        trained = context["ti"].xcom_pull(task_ids=TRAIN.task_id)
        evaluation = context["ti"].xcom_pull(task_ids=EVALUATE.task_id)
        self.skip_identical_weights(context, trained)
        from trainpipe.state.usage import version_usage_tags
        from trainpipe.steps.register.lineage import model_family_tags

        # What the training cost (gpu_hours, cpu_hours, cost) and which model family it trained go on the version
        # with its lineage.
        tags = {**self.lineage_tags(context, trained), **version_usage_tags(self.hook.client, trained["mlflow_run_id"]),
                **model_family_tags(self.hook.client, trained["mlflow_run_id"])}
        registered = register_candidate(self.plan.registration, model_uri=trained["model_uri"],
                                        mlflow_run_id=trained["mlflow_run_id"], tags=tags,
                                        evaluation=evaluation, hook=self.hook, backtest=backtest is not None)
        self.keep_lineage(snapshot=self.snapshot_info(context).to_dict(), registered=registered)
        if backtest is not None:
            alias = f" (alias {registered['alias']})" if registered["alias"] else ""
            leave_note(context["ti"], backtest_note(
                backtest.window, registered=f"{registered['model_name']} version {registered['version']}{alias}"))
        return registered

    def skip_identical_weights(self, context: Context, trained: dict[str, Any]) -> None:
        """A candidate whose weights are the production version's is no new version (whatever the cache)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from trainpipe.state.run_notes import leave_note, weights_unchanged_note
        from trainpipe.steps.register.model_registry import same_weights_as_production

        registration = self.plan.registration
        same = same_weights_as_production(self.hook.client, registration, trained["weights_sha256"],
                                          dag_id=self.dag_id, airflow_run_id=context["run_id"])
        if same is None:
            return
        leave_note(context["ti"], weights_unchanged_note(model_name=registration.model_name, version=same,
                                                         alias=registration.alias))
        raise AirflowSkipException(f"the candidate's weights (sha256 {trained['weights_sha256'][:16]}) are "
                                   f"{registration.model_name} version {same}'s: nothing registered")


class PromoteOperator(LineageFacets, _PipelineStepOperator):
    """Moves the production alias (champion) to the registered version and the replaced version to the
    previous alias, tagging who, when and why (the gate results). Once per version: a re-run moves nothing."""

    lineage_step = "promote"

    ui_color = "#c8ecd0"
    operator_extra_links = (ModelVersionLink(), EvaluationReportLink())

    def promotion_reason(self, context: Context) -> tuple[str, str, dict[str, Any]]:
        """Who promotes, a one-line why, and the details (JSON on the version)."""
        from trainpipe.steps.register.model_registry import dag_actor, gate_summary

        evaluation = context["ti"].xcom_pull(task_ids=EVALUATE.task_id)
        details = {"dag_id": self.dag_id, "airflow_run_id": context["run_id"], "gates": evaluation["gates"],
                   "gates_passed": evaluation["gates_passed"]}
        actor, reason = dag_actor(self.dag_id, context["run_id"]), gate_summary(evaluation["gates"])
        if self.plan.registration.approval.required:
            from trainpipe.plan.steps import APPROVE_TASK

            # Approved by a person (or by the timeout, with on_timeout: approve): they promote.
            approval = context["ti"].xcom_pull(task_ids=APPROVE_TASK) or {}
            details["approval"] = approval
            actor = f"{approval.get('by', '?')} (approved in {actor})"
            reason = f"{reason}; approved by {approval.get('by', '?')}"
        return actor, reason, details

    def leave_promotion_note(self, context: Context, version: Any, approval: dict[str, Any] | None) -> None:
        """The run's note: the version and the main metric (the spec's first) against the replaced champion's."""
        from trainpipe.state.run_notes import leave_note, promotion_note

        evaluation = context["ti"].xcom_pull(task_ids=EVALUATE.task_id)
        metric = self.plan.evaluation.metrics[0] if self.plan.evaluation.metrics else None
        champion = evaluation.get("champion") or {}
        champion_version = evaluation.get("champion_version")
        leave_note(context["ti"], promotion_note(
            model_name=self.plan.registration.model_name, version=version, alias=self.plan.registration.alias,
            metric=metric, value=(evaluation.get("candidate") or {}).get(metric),
            champion_value=champion.get(metric), champion_version=int(champion_version) if champion_version else None,
            approved_by=approval.get("by") if approval else None))

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from trainpipe.steps.register.model_registry import promote_once

        registered = context["ti"].xcom_pull(task_ids=REGISTER.task_id)
        self.keep_lineage(registered=registered)
        if backtest_of(context) is not None:
            # Register's note says why; run on its own (`airflow tasks test`), promote must not move it either.
            raise AirflowSkipException("a backtest is never promoted (registration.backtest.promote: deny)")
        if not context["ti"].xcom_pull(task_ids=EVALUATE.task_id)["gates_passed"]:
            # The gate task skips this one; run on its own (`airflow tasks test`), it must not promote either.
            raise AirflowSkipException("a gate failed: nothing is promoted")
        actor, reason, details = self.promotion_reason(context)
        registration = self.plan.registration
        promotion = promote_once(self.hook.client, registration.model_name, registered["version"], actor=actor,
                                 reason=reason, details=details, champion_alias=registration.alias,
                                 previous_alias=registration.previous_alias, team=registration.owner_team)
        if promotion.moved:
            self.log.info("%s version %s is now %s (%s: %s)", promotion.model_name, promotion.version, promotion.alias,
                          promotion.previous_alias, promotion.replaced_version or "none")
            self.leave_promotion_note(context, registered["version"], details.get("approval"))
        elif promotion.at:
            self.log.info("%s version %s was promoted before (%s by %s): nothing moved", promotion.model_name,
                          promotion.version, promotion.at, promotion.actor)
        else:
            self.log.info("%s version %s was rejected: nothing moved", promotion.model_name, promotion.version)
        if promotion.moved or promotion.at:  # not for a rejected version: it holds no alias to announce
            self.describe_model_event(context, promotion)
        return promotion.to_dict()

    def describe_model_event(self, context: Context, promotion: Any) -> None:
        """The model asset event says what moved, so a deployment DAG scheduled on it needs no registry look-up:
        ``model``, ``version``, ``alias``, ``previous_version``, ``metrics`` (the candidate's holdout values) and
        ``dataset_digest``. A re-run (nothing moved) describes the version promoted before, as it is."""
        from airflow.sdk import Asset

        evaluation = context["ti"].xcom_pull(task_ids=EVALUATE.task_id) or {}
        extra = {"model": promotion.model_name, "version": promotion.version, "alias": promotion.alias,
                 "previous_version": promotion.replaced_version,
                 "metrics": {name: float(value) for name, value in (evaluation.get("candidate") or {}).items()},
                 "dataset_digest": self.snapshot_info(context).digest}
        for uri in self.plan.task(self.task_id).outlets:  # the model asset (plan.model_asset_uri)
            context["outlet_events"][Asset(uri)].extra = extra
