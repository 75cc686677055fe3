"""A manifest dataset version (``data.snapshot: manifest``): the source's parquet files listed, nothing copied;
split by row groups, reused while the files are the same, and every reader stopped by a changed file."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainpipe.errors import DatasetChangedError, OutsideStorageRootError, SpecError
from trainpipe.plan.model import DataPlan
from trainpipe.settings import Settings
from trainpipe.state.datasets import load_manifest, read_split
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.storage import storage_access
from trainpipe_trainer.data.manifest import MANIFEST_FILE

DAY = datetime(2026, 11, 5, tzinfo=UTC)
SPEC = ("dag_configs/p.yaml", 7, 8)


def _settings(root: Path, tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", storage_root=root.as_uri(), storage_conn_id=None,
                    mlflow_tracking_uri="unused", mlflow_artifact_root=str(tmp_path / "artifacts"))


def _plan(uri: str, *, snapshot: str = "manifest", fraction: float = 0.3, **kw) -> DataPlan:
    fields = {"conn_id": None, "format": "parquet", "time_column": None, "window": None,
              "holdout_fraction": fraction, "holdout_key": None, "uri_declared_at": SPEC, **kw}
    return DataPlan(uri=uri, snapshot=snapshot, **fields)


def _write(path: Path, start: int, rows: int = 10, *, group: int = 3, extra: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {"x": pa.array([float(i) for i in range(start, start + rows)]),
               "y": pa.array([i % 2 for i in range(start, start + rows)], pa.int64())}
    if extra:
        columns["z"] = pa.array(["a"] * rows)
    pq.write_table(pa.table(columns), path, row_group_size=group)


@pytest.fixture
def lake(tmp_path: Path) -> tuple[Path, Settings]:
    root = tmp_path / "storage"
    _write(root / "lake" / "part-0.parquet", 0)
    _write(root / "lake" / "day=2" / "part-1.parquet", 10)
    (root / "lake" / "_SUCCESS").write_text("")
    # Skipped: Delta's log and hidden files are not data files (this one would fail the schema check).
    _write(root / "lake" / "_delta_log" / "x.parquet", 0, extra=True)
    _write(root / "lake" / ".tmp-upload.parquet", 0, extra=True)
    return root, _settings(root, tmp_path)


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_a_folder_becomes_a_manifest_version_split_by_row_groups_and_reused(lake):
    root, settings = lake
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY, run_id="r1")
        manifest, _ = load_manifest(info, settings=settings)
        train = read_split(info, "train", settings=settings)
        holdout = read_split(info, "holdout", settings=settings)
        again = take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY, run_id="r2")

    folder = root / "snapshots" / "p" / info.digest[:16]
    assert info.kind == "manifest" and info.digest == manifest.digest
    assert _files(folder) == {MANIFEST_FILE, "manifest.json"}  # no copy of the rows
    assert info.train_uri == info.holdout_uri == info.manifest_uri == (folder / MANIFEST_FILE).as_uri()
    assert [f.path for f in manifest.files] == ["day=2/part-1.parquet", "part-0.parquet"]
    assert [f.row_groups for f in manifest.files] == [(3, 3, 3, 1), (3, 3, 3, 1)]
    assert all(f.mtime is not None and f.etag is None for f in manifest.files)
    assert (info.rows, info.train_rows + info.holdout_rows) == (20, 20)
    assert 0 < info.holdout_rows < 20 and (len(train), len(holdout)) == (info.train_rows, info.holdout_rows)
    # Whole row groups on either side, and every row once.
    assert sorted([*train["x"], *holdout["x"]]) == [float(i) for i in range(20)]
    assert info.schema == [["x", "float64"], ["y", "int64"]]
    assert info.size_bytes == sum(f.size for f in manifest.files)
    assert again == info and again.created_by_run_id == "r1"

    # A new file is a new version; the first one stays as it was.
    _write(root / "lake" / "part-2.parquet", 20)
    with storage_access(settings):
        newer = take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)
    assert newer.digest != info.digest and newer.rows == 30
    assert (folder / "manifest.json").exists()


def test_read_split_stops_at_max_rows_and_reads_only_the_columns_asked(lake):
    _, settings = lake
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake", fraction=0.1), settings=settings, logical_date=DAY)
        head = read_split(info, "train", settings=settings, columns=["y"], max_rows=4)
    assert list(head.columns) == ["y"] and len(head) == 4


def test_a_file_changed_after_the_snapshot_stops_the_reader_naming_it_and_nothing_stored_changes(lake):
    root, settings = lake
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)
    folder = root / "snapshots" / "p" / info.digest[:16]
    stored = {name: (folder / name).read_bytes() for name in _files(folder)}
    changed = root / "lake" / "part-0.parquet"
    _write(changed, 100, rows=12)
    with storage_access(settings), pytest.raises(DatasetChangedError, match=r"part-0\.parquet: changed since "):
        read_split(info, "train", settings=settings)
    changed.unlink()
    with storage_access(settings), pytest.raises(DatasetChangedError, match=r"part-0\.parquet: listed by .* gone"):
        read_split(info, "holdout", settings=settings)
    assert {name: (folder / name).read_bytes() for name in _files(folder)} == stored


def test_one_file_with_another_schema_is_located_at_data_uri_naming_it(lake):
    root, settings = lake
    _write(root / "lake" / "part-9.parquet", 0, extra=True)
    with storage_access(settings), pytest.raises(SpecError) as caught:
        take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)
    text = str(caught.value)
    assert text.startswith("dag_configs/p.yaml:7:8: data.uri: ") and "part-9.parquet" in text
    assert "extra z (string)" in text, text
    assert not (root / "snapshots").exists()


def test_an_empty_folder_is_located_at_data_uri(tmp_path):
    root = tmp_path / "storage"
    (root / "empty").mkdir(parents=True)
    (root / "empty" / "_SUCCESS").write_text("")
    settings = _settings(root, tmp_path)
    with storage_access(settings), pytest.raises(SpecError, match=r"^dag_configs/p\.yaml:7:8: data\.uri: empty "
                                                                  r"holds no parquet files"):
        take_snapshot("p", _plan("empty"), settings=settings, logical_date=DAY)


def test_a_link_in_the_folder_to_a_file_outside_the_root_is_refused_unread(lake, tmp_path):
    root, settings = lake
    outside = tmp_path / "secret.parquet"
    _write(outside, 0)
    (root / "lake" / "day=2" / "leak.parquet").symlink_to(outside)
    before = os.stat(outside).st_atime_ns
    with storage_access(settings), pytest.raises(OutsideStorageRootError, match=r"leak\.parquet.* outside the "
                                                                                r"storage root; nothing was read"):
        take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)
    assert os.stat(outside).st_atime_ns == before  # its footer was never opened
    assert not (root / "snapshots").exists()


def test_auto_keeps_copying_a_small_folder_with_the_row_hash_split(lake):
    root, settings = lake
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake", snapshot="auto"), settings=settings, logical_date=DAY)
        copied = take_snapshot("p", _plan("lake", snapshot="copy"), settings=settings, logical_date=DAY)
    assert info.kind == "copy" and info.manifest_uri is None
    assert _files(root / "snapshots" / "p" / info.digest[:16]) == {"train.parquet", "holdout.parquet", "manifest.json"}
    # The same version a copy makes (today's behaviour exactly): the same rows, the same row-hash split.
    assert copied == info


def test_auto_lists_a_folder_of_256_mib_or_more_as_a_manifest(lake, monkeypatch):
    from trainpipe.plan import model

    root, settings = lake
    # The threshold lowered to the test folder's size: the decision is by listed sizes, nothing else.
    size = sum(p.stat().st_size for p in [root / "lake" / "part-0.parquet", root / "lake" / "day=2" / "part-1.parquet"])
    monkeypatch.setattr(model, "AUTO_MANIFEST_BYTES", size)
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake", snapshot="auto"), settings=settings, logical_date=DAY)
    assert info.kind == "manifest" and info.rows == 20
    monkeypatch.setattr(model, "AUTO_MANIFEST_BYTES", size + 1)
    with storage_access(settings):
        assert take_snapshot("p", _plan("lake", snapshot="auto"), settings=settings, logical_date=DAY).kind == "copy"


def test_a_thousand_tiny_files_snapshot_in_about_the_listings_time(tmp_path):
    root = tmp_path / "storage"
    table = pa.table({"x": pa.array([1.0, 2.0]), "y": pa.array([0, 1], pa.int64())})
    for i in range(1000):
        folder = root / "many" / f"d{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / f"f{i:04d}.parquet")
    settings = _settings(root, tmp_path)
    started = time.perf_counter()
    with storage_access(settings):
        info = take_snapshot("p", _plan("many"), settings=settings, logical_date=DAY)
    seconds = time.perf_counter() - started
    print(f"manifest snapshot of 1,000 local files: {seconds:.2f} s")
    assert info.rows == 2000
    # Generous (the target is under 10 s on a shared machine): proves the footers are not read one by one
    # through something slow, not a speed.
    assert seconds < 60


def test_read_split_of_a_copy_version_is_its_parquet_file(lake):
    root, settings = lake
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake", snapshot="copy"), settings=settings, logical_date=DAY)
        holdout = read_split(info, "holdout", settings=settings)
    pd.testing.assert_frame_equal(holdout, pd.read_parquet(root / "snapshots" / "p" / info.digest[:16] /
                                                           "holdout.parquet"))


def test_a_link_to_a_file_inside_the_root_is_listed_as_its_target_and_reads_back(lake):
    root, settings = lake
    _write(root / "elsewhere" / "kept.parquet", 50)
    (root / "lake" / "linked.parquet").symlink_to(root / "elsewhere" / "kept.parquet")
    with storage_access(settings):
        info = take_snapshot("p", _plan("lake", fraction=0.0), settings=settings, logical_date=DAY)
        manifest, _ = load_manifest(info, settings=settings)
        train = read_split(info, "train", settings=settings)
    [linked] = [f for f in manifest.files if f.path == "linked.parquet"]
    assert (linked.size, linked.mtime) == ((root / "elsewhere" / "kept.parquet").stat().st_size,
                                           (root / "elsewhere" / "kept.parquet").stat().st_mtime)
    assert info.rows == 30 and sorted(train["x"])[-1] == 59.0


def test_a_link_to_nothing_is_located_at_data_uri_naming_it(lake):
    root, settings = lake
    (root / "lake" / "gone.parquet").symlink_to(root / "never-written.parquet")
    with storage_access(settings), pytest.raises(SpecError, match=r"data\.uri: gone\.parquet of lake is a link to "
                                                                  r"nothing"):
        take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)


def test_under_a_policy_a_link_to_a_file_the_team_may_not_read_is_refused_unread(lake):
    from trainpipe.errors import PolicyViolationError

    root, settings = lake
    # Inside the storage root, but outside the team's allowed URIs.
    _write(root / "other-team" / "private.parquet", 0)
    (root / "lake" / "borrowed.parquet").symlink_to(root / "other-team" / "private.parquet")
    with storage_access(settings), pytest.raises(PolicyViolationError, match=r"borrowed\.parquet.* resolves outside "
                                                                             r"the URIs the platform policy allows"):
        take_snapshot("p", _plan("lake", allowed_uris=("lake/**", "lake")), settings=settings, logical_date=DAY)
    with storage_access(settings):  # the same folder without the link is allowed
        (root / "lake" / "borrowed.parquet").unlink()
        assert take_snapshot("p", _plan("lake", allowed_uris=("lake/**", "lake")), settings=settings,
                             logical_date=DAY).kind == "manifest"


def test_the_datasets_command_says_a_version_is_a_manifest_and_a_copy_says_nothing_new(lake, tmp_path, monkeypatch,
                                                                                        capsys):
    from trainpipe.commands.main import main

    root, settings = lake
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", root.as_uri())
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINPIPE_STORAGE_CONN_ID", raising=False)
    with storage_access(settings):
        listed = take_snapshot("p", _plan("lake"), settings=settings, logical_date=DAY)
        copied = take_snapshot("c", _plan("lake/part-0.parquet", snapshot="copy"), settings=settings,
                               logical_date=DAY)
    assert main(["datasets", "p"]) == 0
    out = capsys.readouterr().out
    assert f"p version {listed.digest[:16]}" in out
    assert "kind:        manifest: the source's files as listed in data_manifest.json, nothing copied" in out
    assert main(["datasets", "c"]) == 0
    out = capsys.readouterr().out
    assert f"c version {copied.digest[:16]}" in out and "kind:" not in out
