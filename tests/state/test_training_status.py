"""The train task's status marker (``output/status.json``), which the checkpoint sensor reads."""

from __future__ import annotations

from trainpipe.settings import Settings
from trainpipe.state.checkpoint_state import read_training_status, record_training_status
from trainpipe.state.run_folder import run_dir_for

RUN_ID = "manual__2026-11-28T21:01:48+00:00"


def test_a_late_retry_callback_of_the_killed_try_does_not_overwrite_the_running_retry(tmp_path, monkeypatch):
    """Seen in CI: the scheduler found try 1 without a heartbeat and queued its retry callback; the
    dag-processor ran it 13 s later, after try 2 had started and recorded itself running. Had try 1's
    "failed, retry follows" replaced it, the sensor would wait for a retry that is already running."""
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", (tmp_path / "storage").as_uri())
    settings = Settings.from_env()
    run_dir = run_dir_for("fraud", settings, RUN_ID)

    record_training_status("fraud", settings=settings, airflow_run_id=RUN_ID, state="running", try_number=1)
    record_training_status("fraud", settings=settings, airflow_run_id=RUN_ID, state="running", try_number=2)
    started = read_training_status(run_dir)
    record_training_status("fraud", settings=settings, airflow_run_id=RUN_ID, state="failed", try_number=1)

    assert read_training_status(run_dir) == started
    assert (started.state, started.try_number) == ("running", 2)
    # The retry's own end is recorded as always.
    record_training_status("fraud", settings=settings, airflow_run_id=RUN_ID, state="succeeded", try_number=2)
    assert (read_training_status(run_dir).state, read_training_status(run_dir).try_number) == ("succeeded", 2)
