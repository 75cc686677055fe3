"""Run time: the snapshot task refuses a data path outside the team's allowed URIs before reading it,
also when a symlink under an allowed folder leads out, and stores nothing."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from trainpipe.errors import OutsideStorageRootError, PolicyViolationError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot


@pytest.fixture
def storage(tmp_path: Path, monkeypatch) -> Settings:
    root = tmp_path / "storage"
    (root / "demo").mkdir(parents=True)
    pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}).to_parquet(root / "demo" / "ok.parquet")
    secret = tmp_path / "outside" / "secret.parquet"
    secret.parent.mkdir()
    pd.DataFrame({"password": ["hunter2"] * 4}).to_parquet(secret)
    (root / "demo" / "link.parquet").symlink_to(secret)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{root}")
    return Settings.from_env()


def _data(uri: str) -> DataPlan:
    return DataPlan(uri=uri, conn_id=None, format="parquet", time_column=None, window=None, holdout_fraction=0.5,
                    holdout_key=None, allowed_uris=("demo/ok.parquet", "demo/link.parquet"))


def test_a_symlink_out_of_the_allowed_folder_is_refused_before_reading(storage):
    when = datetime(2025, 1, 2, tzinfo=UTC)
    snapshots = Path(storage.storage_root.removeprefix("file://")) / "snapshots"
    assert take_snapshot("risk_p", _data("demo/ok.parquet"), settings=storage, logical_date=when).rows == 4
    before = sorted(p.name for p in (snapshots / "risk_p").iterdir())
    with pytest.raises(PolicyViolationError, match=r"data.uri 'demo/link.parquet' resolves outside the URIs the "
                                                   r"platform policy allows"):
        take_snapshot("risk_p", _data("demo/link.parquet"), settings=storage, logical_date=when)
    with pytest.raises(PolicyViolationError, match="nothing was read"):
        take_snapshot("risk_p", dataclasses.replace(_data("demo/ok.parquet"), allowed_uris=("s3://risk-data/**",)),
                      settings=storage, logical_date=when)
    # Nothing of the secret was stored: no new dataset version.
    assert sorted(p.name for p in (snapshots / "risk_p").iterdir()) == before
    # Without a policy (no allowed URIs in the plan) the link out of the storage root is refused too, and an
    # absolute path to a worker's file (its first line would show as "columns present").
    outside = Path(storage.storage_root.removeprefix("file://")).parent / "outside" / "secret.parquet"
    for uri in ("demo/link.parquet", str(outside)):
        with pytest.raises(OutsideStorageRootError, match="is a local path outside the storage root; nothing was read"):
            take_snapshot("risk_q", dataclasses.replace(_data(uri), allowed_uris=None), settings=storage, logical_date=when)
    assert not (snapshots / "risk_q").exists()
    assert take_snapshot("risk_q", dataclasses.replace(_data("demo/ok.parquet"), allowed_uris=None),
                         settings=storage, logical_date=when).rows == 4
