"""The spec's ``registration:`` section: names, approval, backtests."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator

from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.types import Duration

# ASCII only: \w admits any letter, and a registry on an accent- and case-insensitive collation (MySQL's
# default) takes 'chámpion' or a Cyrillic 'а' for 'champion', so register would move the production alias.
ALIAS_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"


class ApprovalSpec(SpecModel):
    mode: Literal["none", "required"] = Field(
        default="required",
        description="'required': an `approve` task between register and promote waits for a person (Airflow's "
        "Required Actions, or the REST API); 'none': promote right after register.",
        examples=["required"],
    )
    timeout: Duration | None = Field(
        default=timedelta(hours=24),
        description="How long the approval waits for an answer; then on_timeout decides. While it waits, the next "
        "run of the pipeline waits too (one run at a time).",
        examples=["24h"],
    )
    on_timeout: Literal["reject", "approve"] = Field(
        default="reject",
        description="The answer when nobody answered within timeout: 'reject' (the version stays challenger, "
        "tagged rejected) or 'approve'.",
        examples=["reject"],
    )


def _normalise_approval(value: Any) -> Any:
    # YAML friendly forms: "none" / "required" -> {mode: ...}.
    if isinstance(value, str):
        return {"mode": value.strip()}
    return value


class BacktestSpec(SpecModel):
    """A run for a past window (a backfill, or data older than the champion's): what it may do."""

    # "register" as a Python name would shadow pydantic's BaseModel.register (a warning at every import).
    register_version: bool = Field(
        default=False,
        alias="register",
        description="Register the backtest's model as a version tagged `trainpipe.backtest=true` (never "
        "challenger). false: it trains, evaluates and records its metrics on the MLflow run only.",
        examples=[True],
    )
    alias: str | None = Field(
        default=None,
        pattern=ALIAS_PATTERN,
        description="With register: true, the alias the registered backtest version takes (a plain name, kept "
        "literal; not the production, challenger or previous alias, nor champion, challenger or "
        "previous_champion). null: no alias.",
        examples=["backtest"],
    )
    promote: Literal["deny", "allow"] = Field(
        default="deny",
        description="'deny': a backtest moves no alias of the lifecycle and never becomes the validation "
        "baseline. 'allow': a run for a past window is treated as any other run (register, promote, baseline).",
        examples=["deny"],
    )


# A name that becomes an MLflow name or a storage path segment: plain text that MLflow, a URL and a file
# system all read the same way (and a policy's model_name_prefix matches as written).
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


def plain_name_problem(value: str) -> str | None:
    """Why ``value`` is not a plain name (letters, digits, '_', '-' and '.', no '..'), or None."""
    if _PLAIN_NAME.fullmatch(value) and ".." not in value:
        return None
    return (f"must be a plain name: letters, digits, '_', '-' and '.', starting with a letter or digit, without "
            f"'..', at most 200 characters (it becomes an MLflow name and a storage path segment); got {value!r}")


class RegistrationSpec(SpecModel):
    model_name: str = Field(
        description="MLflow registered model name: a plain name (letters, digits, '_', '-' and '.', no '..').",
        examples=["fraud_detector"],
    )

    @field_validator("model_name")
    @classmethod
    def _plain_model_name(cls, value: str) -> str:
        problem = plain_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    alias: str = Field(
        default="champion",
        pattern=ALIAS_PATTERN,
        description="The production alias: `promote` moves it to the new version when every gate passes "
        "(and the approval, if any, is given).",
        examples=["champion"],
    )
    challenger_alias: str = Field(
        default="challenger",
        pattern=ALIAS_PATTERN,
        description="Alias `register` gives each new version, before it is promoted.",
        examples=["challenger"],
    )
    previous_alias: str = Field(
        default="previous_champion",
        pattern=ALIAS_PATTERN,
        description="Alias the replaced production version keeps on promotion; `trainpipe rollback` moves "
        "the production alias back to it.",
        examples=["previous_champion"],
    )
    approval: Annotated[
        ApprovalSpec,
        BeforeValidator(_normalise_approval),
        WithJsonSchema({
            "anyOf": [{"type": "string", "enum": ["none", "required"]}, ApprovalSpec.model_json_schema()],
            "description": "'none', 'required', or {mode: required, timeout: 24h, on_timeout: reject | approve}.",
        }),
    ] = Field(
        default_factory=lambda: ApprovalSpec(mode="none"),
        description="Human approval before promotion: 'none' (promote when the gates pass), 'required' (a person "
        "approves in Airflow's Required Actions or through the REST API; unanswered after 24h: rejected), or "
        "{mode: required, timeout: 2h, on_timeout: reject | approve}.",
        examples=["required", {"mode": "required", "timeout": "8h", "on_timeout": "reject"}],
    )
    backtest: BacktestSpec = Field(
        default_factory=BacktestSpec,
        description="A backtest is a backfill run, or a run whose data window ends before the current production "
        "version's training window ends. By default it trains, evaluates and records its metrics, moves no alias "
        "and leaves the validation baseline as it is.",
        examples=[{"register": True, "alias": "backtest", "promote": "deny"}],
    )
