"""check_gate: absolute gates, relative gates over the champion in the metric's good direction,
no champion yet, and a champion whose metric is exactly zero."""

from __future__ import annotations

import pytest

from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.steps.evaluate.evaluate import CLASSES_GATE, check_gate, check_gates


def _gate(text: str):
    return EvaluationSpec(metrics=["auc", "rmse", "log_loss"], gates=[text]).gates[0]


@pytest.mark.parametrize(("gate", "value", "passed"), [
    ("auc >= 0.80", 0.80, True),
    ("auc >= 0.80", 0.7999, False),
    ("auc > 0.80", 0.80, False),
    ("rmse <= 1.5", 1.5, True),
    ("rmse < 1.5", 1.5, False),
])
def test_absolute_gates_compare_the_value(gate, value, passed):
    metric = gate.split()[0]
    outcome = check_gate(_gate(gate), {metric: value}, {metric: 123.0})

    assert outcome.passed is passed
    assert (outcome.compared, outcome.baseline, outcome.note) == (value, None, "absolute")


def test_relative_gate_is_the_change_over_the_champion():
    outcome = check_gate(_gate("auc >= +0.5%"), {"auc": 0.905}, {"auc": 0.90})

    assert outcome.compared == pytest.approx(0.005 / 0.90)
    assert outcome.passed  # +0.556% >= +0.5%
    assert outcome.baseline == 0.90 and outcome.note == "+0.556% vs champion"
    assert not check_gate(_gate("auc >= +0.5%"), {"auc": 0.904}, {"auc": 0.90}).passed  # +0.444%


@pytest.mark.parametrize("metric", ["rmse", "log_loss"])
def test_relative_gate_on_a_lower_is_better_metric_counts_a_decrease_as_improvement(metric):
    better = check_gate(_gate(f"{metric} >= +10%"), {metric: 0.8}, {metric: 1.0})
    worse = check_gate(_gate(f"{metric} >= +10%"), {metric: 1.2}, {metric: 1.0})

    assert better.compared == pytest.approx(0.2) and better.passed
    assert worse.compared == pytest.approx(-0.2) and not worse.passed


def test_a_negative_relative_gate_tolerates_a_bounded_regression():
    gate = _gate("auc >= -1%")

    assert check_gate(gate, {"auc": 0.8915}, {"auc": 0.90}).passed  # -0.94%
    assert not check_gate(gate, {"auc": 0.88}, {"auc": 0.90}).passed  # -2.2%


def test_relative_gate_passes_when_there_is_no_champion_yet():
    outcome = check_gate(_gate("auc >= +50%"), {"auc": 0.51}, None)

    assert outcome.passed and outcome.note == "no champion yet" and outcome.baseline is None


def test_a_zero_baseline_compares_the_absolute_change_instead_of_dividing_by_zero():
    # A perfect champion (rmse 0): any error is a regression of that size, equal is no change.
    assert check_gate(_gate("rmse >= +0%"), {"rmse": 0.0}, {"rmse": 0.0}).passed
    worse = check_gate(_gate("rmse >= +0%"), {"rmse": 0.25}, {"rmse": 0.0})
    assert worse.compared == pytest.approx(-0.25) and not worse.passed


def test_a_champion_with_other_classes_fails_a_check_and_the_gates_that_compare_with_it():
    gates = tuple(EvaluationSpec(metrics=["macro_f1", "log_loss"],
                                 gates=["macro_f1 >= +1%", "log_loss <= 0.9", "worst_slice(macro_f1) >= -5%"]).gates)
    slices = {"region": [{"value": "north", "rows": 40, "candidate": {"macro_f1": 0.6}, "champion": None,
                          "undefined": {}}]}
    difference = "the candidate's classes differ from the champion's: new 'x'; missing 'y'"

    outcomes = check_gates(gates, {"candidate": {"macro_f1": 0.8, "log_loss": 0.5}, "champion": None,
                                   "slices": slices, "classes_differ": difference})

    assert [(o.gate, o.passed) for o in outcomes] == [
        (CLASSES_GATE, False), ("macro_f1 >= +1% vs champion", False), ("log_loss <= 0.9", True),
        ("worst_slice(macro_f1) >= -5% vs champion", False)]
    assert outcomes[0].note == difference and outcomes[0].reference == "classes"
    # A gate that is not compared shows the value it would have judged: the worst slice's for worst_slice.
    assert outcomes[1].value == 0.8 and outcomes[3].value == 0.6
    assert outcomes[1].note == "not compared: the champion's classes differ from the candidate's"
