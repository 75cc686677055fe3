"""Which runs are backtests (issue 33): any backfill run, and a run whose window ends before the production
version's training window ends; the rest are runs like any other."""

from __future__ import annotations

from datetime import UTC, datetime

from trainpipe.steps.backtest import Backtest, classify

CHAMPION = (3, "2026-11-27T00:00:00+00:00")


def test_a_window_ending_before_the_champion_s_is_a_backtest():
    verdict = classify(run_type="manual", window_start="2026-10-07T00:00:00+00:00",
                       window_end="2026-11-06T00:00:00+00:00", champion=CHAMPION)
    assert verdict == Backtest(window="2026-10-07..2026-11-06", champion_version=3,
                               reason="window ends 2026-11-06, before version 3's (2026-11-27)")


def test_the_same_or_a_later_window_end_is_not():
    for end in ("2026-11-27T00:00:00+00:00", "2026-11-28T00:00:00+00:00"):
        assert classify(run_type="scheduled", window_start=None, window_end=end, champion=CHAMPION) is None


def test_every_backfill_run_is_a_backtest_even_for_a_newer_window_or_without_a_champion():
    verdict = classify(run_type="backfill", window_start="2026-11-01T00:00:00+00:00",
                       window_end="2026-12-01T00:00:00+00:00", champion=None)
    assert verdict == Backtest(window="2026-11-01..2026-12-01", reason="backfill run", champion_version=None)


def test_without_a_champion_or_a_time_window_a_manual_run_is_not():
    assert classify(run_type="manual", window_start="2026-10-07T00:00:00+00:00",
                    window_end="2026-11-06T00:00:00+00:00", champion=None) is None
    assert classify(run_type="manual", window_start=None, window_end=None, champion=CHAMPION) is None


def test_a_backfill_without_a_time_window_names_its_logical_date():
    verdict = classify(run_type="backfill", window_start=None, window_end=None, champion=CHAMPION,
                       logical_date=datetime(2026, 9, 1, tzinfo=UTC))
    assert verdict is not None and verdict.window == "2026-09-01"


def test_the_verdict_survives_xcom():
    verdict = Backtest(window="2026-10-07..2026-11-06", reason="backfill run", champion_version=1)
    assert Backtest.from_dict(verdict.to_dict()) == verdict
    assert Backtest.from_dict(None) is None
