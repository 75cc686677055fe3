"""A run parameter from a trigger's conf: JSON's Infinity and NaN are refused with the located error
other bad values get (not an OverflowError), and epochs and seed have the ceilings of their spec fields
even where the spec declares no maximum and no policy limits epochs: no run that never ends, no seed
torch cannot take."""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, spec_with
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError, TrainpipeError
from trainpipe.operators.context import run_plan
from trainpipe.plan.params import apply_run_params
from trainpipe.settings import Settings
from trainpipe.spec.sections.training import MAX_EPOCHS
from trainpipe_trainer.config import MAX_SEED

FIX = "; trigger the run with a value within the param's bounds"


@pytest.fixture(scope="module")
def plan():
    # Its epochs and seed params declare no maximum; no policy is in force.
    return compile_file(REPO / "dag_configs" / "fraud_detector.yaml", "dag_configs/fraud_detector.yaml",
                        settings=Settings.from_env())


def _where(plan, name: str) -> str:
    file, line, column = next(p for p in plan.params if p.name == name).declared_at
    return f"{file}:{line}:{column}: params.{name}: "


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("epochs", float("inf"), "this run's value inf is not a finite number"),
    ("epochs", float("nan"), "this run's value nan is not a finite number"),
    ("seed", float("-inf"), "this run's value -inf is not a finite number"),
    ("learning_rate", float("inf"), "this run's value inf is not a finite number"),
    ("epochs", 10**30, f"this run's value {10**30} is not <= 100000 (training.epochs)"),
    ("epochs", MAX_EPOCHS + 1, "this run's value 100001 is not <= 100000 (training.epochs)"),
    ("seed", 10**40, f"this run's value {10**40} is not <= {2**63 - 1} (training.seed)"),
    ("seed", 2**63, f"this run's value {2**63} is not <= {2**63 - 1} (training.seed)"),
    ("seed", 1e19, f"this run's value 10000000000000000000 is not <= {2**63 - 1} (training.seed)"),
])
def test_a_bad_value_is_refused_naming_the_param_and_the_fix(plan, name, value, problem):
    with pytest.raises(SpecError) as refused:
        apply_run_params(plan, {name: value})
    assert isinstance(refused.value, TrainpipeError) and isinstance(refused.value, ValueError)
    assert str(refused.value) == _where(plan, name) + problem + FIX


def test_json_infinity_from_a_trigger_conf_gives_no_run_plan(plan):
    conf = json.loads('{"epochs": Infinity, "seed": 3}')  # what Python's json reads from a conf
    with pytest.raises(SpecError, match=r"params\.epochs: this run's value inf is not a finite number"):
        run_plan(plan, {"params": conf})


def test_the_ceilings_hold_over_a_declared_maximum(tmp_path):
    path = spec_with(tmp_path, "    description: Seed for initialisation and shuffling\n",
                     "    description: Seed for initialisation and shuffling\n    maximum: 1.0e+30\n")
    variant = compile_file(path, "variant.yaml", settings=Settings.from_env())
    with pytest.raises(SpecError, match=rf"params\.seed: this run's value 1000000000000000000000 is not <= {2**63 - 1} "
                                        r"\(training\.seed\)"):
        apply_run_params(variant, {"seed": 10**21})


def test_values_up_to_the_ceilings_still_run(plan):
    run, changed = apply_run_params(plan, {"seed": MAX_SEED, "epochs": MAX_EPOCHS})
    assert (run.trainer.seed, run.trainer.epochs) == (MAX_SEED, MAX_EPOCHS)
    assert changed == {"seed": MAX_SEED, "epochs": MAX_EPOCHS}
    assert apply_run_params(plan, {"seed": 42.0})[0].trainer.seed == 42
