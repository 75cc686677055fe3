"""Unchanged inputs train nothing (issue 33): real dag.test() runs (torchrun, GE, MLflow, trainpipe's note listener).

A second run on the same data finds version 1 by its training key and skips train onwards, saying so in its note;
`force: true` trains again, and its candidate (same data, same seed: the same weights) is not registered; a
changed seed, hyperparameter or data trains again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.support import load_dag, run_dag

pytestmark = [pytest.mark.integration, pytest.mark.slow]

END = datetime(2026, 10, 31, tzinfo=UTC)
DAG_ID = "cache_pipeline"
SEED = "  seed: 3\n"
PARAMS = """\
params:
  seed:
    description: seed of this run
  learning_rate:
    description: learning rate of this run
"""
AFTER_TRAIN = ("evaluate", "gate", "register", "promote")


@pytest.fixture(scope="module")
def configs(small_pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cache_configs")
    (folder / f"{DAG_ID}.yaml").write_text(small_pipeline.spec(DAG_ID, "cache", training=SEED, tail=PARAMS))
    _data(small_pipeline, seed=7)
    return folder


def _data(small_pipeline, *, seed: int) -> None:
    # 20 days of rows in a 30-day window: a run a day later snapshots the same rows (the same dataset version).
    small_pipeline.data(DAG_ID, "cache", end=END, seed=seed)


def _note(dag_run) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        note = DagRun.find(dag_id=dag_run.dag_id, run_id=dag_run.run_id, session=session)[0].note
    assert note, "the run has no note"
    return note.splitlines()[0]


def _versions(client) -> list[int]:
    return sorted(int(v.version) for v in client.search_model_versions(f"name = '{DAG_ID}'"))


def test_same_inputs_train_nothing_force_trains_and_identical_weights_register_nothing(configs, small_pipeline,
                                                                                        monkeypatch):
    import mlflow

    client = mlflow.MlflowClient()

    def run(day: int, **conf):
        return run_dag(load_dag(configs, DAG_ID, monkeypatch), logical_date=END + timedelta(days=day),
                       run_conf=conf or None)

    first, states = run(0)
    assert states["promote"] == "success", states
    version_1 = client.get_model_version(DAG_ID, "1")
    key = version_1.tags["trainpipe.training_key"]
    assert len(key) == 64

    # The same rows a day later: nothing trained, the grid shows every step after validate as skipped.
    second, states = run(1)
    assert second.state == "success"
    assert {task: states[task] for task in ("train", "watch_checkpoints", *AFTER_TRAIN)} == dict.fromkeys(
        ("train", "watch_checkpoints", *AFTER_TRAIN), "skipped"), states
    trained_on = datetime.fromtimestamp(version_1.creation_timestamp / 1000, UTC).date().isoformat()
    assert _note(second) == f"inputs unchanged since version 1 (trained {trained_on}): nothing trained"
    assert _versions(client) == [1]

    # force: true trains again; the same data and seed give the same weights: no second version of them.
    forced, states = run(2, force=True)
    assert states["train"] == states["evaluate"] == "success", states
    assert states["register"] == states["promote"] == "skipped", states
    assert _note(forced) == f"weights unchanged: identical to {DAG_ID} version 1 (champion); nothing registered"
    assert _versions(client) == [1]

    # Another seed, another learning rate: other inputs, trained (and registered: other weights).
    for day, conf in ((3, {"seed": 4}), (4, {"learning_rate": 0.01})):
        changed, states = run(day, **conf)
        assert states["train"] == "success" and states["register"] == "success", (conf, states)
        assert client.get_model_version(DAG_ID, str(_versions(client)[-1])).tags["trainpipe.training_key"] != key

    # New data: a new dataset version, trained.
    _data(small_pipeline, seed=8)
    new_data, states = run(5)
    assert states["train"] == "success" and states["register"] == "success", states

    # `trainpipe gc` keeps what the cache entry (version 1) points to: its snapshot, no longer the baseline.
    from trainpipe.settings import Settings
    from trainpipe.state.retention import DriftPins, collect

    digest = version_1.tags["dataset_digest"][:16]
    plan = collect(Settings.from_env(), older_than=timedelta(0), keep_runs=0, pins=DriftPins(by_pipeline={}),
                   client=client)
    assert not [item for item in plan.items if item.kind == "snapshot" and digest in item.label]
    kept = [line for line in plan.kept if digest in line]
    assert kept and "a registered model version was trained on it" in kept[0], plan.kept


def test_a_force_that_is_not_a_boolean_fails_the_run_saying_so(configs, monkeypatch):
    dag_run, states = run_dag(load_dag(configs, DAG_ID, monkeypatch), logical_date=END + timedelta(days=9),
                              run_conf={"force": "yes"})
    assert states["train"] == "failed", states
    assert dag_run.state == "failed"
