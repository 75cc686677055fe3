"""trainpipe_trainer.tracking.tracker: what the MLflow run records about a config."""

from __future__ import annotations

from pathlib import Path

from trainpipe_trainer.config import CheckpointConfig, TrackingConfig, TrainingConfig
from trainpipe_trainer.tracking.tracker import flatten_params


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
    # Left out like the config's JSON leaves it out: a ranking run's params are what they were.
    assert not [k for k in params if k.startswith("label_classes")]


def test_flatten_params_records_a_multiclass_runs_classes_in_order() -> None:
    config = TrainingConfig(pipeline_id="p", task="multiclass_classification", label_classes=("10", "2", "7"),
                            train_data_uri="t.parquet", features=("a",), label="y",
                            checkpoint=CheckpointConfig(root_uri="file:///unused"), output_uri="o")
    params = flatten_params(config, world_size=1)
    assert params["label_classes"] == '["10", "2", "7"]'
    assert params["label_classes_count"] == "3"


class FlakyServer:
    """Stands in for MlflowClient.log_batch: refuses while ``down``, records what it accepts."""

    def __init__(self) -> None:
        self.down = False
        self.metrics: list[tuple[str, float, int, int]] = []
        self.tags: dict[str, str] = {}
        self.refused = 0

    def send(self, metrics: list, tags: dict[str, str]) -> None:
        if self.down:
            self.refused += 1
            raise ConnectionError("connection refused")
        self.metrics.extend(metrics)
        self.tags.update(tags)


def _publisher(server: FlakyServer, tmp_path: Path, *, max_buffered: int = 1000, messages: list[str] | None = None):
    from trainpipe_trainer.tracking.tracker import MetricPublisher

    return MetricPublisher(
        send=server.send,
        max_buffered=max_buffered,
        spill_path=tmp_path / "spill" / "run.jsonl",
        flush_every_seconds=0.01,
        max_backoff_seconds=0.05,
        say=(messages if messages is not None else []).append,
    )


def test_metrics_logged_during_an_outage_are_all_delivered_once_it_ends(tmp_path: Path) -> None:
    server = FlakyServer()
    messages: list[str] = []
    publisher = _publisher(server, tmp_path, max_buffered=50, messages=messages)
    publisher.start()
    publisher.log_metric("train_loss", 1.0, 1)
    assert publisher.flush(timeout=10)
    server.down = True
    for step in range(2, 302):
        publisher.log_metric("train_loss", float(step), step)
    publisher.set_tags({"resumed_from_step": "1"})
    # Beyond max_buffered the oldest metrics wait in the spill file, not in memory.
    assert publisher.spilled >= 250
    assert not publisher.flush(timeout=0.3)
    assert server.refused >= 1
    server.down = False
    assert publisher.flush(timeout=10)
    assert publisher.close(timeout=5)
    assert sorted(step for _, _, _, step in server.metrics) == list(range(1, 302))
    assert len({(key, step) for key, _, _, step in server.metrics}) == 301
    assert server.tags == {"resumed_from_step": "1"}
    assert not (tmp_path / "spill" / "run.jsonl").exists()
    assert messages[0].startswith("cannot reach the tracking server (ConnectionError: connection refused)")
    assert messages[-1].startswith("the tracking server is reachable again")


def test_metrics_still_undelivered_at_the_end_stay_on_disk_for_the_next_attempt(tmp_path: Path) -> None:
    server = FlakyServer()
    server.down = True
    first = _publisher(server, tmp_path, max_buffered=10)
    first.start()
    for step in range(1, 26):
        first.log_metric("train_loss", float(step), step)
    assert not first.close(timeout=0.2)
    assert (tmp_path / "spill" / "run.jsonl").exists()

    server.down = False
    retry = _publisher(server, tmp_path, max_buffered=10)
    retry.start()
    retry.log_metric("train_loss", 26.0, 26)
    assert retry.close(timeout=10)
    assert sorted(step for _, _, _, step in server.metrics) == list(range(1, 27))


def test_log_metric_only_queues(tmp_path: Path) -> None:
    server = FlakyServer()
    publisher = _publisher(server, tmp_path)
    # Not started: nothing is sent, the call just queues (the loop never waits for the network).
    publisher.log_metric("train_loss", 0.5, 3)
    assert server.metrics == [] and publisher.backlog() == 1
