"""trainpipe_trainer.tracking: what the MLflow run records about a config."""

from __future__ import annotations

from trainpipe_trainer.config import CheckpointConfig, TrackingConfig, TrainingConfig
from trainpipe_trainer.tracking import flatten_params


def test_flatten_params_records_hyperparameters_but_not_uris_or_tags() -> None:
    config = TrainingConfig(
        pipeline_id="p",
        task="ranking",
        group_column="qid",
        train_data_uri="s3://b/train.parquet",
        features=("a", "b"),
        label="y",
        checkpoint=CheckpointConfig(root_uri="s3://b/ckpt", every_n_steps=50),
        tracking=TrackingConfig(tracking_uri="https://user:secret@mlflow", run_id="abc"),
        output_uri="s3://b/out",
        storage_options={"client_kwargs": {"endpoint_url": "http://minio"}},
        tags={"dag_id": "d"},
    )
    params = flatten_params(config, world_size=4)
    assert params["world_size"] == "4"
    assert params["features_count"] == "2"
    assert params["features"] == '["a", "b"]'
    assert params["model.hidden_layers"] == "[64, 32]"
    assert params["model.ranking_loss"] == "listwise"
    assert params["checkpoint.every_n_steps"] == "50"
    assert params["strategy"] == "ddp"
    assert not [k for k in params if k.startswith(("storage_options", "tags"))]
    assert "tracking.tracking_uri" not in params and "tracking.run_id" not in params
