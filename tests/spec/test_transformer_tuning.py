"""Tuning the transformer family's own parameters (issue 53): ``max_length`` and ``lora_r`` in ``tuning.space``
compile to search dimensions below the trainer config's ``model.params``; under another family, without
``trainable: lora`` or outside the family's own bounds they are refused at their line, with the fix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.spec.test_transformer_spec import _compile, _line, _refused, classifier
from tests.support import REPO
from trainpipe.plan.params import with_trial_params
from trainpipe_trainer.config import SearchDimension


@pytest.fixture(autouse=True)
def _no_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)
    monkeypatch.setenv("TRAINPIPE_STORAGE_ROOT", f"file://{tmp_path / 'storage'}")


def tuned(space: dict[str, Any], **model: Any) -> dict[str, Any]:
    spec = classifier(**model)
    spec["training"].pop("distributed", None)  # trials run with the local launcher
    spec["tuning"] = {"n_trials": 4, "space": space}
    return spec


def test_max_length_and_lora_r_compile_to_dimensions_below_model_params(tmp_path):
    plan = _compile(tmp_path, tuned({"learning_rate": {"log_uniform": [0.0001, 0.01]},
                                     "max_length": {"choice": [32, 64, 128]}, "lora_r": {"int": [2, 16]}}))

    assert plan.tuning.space == (
        SearchDimension(name="learning_rate", target=("learning_rate",), distribution="log_uniform", low=0.0001,
                        high=0.01),
        SearchDimension(name="max_length", target=("model", "params", "max_length"), distribution="choice",
                        choices=("32", "64", "128")),
        SearchDimension(name="lora_r", target=("model", "params", "lora", "r"), distribution="int", low=2, high=16),
    )
    # A trial's values land in the trainer config's params; the rest of the config is the spec's.
    trial = with_trial_params(plan, {"max_length": "128", "lora_r": 12, "learning_rate": 0.001}).trainer
    assert trial.model.params == {"max_length": 128, "trainable": "lora", "lora": {"r": 12}}
    assert plan.trainer.model.params == {"max_length": 64, "trainable": "lora", "lora": {"r": 4}}
    assert dataclasses.replace(trial, model=plan.trainer.model, learning_rate=plan.trainer.learning_rate) \
        == plan.trainer
    assert json.loads(trial.to_json())["model"]["params"]["lora"] == {"r": 12}


def test_lora_r_is_tuned_where_the_spec_leaves_lora_out(tmp_path):
    plan = _compile(tmp_path, tuned({"lora_r": {"choice": [4, 8]}}, params={"trainable": "lora"}))

    trial = with_trial_params(plan, {"lora_r": 8}).trainer
    assert trial.model.params == {"trainable": "lora", "lora": {"r": 8}}


@pytest.mark.parametrize(("family", "model"), [
    ("mlp", {"type": "mlp"}),
    ("text_bag", {"type": "text_bag", "params": {}}),
])
@pytest.mark.parametrize("name", ["max_length", "lora_r"])
def test_the_transformers_names_are_refused_under_another_family(tmp_path, family, model, name):
    spec = yaml.safe_load((REPO / "dag_configs" / "ticket_router.yaml").read_text())
    spec["training"]["model"] = model
    spec["training"].pop("distributed", None)
    spec["tuning"] = {"n_trials": 4, "space": {name: {"int": [16, 64]}}}

    problems = _refused(tmp_path, spec)

    assert (f"tuning.space.{name}", _line(tmp_path, f"{name}:"),
            f"{name} tunes training.model.params.{'max_length' if name == 'max_length' else 'lora.r'}, a parameter "
            f"of the transformer family, and training.model.type is {family!r}; remove it from tuning.space, or set "
            "training.model.type: transformer") in problems


def test_lora_r_needs_trainable_lora(tmp_path):
    problems = _refused(tmp_path, tuned({"lora_r": {"int": [2, 16]}}, params={"max_length": 64}))

    assert problems == [("tuning.space.lora_r", _line(tmp_path, "lora_r:"), (
        "lora_r tunes training.model.params.lora.r, which the transformer family reads only with trainable: lora, "
        "and training.model.params leaves trainable out; set training.model.params.trainable: lora, or remove "
        "lora_r from tuning.space"))]


@pytest.mark.parametrize(("name", "distribution", "kind", "value", "bounds"), [
    ("max_length", {"int": [4, 64]}, "int", 4, "a whole number from 8 to 8192"),
    ("max_length", {"choice": [64, 10000]}, "choice", 10000, "a whole number from 8 to 8192"),
    ("lora_r", {"int": [0, 8]}, "int", 0, "a whole number from 1 to 1024"),
    ("lora_r", {"choice": [8, 2048]}, "choice", 2048, "a whole number from 1 to 1024"),
    ("lora_r", {"choice": [8, 8.5]}, "choice", 8.5, "a whole number"),
])
def test_a_range_outside_the_familys_bounds_is_refused_at_its_line(tmp_path, name, distribution, kind, value, bounds):
    problems = _refused(tmp_path, tuned({name: distribution}))

    path = "max_length" if name == "max_length" else "lora.r"
    assert len(problems) == 1
    field, line, message = problems[0]
    assert (field, line) == (f"tuning.space.{name}.{kind}", _line(tmp_path, f"{kind}:", after=f"{name}:"))
    assert message.startswith(f"{value!r} is not a valid training.model.params.{path}: it must be {bounds}")


def test_a_fractional_range_of_a_whole_number_is_refused(tmp_path):
    problems = _refused(tmp_path, tuned({"max_length": {"uniform": [16.0, 64.0]}}))

    assert [(p[0], p[2]) for p in problems] == [
        ("tuning.space.max_length.uniform", "max_length is a whole number: use {int: [low, high]} or {choice: [...]}")]


def test_the_names_are_not_run_parameters(tmp_path):
    spec = tuned({"learning_rate": {"log_uniform": [0.0001, 0.01]}})
    spec["params"] = {"max_length": {"default": 64}}

    problems = _refused(tmp_path, spec)

    assert [(p[0], p[1]) for p in problems] == [("params.max_length", _line(tmp_path, "max_length:", after="alias:"))]
    assert problems[0][2].startswith("'max_length' is not a hyperparameter a run can override")
