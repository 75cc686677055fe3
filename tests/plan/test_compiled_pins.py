"""The compiled plan and trainer config of every example spec are pinned byte for byte.

A restructuring of the provider or the trainer must leave what a spec compiles to unchanged; an
intended change of the plan or the trainer contract rewrites the pins with `python tools/pin_compiled.py`
and shows the difference in review.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.support import REPO

PINS = REPO / "tests" / "fixtures" / "compiled"


def _pin_tool():
    spec = importlib.util.spec_from_file_location("pin_compiled", REPO / "tools" / "pin_compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = sorted(p.stem for p in (REPO / "dag_configs").glob("*.yaml"))


def test_every_example_spec_is_pinned():
    pinned = {p.name.split(".")[0] for p in PINS.glob("*.json")}
    assert pinned == set(EXAMPLES), "run `python tools/pin_compiled.py` after adding or removing an example spec"


@pytest.mark.parametrize("example", EXAMPLES)
def test_plan_and_trainer_config_bytes_are_unchanged(example):
    produced = _pin_tool().compiled(REPO / "dag_configs" / f"{example}.yaml")
    assert set(produced) == {f"{example}.plan.json", f"{example}.trainer.json"}
    for name, text in produced.items():
        assert text == (PINS / name).read_text(), (
            f"{name} changed: if intended, run `python tools/pin_compiled.py` and review the diff")
