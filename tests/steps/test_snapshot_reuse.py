"""A reused dataset version: the log line names this run's window, and the window the version was stored for."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import storage_access


def test_the_reuse_line_names_this_runs_window(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", (tmp_path / "storage").as_uri())
    (tmp_path / "storage").mkdir()
    start = datetime(2026, 11, 1, tzinfo=UTC)
    frame = pd.DataFrame({"event_time": [start + timedelta(hours=h) for h in range(48)],
                          "x": np.arange(48.0), "y": np.arange(48) % 2})
    frame.to_parquet(tmp_path / "storage" / "events.parquet")
    data = DataPlan(uri="events.parquet", conn_id=None, format="parquet", time_column="event_time",
                    window=timedelta(days=30), holdout_fraction=0.2, holdout_key=None)
    settings = Settings.from_env()

    # A handler on the module's own logger: what reaches the console depends on the logging set up before.
    logger = logging.getLogger("trainpipe.steps.snapshot")
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    monkeypatch.setattr(logger, "disabled", False)
    # setLevel, not the attribute: it also clears the logger's cache of isEnabledFor answers, which an
    # earlier test of the same worker may have filled at WARNING (then no INFO record is ever made).
    previous = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        with storage_access(settings):
            first = take_snapshot("events", data, settings=settings,
                                  logical_date=datetime(2026, 11, 5, tzinfo=UTC))
            second = take_snapshot("events", data, settings=settings,
                                   logical_date=datetime(2026, 11, 6, tzinfo=UTC))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)

    assert second.digest == first.digest  # the same rows in both windows
    [line] = [r.getMessage() for r in records if "holds the same rows" in r.getMessage()]
    assert ("this run's window 2026-10-07T00:00:00+00:00 .. 2026-11-06T00:00:00+00:00 holds the same rows as the "
            "stored version") in line, line
    assert f"for the window {first.window_start} .. {first.window_end}" in line
