"""The ``approve`` step (``registration.approval: required``): what the person reads before answering, who answered,
and what a rejection does. Airflow-free: the operator (``trainpipe.operators.approval.ApproveOperator``, Airflow's
own HITL ``ApprovalOperator``) waits for the answer and passes it in.

Approve lets ``promote`` run; Reject (or no answer within the timeout, with ``on_timeout: reject``) tags the version
rejected, keeps it ``challenger`` and leaves a line in the run's note.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainpipe.plan.model import ApprovalPlan, PipelinePlan, RegistrationPlan


def _duration(seconds: float) -> str:
    from trainpipe.notifications.channels import duration_text

    return duration_text(seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """Who answered the approval request, read from the HITL event."""

    # A person's name (or id), or the timeout and its policy when nobody answered.
    actor: str
    timed_out: bool
    # How long the request waited when nobody answered (the timeout, or "none"); None for a person's answer.
    waited: str | None
    # When the answer came (ISO text), if the event says.
    at: str | None


def answer_of(approval: ApprovalPlan, event: dict[str, Any]) -> Answer:
    timed_out = bool(event.get("timedout"))
    user = event.get("responded_by_user") or {}
    waited = None
    if timed_out or not user:
        waited = _duration(approval.timeout.total_seconds()) if approval.timeout else "none"
        actor = f"timeout ({waited}, on_timeout: {approval.on_timeout})"
    else:
        actor = str(user.get("name") or user.get("id"))
    responded_at = event.get("responded_at")
    at = responded_at.isoformat() if hasattr(responded_at, "isoformat") else responded_at
    return Answer(actor=actor, timed_out=timed_out, waited=waited, at=at)


def reject_version(client: Any, registration: RegistrationPlan, version: Any, answer: Answer, *, dag_id: str,
                   run_id: str) -> str:
    """Tag the version rejected (it keeps the challenger alias) and return the run note's line."""
    from trainpipe.state.run_notes import approval_note
    from trainpipe.steps.register.model_registry import reject

    reject(client, registration.model_name, version, actor=answer.actor,
           reason=f"approval rejected in Airflow (DAG {dag_id}, run {run_id})")
    return approval_note(model_name=registration.model_name, version=version, at=answer.at,
                         challenger_alias=registration.challenger_alias,
                         rejected_by=None if answer.waited is not None else answer.actor, waited=answer.waited)


def approval_body(plan: PipelinePlan, registered: dict[str, Any], evaluation: dict[str, Any], *,
                  mlflow_run_page: str | None = None) -> str:
    """The Markdown the person reads before answering: what is asked, the gate table, the report."""
    from trainpipe.steps.evaluate.gate_table import as_markdown, gate_table
    from trainpipe.steps.register.model_registry import report_uri

    registration = plan.registration
    approval = registration.approval
    table = gate_table(evaluation)
    champion = (f"version {table.champion_version}" if table.champion_version is not None else "no version yet")
    version = registered["version"]
    lines = [
        f"**{registration.model_name}** version **{version}** passed its gates and waits for your approval to "
        f"become `{registration.alias}` (now: {champion}).",
        "",
        as_markdown(table),
        "",
    ]
    report = report_uri(evaluation)
    if report:
        lines.append(f"Evaluation report: `{report}`"
                     + (f" ([MLflow run]({mlflow_run_page}), artifacts: evaluation/)" if mlflow_run_page else ""))
    else:
        lines.append("Evaluation report: none for this run.")
    lines += [
        "",
        f"- **Approve**: version {version} becomes `{registration.alias}`"
        + (f", version {table.champion_version} becomes `{registration.previous_alias}`."
           if table.champion_version is not None else "."),
        f"- **Reject**: version {version} stays `{registration.challenger_alias}`, tagged `trainpipe.rejected`; "
        "nothing is promoted.",
    ]
    if approval.timeout is not None:
        lines.append(f"- No answer within {_duration(approval.timeout.total_seconds())}: "
                     f"{'rejected' if approval.on_timeout == 'reject' else 'approved'} (on_timeout: {approval.on_timeout}).")
    return "\n".join(lines)
