"""The training key (issue 33): the same inputs give the same key; the data, a result-changing setting, the
trainer's image or a run's override give another. The lookup against a real MLflow registry honours max_age,
and a run's `force` is true or false, never guessed."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from trainpipe.errors import SpecError
from trainpipe.plan.build import build_plan
from trainpipe.plan.model import PipelinePlan
from trainpipe.plan.params import apply_run_params
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded
from trainpipe.state.datasets import SnapshotInfo
from trainpipe.state.training_cache import cached_version, forced, training_key


def _plan(training: str = "", seed: int = 1) -> PipelinePlan:
    text = f"""
pipeline_id: keyed
data: {{uri: demo/keyed.parquet}}
training: {{task: binary_classification, features: [amount], label: is_fraud, seed: {seed}{training}}}
evaluation: {{metrics: [auc]}}
registration: {{model_name: keyed}}
params: {{learning_rate: {{description: this run's}}}}
"""
    return build_plan(validate_loaded(load_yaml_text(text, "keyed.yaml")), spec_file="keyed.yaml", spec_text=text)


def _snapshot(digest: str = "a" * 64) -> SnapshotInfo:
    return SnapshotInfo(digest=digest, uri="file:///s", train_uri="file:///s/train.parquet",
                        holdout_uri="file:///s/holdout.parquet", rows=10, train_rows=8, holdout_rows=2,
                        window_start=None, window_end=None, source_uri="file:///d")


def test_the_same_inputs_give_the_same_key_and_any_change_another():
    plan, snapshot = _plan(), _snapshot()
    key = training_key(plan, snapshot, param_overrides={})
    assert key == training_key(_plan(), _snapshot(), param_overrides={})
    overridden, overrides = apply_run_params(plan, {"learning_rate": 0.05})
    others = {
        "data": training_key(plan, _snapshot("b" * 64), param_overrides={}),
        "seed": training_key(_plan(seed=2), snapshot, param_overrides={}),
        "hyperparameter": training_key(_plan(", epochs: 3"), snapshot, param_overrides={}),
        "override": training_key(overridden, snapshot, param_overrides=overrides),
        "world size": training_key(_plan(", distributed: {nproc_per_node: 2}"), snapshot, param_overrides={}),
    }
    assert key not in others.values() and len(set(others.values())) == len(others), others


def test_where_the_run_trains_is_not_an_input():
    """The storage root and the run's folders are not in the key: the same training elsewhere is the same."""
    plan = _plan()
    moved = dataclasses.replace(plan, trainer=dataclasses.replace(
        plan.trainer, output_uri="s3://elsewhere/output", tracking=dataclasses.replace(
            plan.trainer.tracking, tracking_uri="http://mlflow.example")))
    assert training_key(moved, _snapshot(), param_overrides={}) == training_key(plan, _snapshot(), param_overrides={})


def test_the_lookup_finds_a_fresh_version_only(tmp_path):
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_registered_model("keyed")
    run = client.create_run(client.create_experiment("keyed")).info.run_id
    client.create_model_version("keyed", f"runs:/{run}/model", run_id=run, tags={"trainpipe.training_key": "k1"})
    client.create_model_version("keyed", f"runs:/{run}/model", run_id=run, tags={"trainpipe.training_key": "k2"})

    found = cached_version(client, "keyed", "k2", max_age=timedelta(days=30))
    assert found is not None and found.version == 2
    assert cached_version(client, "keyed", "k3", max_age=timedelta(days=30)) is None
    later = datetime.now(UTC) + timedelta(days=31)
    assert cached_version(client, "keyed", "k2", max_age=timedelta(days=30), now=later) is None
    assert cached_version(client, "unknown_model", "k2", max_age=timedelta(days=30)) is None


def test_force_is_true_or_false():
    assert forced({"force": True}) and not forced({"force": False}) and not forced({}) and not forced(None)
    with pytest.raises(SpecError, match=r"run conf: force: must be true or false, got 'yes'; trigger the run with"):
        forced({"force": "yes"})
