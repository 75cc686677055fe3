"""trainpipe.steps.validate.drift: schema hashes and diffs, PSI and KS against values computed independently."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import ks_2samp

from trainpipe.plan.model import DriftLevels, DriftPlan, FeatureDriftLevels, SchemaPolicy
from trainpipe.steps.validate import drift

SCHEMA = [("id", "int64"), ("amount", "float64"), ("country", "str"), ("is_fraud", "int64")]
LEVELS = DriftLevels(warn=0.1, fail=0.25)


# --- schema ------------------------------------------------------------------------------------

def test_schema_hash_is_sha256_of_ordered_names_and_types():
    expected = hashlib.sha256(
        b'[["id","int64"],["amount","float64"],["country","str"],["is_fraud","int64"]]').hexdigest()
    assert drift.schema_hash(SCHEMA) == expected
    assert drift.schema_hash(list(reversed(SCHEMA))) != expected  # order is part of the schema
    assert drift.schema_hash([("id", "int32"), *SCHEMA[1:]]) != expected


def test_frame_schema_is_ordered_names_and_dtypes():
    frame = pd.DataFrame({"b": [1.5], "a": [2]})
    assert drift.frame_schema(frame) == [("b", "float64"), ("a", "int64")]


def test_schema_diff_classes():
    current = [("id", "int64"), ("amount", "str"), ("is_fraud", "int64"), ("channel", "str")]

    diff = drift.schema_diff(SCHEMA, current)

    assert diff.added == (("channel", "str"),)
    assert diff.removed == (("country", "str"),)
    assert diff.retyped == (("amount", "float64", "str"),)
    assert diff.lines() == ["+ channel: str", "- country: str", "~ amount: float64 -> str"]
    assert drift.schema_diff(SCHEMA, list(reversed(SCHEMA))).empty  # a reorder changes no column


@pytest.mark.parametrize(
    ("current", "policy", "failures", "warnings"),
    [
        pytest.param([*SCHEMA, ("channel", "str")], SchemaPolicy(added_columns="allow"), [], [], id="added-allowed"),
        pytest.param([*SCHEMA, ("channel", "str")], SchemaPolicy(added_columns="warn"), [],
                     ["+ channel: str (validation.schema.added_columns: warn)"], id="added-warned"),
        pytest.param([*SCHEMA, ("channel", "str")], SchemaPolicy(added_columns="fail"),
                     ["+ channel: str (validation.schema.added_columns: fail)"], [], id="added-failed"),
        pytest.param([c for c in SCHEMA if c[0] != "country"], SchemaPolicy(removed_columns="allow"), [], [],
                     id="removed-unused-allowed"),
        pytest.param([c for c in SCHEMA if c[0] != "country"], SchemaPolicy(),
                     ["- country: str (validation.schema.removed_columns: fail)"], [], id="removed-unused-failed"),
        pytest.param([c for c in SCHEMA if c[0] != "amount"],
                     SchemaPolicy(removed_columns="allow", used_columns=("amount", "is_fraud")),
                     ["- amount: float64 (a column the pipeline uses; never allowed)"], [], id="removed-feature"),
        pytest.param([c for c in SCHEMA if c[0] != "is_fraud"],
                     SchemaPolicy(removed_columns="warn", used_columns=("amount", "is_fraud")),
                     ["- is_fraud: int64 (a column the pipeline uses; never allowed)"], [], id="removed-label"),
        pytest.param([("id", "float64"), *SCHEMA[1:]], SchemaPolicy(retyped_columns="warn"), [],
                     ["~ id: int64 -> float64 (validation.schema.retyped_columns: warn)"], id="retyped-unused-warned"),
        pytest.param([SCHEMA[0], ("amount", "str"), *SCHEMA[2:]],
                     SchemaPolicy(retyped_columns="allow", used_columns=("amount",)),
                     ["~ amount: float64 -> str (a column the pipeline uses; never allowed)"], [], id="retyped-feature"),
    ],
)
def test_schema_violations_per_change_class(current, policy, failures, warnings):
    assert drift.schema_violations(drift.schema_diff(SCHEMA, current), policy) == (failures, warnings)


# --- PSI ---------------------------------------------------------------------------------------

def test_psi_of_shares_matches_the_hand_computed_value():
    # (0.4-0.5)*ln(0.4/0.5) + (0.4-0.3)*ln(0.4/0.3) + 0 = 0.0223144 + 0.0287682
    assert drift.psi([0.5, 0.3, 0.2], [0.4, 0.4, 0.2]) == pytest.approx(0.0510826, abs=1e-7)
    assert drift.psi([0.25] * 4, [0.25] * 4) == 0.0


def test_categorical_psi_by_hand():
    reference = pd.Series(list("aaaaabbbcc"))  # shares a .5, b .3, c .2
    current = pd.Series(list("aaaabbbbcc"))  # shares a .4, b .4, c .2

    result = drift.feature_drift("country", reference, current, bins=10, psi_levels=LEVELS)

    assert result.kind == "categorical"
    assert result.ks is None
    assert result.psi == pytest.approx(0.0510826, abs=1e-7)
    assert [b[0] for b in result.bins] == ["a", "b", "c", drift.OTHER_BIN, drift.MISSING_BIN]
    assert result.verdict == "pass"


def test_categorical_unseen_and_missing_values_have_bins_of_their_own():
    reference = pd.Series(["a", "a", "b", None], dtype=object)  # a .5, b .25, missing .25
    current = pd.Series(["a", "new", "new", "b"], dtype=object)  # a .25, b .25, other .5, missing 0

    result = drift.feature_drift("c", reference, current, bins=10, psi_levels=LEVELS)

    floor = drift.PSI_FLOOR
    expected = ((0.25 - 0.5) * math.log(0.25 / 0.5) + (0.5 - floor) * math.log(0.5 / floor)
                + (floor - 0.25) * math.log(floor / 0.25))
    assert result.psi == pytest.approx(expected, rel=1e-9)
    assert dict((label, (ref, cur)) for label, ref, cur in result.bins) == {
        "a": (0.5, 0.25), "b": (0.25, 0.25), drift.OTHER_BIN: (0.0, 0.5), drift.MISSING_BIN: (0.25, 0.0)}
    assert result.verdict == "fail"
    assert result.reasons == (f"psi {result.psi:.4f} >= fail 0.25",)


def test_numeric_psi_on_reference_quantile_bins_by_hand():
    reference = pd.Series(np.arange(1.0, 11.0))  # median 5.5: two bins of .5
    current = pd.Series([1, 2, 3, 6, 7, 8, 9, 10, np.nan, np.nan], dtype=float)  # .3, .5, missing .2

    result = drift.feature_drift("x", reference, current, bins=2)

    # (0.3-0.5)*ln(0.3/0.5) + 0 + (0.2-1e-4)*ln(0.2/1e-4) = 0.1021651 + 1.5194204
    assert result.psi == pytest.approx(1.6215855, abs=1e-6)
    assert [b[0] for b in result.bins] == ["(-inf, 5.5]", "(5.5, inf]", drift.MISSING_BIN]
    assert result.verdict == "pass"  # no levels given: reported, not judged


def test_a_flag_is_binned_by_value_so_a_changed_encoding_drifts():
    reference = pd.Series([0.0] * 90 + [1.0] * 10)
    recoded = pd.Series([0.0] * 90 + [2.0] * 10)  # 1 became 2 upstream: same mean shape, new value

    result = drift.feature_drift("is_foreign", reference, recoded, bins=10, psi_levels=LEVELS)

    assert [b[0] for b in result.bins] == ["0.0", "1.0", drift.OTHER_BIN, drift.MISSING_BIN]
    expected = 2 * (0.1 - drift.PSI_FLOOR) * math.log(0.1 / drift.PSI_FLOOR)
    assert result.psi == pytest.approx(expected, rel=1e-9)
    assert result.verdict == "fail"


def test_same_distribution_gives_psi_near_zero_and_shift_gives_large_psi():
    rng = np.random.default_rng(0)
    reference = pd.Series(rng.normal(0, 1, 20_000))
    same = drift.feature_drift("x", reference, pd.Series(rng.normal(0, 1, 20_000)), bins=10, psi_levels=LEVELS)
    shifted = drift.feature_drift("x", reference, pd.Series(rng.normal(1, 1, 20_000)), bins=10, psi_levels=LEVELS)
    assert same.psi < 0.01 and same.verdict == "pass"
    assert shifted.psi > 0.25 and shifted.verdict == "fail"


# --- KS ----------------------------------------------------------------------------------------

def test_ks_by_hand():
    # ECDFs of [1,2,3,4] and [3,4,5,6] differ most at x=2 (0.5 vs 0) and x=4 (1 vs 0.5): D = 0.5.
    result = drift.feature_drift("x", pd.Series([1.0, 2, 3, 4]), pd.Series([3.0, 4, 5, 6]), bins=2)
    assert result.ks == 0.5


def test_ks_equals_scipy_and_ignores_missing_values():
    rng = np.random.default_rng(1)
    reference = pd.Series(rng.lognormal(3, 1, 3000))
    current = pd.Series(np.append(rng.lognormal(3.1, 1, 2500), [np.nan] * 50))

    result = drift.feature_drift("amount", reference, current, bins=10, ks_levels=DriftLevels(warn=0.01, fail=0.5))

    expected = ks_2samp(reference.to_numpy(), current.dropna().to_numpy())
    assert result.ks == pytest.approx(expected.statistic, abs=1e-12)
    assert result.ks_pvalue == pytest.approx(expected.pvalue, rel=1e-9)
    assert result.verdict == "warn"
    assert result.reasons == (f"ks {expected.statistic:.4f} >= warn 0.01",)


# --- a report over features --------------------------------------------------------------------

def _plan(**features: FeatureDriftLevels) -> DriftPlan:
    return DriftPlan(reference="baseline", bins=10, psi=LEVELS, ks=DriftLevels(warn=0.05, fail=0.1),
                     features=tuple(features.items()))


def test_compare_applies_per_feature_levels_ignores_and_skips():
    rng = np.random.default_rng(2)
    reference = pd.DataFrame({"a": rng.normal(0, 1, 5000), "b": rng.normal(0, 1, 5000),
                              "c": rng.choice(["x", "y"], 5000), "gone": rng.normal(0, 1, 5000)})
    current = reference.assign(a=reference["a"] + 1.0, b=reference["b"] + 1.0, c="y").drop(columns=["gone"])
    plan = _plan(b=FeatureDriftLevels(psi=DriftLevels(warn=50.0), ks=DriftLevels(warn=0.99)),
                 c=FeatureDriftLevels(psi=None, ks=None, ignore=True))

    report = drift.compare(reference, current, plan, features=["a", "b", "c", "gone"],
                           reference_digest="r" * 64, current_digest="n" * 64)

    assert [f.feature for f in report.features] == ["a", "b"]
    assert report.skipped == ("gone",)
    assert [f.feature for f in report.failed()] == ["a"]
    assert report.features[1].verdict == "pass"
    assert report.verdict == "fail"
    message = drift.failure_message(report)
    assert message.startswith("distribution drift vs version rrrrrrrrrrrrrrrr in a (psi ")
    assert "ks " in message and ">= fail 0.1" in message
    metrics = report.metrics()
    assert set(metrics) == {"drift_psi.a", "drift_psi.b", "drift_ks.a", "drift_ks.b", "drift_psi_max", "drift_ks_max"}
    assert metrics["drift_psi_max"] == max(metrics["drift_psi.a"], metrics["drift_psi.b"])
    table = report.table().splitlines()
    assert table[0].split() == ["feature", "kind", "psi", "ks", "verdict", "why"]
    assert table[2].startswith("a ") and "FAIL" in table[2]
    assert table[-1] == "not compared (missing on one side): gone"
    page = report.html(title="t <1>")
    assert "<title>t &lt;1&gt;</title>" in page and "id='a'" in page
    assert json.loads(json.dumps(report.to_dict()))["features"][0]["feature"] == "a"


def test_metric_keys_are_valid_mlflow_keys():
    frame = pd.DataFrame({"ctr@10": np.arange(100.0), "name (raw)": np.arange(100.0)})
    report = drift.compare(frame, frame, _plan(), features=["ctr@10", "name (raw)"],
                           reference_digest="r" * 64, current_digest="n" * 64)
    assert set(report.metrics()) == {"drift_psi.ctr_10", "drift_ks.ctr_10", "drift_psi.name _raw_",
                                     "drift_ks.name _raw_", "drift_psi_max", "drift_ks_max"}
