"""Backtests: a run for a past window (a backfill, or data older than the champion's) moves nothing.

The snapshot step decides once per DAG run (``classify``) and leaves the verdict under ``BACKTEST_XCOM``;
validate then keeps the baseline, register tags the version (or registers none), approve and promote skip.
Airflow-free: the operators pass in the run type and an MLflow client.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainpipe.plan.tracking import VERSION_DATASET_DIGEST_TAG, WINDOW_END_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainpipe.settings import Settings

log = logging.getLogger(__name__)

# The snapshot task's verdict (a Backtest as a dict, or None).
BACKTEST_XCOM = "trainpipe_backtest"
# Airflow's DagRunType.BACKFILL_JOB, as text: this module imports no Airflow.
BACKFILL_RUN_TYPE = "backfill"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backtest:
    """Why a run is a backtest, in the words of its note and log."""

    # "2026-10-07..2026-11-06", or the logical date when the data has no time window.
    window: str
    # "backfill run", or "window ends 2026-11-06, before version 3's (2026-11-27)".
    reason: str
    champion_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any] | None) -> Backtest | None:
        return cls(**record) if record else None


def window_text(start: str | None, end: str | None, *, logical_date: datetime | None = None) -> str:
    """``2026-10-07..2026-11-06`` (dates of the window's ISO bounds); without a window, the logical date."""
    if end is None:
        return logical_date.date().isoformat() if logical_date is not None else "the run's data"
    return f"{start[:10] if start else '…'}..{end[:10]}"


def champion_window_end(client: MlflowClient, model_name: str, alias: str, *, settings: Settings,
                        pipeline_id: str) -> tuple[int, str] | None:
    """The production version and the end of the window it was trained on: its ``WINDOW_END_TAG``, else the
    manifest of its ``dataset_digest`` (versions registered before the tag). None when there is no production
    version or its window is unknown (then only a backfill run is a backtest)."""
    from mlflow.exceptions import MlflowException

    from trainpipe.state.datasets import find_version

    try:
        aliases = client.get_registered_model(model_name).aliases or {}
    except MlflowException:
        return None  # no model yet
    if alias not in aliases:
        return None
    number = int(aliases[alias])
    tags = client.get_model_version(model_name, str(number)).tags or {}
    if tags.get(WINDOW_END_TAG):
        return number, tags[WINDOW_END_TAG]
    digest = tags.get(VERSION_DATASET_DIGEST_TAG)
    info = find_version(settings, pipeline_id, digest) if digest else None
    if info is None or info.window_end is None:
        return None
    return number, info.window_end


def classify(*, run_type: str | None, window_start: str | None, window_end: str | None,
             champion: tuple[int, str] | None, logical_date: datetime | None = None) -> Backtest | None:
    """The run's verdict: a backfill run, or a window that ends before the champion's ends, is a backtest.

    The champion's window *end* is the line, not its start: a window that ends inside the champion's
    (a month's window for a date three weeks back) holds no newer data, so its model cannot be fresher."""
    window = window_text(window_start, window_end, logical_date=logical_date)
    if run_type == BACKFILL_RUN_TYPE:
        return Backtest(window=window, reason="backfill run",
                        champion_version=champion[0] if champion is not None else None)
    if champion is None or window_end is None:
        return None
    version, champion_end = champion
    if datetime.fromisoformat(window_end) < datetime.fromisoformat(champion_end):
        return Backtest(window=window, champion_version=version,
                        reason=f"window ends {window_end[:10]}, before version {version}'s ({champion_end[:10]})")
    return None
