"""The parts of `make stack` a user's shell meets, without starting the whole stack: `cli.env` (what it exports
and that a shell can source it) and the mail sink behind `smtp_default` (a real process, mail sent through
Airflow's SMTP provider with the connection the stack defines)."""

from __future__ import annotations

import email
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trainpipe_stack as stack

KEYS = {"postgres_password": "pg-secret", "airflow_db_password": "af-secret", "mlflow_db_password": "ml-secret",
        "admin_password": "admin-secret", "jwt_secret": "jwt-secret", "fernet_key": "fernet-key-value",
        "s3_access_key": "trainpipe", "s3_secret_key": "s3 secret with 'quotes' and $dollar"}


def test_cli_env_points_every_client_at_the_stack_and_sources_in_a_shell(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("AIRFLOW", "TRAINPIPE_", "MLFLOW_", "AWS_")):
            monkeypatch.delenv(key)
    config = stack.StackConfig.from_env({"TRAINPIPE_STACK_HOME": str(tmp_path / "state")})
    values = stack.cli_env(config, KEYS)
    path = tmp_path / "cli.env"
    path.write_text(stack.cli_env_text(values))

    # What a shell sees after `source cli.env`.
    shown = subprocess.run(["bash", "-c", f"source {path} && env -0"], capture_output=True, check=True).stdout
    exported = dict(item.split("=", 1) for item in shown.decode().split("\0") if "=" in item)
    services = stack.airflow_env(config, KEYS)
    for key in ("TRAINPIPE_STORAGE_ROOT", "TRAINPIPE_STORAGE_CONN_ID", "MLFLOW_TRACKING_URI", "TRAINPIPE_DAG_CONFIGS",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW_CONN_SMTP_DEFAULT"):
        assert exported[key] == services[key], key
    assert exported["TRAINPIPE_STORAGE_ROOT"] == "s3://trainpipe/storage"
    connection = json.loads(exported["AIRFLOW_CONN_TRAINPIPE_S3"])
    assert connection["login"] == "trainpipe" and connection["password"] == KEYS["s3_secret_key"]
    assert connection["extra"] == {"endpoint_url": config.s3_url, "region_name": "us-east-1"}
    # The keys travel in the connection only.
    assert not [key for key in exported if key.startswith("AWS_")]
    assert all(line.startswith(("#", "export ")) for line in path.read_text().splitlines())


def test_the_stack_defines_the_connections_the_examples_name():
    import re

    named = set()
    for spec in (Path(__file__).resolve().parents[2] / "dag_configs").glob("*.yaml"):
        named |= set(re.findall(r"conn_id:\s*([A-Za-z0-9_]+)", spec.read_text()))
    config = stack.StackConfig.from_env({})
    defined = {key.removeprefix("AIRFLOW_CONN_").lower() for key in stack.airflow_env(config, KEYS)
               if key.startswith("AIRFLOW_CONN_")} | {stack.S3_CONN_ID}
    assert named and named <= defined, named - defined


@pytest.mark.integration
def test_mail_sent_through_smtp_default_lands_as_a_file_in_the_sink(tmp_path, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tmp_path / "mail"
    sink = subprocess.Popen([sys.executable, stack.__file__, "mail-sink", "--port", str(port),
                             "--folder", str(folder)])
    try:
        deadline = time.monotonic() + 60
        while not stack._smtp_ready(port):
            assert sink.poll() is None and time.monotonic() < deadline, "the mail sink did not start"
            time.sleep(0.2)
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", stack.smtp_connection("127.0.0.1", port))
        from airflow.providers.smtp.hooks.smtp import SmtpHook

        with SmtpHook(smtp_conn_id="smtp_default") as hook:
            # No sender given, as in the example specs: the connection's from_email.
            hook.send_email_smtp(to="ml-oncall@example.com", subject="[trainpipe] approve?",
                                 html_content="<p>version 3</p>")
    finally:
        sink.terminate()
        assert sink.wait(timeout=30) == 0
    [stored] = list(folder.glob("*.eml"))
    message = email.message_from_bytes(stored.read_bytes())
    assert message["Subject"] == "[trainpipe] approve?" and message["To"] == "ml-oncall@example.com"
    assert message["From"] == "trainpipe@localhost"
    assert not list(folder.glob(".*.partial"))
