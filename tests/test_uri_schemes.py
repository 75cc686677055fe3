"""Spec URIs: only the schemes trainpipe's storage reads (trainpipe.uris.STORAGE_SCHEMES), refused at
the spec stage before any I/O and again in storage.resolve_uri; no request is ever made for another
scheme; and an error about a file that was read names its path and the kind of problem, never its
content."""

from __future__ import annotations

import dataclasses
import http.server
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from trainpipe.commands.main import main
from trainpipe.errors import SpecError, UnsupportedUriError
from trainpipe.plan.build import build_plan
from trainpipe.settings import Settings
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import resolve_uri

SECRET = "fernet_key = 6cT0pSecretValue"
TEXT = """\
pipeline_id: p
data:
  uri: {uri}
  time_column: event_time
  window: 30d
training: {{task: binary_classification, features: [amount], label: is_fraud}}
evaluation: {{metrics: [auc]}}
registration: {{model_name: m}}
"""
END = datetime(2026, 6, 30, tzinfo=UTC)


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    requests: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"amount,is_fraud,event_time\n1,0,2026-06-29\n")

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", requests
    httpd.shutdown()
    httpd.server_close()


def _problems(uri: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(TEXT.format(uri=uri), "s.yaml"))
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize(("uri", "scheme"), [
    ("http://{host}/data.csv", "http"), ("https://{host}/data.csv", "https"), ("HTTP://{host}/data.csv", "HTTP"),
    ("memory://data.parquet", "memory"), ("gs://bucket/data.parquet", "gs"), ("ftp://{host}/x", "ftp"),
    ("data:text/csv,a", "data"), ("http:data.csv", "http"),
])
def test_other_schemes_are_refused_at_the_spec_stage_without_a_request(uri: str, scheme: str, server, monkeypatch,
                                                                      tmp_path: Path, capsys):
    base, requests = server
    uri = uri.format(host=base.removeprefix("http://"))

    assert _problems(uri) == [f"s.yaml:3:3: data.uri: scheme {scheme!r} is not one trainpipe reads; use a file:// "
                              "or s3:// URI or a path relative to the storage root"]
    (tmp_path / "s.yaml").write_text(TEXT.format(uri=uri))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "s.yaml"]) == 1
    assert "data.uri: scheme" in capsys.readouterr().out
    assert requests == []


def test_chained_filesystems_are_refused(server):
    base, requests = server
    (problem,) = _problems(f"simplecache::{base}/data.csv")
    assert problem.startswith("s.yaml:3:3: data.uri: 'simplecache::http://127.0.0.1:") and "chains filesystems" in problem
    with pytest.raises(UnsupportedUriError, match="chains filesystems"):
        resolve_uri(f"simplecache::{base}/data.csv", Settings.from_env())
    assert requests == []


@pytest.mark.parametrize("uri", ["file:///srv/data/x.parquet", "/srv/data/x.parquet", "s3://bucket/x.parquet",
                                 "demo/transactions/transactions.parquet", "S3://bucket/x.parquet"])
def test_storage_schemes_and_relative_paths_stay_allowed(uri: str):
    assert validate_loaded(load_yaml_text(TEXT.format(uri=uri), "s.yaml")).data.uri == uri


def test_run_time_refuses_another_scheme_before_any_request(server):
    """A plan that skipped the spec stage: the snapshot task refuses the URI before opening it."""
    base, requests = server
    settings = Settings.from_env()
    text = TEXT.format(uri="demo/p/data.csv")
    plan = build_plan(validate_loaded(load_yaml_text(text, "s.yaml")), spec_file="s.yaml", spec_text=text)
    tampered = dataclasses.replace(plan.data, uri=f"{base}/data.csv")

    with pytest.raises(UnsupportedUriError, match=r"scheme 'http' is not one trainpipe reads"):
        take_snapshot(plan.dag_id, tampered, settings=settings, logical_date=END)
    assert requests == []


def _snapshot_of(path: Path, *, file_format: str = "parquet"):
    text = TEXT.format(uri=path.as_uri()).replace("  window: 30d\n", f"  window: 30d\n  format: {file_format}\n")
    plan = build_plan(validate_loaded(load_yaml_text(text, "s.yaml")), spec_file="s.yaml", spec_text=text)
    return lambda: take_snapshot(plan.dag_id, plan.data, settings=Settings.from_env(), logical_date=END)


@pytest.fixture
def under_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files below lie under the storage root: without a policy, one elsewhere is not read at all."""
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", tmp_path.as_uri())
    return tmp_path


@pytest.mark.usefixtures("under_the_root")
def test_a_file_that_is_not_parquet_is_named_not_quoted(tmp_path: Path):
    secret_file = tmp_path / "airflow.cfg"
    secret_file.write_text(f"[core]\n{SECRET}\n")
    # Located at the spec's data.uri (the user's fix), worded by the storage layer's DataReadError.
    with pytest.raises(SpecError) as caught:
        _snapshot_of(secret_file)()
    message = str(caught.value)
    assert "data.uri: " in message
    assert message.endswith(f"{secret_file}: not a readable parquet file (ArrowInvalid); check data.uri and data.format")
    assert "6cT0p" not in message and caught.value.__cause__ is None


@pytest.mark.usefixtures("under_the_root")
def test_a_header_and_values_read_as_csv_are_not_echoed(tmp_path: Path):
    """The first line of a file read as CSV is its header; a bad time column quotes a value in pandas'
    own message (the control below): neither reaches trainpipe's error."""
    as_header = tmp_path / "a.csv"
    as_header.write_text(f"{SECRET}\nx\n")
    with pytest.raises(SpecError) as caught:
        _snapshot_of(as_header, file_format="csv")()
    assert "data.time_column: column 'event_time' is not in file://" in str(caught.value)
    assert "6cT0p" not in str(caught.value)

    as_value = tmp_path / "b.csv"
    as_value.write_text(f"event_time,amount,is_fraud\n{SECRET},1,0\n")
    with pytest.raises(ValueError, match="6cT0p"):  # the control: pandas quotes the value
        pd.to_datetime(pd.read_csv(as_value)["event_time"], utc=True)
    with pytest.raises(SpecError, match=r"column 'event_time' of file://.* does not hold dates and times") as caught:
        _snapshot_of(as_value, file_format="csv")()
    assert "6cT0p" not in str(caught.value)


@pytest.mark.usefixtures("under_the_root")
def test_validating_a_file_read_by_mistake_does_not_echo_its_header(tmp_path: Path, capfd, caplog):
    """Without a time column the snapshot of any readable file succeeds (which files a team may read
    is the platform policy's); the validate task then reports the missing columns by count only."""
    from trainpipe.errors import ValidationFailedError
    from trainpipe.steps.validate.validate import validate_snapshot

    secret_file = tmp_path / "c.csv"
    secret_file.write_text(f"{SECRET}\nx\n")
    text = (TEXT.format(uri=secret_file.as_uri()).replace("  time_column: event_time\n  window: 30d\n", "  format: csv\n"))
    plan = build_plan(validate_loaded(load_yaml_text(text, "s.yaml")), spec_file="s.yaml", spec_text=text)
    settings = Settings.from_env()
    snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=END)

    with pytest.raises(ValidationFailedError) as caught:
        validate_snapshot(plan.dag_id, plan.validation, snapshot, settings=settings)
    # The report reaches the console or, after another module set up logging, only the log records.
    out, err = capfd.readouterr()
    logged = out + err + caplog.text
    assert "FAIL expect_column_to_exist(column='amount'): column 'amount' is missing (1 columns present)" in logged
    assert "6cT0p" not in logged + str(caught.value)
