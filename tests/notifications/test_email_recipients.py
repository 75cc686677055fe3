"""notify.email recipients are single plain addresses: what the platform's domain rule judged is exactly
who gets the mail. An address list or display form hidden in one item (SMTP clients split on ',' and
';' and read '<...>') is refused at the spec, so no message ever goes to the address smuggled in it."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml
from aiosmtpd.controller import Controller

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.notifications.channels import Message, _send_on
from trainpipe.settings import Settings

SMUGGLED = [
    "attacker@evil.com,ml-oncall@example.com",
    "attacker@evil.com>, <ml-oncall@example.com",
    "attacker@evil.com; ml-oncall@example.com",
    "attacker%evil.com@example.com",
    "Mallory <attacker@evil.com>",
    "ml-oncall@example.com (attacker@evil.com)",
    "{{ conn.smtp_default.password }}@example.com",
]


class Inbox:
    def __init__(self) -> None:
        self.envelopes: list = []

    async def handle_DATA(self, server, session, envelope) -> str:
        self.envelopes.append(envelope)
        return "250 OK"


def _spec(tmp_path: Path, to: list[str]) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_approval.yaml").read_text())
    spec["notify"]["email"]["to"] = to
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize("address", SMUGGLED)
def test_an_address_hiding_another_recipient_is_refused_at_its_item(tmp_path: Path, address: str) -> None:
    with pytest.raises(SpecError, match="is not one plain e-mail address") as caught:
        compile_file(_spec(tmp_path, ["risk-ml@example.com", address]), settings=Settings.from_env())
    assert [p.field_path for p in caught.value.problems] == ["notify.email.to[1]"]


def test_plain_addresses_are_exactly_the_recipients_of_the_mail(tmp_path: Path, monkeypatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0, "timeout": 10,
                  "from_email": "trainpipe@example.com"}}))
    plan = compile_file(_spec(tmp_path, ["risk-ml@example.com", "a.b+oncall@sub.example.com"]), settings=Settings.from_env())
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        sent = _send_on(plan.notify.channels, "gate_failure", Message(subject="gate failed", text="auc 0.61"), {})
    finally:
        controller.stop()
    assert sent == ["email"]
    (envelope,) = inbox.envelopes
    assert sorted(envelope.rcpt_tos) == ["a.b+oncall@sub.example.com", "risk-ml@example.com"]
