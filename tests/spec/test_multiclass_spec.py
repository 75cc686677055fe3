"""`task: multiclass_classification` in a spec: its metrics, and `training.label_classes` at the trust boundary.

Class names are data: a template or a path among them stays the literal text the label's values are
compared with (nothing renders or opens it); a value that is no class name is refused at its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import REPO
from trainpipe.compile.compiler import compile_file
from trainpipe.errors import SpecError
from trainpipe.settings import Settings

PASSWORD = "pw-5c0ffee-never-shown"
TEMPLATE = "{{ conn.leak.password }}"


def _digits(**training: object) -> dict:
    spec = yaml.safe_load((REPO / "dag_configs" / "digit_classifier.yaml").read_text())
    spec["training"].update(training)
    return spec


def _compile(tmp_path: Path, spec: dict):
    file = tmp_path / "digits.yaml"
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return file, compile_file(file, "digits.yaml", settings=Settings.from_env(), configs_root=tmp_path)


def _problem(tmp_path: Path, spec: dict):
    with pytest.raises(SpecError) as raised:
        _compile(tmp_path, spec)
    # A value of neither type gets one line per type it is not, all at the same place: the first.
    problem = raised.value.problems[0]
    assert {(p.line, p.field_path.split(".")[1]) for p in raised.value.problems} == {
        (problem.line, problem.field_path.split(".")[1])}
    lines = (tmp_path / "digits.yaml").read_text().splitlines()
    return problem, lines[problem.line - 1] if problem.line else ""


@pytest.fixture(autouse=True)
def _no_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINPIPE_POLICY", raising=False)


def test_templates_and_paths_among_the_classes_stay_literal_text(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LEAK", json.dumps({"conn_type": "generic", "password": PASSWORD}))
    classes = [TEMPLATE, "../../etc/passwd", "${HOME}", 7]
    _, plan = _compile(tmp_path, _digits(label_classes=classes))
    config = plan.trainer.to_json()
    assert plan.trainer.label_classes == (TEMPLATE, "../../etc/passwd", "${HOME}", "7")
    assert PASSWORD not in config and PASSWORD not in json.dumps(plan.to_dict(), default=str)
    # Where they are compared with the data: as text, so a label value "{{ conn.leak.password }}" matches it.
    import pandas as pd

    from trainpipe_trainer.preprocessing import label_class_indices

    indices = label_class_indices(pd.Series([TEMPLATE, "7", "${HOME}"]), plan.trainer.label_classes,
                                  label="digit", source="test")
    assert indices.tolist() == [0, 3, 2]


@pytest.mark.parametrize(("classes", "expected"), [
    ([{"name": "a"}, "b"], "label_classes[0]"),      # a mapping is no class name
    ([["a"], "b"], "label_classes[0]"),
    (["a"], "label_classes"),                        # one class is no classification
    (["a", ""], "label_classes[1]"),                  # nor is empty text
    (["a", "x" * 201], "label_classes[1]"),
])
def test_a_value_that_is_no_class_name_is_refused_at_its_line(tmp_path, classes, expected):
    problem, line = _problem(tmp_path, _digits(label_classes=classes))
    assert problem.field_path.startswith(f"training.{expected}"), problem
    assert "label_classes" in line or line.strip().startswith("-"), line


def test_a_class_listed_twice_as_number_and_text_is_refused_at_the_second(tmp_path):
    problem, line = _problem(tmp_path, _digits(label_classes=[1, 2, "2"]))
    assert problem.field_path == "training.label_classes[2]"
    assert "listed twice" in problem.message and "compared as text" in problem.message
    assert "'2'" in line or '"2"' in line


def test_label_classes_on_another_task_is_refused_at_its_line(tmp_path):
    spec = yaml.safe_load((REPO / "dag_configs" / "fraud_detector.yaml").read_text())
    spec["training"]["label_classes"] = [0, 1]
    problem, line = _problem(tmp_path, spec)
    assert problem.field_path == "training.label_classes"
    assert line.strip().startswith("label_classes:")
    assert "only applies to task 'multiclass_classification', not 'binary_classification'" in problem.message


def test_binary_metrics_are_no_multiclass_metrics_and_the_fix_names_them(tmp_path):
    spec = _digits()
    spec["evaluation"]["metrics"] = ["accuracy", "auc"]
    spec["evaluation"]["gates"] = ["accuracy >= 0.9"]
    problem, _ = _problem(tmp_path, spec)
    assert problem.field_path == "evaluation.metrics[1]"
    assert "'auc' is not a multiclass_classification metric" in problem.message
    assert "accuracy, balanced_accuracy, macro_f1, log_loss" in problem.message


def test_tuning_takes_the_multiclass_checkpoint_metrics(tmp_path):
    spec = _digits()
    spec["tuning"] = {"metric": "validation_macro_f1", "n_trials": 4,
                      "space": {"learning_rate": {"log_uniform": [0.0001, 0.01]}}}
    _, plan = _compile(tmp_path, spec)
    assert plan.tuning.metric == "validation_macro_f1" and plan.tuning.direction == "maximize"
    spec["tuning"]["metric"] = "validation_auc"
    problem, _ = _problem(tmp_path, spec)
    assert problem.field_path == "tuning.metric"
    assert "validation_macro_f1" in problem.message


def test_early_stopping_takes_the_multiclass_metrics_and_refuses_others_at_their_line(tmp_path):
    _, plan = _compile(tmp_path, _digits(early_stopping={"metric": "validation_macro_f1", "patience": 3}))
    assert plan.trainer.early_stopping.metric == "validation_macro_f1"
    problem, line = _problem(tmp_path, _digits(early_stopping={"metric": "validation_rmse", "patience": 3}))
    assert problem.field_path == "training.early_stopping.metric"
    assert "validation_rmse" in line
    assert ("a multiclass_classification trainer does not compute validation_rmse; use one of validation_loss, "
            "validation_accuracy, validation_balanced_accuracy, validation_macro_f1") in problem.message
