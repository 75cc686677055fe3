"""The spec's ``validation:`` section: expectations, schema and drift checks."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator

from trainpipe.spec.sections.common import SpecModel


class ExpectationSpec(SpecModel):
    name: str = Field(
        description="Great Expectations 1.x expectation, snake_case.",
        examples=["expect_column_values_to_not_be_null"],
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the expectation.",
        examples=[{"column": "amount"}],
    )


def _normalise_expectation(value: Any) -> Any:
    # YAML friendly forms: "expect_x" or {expect_x: {column: a}} -> {name, kwargs}.
    if isinstance(value, str):
        return {"name": value, "kwargs": {}}
    if isinstance(value, dict) and len(value) == 1 and "name" not in value:
        ((name, kwargs),) = value.items()
        return {"name": name, "kwargs": kwargs if kwargs is not None else {}}
    return value


_VERDICT_ACTIONS = Literal["allow", "warn", "fail"]


class SchemaCheckSpec(SpecModel):
    """What a schema change vs the baseline version does. Removing or retyping a column the pipeline
    uses (a feature, the label, the query or time column) always fails, whatever is set here."""

    added_columns: _VERDICT_ACTIONS = Field(
        default="allow", description="A column the baseline did not have: allow, warn (log it) or fail.", examples=["allow"]
    )
    removed_columns: _VERDICT_ACTIONS = Field(
        default="fail", description="A column of the baseline that is gone (and that the pipeline does not use).",
        examples=["warn"],
    )
    retyped_columns: _VERDICT_ACTIONS = Field(
        default="fail", description="A column whose type changed (and that the pipeline does not use).", examples=["fail"]
    )


class DriftLevelsSpec(SpecModel):
    warn: float | None = Field(default=None, ge=0, description="Log a warning at or above this value.", examples=[0.1])
    fail: float | None = Field(default=None, ge=0, description="Stop the run before training at or above this value.",
                               examples=[0.25])


class KsLevelsSpec(SpecModel):
    warn: float | None = Field(default=None, ge=0, le=1, description="Log a warning at or above this KS statistic.",
                               examples=[0.1])
    fail: float | None = Field(default=None, ge=0, le=1, description="Stop the run at or above this KS statistic.",
                               examples=[0.2])


class FeatureDriftSpec(SpecModel):
    psi: DriftLevelsSpec | None = Field(
        default=None, description="This feature's PSI levels, in place of validation.drift.psi.", examples=[{"fail": 0.5}]
    )
    ks: KsLevelsSpec | None = Field(
        default=None, description="This feature's KS levels, in place of validation.drift.ks.", examples=[{"warn": 0.2}]
    )
    ignore: bool = Field(default=False, description="Do not compare this feature.", examples=[False])


_REFERENCE = re.compile(r"^(baseline|[0-9a-f]{16,64})$")


class DriftSpec(SpecModel):
    reference: str = Field(
        default="baseline",
        description="The version compared against: 'baseline' (the last version that passed validation) or a pinned "
        "version's digest (at least its first 16 hex characters, as `trainpipe datasets` lists them).",
        examples=["baseline", "3f9a0c1d2e4b5a69"],
    )
    bins: int = Field(default=10, ge=2, le=100, description="PSI bins of a numeric feature (reference quantiles).", examples=[10])
    psi: DriftLevelsSpec = Field(
        default_factory=lambda: DriftLevelsSpec(warn=0.1, fail=0.25),
        description="Population stability index levels for every feature (0.1 / 0.25 by default).",
        examples=[{"warn": 0.1, "fail": 0.25}],
    )
    ks: KsLevelsSpec = Field(
        default_factory=KsLevelsSpec,
        description="Two-sample Kolmogorov-Smirnov statistic levels for every numeric feature (none by default: "
        "reported, not judged).",
        examples=[{"warn": 0.1, "fail": 0.2}],
    )
    features: dict[str, FeatureDriftSpec] = Field(
        default_factory=dict,
        description="Per-feature levels, or ignore: true.",
        examples=[{"is_foreign": {"psi": {"fail": 0.5}}}],
    )

    @field_validator("reference", mode="before")
    @classmethod
    def _quoted_digest(cls, value: Any) -> Any:
        # YAML reads an all-digit digest prefix as a number and drops its leading zeros.
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"YAML read {value!r} as a number; write the version digest in quotes")
        return value

    @field_validator("reference")
    @classmethod
    def _known_reference(cls, value: str) -> str:
        if not _REFERENCE.fullmatch(value):
            raise ValueError(f"{value!r} is neither 'baseline' nor a version digest; write 'baseline', or the first 16 "
                             "(or more) lowercase hex characters of a version that `trainpipe datasets` lists")
        return value


class ValidationSpec(SpecModel):
    expectations: list[
        Annotated[
            ExpectationSpec,
            BeforeValidator(_normalise_expectation),
            WithJsonSchema({
                "anyOf": [
                    {"type": "string", "pattern": "^expect_[a-z0-9_]+$"},
                    {"type": "object", "minProperties": 1, "maxProperties": 1,
                     "patternProperties": {"^expect_[a-z0-9_]+$": {"type": ["object", "null"]}},
                     "additionalProperties": False},
                    ExpectationSpec.model_json_schema(),
                ],
                "description": "An expectation name, or {name: {kwargs}}.",
            }),
        ]
    ] = Field(
        default_factory=list,
        description="Great Expectations run on the snapshot before training. Feature and label columns "
        "are always required to exist.",
        examples=[[{"expect_column_values_to_not_be_null": {"column": "amount"}}]],
    )
    max_volume_change: float | None = Field(
        default=None,
        gt=0,
        description="Fail when the row count changes by more than this fraction vs the previous snapshot.",
        examples=[0.2],
    )
    schema_: SchemaCheckSpec = Field(
        default_factory=SchemaCheckSpec,
        alias="schema",
        description="Schema changes vs the baseline version (the last one that passed validation) that are allowed.",
        examples=[{"added_columns": "allow", "removed_columns": "fail", "retyped_columns": "fail"}],
    )
    drift: DriftSpec | None = Field(
        default=None,
        description="Distribution drift of each feature vs the baseline (or a pinned) version: PSI and KS, with warn "
        "and fail levels. Not checked when omitted.",
        examples=[{"psi": {"warn": 0.1, "fail": 0.25}, "ks": {"warn": 0.1, "fail": 0.2}}],
    )
