"""The outcome and reason of a run from its facts, and the pages' escaping (no Airflow, no MLflow)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainpipe.fleet import render
from trainpipe.fleet.collect import MlflowFacts, PipelineFacts, pipeline_row
from trainpipe.fleet.outcome import DriftFacts, RunFacts, TaskFacts, duration_words, outcome_of

NOW = datetime(2026, 11, 25, 8, 0, tzinfo=UTC)


def _run(state: str, note: str | None = None, **tasks: str) -> RunFacts:
    return RunFacts(run_id="scheduled__2026-11-25", state=state, logical_date=NOW - timedelta(hours=8),
                    start_date=NOW - timedelta(hours=7), end_date=NOW - timedelta(hours=6), note=note,
                    tasks=tuple(TaskFacts(task_id=t, state=s) for t, s in tasks.items()))


def test_the_notes_first_line_is_the_reason() -> None:
    run = _run("failed", "validation failed: drift in amount (PSI 6.84 >= 0.25)\nsecond line", validate="failed")
    assert outcome_of(run, now=NOW) == ("validation_failed", "validation failed: drift in amount (PSI 6.84 >= 0.25)")


def test_without_a_note_the_drift_record_says_why() -> None:
    drift = DriftFacts(verdict="fail", failed_features=("amount", "hour_of_day"), psi={"amount": 6.84, "hour_of_day": 0.4},
                       ks={"amount": 0.71})
    assert outcome_of(_run("failed", validate="failed"), now=NOW, drift=drift) == (
        "validation_failed", "validation failed: drift in amount (PSI 6.84, KS 0.71), hour_of_day (PSI 0.40)")


def test_gate_failure_of_a_successful_run() -> None:
    note = "gates failed (1 of 2): auc >= +0.1% (got 0.8812, -0.08% vs champion); nothing registered"
    assert outcome_of(_run("success", note, gate="success", promote="skipped"), now=NOW) == ("gates_failed", note)


def test_a_person_rejected() -> None:
    note = "m version 4 rejected by alice; it stays challenger"
    assert outcome_of(_run("success", note, approve="skipped", promote="skipped"), now=NOW) == ("rejected", note)


@pytest.mark.parametrize(("seconds", "words"), [(59, "0 min"), (3 * 3600 + 5, "3 h"), (47 * 3600, "47 h"),
                                                (3 * 86400, "3 d")])
def test_durations_in_one_unit(seconds: float, words: str) -> None:
    assert duration_words(seconds) == words


def test_running_and_never_run() -> None:
    assert outcome_of(_run("running"), now=NOW) == ("running", "running for 7 h")
    assert outcome_of(None, now=NOW) == ("never_run", "never run")


def test_markup_in_a_note_or_a_name_is_shown_as_text() -> None:
    attack = "<img src=x onerror=alert(1)>"
    pipeline = PipelineFacts(pipeline_id="p", owner=attack, team=attack, schedule=None, is_paused=False,
                             last_run=_run("failed", attack, train="failed"))
    row = pipeline_row(pipeline, MlflowFacts(), now=NOW, links={"DAG": "/dags/p'><script>alert(1)</script>"})
    html = render.fleet_page([row], teams=[attack], team=None, outcome=None, base="/trainpipe")
    assert "<img" not in html and "<script>alert" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_a_backtest_is_a_hollow_point_off_the_metric_history_line() -> None:
    """Issue 33: a registered backtest (a run for a past window) never held production; the history shows it
    apart instead of as a dip or a jump of the lifecycle's line."""
    svg = render.line_chart({"auc": [(1, 0.8), (2, 0.6), (3, 0.82)]}, backtests=frozenset({2}))

    [line] = [part for part in svg.split("<") if part.startswith("polyline")]
    assert line.count(",") == 2  # versions 1 and 3 only
    assert svg.count("class='backtest'") == 1 and "auc v2: 0.6000 (backtest)" in svg
    assert "auc v1: 0.8000 (backtest)" not in svg
