"""The spec's ``notify:`` section."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.types import Duration

NotifyEvent = Literal["gate_failure", "task_failure", "approval", "promotion"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


# One plain address, local@domain.tld: no display name, list, route or comment (nor the RFC's rare
# '{', '|', '}' and '`', which only make an address read as a template). SMTP clients split a
# "recipient" on ',' and ';' and read '<...>' as the address, so anything more would send mail to
# addresses the platform's domain rule never saw.
_PLAIN_ADDRESS = re.compile(
    r"^[A-Za-z0-9!#$&'*+/=?^_~-]+(\.[A-Za-z0-9!#$&'*+/=?^_~-]+)*"
    r"@[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)+$"
)


def _plain_address(address: str) -> str:
    if not _PLAIN_ADDRESS.fullmatch(address):
        raise ValueError(
            f"{address!r} is not one plain e-mail address (name@example.com): no display name, '<>', ',', ';', '%', "
            "spaces or comments; list several recipients as separate items"
        )
    return address


EmailAddress = Annotated[str, AfterValidator(_plain_address)]


class EmailNotifySpec(SpecModel):
    to: Annotated[list[EmailAddress], BeforeValidator(_one_or_many)] = Field(
        min_length=1,
        description="Recipient address, or a list of them.",
        examples=[["ml-oncall@example.com"]],
    )
    conn_id: str = Field(
        default="smtp_default",
        description="Airflow SMTP connection (host, port, login, password, TLS): credentials stay in Airflow, never in YAML.",
        examples=["smtp_default"],
    )
    from_email: EmailAddress | None = Field(
        default=None,
        description="Sender address; the connection's `from_email` extra when omitted.",
        examples=["trainpipe@example.com"],
    )
    # Not `on`: YAML 1.1 reads that key as the boolean true.
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS),
        min_length=1,
        description="Which events send a message: gate_failure (with the gate table), task_failure (a task failed "
        "for good, after its retries), approval (a version waits for a person's approval), promotion (a version "
        "became the production alias). All four by default.",
        examples=[["gate_failure", "task_failure"]],
    )


class SlackNotifySpec(SpecModel):
    channel: str = Field(min_length=1, description="Slack channel to post to.", examples=["#ml-alerts"])
    conn_id: str = Field(
        default="slack_api_default",
        description="Airflow Slack API connection (the bot token lives there, never in YAML). Needs the Slack "
        "provider: pip install apache-airflow-providers-slack.",
        examples=["slack_api_default"],
    )
    events: list[NotifyEvent] = Field(
        default_factory=lambda: list(NOTIFY_EVENTS),
        min_length=1,
        description="Which events post a message; see notify.email.events.",
        examples=[["gate_failure", "promotion"]],
    )


class DeadlineSpec(SpecModel):
    within: Duration = Field(
        description="How long after the run was queued it must have ended: then an Airflow Deadline Alert sends the "
        "notify channels a message naming the step the run is in. The platform may cap it "
        "(limits.max_deadline_within).",
        examples=["6h"],
    )


class NotifySpec(SpecModel):
    email: EmailNotifySpec | None = Field(
        default=None, description="E-mail through Airflow's SMTP provider (SmtpNotifier).",
        examples=[{"to": "ml-oncall@example.com", "conn_id": "smtp_default"}],
    )
    slack: SlackNotifySpec | None = Field(
        default=None, description="Slack through Airflow's Slack provider (SlackNotifier).",
        examples=[{"channel": "#ml-alerts"}],
    )
    deadline: DeadlineSpec | None = Field(
        default=None, description="A run still going this long after it was queued is late: every channel above is "
        "told, with the step the run is in (Airflow Deadline Alerts, Airflow 3.1 or later).",
        examples=[{"within": "6h"}],
    )

    @model_validator(mode="after")
    def _some_channel(self) -> NotifySpec:
        if self.email is None and self.slack is None:
            raise ValueError("name at least one channel: email (to, conn_id) or slack (channel, conn_id)")
        return self
