"""Run time, under a policy: a data folder whose member file is a symlink out of the team's allowed
URIs (``daily/part-1.parquet -> another team's file``) is refused before any member is read, without
naming where the link leads; a folder of the team's own files, or of links that stay inside, still reads."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from trainpipe import storage
from trainpipe.errors import OutsideStorageRootError, PolicyViolationError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot

WHEN = datetime(2025, 1, 2, tzinfo=UTC)
OTHER_TEAMS_ROW = "other-team-secret"


@pytest.fixture
def settings(tmp_path: Path, monkeypatch) -> Settings:
    root = tmp_path / "storage"
    daily = root / "demo" / "transactions" / "daily"
    daily.mkdir(parents=True)
    pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1], "who": ["risk", "risk"]}).to_parquet(daily / "part-0.parquet")
    clicks = tmp_path / "elsewhere" / "other_team" / "clicks.parquet"
    clicks.parent.mkdir(parents=True)
    pd.DataFrame({"a": [9.0, 9.0], "label": [1, 1], "who": [OTHER_TEAMS_ROW] * 2}).to_parquet(clicks)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{root}")
    return Settings.from_env()


def _root(settings: Settings) -> Path:
    return Path(settings.storage_root.removeprefix("file://"))


def _data(uri: str, allowed: tuple[str, ...] | None = ("demo/**",)) -> DataPlan:
    return DataPlan(uri=uri, conn_id=None, format="parquet", time_column=None, window=None, holdout_fraction=0.5,
                    holdout_key=None, allowed_uris=allowed)


def _stored_rows(settings: Settings) -> list[str]:
    """Every value of ``who`` in every parquet file trainpipe stored."""
    snapshots = _root(settings) / "snapshots"
    files = sorted(snapshots.rglob("*.parquet")) if snapshots.exists() else []
    return [who for file in files for who in pd.read_parquet(file)["who"]]


def test_a_member_linked_to_another_teams_file_is_refused_before_reading(settings, tmp_path, monkeypatch):
    daily = _root(settings) / "demo" / "transactions" / "daily"
    target = tmp_path / "elsewhere" / "other_team" / "clicks.parquet"
    (daily / "part-1.parquet").symlink_to(target)
    opened: list[str] = []
    real_read = storage.parquet_from_bytes
    monkeypatch.setattr(storage, "parquet_from_bytes", lambda raw: opened.append("read") or real_read(raw))

    with pytest.raises(PolicyViolationError) as refused:
        take_snapshot("risk_p", _data("demo/transactions/daily"), settings=settings, logical_date=WHEN)

    message = str(refused.value)
    assert message == (
        "data.uri 'demo/transactions/daily' holds 'part-1.parquet', which resolves outside the URIs the platform "
        "policy allows this pipeline's team ('demo/**'); nothing was read. Use data the team may read, or ask the "
        "platform team to allow it")
    assert "elsewhere" not in message and "clicks" not in message  # the link's target is not shown
    assert opened == []  # not even the team's own member was read
    assert OTHER_TEAMS_ROW not in _stored_rows(settings) and _stored_rows(settings) == []


def test_a_linked_subfolder_member_is_judged_by_where_it_leads(settings, tmp_path):
    # The folder itself is fine; its member is reached through a linked folder that leads out.
    daily = _root(settings) / "demo" / "transactions" / "daily"
    (daily.parent / "mirror").symlink_to(tmp_path / "elsewhere" / "other_team")
    (daily / "part-2.parquet").symlink_to(daily.parent / "mirror" / "clicks.parquet")
    with pytest.raises(PolicyViolationError, match=r"holds 'part-2.parquet', which resolves outside"):
        take_snapshot("risk_p", _data("demo/transactions/daily"), settings=settings, logical_date=WHEN)
    assert _stored_rows(settings) == []


def test_a_folder_of_the_teams_own_files_still_reads(settings):
    daily = _root(settings) / "demo" / "transactions" / "daily"
    # A link that stays inside the allowed URIs is judged by where it leads, and read.
    pd.DataFrame({"a": [3.0, 4.0], "label": [0, 1], "who": ["risk", "risk"]}).to_parquet(
        _root(settings) / "demo" / "extra.parquet")
    (daily / "part-1.parquet").symlink_to(_root(settings) / "demo" / "extra.parquet")
    # A file the read does not open (not *.parquet) is not judged: nothing of it is read.
    (daily / "README.txt").symlink_to("/etc/hostname")

    info = take_snapshot("risk_p", _data("demo/transactions/daily"), settings=settings, logical_date=WHEN)

    assert info.rows == 4
    assert sorted(_stored_rows(settings)) == ["risk"] * 4


def test_without_a_policy_a_member_linked_out_of_the_storage_root_is_refused_too(settings, tmp_path):
    daily = _root(settings) / "demo" / "transactions" / "daily"
    (daily / "part-1.parquet").symlink_to(tmp_path / "elsewhere" / "other_team" / "clicks.parquet")
    with pytest.raises(OutsideStorageRootError, match=r"\('part-1.parquet' of the folder leads there\)"):
        take_snapshot("risk_q", dataclasses.replace(_data("demo/transactions/daily"), allowed_uris=None),
                      settings=settings, logical_date=WHEN)
    assert OTHER_TEAMS_ROW not in _stored_rows(settings)
    # A link inside the storage root is read.
    (daily / "part-1.parquet").unlink()
    (daily / "part-1.parquet").symlink_to(daily / "part-0.parquet")
    assert take_snapshot("risk_q", dataclasses.replace(_data("demo/transactions/daily"), allowed_uris=None),
                         settings=settings, logical_date=WHEN).rows == 4


def test_a_pattern_naming_the_folder_itself_admits_its_own_files_not_links_elsewhere(settings):
    daily = _root(settings) / "demo" / "transactions" / "daily"
    exact = ("demo/transactions/daily",)
    assert take_snapshot("risk_p", _data("demo/transactions/daily", exact), settings=settings,
                         logical_date=WHEN).rows == 2
    # A link to a file the pattern does not cover is refused, even inside the storage root.
    pd.DataFrame({"a": [3.0], "label": [0], "who": ["search"]}).to_parquet(_root(settings) / "demo" / "x.parquet")
    (daily / "part-1.parquet").symlink_to(_root(settings) / "demo" / "x.parquet")
    with pytest.raises(PolicyViolationError, match=r"holds 'part-1.parquet', which resolves outside"):
        take_snapshot("risk_r", _data("demo/transactions/daily", exact), settings=settings, logical_date=WHEN)
