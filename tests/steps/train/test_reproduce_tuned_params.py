"""``trainpipe reproduce`` of a tuned version: the best trial's parameters come from an MLflow run tag,
which anyone with MLflow access can edit, so each value is checked against its dimension of the spec's
search space (type, bounds, choices) before it reaches the trainer config, as run parameters are."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO
from trainpipe.errors import TrainpipeError, TrialParamsError
from trainpipe.plan.params import with_trial_params
from trainpipe.plan.tracking import BEST_PARAMS_TAG
from trainpipe.settings import Settings
from trainpipe.steps.train.reproduce import Lineage, _tuned_params, plan_for

SPEC = "fraud_detector_tuned.yaml"
# As the final training's run records them (json.dumps of Optuna's params): a layer list as its JSON text.
BEST = {"learning_rate": 0.01, "batch_size": 128, "warmup_steps": 7, "dropout": 0.2, "hidden_layers": "[64, 32]"}
TAG = f"MLflow run tag {BEST_PARAMS_TAG!r} of run r123"


def _lineage(tuned_params: dict) -> Lineage:
    return Lineage(model_name="fraud_detector_tuned", version=3, alias=None, mlflow_run_id="r123",
                   dag_id="fraud_detector_tuned", dataset_digest="0" * 64, spec_file=SPEC, spec_sha256="0" * 64,
                   spec_text=(REPO / "dag_configs" / SPEC).read_text(), seed=None, world_size=None,
                   param_overrides={}, weights_sha256="0" * 64, tuned_params=tuned_params)


def test_the_recorded_best_parameters_are_applied():
    trainer = plan_for(_lineage(json.loads(json.dumps(BEST))), configs_root=REPO / "dag_configs",
                       settings=Settings.from_env()).trainer
    assert (trainer.learning_rate, trainer.batch_size, trainer.optimization.warmup_steps) == (0.01, 128, 7)
    assert trainer.model.dropout == 0.2 and trainer.model.hidden_layers == (64, 32)


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("learning_rate", 5.0, "5.0 is not within [0.0001, 0.1]"),
    ("learning_rate", -1.0, "-1.0 is not within [0.0001, 0.1]"),
    ("learning_rate", float("inf"), "inf is not a finite number"),
    ("learning_rate", "0.01", "'0.01' is not a number"),
    ("dropout", 0.99, "0.99 is not within [0.0, 0.3]"),
    ("warmup_steps", 10**12, f"{10**12} is not within [0, 50]"),
    ("warmup_steps", 7.5, "7.5 is not a whole number"),
    ("warmup_steps", True, "True is not a number"),
    ("batch_size", 10**9, f"{10**9} is not one of 32, 64, 128"),
    ("batch_size", 128.0, "128.0 is not one of 32, 64, 128"),
    ("hidden_layers", "[100000, 100000]", "'[100000, 100000]' is not one of [32], [32, 16], [64, 32]"),
    ("hidden_layers", [64, 32], "[64, 32] is not one of [32], [32, 16], [64, 32]"),
    ("hidden_layers", "not json", "'not json' is not one of [32], [32, 16], [64, 32]"),
])
def test_an_edited_tag_is_refused_naming_the_tag_and_the_parameter(name, value, problem):
    with pytest.raises(TrialParamsError) as refused:
        plan_for(_lineage({**BEST, name: value}), configs_root=REPO / "dag_configs", settings=Settings.from_env())
    assert isinstance(refused.value, TrainpipeError) and isinstance(refused.value, ValueError)
    assert str(refused.value) == (
        f"{TAG}: {name}: {problem} (tuning.space.{name}); the search could not have chosen it, so nothing was "
        "applied: restore the parameters the study's best trial recorded")


def test_a_tag_that_is_not_a_json_object_is_refused():
    for text in ("[1, 2]", "{not json", "null"):
        with pytest.raises(TrialParamsError, match=rf"^{TAG}.* is not a JSON object of the best trial's parameters; "
                                                   "restore"):
            _tuned_params({BEST_PARAMS_TAG: text}, "r123")
    assert _tuned_params({}, "r123") is None


def test_the_train_task_checks_the_trial_it_takes_as_well():
    # The same check for every caller: pick_best's XCom goes through it too.
    from trainpipe.compile.compiler import compile_directory

    plan = compile_directory(REPO / "dag_configs", settings=Settings.from_env()).plans["fraud_detector_tuned"]
    with pytest.raises(TrialParamsError, match=r"^the best trial's parameters: dropout: 2.0 is not within"):
        with_trial_params(plan, {**BEST, "dropout": 2.0})
