"""The `trainpipe` CLI on an s3:// storage root (moto's S3 server on 127.0.0.1), run as a user runs it: a
separate process, settings from the environment only (what `source .trainpipe/stack/cli.env` exports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.moto_s3 import moto_s3_server
from tests.support import REPO

pytestmark = pytest.mark.integration

BUCKET = "trainpipe"
CONN_ID = "trainpipe_s3"
ROOT = f"s3://{BUCKET}/storage"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_s3_server() as url:
        import boto3

        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        yield url


def _connection(endpoint: str, *, login: str | None = "testing") -> str:
    conn: dict = {"conn_type": "aws", "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    if login:
        conn.update(login=login, password="testing")
    return json.dumps(conn)


def _env(tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """No AWS credentials but the ones given (no ~/.aws, no instance metadata)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW_CONN_", "TRAINPIPE_STORAGE"))}
    env.update({"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                "TRAINPIPE_STORAGE_ROOT": ROOT, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def _trainpipe(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainpipe.commands.main", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _objects(endpoint: str, prefix: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def test_demo_data_writes_to_the_s3_root_and_no_local_folder(endpoint, tmp_path):
    env = _env(tmp_path, TRAINPIPE_STORAGE_CONN_ID=CONN_ID, AIRFLOW_CONN_TRAINPIPE_S3=_connection(endpoint))
    work = tmp_path / "work"
    work.mkdir()

    done = _trainpipe(["demo-data", "--drift", "amount", "--force", "--end", "2026-06-30"], env, work)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:6] == [
        f"transactions: {ROOT}/demo/transactions/transactions.parquet (connection {CONN_ID})",
        f"clicks: {ROOT}/demo/clicks/clicks.parquet (connection {CONN_ID})",
        f"digits: {ROOT}/demo/digits/digits.parquet (connection {CONN_ID})",
        f"tickets: {ROOT}/demo/tickets/tickets.parquet (connection {CONN_ID})",
        f"instructions: {ROOT}/demo/instructions/instructions.parquet (connection {CONN_ID})",
        f"tiny-lm: {ROOT}/demo/models/tiny-lm (connection {CONN_ID})",
    ]
    assert set(_objects(endpoint, "storage/demo/")) == {"storage/demo/transactions/transactions.parquet",
                                                        "storage/demo/clicks/clicks.parquet",
                                                        "storage/demo/digits/digits.parquet",
                                                        "storage/demo/tickets/tickets.parquet",
                                                        "storage/demo/instructions/instructions.parquet",
                                                        *(f"storage/demo/models/tiny-lm/{name}" for name in (
                                                            "config.json", "generation_config.json",
                                                            "model.safetensors", "tokenizer.json",
                                                            "tokenizer_config.json"))}
    assert list(work.iterdir()) == []  # no folder named "s3:"
    # The stored data is the drifted day: the same bytes a local run writes.
    local = _trainpipe(["demo-data", "--drift", "amount", "--end", "2026-06-30", "--out", str(tmp_path / "local")],
                       env, work)
    assert local.returncode == 0, local.stderr
    import boto3

    stored = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing").get_object(
        Bucket=BUCKET, Key="storage/demo/transactions/transactions.parquet")["Body"].read()
    assert stored == (tmp_path / "local" / "transactions" / "transactions.parquet").read_bytes()


def test_datasets_lists_the_versions_stored_under_the_s3_root(endpoint, tmp_path, monkeypatch):
    from trainpipe.compile.compiler import compile_file
    from trainpipe.settings import Settings
    from trainpipe.steps.snapshot import take_snapshot

    env = _env(tmp_path, TRAINPIPE_STORAGE_CONN_ID=CONN_ID, AIRFLOW_CONN_TRAINPIPE_S3=_connection(endpoint))
    work = tmp_path / "work"
    work.mkdir()
    assert _trainpipe(["demo-data", "--end", "2026-06-30", "--force"], env, work).returncode == 0
    # Two versions, written by the snapshot task's own code on the same root.
    for name in ("TRAINPIPE_STORAGE_ROOT", "TRAINPIPE_STORAGE_CONN_ID", "AIRFLOW_CONN_TRAINPIPE_S3"):
        monkeypatch.setenv(name, env[name])
    plan = compile_file(REPO / "dag_configs" / "fraud_detector.yaml", settings=Settings.from_env())
    digests = {take_snapshot("fraud_detector", plan.data, settings=Settings.from_env(),
                             logical_date=datetime(2026, 6, day, tzinfo=UTC)).digest for day in (20, 30)}

    listed = _trainpipe(["datasets", "fraud_detector"], env, work)

    assert listed.returncode == 0, listed.stderr
    headers = [line for line in listed.stdout.splitlines() if line.startswith("fraud_detector version ")]
    assert {line.split()[2] for line in headers} == {d[:16] for d in digests}
    storage_lines = [line.split(":", 1)[1].strip() for line in listed.stdout.splitlines()
                     if line.strip().startswith("storage:")]
    assert storage_lines and all(line.startswith(f"{ROOT}/snapshots/fraud_detector/") for line in storage_lines)
    assert f"{CONN_ID}@" not in listed.stdout


def _one_line_error(done: subprocess.CompletedProcess[str], command: str) -> str:
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"trainpipe {command}: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_an_undefined_connection_is_one_line_naming_it(endpoint, tmp_path):
    env = _env(tmp_path, TRAINPIPE_STORAGE_CONN_ID=CONN_ID)  # no AIRFLOW_CONN_TRAINPIPE_S3

    for command in (["demo-data", "--force"], ["datasets", "fraud_detector"]):
        line = _one_line_error(_trainpipe(command, env, tmp_path), command[0])
        assert f"the Airflow connection '{CONN_ID}' (TRAINPIPE_STORAGE_CONN_ID) is not defined" in line
        assert "AIRFLOW_CONN_TRAINPIPE_S3" in line and "source .trainpipe/stack/cli.env" in line


def test_missing_credentials_are_one_line_naming_the_setting(endpoint, tmp_path):
    env = _env(tmp_path)  # neither a connection nor AWS_* keys

    line = _one_line_error(_trainpipe(["datasets", "fraud_detector"], env, tmp_path), "datasets")

    assert line == (f"trainpipe datasets: storage {ROOT}: no S3 credentials: TRAINPIPE_STORAGE_CONN_ID (not set); "
                    "set it to an Airflow connection with the S3 endpoint and keys "
                    "(on the stack: source .trainpipe/stack/cli.env)")


def test_refused_credentials_are_one_line_naming_the_connection(tmp_path):
    with moto_s3_server(check_credentials=True) as strict:
        env = _env(tmp_path, TRAINPIPE_STORAGE_CONN_ID=CONN_ID, AIRFLOW_CONN_TRAINPIPE_S3=_connection(strict))

        line = _one_line_error(_trainpipe(["demo-data", "--force"], env, tmp_path), "demo-data")

    assert line.startswith(f"trainpipe demo-data: storage {ROOT}: the S3 endpoint refused the credentials (")
    assert f"check the login and password of the Airflow connection '{CONN_ID}' (TRAINPIPE_STORAGE_CONN_ID, " \
           "AIRFLOW_CONN_TRAINPIPE_S3)" in line


@pytest.mark.slow
def test_train_snapshots_and_checkpoints_on_the_s3_root_with_the_connection_only(endpoint, tmp_path):
    """`trainpipe train` with nothing but the connection: the snapshot (this process) and the trainer (torchrun,
    s3fs) both reach the bucket; no AWS_* variable is set by the user."""
    env = _env(tmp_path, TRAINPIPE_STORAGE_CONN_ID=CONN_ID, AIRFLOW_CONN_TRAINPIPE_S3=_connection(endpoint))
    work = tmp_path / "work"
    work.mkdir()
    assert _trainpipe(["demo-data", "--end", "2026-06-30", "--force"], env, work).returncode == 0
    spec = work / "cli_s3_train.yaml"
    spec.write_text("""\
pipeline_id: cli_s3_train
schedule: none
data: {uri: demo/transactions/transactions.parquet, time_column: event_time, window: 30d}
training:
  task: binary_classification
  model: {type: mlp, hidden_layers: [8]}
  features: [amount, merchant_risk, hour_of_day]
  label: is_fraud
  epochs: 1
  batch_size: 256
  distributed: {nproc_per_node: 1}
  checkpoint: {every_n_steps: 10}
evaluation: {metrics: [auc], gates: ["auc >= 0.0"]}
registration: {model_name: cli_s3_train}
""")

    trained = _trainpipe(["train", str(spec), "--logical-date", "2026-06-30", "--run-dir", "s3://trainpipe/storage/runs/cli"],
                         env, work)

    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert trained.stdout.splitlines()[-1].startswith("weights sha256: ")
    assert _objects(endpoint, "storage/snapshots/cli_s3_train/")
    assert any("/checkpoints/step-" in key for key in _objects(endpoint, "storage/runs/cli/"))
    assert list(work.iterdir()) == [spec]
