"""trainpipe_trainer.storage: one way to read and write local paths, file:// and s3:// URIs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from trainpipe_trainer import storage
from trainpipe_trainer.data.splits import read_parquet
from trainpipe_trainer.errors import TrainerDataError

from .helpers import S3


def test_local_write_creates_parents_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = storage.join((tmp_path / "out").as_uri(), "nested", "result.json")
    storage.write_text(target, '{"ok": true}')
    assert storage.read_text(target) == '{"ok": true}'
    assert [p.name for p in (tmp_path / "out" / "nested").iterdir()] == ["result.json"]


def test_join_tolerates_slashes() -> None:
    assert storage.join("s3://b/run/", "/step-3/", "manifest.json") == "s3://b/run/step-3/manifest.json"


def test_s3_text_and_parquet(s3_bucket: S3) -> None:
    storage.write_text(s3_bucket.uri("out/result.json"), "{}", s3_bucket.storage_options)
    assert storage.read_text(s3_bucket.uri("out/result.json"), s3_bucket.storage_options) == "{}"

    frame = pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1]})
    fs, path = storage.url_to_fs(s3_bucket.uri("data/train.parquet"), s3_bucket.storage_options)
    with fs.open(path, "wb") as handle:
        frame.to_parquet(handle)
    pd.testing.assert_frame_equal(read_parquet(s3_bucket.uri("data/train.parquet"), s3_bucket.storage_options), frame)
    with pytest.raises(TrainerDataError, match=r"train_data_uri: s3://.*/data/absent\.parquet does not exist"):
        read_parquet(s3_bucket.uri("data/absent.parquet"), s3_bucket.storage_options)
