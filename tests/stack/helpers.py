"""Helpers of the `stack` tier: the test specs, a REST API v2 client, polling with a bound."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from trainpipe_stack import Stack, StackConfig, s3_client

DATA_KEY = "stack_tests/transactions.parquet"  # under the storage root (s3://<bucket>/storage/)
FEATURES = ["amount", "merchant_risk", "hour_of_day", "distance_from_home_km", "transactions_last_24h",
            "account_age_days", "is_foreign"]

T = TypeVar("T")


def spec_yaml(pipeline_id: str, *, schedule: str = "none", epochs: int = 2, every_n_steps: int = 20,
              stall_timeout: str = "10m") -> str:
    """A small binary-classification pipeline on the test data; gates every model passes."""
    features = ", ".join(FEATURES)
    return f"""\
pipeline_id: {pipeline_id}
description: stack tier test pipeline
schedule: "{schedule}"
retries: 1
retry_delay: 5s
data:
  uri: {DATA_KEY}
  time_column: event_time
  window: 30d
validation:
  expectations:
    - expect_column_values_to_not_be_null: {{column: amount}}
    - expect_table_row_count_to_be_between: {{min_value: 100}}
  max_volume_change: 0.5
training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [16]}}
  features: [{features}]
  label: is_fraud
  epochs: {epochs}
  batch_size: 64
  learning_rate: 0.003
  seed: 3
  distributed: {{nproc_per_node: 1, nnodes: 1, strategy: ddp}}
  checkpoint: {{every_n_steps: {every_n_steps}, keep_last: 2, stall_timeout: {stall_timeout}}}
evaluation:
  metrics: [auc]
  gates: ["auc >= 0.5"]
registration:
  model_name: {pipeline_id}
  alias: champion
params:
  epochs:
    description: Passes over the training split for this run
    minimum: 1
    maximum: 100
"""


# The demo data the CLI writes (`trainpipe demo-data`), with a drift check against the last accepted version.
DRIFT_SPEC = spec_yaml("stack_drift", epochs=1).replace(f"uri: {DATA_KEY}", "uri: demo/transactions/transactions.parquet") \
    .replace("  max_volume_change: 0.5\n", "  max_volume_change: 0.5\n  drift:\n    psi: {warn: 0.1, fail: 0.25}\n")


def approval_spec(pipeline_id: str, approval: str, notify: str = "") -> str:
    """A one-epoch pipeline whose ``approve`` task waits for a person (``registration.approval``)."""
    return spec_yaml(pipeline_id, epochs=1).replace(
        "  alias: champion\n", f"  alias: champion\n  approval: {approval}\n{notify}")


# Waits for a person's answer and mails the request through smtp_default (the stack's mail sink).
APPROVAL_SPEC = approval_spec(
    "stack_approval", "{mode: required, timeout: 1h, on_timeout: reject}",
    "notify:\n  email:\n    to: [ml-oncall@example.com]\n    conn_id: smtp_default\n    events: [approval]\n")
# Approved twice, then rolled back. Its mail names a connection nobody defined (as in a fresh install): the
# message is logged as not sent, and the approval and the promotion go on.
APPROVAL_FLOW_SPEC = approval_spec(
    "stack_approval_flow", "required",
    "notify: {email: {to: [oncall@example.com], conn_id: smtp_undefined, events: [approval, promotion]}}\n")
# Nobody answers: the scheduler applies the default (Reject) 5 s after the task began to wait.
APPROVAL_TIMEOUT_SPEC = approval_spec("stack_approval_timeout", "{mode: required, timeout: 5s, on_timeout: reject}")
# The approval waits an hour, so the run is still going when its 20 s are up. The mail channel subscribes to no
# event of its own: a late run is every channel's concern.
DEADLINE_SPEC = approval_spec(
    "stack_deadline", "{mode: required, timeout: 1h}",
    "notify:\n  email: {to: [oncall@example.com], conn_id: smtp_default, events: [promotion]}\n"
    "  deadline: {within: 20s}\n")

# Started together as soon as the stack serves them (tests/stack/test_stack_approval.py): they wait for people,
# so they overlap every other run's work.
APPROVAL_SPECS = {
    "stack_approval": APPROVAL_SPEC,
    "stack_approval_flow": APPROVAL_FLOW_SPEC,
    "stack_approval_timeout": APPROVAL_TIMEOUT_SPEC,
    "stack_deadline": DEADLINE_SPEC,
}

# The specs in the watched folder when the stack starts (the tests drop more).
SPECS = {
    "stack_drift": DRIFT_SPEC,
    **APPROVAL_SPECS,
    "stack_manual": spec_yaml("stack_manual", epochs=2),
    # Long enough to kill the worker after a committed checkpoint and well before the end.
    "stack_retry": spec_yaml("stack_retry", epochs=30, every_n_steps=50),
    "stack_scheduled": spec_yaml("stack_scheduled", schedule="* * * * *", epochs=1),
}


def wait_for(what: str, probe: Callable[[], T | None], *, timeout: float, interval: float = 1.0) -> T:
    """Poll until ``probe`` returns something truthy; fail naming ``what`` (a bound, not a timing claim)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class AirflowClient:
    """Airflow's public REST API v2, as any HTTP client uses it."""

    def __init__(self, base_url: str, username: str, password: str) -> None:
        import requests

        self.base_url = base_url
        self.session = requests.Session()
        response = self.session.post(f"{base_url}/auth/token", json={"username": username, "password": password},
                                     timeout=30)
        response.raise_for_status()
        self.session.headers["Authorization"] = f"Bearer {response.json()['access_token']}"

    def request(self, method: str, path: str, *, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        import requests

        # A read is asked again after a timeout, as a polling client does: on a loaded 2-core machine an
        # api-server sharing SQLite with running tasks has stalled a single read past 60 s (seen in CI).
        # A write is never repeated: it may have taken effect.
        attempts = 3 if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            try:
                response = self.session.request(method, f"{self.base_url}/api/v2{path}", timeout=60, **kwargs)
                break
            except (requests.Timeout, requests.ConnectionError):
                if attempt == attempts:
                    raise
        if response.status_code not in expect:
            raise AssertionError(f"{method} {path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def dag_ids(self) -> set[str]:
        return {dag["dag_id"] for dag in self.request("GET", "/dags", params={"limit": 100})["dags"]}

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG, or None while Airflow does not know it."""
        response = self.session.get(f"{self.base_url}/api/v2/dags/{dag_id}", timeout=60)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def unpause(self, dag_id: str, paused: bool = False) -> None:
        self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        run = self.request("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100, "order_by": "run_after"})["dag_runs"]

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        listing = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti for ti in listing}

    def import_errors(self) -> list[dict[str, Any]]:
        return self.request("GET", "/importErrors", params={"limit": 100})["import_errors"]

    def task_log_tail(self, dag_id: str, run_id: str, task_id: str, try_number: int, lines: int = 25) -> str:
        log = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                           params={"full_content": "true"}, headers={"Accept": "application/json"})
        events = [self._log_line(item) for item in log.get("content", [])]
        return "\n".join(f"    | {event}" for event in events[-lines:])

    @staticmethod
    def _log_line(item: Any) -> str:
        """A structured log line as text; a failure's line carries its exception (``error_detail``)."""
        if not isinstance(item, dict):
            return str(item)
        text = str(item.get("event", ""))
        for error in item.get("error_detail") or ():
            if isinstance(error, dict):
                text += f"\n      {error.get('exc_type')}: {error.get('exc_value')}"
                for frame in (error.get("frames") or ())[-4:]:
                    if isinstance(frame, dict):
                        text += f"\n        at {frame.get('filename')}:{frame.get('lineno')} in {frame.get('name')}"
        return text

    def awaiting_input(self, dag_id: str, run_id: str, *, timeout: float, task_id: str = "approve",
                       settle_seconds: float = 10) -> dict[str, Any]:
        """The task's approval request once it has waited ``settle_seconds`` for an answer; fails early if the
        run ended before asking.

        Answer as a person would, not within the second the task parked (docs/lifecycle.md): Airflow 3.3
        re-queues an answered task at once, and if the scheduler has not yet taken the parking process's own
        "finished" event, it reads that event as "changed externally" and fails the task; with retries the
        next try asks again and the answer is lost (seen in CI when a test answered on the mail's arrival).
        """
        seen_at: list[float] = []

        def probe() -> dict[str, Any] | None:
            tis = self.task_instances(dag_id, run_id)
            if tis.get(task_id, {}).get("state") == "awaiting_input":
                seen_at.append(time.monotonic())
                if seen_at[-1] - seen_at[0] < settle_seconds:
                    return None
                return self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails")
            if self.dag_run(dag_id, run_id)["state"] in ("success", "failed"):
                pytest.fail(f"{dag_id} run {run_id} ended before asking for approval: "
                            + ", ".join(f"{t}={ti['state']}" for t, ti in tis.items()))
            return None

        return wait_for(f"{dag_id} {run_id} to await approval", probe, timeout=timeout, interval=2)

    def answer(self, dag_id: str, run_id: str, option: str, task_id: str = "approve") -> dict[str, Any]:
        return self.request("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/-1/hitlDetails",
                            json={"chosen_options": [option], "params_input": {}})

    def wait_for_run(self, dag_id: str, run_id: str, *, timeout: float,
                     on_poll: Callable[[dict[str, dict[str, Any]]], None] | None = None) -> dict[str, Any]:
        """Wait until the run ends; fail with every task's state and the failed tasks' log tails."""

        def finished() -> dict[str, Any] | None:
            if on_poll is not None:
                on_poll(self.task_instances(dag_id, run_id))
            run = self.dag_run(dag_id, run_id)
            return run if run["state"] in ("success", "failed") else None

        run = wait_for(f"{dag_id} run {run_id} to finish", finished, timeout=timeout, interval=1)
        if run["state"] != "success":
            tis = self.task_instances(dag_id, run_id)
            report = [f"{dag_id} run {run_id} ended {run['state']}; tasks: "
                      + ", ".join(f"{task}={ti['state']}/{ti['try_number']}" for task, ti in tis.items())]
            for task, ti in tis.items():
                if ti["state"] == "failed":
                    report.append(f"  {task} try {ti['try_number']}:\n"
                                  + self.task_log_tail(dag_id, run_id, task, ti["try_number"]))
            pytest.fail("\n".join(report))
        return run


@dataclass(frozen=True)
class RunningStack:
    stack: Stack
    urls: dict[str, str]
    dag_configs: Path

    @property
    def config(self) -> StackConfig:
        return self.stack.config

    def s3(self):
        return s3_client(self.config, self.stack.keys)

    def keys_under(self, prefix: str) -> list[str]:
        s3 = self.s3()
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.config.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def worker_log(self) -> str:
        return (self.config.logs / "airflow-worker.log").read_text(errors="replace")

    def mails(self, subject_prefix: str) -> list[email.message.Message]:
        """The messages in the stack's mail sink whose subject starts with ``subject_prefix``, oldest first."""
        found = [email.message_from_bytes(path.read_bytes()) for path in sorted(self.config.mail.glob("*.eml"))]
        return [message for message in found if (message["Subject"] or "").startswith(subject_prefix)]


def trainpipe_cli(running_stack: RunningStack, *args: str) -> subprocess.CompletedProcess[str]:
    """`source cli.env && trainpipe ARGS`, in a shell with nothing else of the stack's settings."""
    command = f"source {running_stack.config.cli_env_file} && {sys.executable} -m trainpipe.commands.main " + " ".join(args)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(running_stack.config.home),
                               "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
