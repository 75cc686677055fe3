"""CheckpointTrigger against real storage: a local run folder and s3:// on a moto server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.moto_s3 import moto_s3_server
from tests.triggers.virtual_clock import VirtualClock
from trainpipe.plan.model import STATUS_POLL_SECONDS, checkpoint_poll_seconds
from trainpipe.state.checkpoint_state import TrainingStatus, assess, read_checkpoint_state, write_training_status
from trainpipe.triggers.checkpoint import CheckpointTrigger

CONN_ID = "trainpipe_test_s3"
BUCKET = "trainpipe-trigger-tests"


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["file", "s3"])
def run_dir(request, tmp_path, monkeypatch):
    from airflow.sdk import ObjectStoragePath

    if request.param == "file":
        uri = (tmp_path / "run").as_uri()
        return ObjectStoragePath(uri), uri, None
    endpoint = request.getfixturevalue("moto_endpoint")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps({
        "conn_type": "aws", "login": "testing", "password": "testing",
        "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }))
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)
    uri = f"s3://{BUCKET}/runs/{request.node.name.replace('[', '_').rstrip(']')}"
    return ObjectStoragePath(uri, conn_id=CONN_ID), uri, CONN_ID


def _commit(run_dir, step: int, saved_at: datetime) -> None:
    step_dir = run_dir / "checkpoints" / f"step-{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "__0_0.distcp").write_bytes(b"shard")
    # The trainer writes whole seconds; sub-second timestamps keep the timing assertions below tight.
    (step_dir / "manifest.json").write_text(json.dumps({"format": "trainpipe-dcp/1", "step": step,
                                                        "saved_at": saved_at.isoformat()}))


def _uncommitted(run_dir, step: int) -> None:
    step_dir = run_dir / "checkpoints" / f"step-{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / "__0_0.distcp").write_bytes(b"half a save")


def _status(run_dir, state: str, *, try_number: int = 1, final: bool = False, started_at: datetime | None = None,
            now: datetime | None = None) -> None:
    now = now or _now()
    write_training_status(run_dir, TrainingStatus(state=state, try_number=try_number, final=final,
                                                  started_at=started_at or now, updated_at=now))


def test_serialize_round_trips_exactly():
    trigger = CheckpointTrigger(run_dir_uri="s3://bucket/runs/p/r", conn_id="aws_default", stall_timeout_seconds=1800,
                                poll_interval=60)

    classpath, kwargs = trigger.serialize()

    assert classpath == "trainpipe.triggers.checkpoint.CheckpointTrigger"
    assert kwargs == {"run_dir_uri": "s3://bucket/runs/p/r", "conn_id": "aws_default", "stall_timeout_seconds": 1800.0,
                      "poll_interval": 60.0, "status_poll_interval": STATUS_POLL_SECONDS, "clear_number": 0}
    from airflow.sdk._shared.module_loading import import_string

    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)
    # A trigger stored by the previous release (no status_poll_interval) still loads.
    old = {k: v for k, v in kwargs.items() if k not in ("status_poll_interval", "clear_number")}
    assert CheckpointTrigger(**old).status_poll_interval == STATUS_POLL_SECONDS
    # The status is never read less often than the checkpoints are listed.
    assert CheckpointTrigger(**{**old, "poll_interval": 0.5}).status_poll_interval == 0.5


def _counting_listings(trigger: CheckpointTrigger) -> list[int]:
    """Counts the trigger's checkpoint listings (its real reads, unchanged)."""
    listings: list[int] = []
    read = trigger._read

    def counted():
        listings.append(1)
        return read()

    trigger._read = counted
    return listings


def _watch(trigger: CheckpointTrigger) -> VirtualClock:
    trigger.clock = clock = VirtualClock()
    return clock


@pytest.mark.integration
def test_run_ends_within_seconds_of_training_end_while_listing_once_a_minute(run_dir):
    path, uri, conn_id = run_dir
    # stall_timeout 30m: the checkpoints are listed once a minute, the status is read every 2 s.
    trigger = CheckpointTrigger(run_dir_uri=uri, conn_id=conn_id, stall_timeout_seconds=1800,
                                poll_interval=checkpoint_poll_seconds(timedelta(minutes=30)),
                                status_poll_interval=STATUS_POLL_SECONDS)
    clock = _watch(trigger)
    listings = _counting_listings(trigger)

    async def scenario():
        _status(path, "running", now=clock.now())
        event = asyncio.ensure_future(trigger.run().__anext__())
        await clock.advance(10, task=event)
        assert not event.done()
        _commit(path, 10, clock.now() - timedelta(seconds=60))
        _commit(path, 20, clock.now())
        _status(path, "succeeded", now=clock.now())
        ended_at = clock.elapsed
        await clock.advance(60, task=event)
        return event.result(), clock.elapsed - ended_at

    event, seconds_after_training = asyncio.run(scenario())

    assert event.payload["status"] == "success" and event.payload["succeeded"] is True
    assert seconds_after_training <= STATUS_POLL_SECONDS  # noticed at the next status read, not the next listing
    # The verdict is taken on a fresh listing: it reports the steps committed since the first one.
    assert event.payload["latest_step"] == 20
    assert len(listings) == 2  # the first look and the verdict's


@pytest.mark.integration
def test_a_stale_listing_never_reports_a_stall_that_a_fresh_one_would_not(run_dir):
    path, uri, conn_id = run_dir
    # Listed once a minute, but stall_timeout is 25 s: the cached listing goes stale quickly.
    trigger = CheckpointTrigger(run_dir_uri=uri, conn_id=conn_id, stall_timeout_seconds=25, poll_interval=60,
                                status_poll_interval=1)
    clock = _watch(trigger)

    async def scenario():
        _status(path, "running", now=clock.now())
        _commit(path, 1, clock.now())
        event = asyncio.ensure_future(trigger.run().__anext__())
        for step in range(2, 10):  # 40 s of steady progress, never listed by the minute's pace
            await clock.advance(5, task=event)
            _commit(path, step, clock.now())
            assert not event.done()
        await clock.advance(120, task=event)  # then silence: a real stall
        return event.result()

    event = asyncio.run(scenario())

    assert event.payload["status"] == "stalled"
    assert event.payload["latest_step"] == 9
    assert 25 < event.payload["idle_seconds"] <= 27  # noticed within a status read of the timeout


@pytest.mark.integration
def test_run_logs_progress_then_succeeds_when_training_ends(run_dir, capsys):
    path, uri, conn_id = run_dir
    trigger = CheckpointTrigger(run_dir_uri=uri, conn_id=conn_id, stall_timeout_seconds=600, poll_interval=2)
    clock = _watch(trigger)

    async def scenario():
        _status(path, "running", now=clock.now())
        event = asyncio.ensure_future(trigger.run().__anext__())
        await clock.advance(10, task=event)
        assert not event.done()  # running, no checkpoint yet: keep watching
        _commit(path, 10, clock.now() - timedelta(seconds=60))
        _commit(path, 20, clock.now())
        _uncommitted(path, 30)  # a save in progress is not a checkpoint
        await clock.advance(10, task=event)
        assert not event.done()
        _status(path, "succeeded", now=clock.now())
        await clock.advance(10, task=event)
        return event.result()

    event = asyncio.run(scenario())

    assert event.payload["status"] == "success"
    assert event.payload["kind"] == "finished" and event.payload["succeeded"] is True
    assert event.payload["latest_step"] == 20
    assert event.payload["steps_per_hour"] == pytest.approx(600.0)
    assert event.payload["message"].startswith("training succeeded (try 1); latest committed step 20")
    logged = capsys.readouterr().out
    assert "try 1 running; no committed checkpoint yet" in logged
    assert "try 1 running; latest committed step 20, committed " in logged and "600 steps/hour" in logged


@pytest.mark.integration
def test_run_fails_after_stall_timeout_without_a_new_checkpoint(run_dir):
    path, uri, conn_id = run_dir
    trigger = CheckpointTrigger(run_dir_uri=uri, conn_id=conn_id, stall_timeout_seconds=300, poll_interval=30)
    clock = _watch(trigger)

    async def scenario():
        _status(path, "running", now=clock.now())
        _commit(path, 10, clock.now())
        event = asyncio.ensure_future(trigger.run().__anext__())
        await clock.advance(200, task=event)
        _commit(path, 20, clock.now())  # progress: the stall clock restarts here
        await clock.advance(280, task=event)
        assert not event.done()  # 480 s after step 10, but only 280 s after step 20
        await clock.advance(600, task=event)
        return event.result(), clock.elapsed

    event, elapsed = asyncio.run(scenario())

    assert event.payload["status"] == "stalled"
    assert event.payload["latest_step"] == 20
    assert 300 < event.payload["idle_seconds"] <= 300 + 30  # within a listing of the timeout
    assert "training stalled: no checkpoint committed for" in event.payload["message"]
    assert 500 < elapsed <= 530  # step 20 (at 200 s) restarted the clock


@pytest.mark.integration
def test_a_failed_try_waiting_for_its_retry_is_not_a_stall(run_dir):
    path, _, _ = run_dir
    long_ago = _now() - timedelta(hours=3)
    _commit(path, 40, long_ago)
    _status(path, "failed", try_number=1, started_at=long_ago)

    state = read_checkpoint_state(path)
    waiting = assess(state, now=_now(), stall_timeout=timedelta(minutes=30))
    assert (waiting.kind, waiting.latest_step) == ("waiting", 40)
    assert waiting.message.startswith("try 1 failed, waiting for the retry")

    _status(path, "running", try_number=2)  # the retry starts: a fresh stall window
    assert assess(read_checkpoint_state(path), now=_now(), stall_timeout=timedelta(minutes=30)).kind == "running"
    _status(path, "failed", try_number=2, final=True)
    final = assess(read_checkpoint_state(path), now=_now(), stall_timeout=timedelta(minutes=30))
    assert (final.kind, final.succeeded) == ("finished", False)


@pytest.mark.integration
@pytest.mark.parametrize("run_dir", ["s3"], indirect=True)
def test_a_status_rewritten_while_it_is_read_is_read_again(run_dir, monkeypatch):
    """A retry's resume check read status.json on S3 while the killed try's retry callback rewrote it: the
    reader had pinned the old ETag and s3fs raised FileExpired, failing the retry (seen in CI). The test
    lands the other writer's rewrite between the reader's open and its read; the server's answer is real."""
    path, _, _ = run_dir
    _commit(path, 40, _now())
    _status(path, "failed", try_number=1)
    filesystem = type(path.fs)
    opened = filesystem._open
    rewritten: list[str] = []

    def open_then_let_the_other_writer_in(self, name, mode="rb", **kwargs):
        handle = opened(self, name, mode, **kwargs)
        if mode == "rb" and name.endswith("status.json") and not rewritten:
            rewritten.append(name)
            _status(path, "running", try_number=2)
        return handle

    monkeypatch.setattr(filesystem, "_open", open_then_let_the_other_writer_in)
    state = read_checkpoint_state(path)

    assert rewritten, "the rewrite did not land between open and read"
    assert state.latest is not None and state.latest.step == 40
    assert state.status is not None and (state.status.state, state.status.try_number) == ("running", 2)
