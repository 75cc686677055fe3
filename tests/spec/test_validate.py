"""Spec loading and validation: every problem names file:line:col, the field path and the fix."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.support import REPO
from trainpipe.errors import SpecError
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.sections.evaluation import GateSpec
from trainpipe.spec.validate import validate_loaded

FRAUD = (REPO / "dag_configs" / "fraud_detector.yaml").read_text()


def _validate(text: str):
    return validate_loaded(load_yaml_text(text, "specs/x.yaml"))


def _messages(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        _validate(text)
    return [str(p) for p in caught.value.problems]


def test_example_spec_normalises_friendly_forms():
    spec = _validate(FRAUD)
    assert spec.data.window == timedelta(days=30)
    assert spec.training.checkpoint.every == timedelta(minutes=20)
    assert spec.validation.expectations[0].name == "expect_column_values_to_not_be_null"
    assert spec.validation.expectations[0].kwargs == {"column": "amount"}
    assert spec.evaluation.gates[0] == GateSpec(metric="auc", op=">=", threshold=0.8, relative=False)
    assert spec.evaluation.gates[2] == GateSpec(metric="auc", op=">=", threshold=0.001, relative=True)


def test_unknown_key_points_at_its_line_and_suggests_the_nearest():
    text = FRAUD.replace("    every_n_steps: 20", "    every_n_step: 20")
    line = text.splitlines().index("    every_n_step: 20") + 1
    assert _messages(text) == [
        f"specs/x.yaml:{line}:5: training.checkpoint.every_n_step: unknown key; did you mean `every_n_steps`?"
    ]


def test_wrong_type_says_what_was_found():
    text = FRAUD.replace("  epochs: 8", "  epochs: many")
    (message,) = _messages(text)
    assert message.startswith("specs/x.yaml:")
    assert "training.epochs: Input should be a valid integer" in message and "'many'" in message


def test_all_problems_of_a_file_are_reported_at_once():
    text = FRAUD.replace("  epochs: 8", "  epochs: 0").replace("    nproc_per_node: 2", "    nproc_per_node: -2")
    messages = _messages(text)
    assert len(messages) == 2
    assert any("training.epochs:" in m for m in messages)
    assert any("training.distributed.nproc_per_node: Input should be greater than or equal to 1" in m for m in messages)


def test_gate_on_metric_not_computed_names_the_fix():
    text = FRAUD.replace("    - f1 >= 0.30", "    - accuracy >= 0.9")
    (message,) = _messages(text)
    assert "evaluation.gates[1]: gate 'accuracy >= 0.9' uses 'accuracy', which evaluation does not compute" in message
    assert "add it to evaluation.metrics" in message


def test_unknown_metric_suggests_a_close_one():
    text = FRAUD.replace("metrics: [auc, f1,", "metrics: [acu, f1,").replace("    - auc >= 0.80\n", "").replace(
        "    - auc >= +0.1%        # and beat the current champion on the same holdout, when there is one\n", "")
    messages = _messages(text)
    assert any("evaluation.metrics[0]: 'acu' is not a binary_classification metric; did you mean `auc`?" in m for m in messages)


def test_unreadable_gate_explains_the_syntax():
    text = FRAUD.replace("    - f1 >= 0.30", "    - f1 => 0.30")
    (message,) = _messages(text)
    assert "evaluation.gates[1]: cannot read gate 'f1 => 0.30'" in message
    assert "'auc >= 0.80'" in message


def test_ranking_needs_a_group_column():
    text = (REPO / "dag_configs" / "search_ranker_nightly.yaml").read_text().replace("  group_column: query_id\n", "")
    (message,) = _messages(text)
    assert "training.group_column: task 'ranking' needs group_column" in message


def test_invalid_cron_is_reported():
    (message,) = _messages(FRAUD.replace('schedule: "@daily"', 'schedule: "0 25 * * *"'))
    assert "schedule: invalid cron expression '0 25 * * *'" in message


def test_yaml_syntax_error_has_its_line():
    (message,) = _messages("pipeline_id: a\ntraining: [1, 2\n")
    assert message.startswith("specs/x.yaml:3:1: YAML syntax error:")


def test_duplicate_keys_are_an_error_not_silently_merged():
    text = FRAUD.replace("  epochs: 8\n", "  epochs: 8\n  epochs: 9\n")
    line = text.splitlines().index("  epochs: 9") + 1
    assert _messages(text) == [f"specs/x.yaml:{line}:3: training.epochs: duplicate key; "
                               "YAML would silently keep only the last one, remove one"]


def test_python_tags_are_refused():
    (message,) = _messages("pipeline_id: !!python/object/apply:os.system ['true']\n")
    assert message.startswith("specs/x.yaml:1:14: could not determine a constructor")
    assert "tags (!!python/...) are refused" in message


def test_spec_error_is_a_value_error():
    with pytest.raises(ValueError, match="required field is missing"):
        _validate("pipeline_id: a\n")


def test_the_dag_id_tag_and_owner_bounds_are_airflows_own():
    """A spec beyond them is refused at its line (tests/fixtures/bad_specs/tag_too_long.yaml, ...), not when
    Airflow builds or stores the DAG, which would name no line."""
    from airflow.models.dag import DagModel
    from airflow.sdk.definitions.dag import TAG_MAX_LEN

    from trainpipe.spec.sections.pipeline import DAG_ID_MAX_LENGTH, OWNER_MAX_LENGTH, TAG_MAX_LENGTH

    assert TAG_MAX_LENGTH == TAG_MAX_LEN
    assert DAG_ID_MAX_LENGTH == DagModel.__table__.c.dag_id.type.length
    assert OWNER_MAX_LENGTH == DagModel.__table__.c.owners.type.length
