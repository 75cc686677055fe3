"""The airflow-init service of docker-compose.yaml: run once before the other Airflow services start.

1. ``airflow db migrate``;
2. the admin password file of Airflow's simple auth manager, from ``AIRFLOW_ADMIN_PASSWORD``;
3. the ``trainpipe_s3`` connection (the storage root's bucket), from the ``AWS_*`` variables,
   overwritten at every run: ``.env`` is the source of truth, not the UI;
4. the example specs' input data under ``<storage root>/demo/`` when ``TRAINPIPE_DEMO_DATA`` is true
   and it is missing (as ``make stack`` does).

Secrets are read from the environment and never printed or passed on a command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

CONN_ID = "trainpipe_s3"
ADMIN_USER = "admin"


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        sys.exit(f"airflow-init: {name} is empty; set it in .env (see .env.example)")
    return value


def migrate() -> None:
    subprocess.run(["airflow", "db", "migrate"], check=True)


def write_admin_password() -> None:
    path = Path(_env("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({ADMIN_USER: _env("AIRFLOW_ADMIN_PASSWORD")}, handle)
    print(f"airflow-init: password of user {ADMIN_USER!r} written")


def import_connection() -> None:
    connection = {
        "conn_type": "aws",
        "login": _env("AWS_ACCESS_KEY_ID"),
        "password": _env("AWS_SECRET_ACCESS_KEY"),
        "extra": json.dumps({"endpoint_url": _env("AWS_ENDPOINT_URL"), "region_name": _env("AWS_DEFAULT_REGION")}),
    }
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "connections.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({CONN_ID: connection}, handle)
        subprocess.run(["airflow", "connections", "import", str(path), "--overwrite"], check=True)


def upload_demo_data() -> None:
    if os.environ.get("TRAINPIPE_DEMO_DATA", "true").lower() not in {"1", "true", "yes"}:
        return
    root = urlparse(_env("TRAINPIPE_STORAGE_ROOT"))
    if root.scheme != "s3":
        print(f"airflow-init: storage root is {root.scheme}://, not s3://; no demo data uploaded")
        return
    import boto3

    from trainpipe.demo.synthetic import DEMO_FILES, write_demo_data

    bucket = root.netloc
    prefix = "/".join(part for part in (root.path.strip("/"), "demo") if part) + "/"
    # boto3 reads the endpoint, keys and region from the AWS_* variables, like the trainer's s3fs.
    client = boto3.client("s3")
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) >= len(DEMO_FILES):
        return
    end = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    with tempfile.TemporaryDirectory() as scratch:
        write_demo_data(scratch, end=end)
        # The tables, and the small language model's folder where the image has the trainer's [transformers].
        for path in sorted(p for p in Path(scratch).rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, prefix + path.relative_to(scratch).as_posix())
    print(f"airflow-init: demo data written to s3://{bucket}/{prefix}")


def main() -> None:
    migrate()
    write_admin_password()
    import_connection()
    upload_demo_data()
    print("airflow-init: done")


if __name__ == "__main__":
    main()
