"""The end-to-end fixtures: ``dag_from(configs, dag_id)`` loads a DAG as Airflow does (tests.support);
``small_pipeline`` writes the small spec and transactions data that the issue-33 tests share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from tests.support import load_dag


@pytest.fixture
def dag_from(monkeypatch: pytest.MonkeyPatch, airflow_db: Path) -> Callable:
    return lambda configs, dag_id: load_dag(configs, dag_id, monkeypatch)


class SmallPipeline:
    """A one-epoch MLP on a few thousand transactions (the training itself is not under test), under
    ``storage/<folder>/<pipeline_id>.parquet`` of the test state."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    @staticmethod
    def spec(pipeline_id: str, folder: str, *, validation: str = "", training: str = "", tail: str = "") -> str:
        """The spec's text; ``validation`` (a whole block), ``training`` (lines under it) and ``tail`` (lines at
        the end, under ``registration:`` first) are what a test adds."""
        return f"""\
pipeline_id: {pipeline_id}
schedule: none
retries: 0
data:
  uri: {folder}/{pipeline_id}.parquet
  time_column: event_time
  window: 30d
{validation}training:
  task: binary_classification
  model: {{type: mlp, hidden_layers: [8]}}
  features: [amount, merchant_risk, hour_of_day]
  label: is_fraud
  epochs: 1
  batch_size: 128
{training}  distributed: {{nproc_per_node: 1}}
  checkpoint: {{every_n_steps: 50}}
evaluation:
  metrics: [auc, f1]
  gates: ["f1 >= 0.0"]
registration:
  model_name: {pipeline_id}
{tail}"""

    def data(self, pipeline_id: str, folder: str, *, end: datetime, rows: int = 2000, days: int = 20,
             **generate: object) -> Path:
        """The pipeline's source data: ``days`` of transactions up to ``end`` (written again each call)."""
        from trainpipe.demo.synthetic import generate_transactions

        path = self.state_dir / "storage" / folder / f"{pipeline_id}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        generate_transactions(rows=rows, days=days, end=end, **generate).to_parquet(path, index=False)
        return path


@pytest.fixture(scope="session")
def small_pipeline(state_dir: Path, airflow_db: Path) -> SmallPipeline:
    return SmallPipeline(state_dir)
