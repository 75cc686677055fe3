"""The ``approve`` task (``registration.approval: required``): Airflow's own human-in-the-loop ``ApprovalOperator``.

The task waits in ``awaiting_input`` without holding a worker; a person answers in the UI (Browse -> Required
Actions) or through the REST API (``PATCH .../taskInstances/approve/-1/hitlDetails``). Its body shows the gate
table (candidate vs champion per metric) and where the evaluation report is. Approve lets ``promote`` run;
Reject (or no answer within the timeout, with ``on_timeout: reject``) tags the version rejected, keeps it
``challenger`` and skips ``promote``. The step's own work (the body, who answered, the rejection) is
``trainpipe.steps.approval``'s.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from trainpipe.operators.context import TaskSettings, backtest_of
from trainpipe.operators.literal import LiteralFields
from trainpipe.plan.steps import EVALUATE, REGISTER

if TYPE_CHECKING:
    from airflow.sdk import Context

    from trainpipe.plan.model import PipelinePlan


class ApproveOperator(TaskSettings, LiteralFields, ApprovalOperator):
    ui_color = "#fff3c4"

    def __init__(self, *, plan: PipelinePlan, **kwargs: Any) -> None:
        approval = plan.registration.approval
        registration = plan.registration
        super().__init__(
            subject=f"Promote the new {registration.model_name} version to {registration.alias}?",
            # The answer applied when the timeout passes (the scheduler's awaiting-input sweep).
            defaults=[self.REJECT if approval.on_timeout == "reject" else self.APPROVE],
            response_timeout=approval.timeout,
            **kwargs,
        )
        self.plan = plan

    @functools.cached_property
    def hook(self):
        from trainpipe.hooks.mlflow import MlflowHook

        return MlflowHook(self.settings)

    def execute(self, context: Context) -> Any:
        from trainpipe.notifications.channels import Message, send
        from trainpipe.plan.model import APPROVAL
        from trainpipe.steps.approval import approval_body

        ti = context["ti"]
        if backtest_of(context) is not None:
            from airflow.sdk.exceptions import AirflowSkipException

            # Nobody is asked about a version that is never promoted (registration.backtest.promote: deny).
            raise AirflowSkipException("a backtest is never promoted: no approval asked")
        registered = ti.xcom_pull(task_ids=REGISTER.task_id)
        evaluation = ti.xcom_pull(task_ids=EVALUATE.task_id)
        registration = self.plan.registration
        self.subject = (f"Promote {registration.model_name} version {registered['version']} "
                        f"to {registration.alias}?")
        self.body = approval_body(self.plan, registered, evaluation, mlflow_run_page=self._mlflow_run_page(evaluation))
        link = self._required_actions_link(context)
        text = (f"{registration.model_name} version {registered['version']} passed its gates and waits for "
                f"approval to become {registration.alias} (run {ti.run_id} of {ti.dag_id})."
                + (f"\n\nAnswer in Airflow: {link}" if link else "\n\nAnswer in Airflow: Browse -> Required Actions."))
        # Sent here rather than through the operator's own notifiers, which raise on a failed send: a mail
        # server that is down (or an SMTP connection not yet defined) must not fail the approval.
        send(self.plan.notify, APPROVAL, Message(subject=f"[trainpipe] {self.subject}", text=text), context)
        self.notifiers = []
        return super().execute(context)

    def _required_actions_link(self, context: Context) -> str | None:
        try:
            return self.generate_link_to_ui_from_context(context=context)
        except ValueError:  # no [api] base_url configured
            return None

    def _mlflow_run_page(self, evaluation: dict[str, Any]) -> str | None:
        """The MLflow UI page of the run that holds the report, when the tracking store is a server."""
        report = evaluation.get("report") or {}
        tracking = self.hook.settings.mlflow_tracking_uri
        if not report.get("run_id") or not tracking or not tracking.startswith(("http://", "https://")):
            return None
        try:
            experiment = self.hook.client.get_run(report["run_id"]).info.experiment_id
        except Exception:  # the body is still useful without the link
            self.log.warning("could not look up the MLflow run %s for the report link", report["run_id"], exc_info=True)
            return None
        return f"{tracking.rstrip('/')}/#/experiments/{experiment}/runs/{report['run_id']}"

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        from airflow.sdk.exceptions import DownstreamTasksSkipped

        try:
            answer = super().execute_complete(context=context, event=event)
        except DownstreamTasksSkipped:
            # Reject: the operator skips promote by raising; record the rejection first.
            self._record(context, event, approved=False)
            raise
        return self._record(context, event, approved=answer["chosen_options"] == [self.APPROVE])

    def _record(self, context: Context, event: dict[str, Any], *, approved: bool) -> dict[str, Any]:
        from trainpipe.state.run_notes import leave_note
        from trainpipe.steps.approval import answer_of, reject_version

        answer = answer_of(self.plan.registration.approval, event)
        ti = context["ti"]
        registration = self.plan.registration
        name, version = registration.model_name, ti.xcom_pull(task_ids=REGISTER.task_id)["version"]
        if approved:
            # The run's note names the approver in promote's line (the promotion is the run's outcome).
            self.log.info("%s version %s approved by %s", name, version, answer.actor)
        else:
            line = reject_version(self.hook.client, registration, version, answer, dag_id=ti.dag_id, run_id=ti.run_id)
            self.log.warning("%s version %s rejected by %s: it stays %s, nothing is promoted", name, version,
                             answer.actor, registration.challenger_alias)
            leave_note(ti, line)
        return {"approved": approved, "by": answer.actor, "timed_out": answer.timed_out, "version": version,
                "responded_at": answer.at}
