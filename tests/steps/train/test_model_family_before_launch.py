"""The train step, before launch, with a model family that is not built in: the local launcher's family is
found in the worker's environment and checks its params, each refusal located at the spec's line before any data
is read; the DAG run's MLflow run records where the family came from, and register copies that onto the version."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.plan.tracking import (
    MODEL_FAMILY_DISTRIBUTION_TAG,
    MODEL_FAMILY_SHA256_TAG,
    MODEL_FAMILY_TAG,
    MODEL_FAMILY_VERSION_TAG,
    TRAINER_IMAGE_TAG,
)
from trainpipe.settings import Settings
from trainpipe.steps.snapshot import take_snapshot
from trainpipe.steps.train.train import (
    RunContext,
    check_training_inputs,
    model_family_tags,
    prepare_training_run,
    trainer_config_for_run,
)
from trainpipe.storage import storage_access

DAY = datetime(2026, 11, 5, tzinfo=UTC)
RUN = RunContext(dag_id="tabular", airflow_run_id="manual__family", try_number=1, spec_sha256="0" * 64,
                 git_commit=None)


def _spec(model: dict) -> dict:
    return {
        "pipeline_id": "tabular",
        "data": {"uri": "tabular.parquet", "time_column": "event_time", "window": "30d"},
        "training": {"task": "regression", "features": ["x1", "x2"], "label": "y", "model": model, "epochs": 1},
        "evaluation": {"metrics": ["rmse"]},
        "registration": {"model_name": "tabular"},
    }


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "storage"
    root.mkdir()
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", root.as_uri())
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    rng = np.random.default_rng(0)
    pd.DataFrame({"event_time": [DAY - timedelta(hours=h + 1) for h in range(40)], "x1": rng.normal(size=40),
                  "x2": rng.normal(size=40), "y": rng.normal(size=40)}).to_parquet(root / "tabular.parquet")
    return root


def _plan(tmp_path: Path, model: dict):
    file = tmp_path / "tabular.yaml"
    file.write_text(yaml.safe_dump(_spec(model), sort_keys=False))
    return compile_file(file, "tabular.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _run_dir(tmp_path: Path):
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath((tmp_path / "run").as_uri())


def _refusal(tmp_path: Path, model: dict) -> tuple[str, str, str]:
    """(field path, the spec line it points at, message) of the check before launch, made while the snapshot's
    train split is moved away: a check that read data first would fail otherwise."""
    plan = _plan(tmp_path, model)
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=_run_dir(tmp_path))
        split = Path(snapshot.train_uri.removeprefix("file://"))
        aside = split.with_suffix(".aside")
        split.rename(aside)
        try:
            with pytest.raises(SpecError) as raised:
                check_training_inputs(plan, config, snapshot, settings=settings)
        finally:
            aside.rename(split)  # the next call of the test takes the same (content-addressed) version
    [problem] = raised.value.problems
    lines = (tmp_path / "tabular.yaml").read_text().splitlines()
    assert problem.file == "tabular.yaml"
    return problem.field_path, lines[problem.line - 1].strip(), problem.message


def test_a_family_no_package_registers_is_refused_at_model_type(tmp_path, storage):
    field, line, message = _refusal(tmp_path, {"type": "acme_nowhere"})

    assert (field, line) == ("training.model.type", "type: acme_nowhere")
    assert message.startswith("no model family 'acme_nowhere' is installed here (installed: mlp")
    assert "Airflow worker's environment for the local launcher" in message


def test_a_parameter_the_family_refuses_is_located_at_its_key(tmp_path, storage, install_family):
    install_family()

    assert _refusal(tmp_path, {"type": "acme_tabnet", "params": {"depth": 40}}) == (
        "training.model.params.depth", "depth: 40", "an integer from 1 to 8, got 40")
    # Below a top-level key: named whole, placed at that key's line.
    field, line, message = _refusal(tmp_path, {"type": "acme_tabnet", "params": {
        "depth": 2, "blocks": [{"kind": "res"}, {"kind": "conv"}]}})
    assert (field, line, message) == ("training.model.params.blocks[1].kind", "blocks:", "res or dense, got 'conv'")
    assert _refusal(tmp_path, {"type": "acme_tabnet", "params": {"width": 3}}) == (
        "training.model.params.width", "width: 3", "unknown parameter; use depth, blocks or note")


def test_a_family_whose_module_does_not_import_is_refused_at_model_type(tmp_path, storage, install_family):
    install_family(source="import acme_dependency_not_installed\n")

    field, line, message = _refusal(tmp_path, {"type": "acme_tabnet"})

    assert (field, line) == ("training.model.type", "type: acme_tabnet")
    assert message.startswith("the model family 'acme_tabnet' is registered but cannot be imported in this "
                              "environment (ModuleNotFoundError: No module named 'acme_dependency_not_installed')")


def test_templates_and_paths_reach_the_family_as_literal_text(tmp_path, storage, install_family, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", json.dumps({"conn_type": "generic", "password": "pw-never-read"}))
    family = install_family()
    note = {"template": "{{ conn.leak.password }}", "path": "../../etc/passwd"}
    plan = _plan(tmp_path, {"type": "acme_tabnet", "params": {"depth": 3, "note": [note]}})
    settings = Settings.from_env()
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        config = trainer_config_for_run(plan, snapshot, settings=settings, run=RUN, mlflow_run_id=None,
                                        run_dir=_run_dir(tmp_path))
        check_training_inputs(plan, config, snapshot, settings=settings)

    assert family.seen() == [{"depth": 3, "note": [note]}]
    assert json.loads(config.to_json())["model"]["params"] == {"depth": 3, "note": [note]}
    assert "pw-never-read" not in config.to_json()


def test_the_run_records_the_family_and_register_copies_it(tmp_path, storage, install_family):
    from trainpipe.hooks.mlflow import MlflowHook
    from trainpipe.steps.register.lineage import model_family_tags as version_family_tags

    family = install_family(version="2.1.0")
    plan = _plan(tmp_path, {"type": "acme_tabnet", "params": {"depth": 3}})
    settings = Settings.from_env()
    hook = MlflowHook(settings)
    with storage_access(settings):
        snapshot = take_snapshot(plan.dag_id, plan.data, settings=settings, logical_date=DAY)
        prepared = prepare_training_run(plan, snapshot, settings=settings, run=RUN, hook=hook,
                                        run_dir=_run_dir(tmp_path))

    expected = {MODEL_FAMILY_TAG: "acme_tabnet", MODEL_FAMILY_DISTRIBUTION_TAG: family.distribution,
                MODEL_FAMILY_VERSION_TAG: "2.1.0", MODEL_FAMILY_SHA256_TAG: family.record_sha256}
    tags = hook.client.get_run(prepared.mlflow_run_id).data.tags
    assert {key: tags.get(key) for key in expected} == expected
    assert TRAINER_IMAGE_TAG not in tags
    # What the register step puts on the version with its lineage.
    assert version_family_tags(hook.client, prepared.mlflow_run_id) == expected


def test_the_built_in_mlp_is_recorded_as_the_trainer_s(tmp_path, storage):
    from importlib import metadata

    plan = _plan(tmp_path, {"hidden_layers": [4]})

    tags = model_family_tags(plan, plan.trainer)

    assert tags[MODEL_FAMILY_TAG] == "mlp" and tags[MODEL_FAMILY_DISTRIBUTION_TAG] == "trainpipe-trainer"
    assert tags[MODEL_FAMILY_VERSION_TAG] == metadata.version("trainpipe-trainer")


def test_on_kubernetes_the_family_is_the_image_s(monkeypatch):
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector_multinode.yaml").read_text())
    spec["training"]["model"] = {"type": "acme_tabnet", "params": {"depth": 3}}
    spec["training"]["kubernetes"]["image"] = "ghcr.io/acme/trainer@sha256:" + "ab" * 32
    from trainpipe.compile.compiler import compile_text

    plan = compile_text(yaml.safe_dump(spec, sort_keys=False), "multinode.yaml", configs_root=REPO / "dag_configs",
                        settings=Settings.from_env())

    # Nothing of the family is looked up here: it is installed in the image, not on the worker.
    assert model_family_tags(plan, plan.trainer) == {
        MODEL_FAMILY_TAG: "acme_tabnet", TRAINER_IMAGE_TAG: "ghcr.io/acme/trainer@sha256:" + "ab" * 32}
