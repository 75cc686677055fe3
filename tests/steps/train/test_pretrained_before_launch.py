"""``training.model.pretrained`` in the train step: resolved against this worker's storage root into the trainer
config's absolute ``model.pretrained_uri``, and checked again as the snapshot step checks data.uri (links
followed; a policy's data.uris), before anything is launched. A refusal is located at the spec's line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.spec.test_transformer_spec import classifier
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.steps.train.train import pretrained_uri


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    storage = tmp_path / "storage"
    (storage / "models" / "tiny-gpt2").mkdir(parents=True)
    (storage / "models" / "tiny-gpt2" / "config.json").write_text("{}")
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{storage}")
    return storage


def _plan(tmp_path: Path, pretrained: str, spec: dict[str, Any] | None = None):
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec or classifier(pretrained=pretrained), sort_keys=False))
    return compile_file(folder / "spec.yaml", "spec.yaml", settings=Settings.from_env(), configs_root=folder)


def _policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uris: list[str]) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"default_team": None, "teams": {"nlp": {"folders": ["**"],
                                                                            "data": {"uris": uris}}}}))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(file))


def test_a_folder_under_the_root_becomes_its_absolute_uri(tmp_path, root):
    plan = _plan(tmp_path, "models/tiny-gpt2")

    assert pretrained_uri(plan, Settings.from_env()) == f"file://{root}/models/tiny-gpt2"


def test_an_s3_folder_and_a_hub_id_pass_as_written(tmp_path, root, monkeypatch):
    assert pretrained_uri(_plan(tmp_path, "s3://nlp-models/gpt2"), Settings.from_env()) == "s3://nlp-models/gpt2"
    file = tmp_path / "hub-policy.yaml"
    file.write_text(yaml.safe_dump({"default_team": None, "teams": {"nlp": {"folders": ["**"],
                                                                            "models": {"hub": True}}}}))
    monkeypatch.setenv("TRAINPIPE_POLICY", str(file))
    assert pretrained_uri(_plan(tmp_path, "hf://openai-community/gpt2"), Settings.from_env()) == \
        "hf://openai-community/gpt2"


def test_a_link_out_of_the_root_is_refused_at_the_spec_s_line(tmp_path, root):
    """The spec stage sees a path under the root; on this worker it is a link to /etc: nothing is handed on."""
    os.symlink("/etc", root / "models" / "escape")
    plan = _plan(tmp_path, "models/escape")

    with pytest.raises(SpecError) as raised:
        pretrained_uri(plan, Settings.from_env())

    [problem] = raised.value.problems
    assert problem.field_path == "training.model.pretrained"
    assert problem.line == plan.inputs_declared_at["model.pretrained"][1]
    assert "is a local path outside the storage root; nothing was read" in problem.message
    assert "/etc" not in problem.message.replace("'models/escape'", "")


def test_under_a_policy_a_link_out_of_data_uris_is_refused(tmp_path, root, monkeypatch):
    (root / "other").mkdir()
    os.symlink(root / "other", root / "models" / "sideways")
    _policy(tmp_path, monkeypatch, ["demo/**", "models/**"])
    plan = _plan(tmp_path, "models/sideways")
    assert plan.data.allowed_uris == ("demo/**", "models/**")

    with pytest.raises(SpecError, match="training.model.pretrained 'models/sideways' resolves outside the URIs"):
        pretrained_uri(plan, Settings.from_env())
    assert pretrained_uri(_plan(tmp_path, "models/tiny-gpt2"), Settings.from_env()) == \
        f"file://{root}/models/tiny-gpt2"


def test_the_run_s_trainer_config_carries_the_resolved_uri(tmp_path, root):
    from types import SimpleNamespace

    from trainpipe.steps.train.train import RunContext, trainer_config_for_run

    plan = _plan(tmp_path, "models/tiny-gpt2")
    snapshot = SimpleNamespace(train_uri="file:///x/train.parquet", digest="d" * 64, label_classes=["a", "b"], kind="copy")
    run = RunContext(dag_id="ticket_router", airflow_run_id="r", try_number=1, spec_sha256="s", git_commit=None)
    from airflow.sdk import ObjectStoragePath

    config = trainer_config_for_run(plan, snapshot, settings=Settings.from_env(), run=run,  # type: ignore[arg-type]
                                    mlflow_run_id=None, run_dir=ObjectStoragePath(f"file://{tmp_path}/run"))

    assert config.model.pretrained_uri == f"file://{root}/models/tiny-gpt2"
    assert config.model.params == plan.trainer.model.params


@pytest.mark.parametrize("label", [None, "completion"])
def test_a_causal_lm_s_inputs_are_its_text_columns_before_launch(tmp_path, root, label):
    """No label to check for a plain language model; a missing completion column is located at the label."""
    import pandas as pd

    from tests.spec.test_transformer_spec import language_model
    from trainpipe.steps.train.train import check_training_inputs, trainer_config_for_run

    plan = _plan(tmp_path, "", spec=language_model(label=label))
    train = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": ["which queue takes a refund?", "where is my parcel?"]}).to_parquet(train)
    from types import SimpleNamespace

    from airflow.sdk import ObjectStoragePath

    from trainpipe.steps.train.train import RunContext

    snapshot = SimpleNamespace(train_uri=f"file://{train}", digest="d" * 64, label_classes=None, schema=None,
                               kind="copy")
    run = RunContext(dag_id="ticket_router", airflow_run_id="r", try_number=1, spec_sha256="s", git_commit=None)
    config = trainer_config_for_run(plan, snapshot, settings=Settings.from_env(), run=run,  # type: ignore[arg-type]
                                    mlflow_run_id=None, run_dir=ObjectStoragePath(f"file://{tmp_path}/run"))
    if label is None:
        check_training_inputs(plan, config, snapshot, settings=Settings.from_env())  # type: ignore[arg-type]
        return
    with pytest.raises(SpecError) as raised:
        check_training_inputs(plan, config, snapshot, settings=Settings.from_env())  # type: ignore[arg-type]
    [problem] = raised.value.problems
    assert problem.field_path == "training.label" and "completion" in problem.message


def test_new_weights_in_the_same_folder_change_the_training_key(tmp_path, root):
    """Unchanged inputs train nothing; new weights written where the spec points are new inputs."""
    from trainpipe.state.datasets import SnapshotInfo
    from trainpipe.state.training_cache import training_key
    from trainpipe.steps.train.train import pretrained_fingerprint

    plan = _plan(tmp_path, "models/tiny-gpt2")
    snapshot = SnapshotInfo(digest="d" * 64, uri="file:///snapshot", train_uri="file:///snapshot/train.parquet",
                            holdout_uri="file:///snapshot/holdout.parquet", rows=10, train_rows=8, holdout_rows=2,
                            window_start=None, window_end=None, source_uri="file:///source.parquet")
    settings = Settings.from_env()

    def key() -> str:
        return training_key(plan, snapshot, param_overrides={}, pretrained=pretrained_fingerprint(plan, settings))

    first = key()
    assert key() == first
    weights = root / "models" / "tiny-gpt2" / "model.safetensors"
    weights.write_bytes(b"weights")
    second = key()
    assert second != first
    os.utime(weights, ns=(1, 1))  # rewritten (a copy of other weights), the same size
    assert key() not in {first, second}
    # A family without pretrained weights keeps the key it had before fingerprints existed.
    assert training_key(plan, snapshot, param_overrides={}) == training_key(plan, snapshot, param_overrides={},
                                                                            pretrained=None)


def test_reproduce_refuses_a_pretrained_folder_whose_files_changed(tmp_path, root):
    """Before anything is trained: the folder the spec names must hold the files the version started from (the
    trainer's sha256 over them, recorded on the version); changed weights are refused naming both hashes."""
    from trainpipe.errors import ReproduceError
    from trainpipe.steps.train.reproduce import Lineage, check_pretrained
    from trainpipe_trainer.models.transformer.pretrained import folder_sha256
    from trainpipe_trainer.outcomes import PRETRAINED_SHA256_TAG, PRETRAINED_URI_TAG

    folder = root / "models" / "tiny-gpt2"
    (folder / "model.safetensors").write_bytes(b"the weights it started from")
    recorded = folder_sha256(folder)  # what the trainer tagged the run with
    plan = _plan(tmp_path, "models/tiny-gpt2")
    lineage = Lineage(model_name="intent", version=3, alias=None, mlflow_run_id="r", dag_id="spec", dataset_digest="d",
                      spec_file="spec.yaml", spec_sha256="s", spec_text="", seed=None, world_size=None,
                      param_overrides={}, weights_sha256="w",
                      model_family={PRETRAINED_URI_TAG: folder.as_uri(), PRETRAINED_SHA256_TAG: recorded})

    check_pretrained(lineage, plan, Settings.from_env())  # the same files: nothing to say

    (folder / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(ReproduceError) as refused:
        check_pretrained(lineage, plan, Settings.from_env())
    message = str(refused.value)
    assert f"sha256 {recorded[:16]}" in message and f"sha256 {folder_sha256(folder)[:16]}" in message
    assert "intent version 3" in message and "restore that folder" in message
