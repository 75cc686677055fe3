"""A late run is told (issue 33, notify.deadline): `airflow standalone` (scheduler, triggerer, api-server,
LocalExecutor on SQLite) runs a pipeline with `deadline: {within: 20s}` whose `approve` task waits for a person. The
scheduler finds the deadline missed, the triggerer runs trainpipe's callback, and the mail reaches a real SMTP server
(aiosmtpd on 127.0.0.1) through the spec's connection, naming the step the run is in.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from stack.helpers import AirflowClient, wait_for

from trainpipe.demo.synthetic import generate_transactions

from .test_approval import API_PORT, BIN, PASSWORD, USER, _api_up, _env, _spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAG_ID = "deadline_late"
SMTP_CONN = "trainpipe_deadline_smtp"
# Every task of the pipeline: the message names one of them, with its state.
TASKS = ("snapshot", "validate", "train", "watch_checkpoints", "evaluate", "gate", "register", "approve", "promote")


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content))
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _text(message: email.message.Message) -> str:
    [part] = [part for part in message.walk() if part.get_content_type() == "text/html"]
    return part.get_payload(decode=True).decode()


def test_a_run_past_its_deadline_mails_the_step_it_is_in():
    from aiosmtpd.controller import Controller

    if _api_up():
        pytest.fail(f"port {API_PORT} is taken; set TRAINPIPE_TEST_APPROVAL_PORT to a free one")
    inbox, port = _Inbox(), _free_port()
    smtp = Controller(inbox, hostname="127.0.0.1", port=port)
    smtp.start()
    root = Path(tempfile.mkdtemp(prefix="deadline-"))
    configs = root / "dag_configs"
    configs.mkdir()
    # The approval waits an hour: the run is still going when its 20 s are up. The mail channel subscribes to no
    # event of its own: a late run is every channel's concern.
    notify = (f"notify:\n  email: {{to: [oncall@example.com], from_email: trainpipe@example.com, conn_id: {SMTP_CONN}, "
              "events: [promotion]}\n"
              "  deadline: {within: 20s}\n")
    (configs / f"{DAG_ID}.yaml").write_text(_spec(DAG_ID, "{mode: required, timeout: 1h}", notify))
    (root / "airflow").mkdir()
    (root / "airflow" / "passwords.json").write_text(json.dumps({USER: PASSWORD}))
    data = root / "trainpipe" / "storage" / "approval"
    data.mkdir(parents=True)
    generate_transactions(rows=3000, days=20, end=datetime.now(UTC) - timedelta(minutes=5)).to_parquet(
        data / "transactions.parquet", index=False)
    env = {**_env(root, configs), f"AIRFLOW_CONN_{SMTP_CONN.upper()}": json.dumps(
        {"conn_type": "smtp", "host": "127.0.0.1", "port": port,
         "extra": {"disable_tls": True, "disable_ssl": True, "retry_limit": 0, "timeout": 10}})}
    log = (root / "standalone.log").open("wb")
    process = subprocess.Popen([str(BIN / "airflow"), "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                               cwd=root, start_new_session=True)
    passed = False
    try:
        wait_for("the api-server of airflow standalone", _api_up, timeout=300, interval=2)
        airflow = AirflowClient(f"http://127.0.0.1:{API_PORT}", USER, PASSWORD)
        wait_for("the deadline DAG", lambda: DAG_ID in airflow.dag_ids(), timeout=300, interval=2)
        assert airflow.import_errors() == []
        airflow.unpause(DAG_ID)
        run_id = airflow.trigger(DAG_ID)

        [mail] = wait_for("the late run's mail", lambda: inbox.messages[:1], timeout=600, interval=2)

        assert mail["Subject"] == f"[trainpipe] {DAG_ID}: run {run_id} is late (not done within 20s)"
        text = _text(mail)
        assert f"Run {run_id} of {DAG_ID} has not ended within 20s of being queued (notify.deadline): it is at " in text
        steps = re.findall(r"(\w+) \((\w+)\)", text.split("it is at ", 1)[1])
        assert steps and all(task in TASKS for task, _ in steps), text
        assert airflow.dag_run(DAG_ID, run_id)["state"] == "running"  # late, not failed: the message says so
        passed = True
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        smtp.stop()
        if passed:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\ndeadline test: airflow standalone state and logs kept in {root}")
