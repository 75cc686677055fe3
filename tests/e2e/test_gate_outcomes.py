"""A failed gate cannot be missed: real dag.test() runs, a real SMTP server (aiosmtpd) on 127.0.0.1, the
SMTP provider's notifier through an Airflow connection, and the run note written by trainpipe's listener."""

from __future__ import annotations

import email
import json
import socket
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path

import pytest

from tests.support import load_dag, run_dag
from trainpipe.demo.synthetic import generate_transactions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 7, 31, tzinfo=UTC)
SMTP_CONN = "trainpipe_test_smtp"


def _spec(pipeline_id: str, *, on_gate_failure: str, notify: str = "") -> str:
    return f"""\
pipeline_id: {pipeline_id}
schedule: none
retries: 1
retry_delay: 5s
data:
  uri: gate_outcomes/transactions.parquet
  time_column: event_time
  window: 30d
training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [8]}}
  features: [amount, merchant_risk, hour_of_day, distance_from_home_km, transactions_last_24h, account_age_days, is_foreign]
  label: is_fraud
  epochs: 1
  batch_size: 128
  distributed: {{nproc_per_node: 1}}
  checkpoint: {{every_n_steps: 50}}
evaluation:
  metrics: [auc, f1]
  gates: ["auc >= 0.9999", "f1 >= 0.0"]   # no model reaches the first one
  on_gate_failure: {on_gate_failure}
registration:
  model_name: {pipeline_id}
{notify}"""


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 OK"


@pytest.fixture(scope="module")
def smtp_server():
    from aiosmtpd.controller import Controller

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def configs(state_dir: Path, airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = state_dir / "storage" / "gate_outcomes"
    data.mkdir(parents=True, exist_ok=True)
    generate_transactions(rows=3000, days=20, end=END).to_parquet(data / "transactions.parquet", index=False)
    folder = tmp_path_factory.mktemp("gate_configs")
    notify = f"""notify:
  email:
    to: [ml-oncall@example.com]
    from_email: trainpipe@example.com
    conn_id: {SMTP_CONN}
    events: [gate_failure, task_failure]
"""
    (folder / "gate_fail.yaml").write_text(_spec("gate_fail", on_gate_failure="fail", notify=notify))
    (folder / "gate_skip.yaml").write_text(_spec("gate_skip", on_gate_failure="skip"))
    return folder


def _run(configs: Path, monkeypatch: pytest.MonkeyPatch, dag_id: str):
    return run_dag(load_dag(configs, dag_id, monkeypatch), logical_date=END)


def _note(dag_id: str, run_id: str) -> str | None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return DagRun.find(dag_id=dag_id, run_id=run_id, session=session)[0].note


def _html(message: Message) -> str:
    parts = [part for part in message.walk() if part.get_content_type() == "text/html"]
    return parts[0].get_payload(decode=True).decode()


def test_on_gate_failure_fail_fails_the_run_and_mails_the_gate_table(configs, smtp_server, monkeypatch, capfd):
    inbox, port = smtp_server
    # The connection the spec names; no credentials in the spec (this server takes none).
    monkeypatch.setenv(f"AIRFLOW_CONN_{SMTP_CONN.upper()}", json.dumps(
        {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
         "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0, "timeout": 10}}))

    dag_run, states = _run(configs, monkeypatch, "gate_fail")

    assert dag_run.state == "failed"
    assert states["evaluate"] == "success"
    assert states["gate"] == "failed"
    assert states["register"] == states["promote"] == "upstream_failed"
    # Exactly one message: the gate's, with the table; task_failure does not repeat it for the gate task.
    assert len(inbox.messages) == 1, [m["Subject"] for m in inbox.messages]
    [message] = inbox.messages
    assert message["Subject"] == "[trainpipe] gate_fail: gates failed, nothing registered, run failed"
    assert message["To"] == "ml-oncall@example.com"
    body = _html(message)
    assert "<th align=\"left\">candidate</th>" in body and "champion (none)" in body
    assert "FAIL auc &gt;= 0.9999" in body and "PASS f1 &gt;= 0" in body
    # The task log has a WARNING with the whole table (Airflow's task logger writes to stdout under dag.test()).
    log = capfd.readouterr().out
    warning = log[log.index("[warning  ] gates failed: the candidate for gate_fail is not registered"):]
    assert warning.splitlines()[1].split() == ["metric", "candidate", "champion", "(none)", "change", "baseline",
                                               "(logistic", "regression)", "gates"]
    assert "FAIL auc >= 0.9999" in warning.splitlines()[2]
    assert _note("gate_fail", dag_run.run_id).startswith("gates failed (1 of 2): auc >= 0.9999 (got 0.")
    import mlflow

    assert mlflow.MlflowClient().search_model_versions("name='gate_fail'") == []


def test_on_gate_failure_skip_succeeds_without_registering_and_notes_why(configs, monkeypatch):
    dag_run, states = _run(configs, monkeypatch, "gate_skip")

    assert dag_run.state == "success"
    assert states["gate"] == "success"  # short-circuited
    assert states["register"] == states["promote"] == "skipped"
    note = _note("gate_skip", dag_run.run_id).splitlines()[0]  # the reason; the training's cost follows
    assert note.startswith("gates failed (1 of 2): auc >= 0.9999 (got 0.") and note.endswith("; nothing registered")
