"""A data URI with userinfo (``s3://risk-x@search-data/...``) under a policy whose data.uris has ``*`` in the
bucket (``s3://risk-*/**``): Airflow's ObjectStoragePath takes the userinfo as the connection, over
data.conn_id, and ``*`` used to match the ``@``. Refused when the spec is compiled, refused again at run
time before any storage path is built, and never matched by a policy glob."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from trainpipe import storage
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError, UnsupportedUriError
from trainpipe.policy import globs
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot

from .conftest import POLICY, compliant_spec

ATTACK = "s3://risk-x@search-data/clicks.parquet"
WILD = ("s3://risk-*/**", "demo/**")
MESSAGE = ("names a connection or credentials in its host part ('risk-x@'); give the bucket alone "
           "(s3://search-data/clicks.parquet) and the connection in conn_id")
WHEN = datetime(2025, 1, 2, tzinfo=UTC)


@pytest.fixture
def wild_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test policy with the risk team's bucket as a glob, in force."""
    text = POLICY.read_text()
    assert 'uris: ["s3://risk-data/**", "demo/**"]' in text
    path = tmp_path / "policy_wild.yaml"
    path.write_text(text.replace('uris: ["s3://risk-data/**", "demo/**"]', 'uris: ["s3://risk-*/**", "demo/**"]'))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(path))
    return path


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """Every ObjectStoragePath trainpipe builds from a URI, as (the URI given, the connection it got): the real
    class, recording."""
    import airflow.sdk
    from airflow.sdk import ObjectStoragePath

    made: list[tuple[str, str | None]] = []

    class Recording(ObjectStoragePath):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append((str(args[0]) if args else "", self.conn_id))

    monkeypatch.setattr(airflow.sdk, "ObjectStoragePath", Recording)
    return made


def _spec(uri: str) -> dict:
    spec = compliant_spec()
    spec["data"] = {**spec["data"], "uri": uri, "conn_id": "aws_risk"}
    return spec


def test_the_payload_is_real_airflow_takes_the_userinfo_as_the_connection():
    """Why the URI must never reach ObjectStoragePath: its userinfo wins over conn_id."""
    from airflow.sdk import ObjectStoragePath

    assert ObjectStoragePath(ATTACK, conn_id="aws_risk").conn_id == "risk-x"


def test_the_wild_policy_still_admits_its_buckets_and_refuses_others(write_spec: Callable[..., Path], wild_policy):
    plan = compile_file(write_spec(_spec("s3://risk-x/clicks.parquet")), "risk/spec.yaml", settings=Settings.from_env())
    assert plan.data.allowed_uris == WILD and plan.data.conn_id == "aws_risk"
    with pytest.raises(SpecError, match=r"rule data\.uris"):
        compile_file(write_spec(_spec("s3://search-data/clicks.parquet")), "risk/spec.yaml", settings=Settings.from_env())


def test_compile_refuses_the_userinfo_at_data_uri(write_spec: Callable[..., Path], wild_policy, built):
    path = write_spec(_spec(ATTACK))

    with pytest.raises(SpecError) as caught:
        compile_file(path, "risk/spec.yaml", settings=Settings.from_env())

    (problem,) = caught.value.problems
    assert problem.field_path == "data.uri" and problem.message == f"{ATTACK!r} {MESSAGE}"
    assert str(problem).startswith("risk/spec.yaml:") and problem.line > 1
    assert built == []  # the spec stage touches no storage


def test_compile_refuses_it_without_a_policy_too(write_spec: Callable[..., Path], monkeypatch):
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    with pytest.raises(SpecError, match=r"data\.uri: 's3://aws_platform_admin@search-data/x' names a connection"):
        compile_file(write_spec(_spec("s3://aws_platform_admin@search-data/x")), "risk/spec.yaml", settings=Settings.from_env())
    with pytest.raises(SpecError) as caught:
        compile_file(write_spec(_spec("s3://AKIAEXAMPLE:hunter2@risk-data/x")), "risk/spec.yaml", settings=Settings.from_env())
    assert "'AKIAEXAMPLE:***@'" in str(caught.value) and "hunter2" not in str(caught.value)


@pytest.mark.parametrize("uri", [ATTACK, "s3://risk-x%40search-data/clicks.parquet", "s3://risk-x:pw@search-data/x",
                                 "s3://@risk-data/x", "S3://risk-x@search-data/x"])
@pytest.mark.parametrize("patterns", [WILD, ("s3://risk-?@search-data/**",), ("s3://**",), ("s3://risk-x@search-data/**",),
                                      ("**",)])
def test_no_policy_glob_admits_userinfo(uri: str, patterns: tuple[str, ...]):
    assert not globs.uri_allowed(uri, patterns, "file:///srv/storage")


def test_run_time_refuses_it_before_building_any_path(write_spec: Callable[..., Path], wild_policy, built):
    """A plan that skipped the spec stage: the snapshot task refuses the URI before any ObjectStoragePath is
    built, so no connection named by the URI is looked up and nothing is read or stored."""
    settings = Settings.from_env()  # the storage root of the configs fixture
    root = Path(settings.storage_root.removeprefix("file://"))
    (root / "demo").mkdir(parents=True)
    pd.DataFrame({"amount": [1.0, 2.0, 3.0, 4.0], "is_fraud": [0, 1, 0, 1]}).to_parquet(root / "demo" / "ok.parquet")
    plan = compile_file(write_spec(_spec("s3://risk-x/clicks.parquet")), "risk/spec.yaml", settings=settings)
    tampered = dataclasses.replace(plan.data, uri=ATTACK, time_column=None, window=None)
    assert tampered.allowed_uris == WILD and tampered.conn_id == "aws_risk"

    with pytest.raises(UnsupportedUriError, match=f"^{ATTACK!r} names a connection"):
        take_snapshot("risk_fraud", tampered, settings=settings, logical_date=WHEN)
    assert built == []
    assert not (root / "snapshots").exists()

    # The policy's own run-time check refuses it as well, given a path built from anything.
    path = storage.resolve_uri("demo/ok.parquet", settings)
    with pytest.raises(UnsupportedUriError, match=r"^data\.uri 's3://risk-x@search-data/clicks\.parquet' names a"):
        storage.require_allowed(ATTACK, path, WILD, settings)
    with pytest.raises(UnsupportedUriError, match="names a connection"):
        storage.read_parquet_uri(ATTACK, conn_id="aws_risk")
    assert [conn for _, conn in built] == [None]  # the one path built here: the storage root's

    # The recording sees the paths a snapshot builds: an allowed URI is read and stored, with no userinfo.
    allowed = dataclasses.replace(tampered, uri="demo/ok.parquet", conn_id=None)
    assert take_snapshot("risk_fraud", allowed, settings=settings, logical_date=WHEN).rows == 4
    assert built and all("@" not in given and conn is None for given, conn in built)


@pytest.mark.parametrize(("value", "pattern", "expected"), [
    ("s3://risk-x@search-data/x", "s3://risk-*/**", False),
    ("s3://risk-x@search-data", "s3://risk-*", False),
    ("s3://risk-@b/x", "s3://risk-?b/**", False),
    ("s3://risk-x%40search-data/x", "s3://risk-*/**", False),
    ("s3://a@b/x", "s3://**", False),
    ("s3://a@b/x", "s3://**x", False),
    ("s3://risk-x/a@b.parquet", "s3://risk-*/*.parquet", True),  # after the host, "@" is a name's
    ("s3://risk-x/a@b/c", "s3://risk-*/**", True),
    ("ghcr.io/trainpipe/trainer@sha256:ab", "ghcr.io/trainpipe/trainer*", True),  # not a URI pattern
])
def test_star_and_question_mark_do_not_match_userinfo(value: str, pattern: str, expected: bool):
    assert globs.matches(value, pattern) is expected


def test_a_uri_with_userinfo_has_no_canonical_form():
    assert globs.canonical_uri(ATTACK, "file:///srv/storage") is None
    assert globs.canonical_uri("s3://risk-x/clicks.parquet", "file:///srv/storage") == "s3://risk-x/clicks.parquet"
