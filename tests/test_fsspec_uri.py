"""URIs handed to the trainer (fsspec, no Airflow) carry no Airflow connection id."""

from __future__ import annotations


def test_fsspec_uri_of_an_s3_path_with_a_connection_has_no_connection_id(tmp_path):
    from airflow.sdk import ObjectStoragePath

    from trainpipe.storage import fsspec_uri

    path = ObjectStoragePath("s3://bucket/storage/runs/p/r/trainer_config.json", conn_id="trainpipe_s3")

    assert str(path) == "s3://trainpipe_s3@bucket/storage/runs/p/r/trainer_config.json"  # what fsspec cannot open
    assert fsspec_uri(path) == "s3://bucket/storage/runs/p/r/trainer_config.json"
    assert fsspec_uri(ObjectStoragePath(tmp_path.as_uri()) / "x.json") == (tmp_path / "x.json").as_uri()
