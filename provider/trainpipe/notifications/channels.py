"""``notify:``: messages on gate failure, task failure, pending approval and promotion, sent through
Airflow's own notifiers (``SmtpNotifier`` of the SMTP provider, ``SlackNotifier`` of the Slack provider),
with the connections the spec names. Credentials stay in those connections.

A message that cannot be sent is logged and never changes the task's outcome: a mail server that is down
must not fail a training run, nor hide the failure the message was about.
"""

from __future__ import annotations

import asyncio
import html
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.errors import MissingExtraError
from trainpipe.plan.model import PROMOTION, TASK_FAILURE

if TYPE_CHECKING:
    from airflow.sdk.bases.notifier import BaseNotifier

    from trainpipe.plan.model import NotifyChannel, NotifyPlan

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    subject: str
    # Paragraphs separated by blank lines.
    text: str
    # The gate table, if any: fixed-width text for Slack, HTML for e-mail.
    table_text: str = ""
    table_html: str = ""

    def as_html(self) -> str:
        paragraphs = "".join(f"<p>{html.escape(p).replace(chr(10), '<br>')}</p>" for p in self.text.split("\n\n"))
        return paragraphs + self.table_html

    def as_slack(self) -> str:
        # Slack reads <...> as a mention (<!channel>) or a link that shows other text (<https://x|Approve>):
        # spec text and run values (an error quoting a trigger's conf) are escaped as Slack asks, & < > alone.
        table = f"\n```\n{_slack_escaped(self.table_text)}\n```" if self.table_text else ""
        return f"*{_slack_escaped(self.subject)}*\n{_slack_escaped(self.text)}{table}"


def _slack_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def notifier(channel: NotifyChannel, message: Message) -> BaseNotifier:
    """Airflow's notifier for ``channel``, with none of its fields a template: the addresses, channel
    and text come from the spec (or hold its text) and are sent as they are, braces included."""
    built = _notifier(channel, message)
    built.template_fields = ()
    return built


def _notifier(channel: NotifyChannel, message: Message) -> BaseNotifier:
    if channel.kind == "email":
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        return SmtpNotifier(to=list(channel.to), from_email=channel.from_email, smtp_conn_id=channel.conn_id,
                            subject=message.subject, html_content=message.as_html())
    if channel.kind == "slack":
        try:
            from airflow.providers.slack.notifications.slack import SlackNotifier
        except ImportError as err:  # the spec stage refuses notify.slack without it; a worker may still lack it
            raise MissingExtraError("notify.slack", "slack", field_path=("notify", "slack")) from err
        return SlackNotifier(slack_conn_id=channel.conn_id, channel=channel.channel, text=message.as_slack())
    raise ValueError(f"unknown notify channel {channel.kind!r}")


def notifiers(notify: NotifyPlan, event: str, message: Message) -> list[BaseNotifier]:
    return [notifier(channel, message) for channel in notify.for_event(event)]


def send(notify: NotifyPlan, event: str, message: Message, context: Any) -> list[str]:
    """Send ``message`` on every channel that subscribes to ``event``; returns the channels that sent it."""
    return _send_on(notify.for_event(event), event, message, context)


def _send_on(channels: Any, event: str, message: Message, context: Any) -> list[str]:
    sent = []
    for channel in channels:
        try:
            # A copy: a notifier merges its fields into the context it is given.
            notifier(channel, message)(dict(context))
        except Exception:
            log.exception("notify.%s (%s): could not send the %s message %r", channel.kind, channel.conn_id, event,
                          message.subject)
        else:
            sent.append(channel.kind)
            log.info("notify.%s: sent the %s message %r", channel.kind, event, message.subject)
    return sent


def _is_gate_failure(error: BaseException | None) -> bool:
    from trainpipe.errors import GatesFailedError

    while error is not None:
        if isinstance(error, GatesFailedError):
            return True
        error = error.__cause__
    return False


class TaskFailureNotification:
    """``on_failure_callback`` of every task: a task failed for good (after its retries).

    A gate failure with ``on_gate_failure: fail`` already sent its own message, with the table.
    """

    def __init__(self, notify: NotifyPlan) -> None:
        self.notify = notify

    def __call__(self, context: Any) -> None:
        error = context.get("exception")
        if _is_gate_failure(error if isinstance(error, BaseException) else None):
            return
        ti = context["ti"]
        subject = f"[trainpipe] {ti.dag_id}: task {ti.task_id} failed"
        lines = [f"Task {ti.task_id} of DAG {ti.dag_id} failed for good (try {ti.try_number}) in run {ti.run_id}."]
        if error:
            lines.append(f"Error: {error}")
        lines.append(f"Log: {ti.log_url}")
        send(self.notify, TASK_FAILURE, Message(subject=subject, text="\n\n".join(lines)), context)


class PromotionNotification:
    """``on_success_callback`` of ``promote``: a message when the production alias moved (not on a re-run
    that found it already there)."""

    def __init__(self, notify: NotifyPlan) -> None:
        self.notify = notify

    def __call__(self, context: Any) -> None:
        ti = context["ti"]
        promoted = ti.xcom_pull(task_ids=ti.task_id) or {}
        if not promoted.get("moved"):
            return
        subject = (f"[trainpipe] {ti.dag_id}: {promoted.get('model_name')} version {promoted.get('version')} "
                   f"is now {promoted.get('alias', 'champion')}")
        previous = promoted.get("replaced_version")
        text = (f"{subject.removeprefix('[trainpipe] ')} (was: {f'version {previous}' if previous else 'none'}), "
                f"promoted by run {ti.run_id}.")
        if promoted.get("reason"):
            text += f"\n\nReason: {promoted['reason']}"
        send(self.notify, PROMOTION, Message(subject=subject, text=text), context)


# The states of a step a late run is in: started, or waiting for something (a retry, a person, its sensor's poke).
_UNDER_WAY = ("running", "queued", "scheduled", "deferred", "up_for_retry", "up_for_reschedule", "awaiting_input",
              "restarting")


# How often, and how far apart, a late run's steps are read while none is under way (a scheduler loop's gap).
_BETWEEN_STEPS_READS = 6
_BETWEEN_STEPS_WAIT_SECONDS = 2.0


def duration_text(seconds: float) -> str:
    """``1h30m``, ``45s``: a wait or a deadline as people write it in a spec."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


def deadline_message(*, dag_id: str, run_id: str, within_seconds: int, states: dict[str, str | None]) -> Message:
    """What a late run's message says: how late, and the steps under way (or that none is)."""
    steps = [f"{task} ({state})" for task, state in states.items() if state in _UNDER_WAY]
    where = f"it is at {', '.join(steps)}" if steps else "no step is under way (see the run in Airflow)"
    within = duration_text(within_seconds)
    return Message(subject=f"[trainpipe] {dag_id}: run {run_id} is late (not done within {within})",
                   text=f"Run {run_id} of {dag_id} has not ended within {within} of being queued "
                        f"(notify.deadline): {where}.")


async def deadline_missed(*, within_seconds: int, channels: list[dict[str, Any]],
                          context: dict[str, Any] | None = None) -> str:
    """The ``notify.deadline`` alert's callback, run by Airflow's triggerer when a run is late: every notify
    channel gets the message (a late run is every channel's concern, whatever its ``events``). Returns the
    message's text, which Airflow keeps as the callback's output."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from asgiref.sync import sync_to_async

    dag_run = (context or {}).get("dag_run") or {}
    dag_id, run_id = dag_run.get("dag_id", "?"), dag_run.get("dag_run_id", "?")
    states: dict[str, str | None] = {}
    for attempt in range(_BETWEEN_STEPS_READS):
        if attempt:
            await asyncio.sleep(_BETWEEN_STEPS_WAIT_SECONDS)
        found = await sync_to_async(RuntimeTaskInstance.get_task_states)(dag_id=dag_id, run_ids=[run_id])
        states = dict(found.get(run_id) or {})
        # Between two steps (one done, the scheduler not yet at the next) none is under way for a moment:
        # read again briefly rather than tell people nothing is happening.
        if any(state in _UNDER_WAY for state in states.values()):
            break
    message = deadline_message(dag_id=dag_id, run_id=run_id, within_seconds=within_seconds, states=states)
    sent = await sync_to_async(_send_on)(deadline_channels(channels), DEADLINE, message, dict(context or {}))
    log.warning("%s (sent on: %s)", message.text, ", ".join(sent) or "no channel")
    return message.text


def deadline_channels(channels: list[dict[str, Any]]) -> list[Any]:
    """The notify channels as the deadline callback's arguments hold them (``dag_builder``: plain data)."""
    from trainpipe.plan.model import NotifyChannel

    return [NotifyChannel(**{**c, "events": tuple(c["events"]), "to": tuple(c["to"])}) for c in channels]


# The name a late run's message goes by in the log; not an event a channel subscribes to.
DEADLINE = "deadline"
