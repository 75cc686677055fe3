"""Expectation arguments checked at the spec stage against Great Expectations' own models.

The spec stage reads the committed table (``trainpipe/spec/expectation_arguments.json``); the tests
at the end import GE to prove the table is GE's (regenerated, equal) and that its verdicts are GE's.
"""

from __future__ import annotations

import warnings
from datetime import date, datetime

import pytest

from tests.probes import probe
from tests.support import REPO
from trainpipe.errors import SpecError
from trainpipe.settings import Settings
from trainpipe.spec import expectations
from trainpipe.spec.loader import load_yaml_text
from trainpipe.spec.validate import validate_loaded

# Items of validation.expectations start on line 14.
BASE = """\
pipeline_id: p
data:
  uri: demo/transactions/transactions.parquet
training:
  task: binary_classification
  features: [amount]
  label: is_fraud
evaluation:
  metrics: [auc]
registration:
  model_name: m
validation:
  expectations:
"""


def _spec(*items: str):
    return validate_loaded(load_yaml_text(BASE + "".join(f"    - {item}\n" for item in items), "specs/x.yaml"))


def _messages(*items: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        _spec(*items)
    return [str(p) for p in caught.value.problems]


def test_misspelt_argument_is_located_at_the_argument_with_the_nearest_name():
    # The required `column` is not reported missing as well: the suggestion already names it.
    assert _messages("expect_column_values_to_be_between: {colum: amount, min_value: 0}") == [
        "specs/x.yaml:14:44: validation.expectations[0].expect_column_values_to_be_between.colum: "
        "unknown argument `colum`; did you mean `column`?"
    ]


def test_unknown_argument_without_a_near_name_lists_the_arguments():
    assert _messages("expect_column_to_exist: {column: amount, wibble: 3}") == [
        "specs/x.yaml:14:48: validation.expectations[0].expect_column_to_exist.wibble: unknown argument `wibble`; "
        "expect_column_to_exist takes batch_id, catch_exceptions, column, column_index, description, id, meta, notes, "
        "rendered_content, result_format, severity, windows"
    ]


def test_missing_required_argument_is_located_at_the_expectation():
    assert _messages("expect_column_values_to_be_in_set: {column: is_fraud}", "expect_column_values_to_not_be_null") == [
        "specs/x.yaml:14:7: validation.expectations[0]: expect_column_values_to_be_in_set needs argument `value_set`; add it",
        "specs/x.yaml:15:7: validation.expectations[1]: expect_column_values_to_not_be_null needs argument `column`; add it",
    ]


@pytest.mark.parametrize("arguments", ["{column: amount}", "{column: amount, min_value: null, max_value: null}"])
def test_one_of_a_group_is_required(arguments: str):
    assert _messages(f"expect_column_values_to_be_between: {arguments}") == [
        "specs/x.yaml:14:7: validation.expectations[0]: expect_column_values_to_be_between needs at least one of "
        "`min_value` or `max_value`; add one"
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("expect_column_values_to_be_between: {column: amount, min_value: zero}",
         "14:60: validation.expectations[0].expect_column_values_to_be_between.min_value: must be a number, a date, "
         "a date and time, a mapping or null, got 'zero'"),
        ("expect_column_values_to_not_be_null: {column: 5}",
         "14:45: validation.expectations[0].expect_column_values_to_not_be_null.column: must be a non-empty string, got 5"),
        ("expect_column_values_to_not_be_null: {column: ''}",
         "14:45: validation.expectations[0].expect_column_values_to_not_be_null.column: must be a non-empty string, got ''"),
        ("expect_column_values_to_not_be_null: {column: amount, mostly: 1.5}",
         "14:61: validation.expectations[0].expect_column_values_to_not_be_null.mostly: must be a number >= 0 and <= 1 "
         "or a mapping, got 1.5"),
        ("expect_column_values_to_be_in_set: {column: is_fraud, value_set: 1}",
         "14:61: validation.expectations[0].expect_column_values_to_be_in_set.value_set: must be a list or a mapping, got 1"),
        ("expect_column_values_to_not_be_null: {column: amount, catch_exceptions: maybe}",
         "14:61: validation.expectations[0].expect_column_values_to_not_be_null.catch_exceptions: must be true or false, "
         "got 'maybe'"),
        ("expect_column_values_to_not_be_null: {column: amount, result_format: FULL}",
         "14:61: validation.expectations[0].expect_column_values_to_not_be_null.result_format: must be one of "
         "'BOOLEAN_ONLY', 'BASIC', 'COMPLETE', 'SUMMARY' or a mapping, got 'FULL'"),
        ("expect_multicolumn_sum_to_equal: {column_list: [a, 7], sum_total: 1}",
         "14:41: validation.expectations[0].expect_multicolumn_sum_to_equal.column_list: must be a list of strings, "
         "got ['a', 7]"),
    ],
)
def test_wrong_type_is_located_at_the_argument_with_the_expected_type(item: str, message: str):
    assert _messages(item) == [f"specs/x.yaml:{message}"]


def test_long_form_arguments_are_located_under_kwargs():
    text = BASE + "    - name: expect_column_values_to_be_in_set\n      kwargs: {column: is_fraud, valueset: [0, 1]}\n"
    with pytest.raises(SpecError) as caught:
        validate_loaded(load_yaml_text(text, "specs/x.yaml"))
    assert [str(p) for p in caught.value.problems] == [
        "specs/x.yaml:15:34: validation.expectations[0].kwargs.valueset: unknown argument `valueset`; did you mean `value_set`?"
    ]


COMMON = ("{column: amount, mostly: 0.95, meta: {owner: risk}, notes: [checked nightly], result_format: COMPLETE, "
          "catch_exceptions: true, row_condition: 'col(\"amount\") > 0', condition_parser: great_expectations, "
          "description: no nulls, severity: warning}")


def test_arguments_common_to_all_expectations_are_accepted():
    spec = _spec(f"expect_column_values_to_not_be_null: {COMMON}")
    assert spec.validation.expectations[0].kwargs["condition_parser"] == "great_expectations"


def test_values_great_expectations_coerces_are_accepted():
    # pydantic v1 reads "0.5" as a float, "yes" as a bool and 1000 as a float: so does the table.
    spec = _spec("expect_column_values_to_be_between: {column: amount, min_value: '0.5', strict_min: 'yes'}",
                 "expect_table_row_count_to_be_between: {min_value: 1000}",
                 "expect_column_values_to_be_between: {column: event_time, min_value: 2024-01-01}")
    assert len(spec.validation.expectations) == 3


def test_every_example_spec_still_validates():
    from trainpipe.compile.compiler import compile_directory

    result = compile_directory(REPO / "dag_configs", settings=Settings.from_env())
    assert result.errors == {} or not result.errors, result.errors
    assert len(result.plans) == len(list((REPO / "dag_configs").glob("[!_]*.yaml")))


def test_checking_arguments_does_not_import_great_expectations():
    code = (
        "import sys; from pathlib import Path; from trainpipe.spec.validate import load_spec; "
        f"spec = load_spec(Path({str(REPO / 'dag_configs' / 'fraud_detector.yaml')!r})); "
        "assert spec.validation.expectations; print('great_expectations' in sys.modules)"
    )
    out = probe(code, check=True).stdout
    assert out.strip() == "False"


# ---------------------------------------------------------------------------------------------
# against Great Expectations itself (imports it)


def test_table_equals_what_the_installed_great_expectations_generates():
    """Fails after a GE upgrade that changes an expectation: run `python tools/gen_expectation_table.py`."""
    from trainpipe.steps.validate.quality import expectation_class, expectation_names

    classes = {name: expectation_class(name) for name in expectation_names()}
    assert expectations.render_table(expectations.generate_table(classes)) == expectations.TABLE_FILE.read_text(
        encoding="utf-8")


def _ge_refuses(name: str, kwargs: dict, argument: str) -> bool:
    """Whether GE's model refuses ``argument`` in ``kwargs`` (its own field errors, not cross-field ones)."""
    from pydantic.v1 import ValidationError

    from trainpipe.steps.validate.quality import expectation_class

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expectation_class(name)(**kwargs)
        except ValidationError as error:
            return any(e["loc"][:1] == (argument,) for e in error.errors())
    return False


# What YAML can produce, and the coercions pydantic v1 is known for (numeric strings, "no" as a bool,
# timestamps as dates, a list of pairs as a mapping, !!binary bytes, !!set sets).
PROBES = [None, True, False, 0, 1, 3, -1, 2.5, 0.5, 1.5, 1e15, float("nan"), float("inf"), "", "a", "abc", "1", "1.5",
          "true", "no", "yes", "2024-01-01", "2024-01-01T12:00:00Z", "2024-01-01 12:00:00+99:00", "2024-13-01",
          "BASIC", "warning", "pandas", "never", b"abc", b"1.5", b"\xff", [], ["a"], ["a", "b"], [1, 2], [[1, 2]],
          ["ab"], [{"a": 1}], {"a", "b"}, {}, {"$PARAMETER": "x"}, {"a": 1}, date(2024, 1, 1), datetime(2024, 1, 1, 12)]


def test_argument_verdicts_agree_with_great_expectations():
    """For every argument of every expectation, each probe value: the table refuses exactly what GE's
    model refuses. Where GE runs more than a type check (a field validator, a nested model), the table
    must at least never refuse what GE accepts. One representative per (argument, type, validators)."""
    from trainpipe.steps.validate.quality import expectation_class

    table = expectations._table()
    checked: set[tuple] = set()
    disagreements = []
    for name, entry in table["expectations"].items():
        cls = expectation_class(name)
        kinds = {argument: table["types"][type_name] for argument, type_name in entry["arguments"].items()}
        base = {argument: expectations._sample(kinds[argument]) for argument in entry["required"]}
        base.update({group[0]: expectations._sample(kinds[group[0]]) for group in entry["one_of"]})
        for argument, type_name in entry["arguments"].items():
            validators = tuple(v.func.__qualname__ for v in cls.__validators__.get(argument, []))
            if (argument, type_name, validators) in checked:
                continue
            checked.add((argument, type_name, validators))
            exact = not validators and "model:" not in type_name
            for value in PROBES:
                problems, _ = expectations.argument_problems(name, {**base, argument: value})
                ours = any(path == (argument,) for path, _ in problems)
                theirs = _ge_refuses(name, {**base, argument: value}, argument)
                if ours != theirs and (exact or ours):
                    disagreements.append(f"{name}.{argument}={value!r}: table refuses {ours}, GE refuses {theirs}")
    assert len(checked) > 60
    assert disagreements == []


def test_expectations_the_table_accepts_build_in_great_expectations():
    """What passes the spec stage builds at run time (`quality.build_expectation`, the validate task)."""
    from trainpipe.spec.validate import load_spec
    from trainpipe.steps.validate.quality import build_expectation

    spec = _spec(f"expect_column_values_to_not_be_null: {COMMON}",
                 "expect_column_values_to_be_between: {column: amount, min_value: '0.5', strict_min: 'yes'}")
    built = [build_expectation(e.name, e.kwargs) for e in spec.validation.expectations]
    for path in sorted((REPO / "dag_configs").glob("[!_]*.yaml")):
        built += [build_expectation(e.name, e.kwargs) for e in load_spec(path).validation.expectations]
    assert len(built) > 10
    assert built[0].mostly == 0.95
