"""trainpipe.steps.validate.quality with real Great Expectations 1.x (ephemeral context, pandas)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.probes import probe
from trainpipe.errors import SpecError
from trainpipe.steps.validate.quality import (
    ExpectationOutcome,
    ValidationReport,
    build_expectation,
    expectation_class,
    expectation_names,
    validate_dataframe,
    volume_change,
)


@pytest.fixture(autouse=True)
def _quiet_gx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GX_ANALYTICS_ENABLED", "false")


@pytest.fixture
def frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "id": [1, 2, 3, 4, 5],
            "amount": [10.0, 20.0, 30.0, 40.0, 250.0],
            "label": [0, 1, 0, 0, 1],
        }
    )


def test_module_import_does_not_load_great_expectations() -> None:
    code = (
        "import sys, trainpipe.steps.validate.quality; "
        "heavy = [m for m in ('great_expectations', 'sklearn', 'airflow', 'torch') if m in sys.modules]; "
        "print(heavy)"
    )
    out = probe(code, check=True).stdout
    assert out.strip() == "[]"


def test_expectation_names_and_classes() -> None:
    names = expectation_names()
    assert isinstance(names, frozenset)
    assert {"expect_column_values_to_not_be_null", "expect_table_row_count_to_be_between"} <= names
    assert "expect_column_kl_divergence_to_be_less_than" in names
    assert all(name == name.lower() for name in names)
    assert expectation_class("expect_column_to_exist").__name__ == "ExpectColumnToExist"


def test_unknown_expectation_suggests_nearest() -> None:
    with pytest.raises(SpecError, match=r"unknown expectation 'expect_column_values_to_not_be_nul'; "
                                        r"did you mean 'expect_column_values_to_not_be_null'\?"):
        expectation_class("expect_column_values_to_not_be_nul")
    with pytest.raises(SpecError, match=r"did you mean 'expect_column_values_to_not_be_null'\?"):
        expectation_class("ExpectColumnValuesToNotBeNull")


def test_passing_suite(frame: pd.DataFrame) -> None:
    report = validate_dataframe(
        frame,
        expectations=[
            ("expect_column_values_to_not_be_null", {"column": "amount"}),
            ("expect_column_values_to_be_in_set", {"column": "label", "value_set": [0, 1]}),
            ("expect_table_row_count_to_be_between", {"min_value": 5, "max_value": 10}),
            ("expect_column_values_to_be_unique", {"column": "id"}),
        ],
        required_columns=["id", "label"],
    )
    assert report.success
    assert report.rows == 5
    assert [(o.name, o.kwargs) for o in report.outcomes] == [
        ("expect_column_to_exist", {"column": "id"}),
        ("expect_column_to_exist", {"column": "label"}),
        ("expect_column_values_to_not_be_null", {"column": "amount"}),
        ("expect_column_values_to_be_in_set", {"column": "label", "value_set": [0, 1]}),
        ("expect_table_row_count_to_be_between", {"min_value": 5, "max_value": 10}),
        ("expect_column_values_to_be_unique", {"column": "id"}),
    ]
    assert report.outcomes[4].observed == "observed 5"
    assert report.failures == []
    assert report.summary().splitlines()[0] == "validation passed: 6/6 expectations met on 5 rows"


def test_failing_expectations_report_observed_values(frame: pd.DataFrame) -> None:
    report = validate_dataframe(
        frame,
        expectations=[
            ("expect_column_mean_to_be_between", {"column": "amount", "min_value": 0, "max_value": 50}),
            ("expect_column_values_to_be_between", {"column": "amount", "min_value": 0, "max_value": 100}),
            ("expect_column_values_to_not_be_null", {"column": "label"}),
        ],
        required_columns=[],
    )
    assert not report.success
    mean, between, not_null = report.outcomes
    assert mean == ExpectationOutcome(
        name="expect_column_mean_to_be_between",
        kwargs={"column": "amount", "min_value": 0, "max_value": 50},
        success=False,
        observed="observed 70.0",
    )
    assert not between.success
    assert between.observed == "1 of 5 values unexpected (20%), e.g. [250.0]"
    assert not_null.success
    lines = report.summary().splitlines()
    assert lines[0] == "validation FAILED: 1/3 expectations met on 5 rows"
    assert lines[1] == (
        "FAIL expect_column_mean_to_be_between(column='amount', min_value=0, max_value=50): observed 70.0"
    )
    assert lines[3].startswith("PASS expect_column_values_to_not_be_null(column='label')")


def test_nulls_are_counted_apart() -> None:
    frame = pd.DataFrame({"country": ["DE", "FR", None, "XX"], "amount": [1.0, None, 3.0, 4.0]})
    report = validate_dataframe(
        frame,
        expectations=[
            ("expect_column_values_to_be_in_set", {"column": "country", "value_set": ["DE", "FR"]}),
            ("expect_column_values_to_not_be_null", {"column": "amount"}),
        ],
        required_columns=[],
    )
    in_set, not_null = report.outcomes
    assert in_set.observed == "1 of 3 non-null values unexpected (33.3%), e.g. ['XX']; 1 null"
    assert not_null.observed == "1 of 4 values null (25%)"


def test_missing_required_column_fails_and_names_it(frame: pd.DataFrame) -> None:
    report = validate_dataframe(
        frame,
        expectations=[("expect_column_values_to_not_be_null", {"column": "merchant"})],
        required_columns=["amount", "merchant"],
    )
    assert isinstance(report, ValidationReport)
    assert not report.success
    exists_amount, exists_merchant, not_null = report.outcomes
    assert exists_amount.success
    assert not exists_merchant.success
    assert exists_merchant.observed == "column 'merchant' is missing (3 columns present)"
    # An expectation on the missing column is a failed outcome too, not a crash.
    assert not not_null.success
    assert not_null.observed.startswith("error: ") and "merchant" in not_null.observed
    assert "FAIL expect_column_to_exist(column='merchant'): column 'merchant' is missing" in report.summary()


def test_unknown_expectation_in_validate_names_its_entry(frame: pd.DataFrame) -> None:
    with pytest.raises(SpecError, match=r"^validation\.expectations\[1\]: "
                                        r"unknown expectation 'expect_column_to_be_unique'; did you mean"):
        validate_dataframe(
            frame,
            expectations=[
                ("expect_column_values_to_not_be_null", {"column": "amount"}),
                ("expect_column_to_be_unique", {"column": "id"}),
            ],
            required_columns=[],
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"colum": "amount", "min_value": 0}, r"colum: unknown argument, did you mean 'column'\?"),
        ({"column": "amount", "min_value": "zero"}, r"min_value: value is not a valid float \(got 'zero'\)"),
        ({"column": "amount"}, r"min_value and max_value cannot both be None"),
    ],
)
def test_bad_kwargs_raise_spec_error(frame: pd.DataFrame, kwargs: dict, message: str) -> None:
    with pytest.raises(SpecError, match=r"validation\.expectations\[0\]: expect_column_values_to_be_between: .*" + message):
        validate_dataframe(
            frame, expectations=[("expect_column_values_to_be_between", kwargs)], required_columns=["amount"]
        )


def test_build_expectation_rejects_non_mapping_kwargs() -> None:
    with pytest.raises(SpecError, match=r"checks\[2\]: expect_column_to_exist: arguments must be a mapping, got list"):
        build_expectation("expect_column_to_exist", ["amount"], field_path="checks[2]")  # type: ignore[arg-type]


def test_volume_change() -> None:
    assert volume_change(120, None) is None
    assert volume_change(120, 100) == pytest.approx(0.2)
    assert volume_change(80, 100) == pytest.approx(0.2)
    assert volume_change(100, 100) == 0.0
    assert volume_change(0, 0) == 0.0
    assert math.isinf(volume_change(5, 0))
    with pytest.raises(ValueError, match="row counts must be >= 0"):
        volume_change(-1, 10)
