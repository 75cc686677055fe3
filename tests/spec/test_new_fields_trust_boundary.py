"""The fields issues 32 to 35 added, at the trust boundary: a Jinja template, a path or a foreign value in
any of them is refused with a located error and leaves no DAG (the folder's other specs compile), or, in a
free-text field that is accepted, reaches what it feeds as written (a late run's mail).
The policy caps these issues name are tested in tests/policy/test_spec_rules.py."""

from __future__ import annotations

import email
import json
import socket
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_directory, compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings

PASSWORD = "pw-7d21a0-never-shown"
TEMPLATE = "{{ conn.leak.password }}"
# A template an SMTP server would take as an address's local part (braces are valid there): the spec
# refuses it; the deadline mail then goes to a plain address, as written.
TEMPLATED_ADDRESS = "{{conn.leak.password}}@example.com"
ADDRESS = "late-runs@example.com"
K8S = ("training", "kubernetes")


def _set(spec: dict, path: tuple[str, ...], value: object) -> None:
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _write(folder: Path, example: str, name: str, path: tuple[str, ...] | None = None, value: object = None,
           **top: object) -> Path:
    spec = yaml.safe_load((REPO / "dag_configs" / example).read_text())
    spec["pipeline_id"] = name
    spec.update(top)
    if path is not None:
        _set(spec, path, value)
    file = folder / f"{name}.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return file


# (example, field path, value): each is refused where it is written.
REFUSED = [
    ("fraud_detector.yaml", ("training", "cache", "max_age"), TEMPLATE),
    ("fraud_detector.yaml", ("training", "early_stopping", "metric"), TEMPLATE),
    ("fraud_detector.yaml", ("training", "early_stopping", "metric"), "../validation_loss"),
    ("fraud_detector.yaml", ("evaluation", "gates"), [f"auc >= baseline + {TEMPLATE}"]),
    ("fraud_detector.yaml", ("evaluation", "gates"), [f"{TEMPLATE} >= baseline"]),
    ("fraud_detector.yaml", ("registration", "backtest"), {"register": True, "alias": "../champion"}),
    ("fraud_detector.yaml", ("registration", "model_name"), "../fraud_detector"),
    ("fraud_detector_tuned.yaml", ("tuning", "warm_start"), TEMPLATE),
    ("fraud_detector_tuned.yaml", ("tuning", "warm_start"), "../previous_study"),
    ("fraud_detector_tuned.yaml", ("tuning", "metric"), TEMPLATE),
    ("search_ranker_gpu.yaml", (*K8S, "on_oom"), {"max_memory": f"128Gi{TEMPLATE}"}),
    ("search_ranker_gpu.yaml", (*K8S, "capacity"), {"spot": {"node_selector": {"a": "b"}},
                                                   "on_demand": {"node_selector": {"a": "c"}},
                                                   "on_demand_after_preemptions": TEMPLATE}),
    # A capacity's node labels and taint values are Kubernetes label values: a template is none.
    ("search_ranker_gpu.yaml", (*K8S, "capacity"), {"spot": {"node_selector": {"pool": TEMPLATE}},
                                                   "on_demand": {"node_selector": {"pool": "on-demand"}}}),
    ("search_ranker_gpu.yaml", (*K8S, "capacity"), {"spot": {"tolerations": [
        {"key": "spot", "operator": "Equal", "value": TEMPLATE, "effect": "NoSchedule"}]}, "on_demand": {}}),
]


@pytest.mark.parametrize(("example", "path", "value"), REFUSED,
                         ids=[f"{'.'.join(p)}={v!r}"[:60] for _, p, v in REFUSED])
def test_a_template_path_or_foreign_value_is_refused_where_written_and_leaves_no_dag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: str, path: tuple[str, ...], value: object):
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    _write(tmp_path, example, "other")
    bad = _write(tmp_path, example, "bad", path, value)
    result = compile_directory(tmp_path, settings=Settings.from_env())

    assert {plan.dag_id for plan in result.plans.values()} == {"other"}  # the bad spec has no DAG, the folder does
    (error,) = result.errors.values()
    field = ".".join(path)
    problems = [p for p in error.problems if p.field_path.startswith(field)]
    assert problems, str(error)
    lines = bad.read_text().splitlines()
    # Located at the line that wrote it: the key's own line, or for a list item the line below the key.
    keys = [(p, p.field_path.rsplit(".", 1)[-1].split("[")[0]) for p in problems]
    assert all(key in lines[p.line - 1] or key in lines[p.line - 2] for p, key in keys), (str(error), problems)
    assert f"{bad.name}:" in str(error)


class _Inbox:
    def __init__(self) -> None:
        self.envelopes: list = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        return "250 OK"


def test_a_late_run_s_mail_goes_to_the_spec_s_address_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """notify.deadline: the DAG's Deadline Alert keeps the channels as plain data; the callback's sending (the
    triggerer's, with a context whose `conn` resolves connections) mails a real SMTP server the address as the
    spec wrote it, never the connection's password."""
    from aiosmtpd.controller import Controller
    from airflow.sdk.execution_time.context import ConnectionAccessor

    from trainpipe.dags.builder import build_dag
    from trainpipe.notifications.channels import DEADLINE, _send_on, deadline_channels, deadline_message

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", json.dumps({"conn_type": "generic", "login": "u", "password": PASSWORD}))
    monkeypatch.setenv("AIRFLOW_CONN_DEADLINE_SMTP", json.dumps(
        {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
         "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0, "timeout": 10}}))
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    templated = {"email": {"to": [TEMPLATED_ADDRESS], "conn_id": "deadline_smtp"}, "deadline": {"within": "1h"}}
    with pytest.raises(SpecError, match="is not one plain e-mail address") as refused:
        compile_file(_write(tmp_path, "fraud_detector.yaml", "late", notify=templated), settings=Settings.from_env())
    assert [p.field_path for p in refused.value.problems] == ["notify.email.to[0]"]
    notify = {"email": {"to": [ADDRESS], "from_email": ADDRESS, "conn_id": "deadline_smtp"}, "deadline": {"within": "1h"}}
    plan = compile_file(_write(tmp_path, "fraud_detector.yaml", "late", notify=notify), settings=Settings.from_env())
    deadline = build_dag(plan).deadline
    kwargs = (deadline[0] if isinstance(deadline, list) else deadline).callback.kwargs
    assert list(kwargs["channels"][0]["to"]) == [ADDRESS]

    inbox = _Inbox()
    smtp = Controller(inbox, hostname="127.0.0.1", port=port)
    smtp.start()
    try:
        message = deadline_message(dag_id="late", run_id="manual__1", within_seconds=3600, states={"train": "running"})
        sent = _send_on(deadline_channels(kwargs["channels"]), DEADLINE, message, {"conn": ConnectionAccessor()})
    finally:
        smtp.stop()
    assert sent == ["email"]
    (envelope,) = inbox.envelopes
    assert envelope.rcpt_tos == [ADDRESS] and envelope.mail_from == ADDRESS
    mail = email.message_from_bytes(envelope.content)
    assert mail["To"] == ADDRESS
    assert PASSWORD.encode() not in envelope.content
