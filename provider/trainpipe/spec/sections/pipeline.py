"""The whole spec: ``PipelineSpec`` and the schedule; the run-parameter lookups."""

from __future__ import annotations

import functools
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from trainpipe.errors import first_hidden_character
from trainpipe.spec.bounds import BoundKeyword, ParamBound
from trainpipe.spec.sections.common import SpecModel
from trainpipe.spec.sections.data import DataSpec
from trainpipe.spec.sections.evaluation import EvaluationSpec
from trainpipe.spec.sections.notify import NotifySpec
from trainpipe.spec.sections.params import OVERRIDABLE_PARAMS, ParamSpec
from trainpipe.spec.sections.registration import RegistrationSpec
from trainpipe.spec.sections.training import TrainingSpec
from trainpipe.spec.sections.tuning import TuningSpec
from trainpipe.spec.sections.validation import ValidationSpec
from trainpipe.spec.types import Duration

_SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly", "@annually")


class AssetScheduleSpec(SpecModel):
    assets: list[str] = Field(
        min_length=1,
        description="Run when these Airflow Assets are updated (their URIs), e.g. another pipeline's snapshot or model.",
        examples=[["trainpipe://fraud_detector/model"]],
    )
    mode: Literal["all", "any"] = Field(
        default="all",
        description="'all': run once every listed asset was updated; 'any': on each update of any.",
        examples=["any"],
    )


def _normalise_schedule(value: Any) -> Any:
    if isinstance(value, dict):
        return value
    if value is None or (isinstance(value, str) and value.strip().lower() in {"none", "null", ""}):
        return None
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("@"):
            if value not in _SCHEDULE_PRESETS:
                raise ValueError(f"unknown schedule preset {value!r}; use one of {', '.join(_SCHEDULE_PRESETS)}")
            return value
        # Airflow's own cron parser; imported here to keep the model's import cheap.
        from croniter import CroniterBadDateError, croniter

        if not croniter.is_valid(value):
            raise ValueError(f"invalid cron expression {value!r}; expected five fields such as '0 0 * * *'")
        try:
            croniter(value, datetime(2025, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            # Airflow would register the DAG and never schedule it, with no error anywhere.
            raise ValueError(f"cron expression {value!r} never fires: no month has that day (such as 31 April or "
                             "30 February); fix the day of month or the month") from None
    return value


def _supported_start(value: datetime) -> datetime:
    # Airflow steps back one interval from the start date to build the first data interval, and dates at
    # either end of datetime's range overflow there (year 1 with @weekly).
    if value.replace(tzinfo=None) < datetime(1970, 1, 1) or value.year > 2999:
        raise ValueError(f"start_date {value.date()} is outside 1970-01-01 to 2999-12-31; write the first date the "
                         "pipeline should run, such as 2025-01-01")
    return value


def _plain_tag(tag: str) -> str:
    # A tag is read by people and filters in the UI: one that only looks like another (a zero-width space,
    # a full-width colon, a Cyrillic 'е' in 'team') would pass for a tag it is not, such as another team's.
    hidden = first_hidden_character(tag)
    if hidden is not None:
        raise ValueError(f"{tag!r} contains the invisible or control character U+{ord(hidden):04X}; remove it")
    plain = unicodedata.normalize("NFKC", tag)
    if plain != tag:
        raise ValueError(f"{tag!r} uses full-width or styled characters; write it as {plain!r}")
    for word in re.findall(r"[^\W\d_]+", tag):
        scripts = {unicodedata.name(c, "?").split(" ")[0] for c in word}
        if "LATIN" in scripts and len(scripts) > 1:
            # Named by code point: the look-alike is, by design, invisible in the quoted tag.
            other = next(c for c in word if not unicodedata.name(c, "?").startswith("LATIN"))
            raise ValueError(f"{tag!r} mixes Latin letters with look-alike letters of another script in {word!r} "
                             f"(U+{ord(other):04X} {unicodedata.name(other, '?')}); write each word in one script")
    return tag


# Airflow's own bounds, refused here with the line rather than when the DAG is built or stored: a DAG id
# (validate_key), a tag (TAG_MAX_LEN) and the owners column (tests/spec/test_validate.py compares them).
DAG_ID_MAX_LENGTH, TAG_MAX_LENGTH, OWNER_MAX_LENGTH = 250, 100, 2000


class PipelineSpec(SpecModel):
    pipeline_id: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9_\-]*$", max_length=DAG_ID_MAX_LENGTH,
        description="Unique id; becomes the DAG id.",
        examples=["fraud_detector"],
    )
    description: str = Field(default="", description="Shown in the Airflow UI.", examples=["Nightly fraud model retrain"])
    owner: str = Field(default="trainpipe", max_length=OWNER_MAX_LENGTH, description="Airflow owner.",
                       examples=["risk-ml"])
    tags: list[Annotated[str, Field(min_length=1, max_length=TAG_MAX_LENGTH), AfterValidator(_plain_tag)]] = Field(
        default_factory=list, description="Airflow DAG tags.", examples=[["fraud"]])
    schedule: Annotated[str | AssetScheduleSpec | None, BeforeValidator(_normalise_schedule)] = Field(
        default=None,
        description="Cron expression, preset (@daily), none (manual triggers only), or {assets: [...]} (data-aware).",
        examples=["0 0 * * *", "@daily", "none", {"assets": ["trainpipe://transactions_ingest/snapshot"]}],
    )
    start_date: Annotated[datetime, AfterValidator(_supported_start)] = Field(
        default=datetime(2025, 1, 1, tzinfo=UTC),
        description="First logical date; runs are not back-filled (catchup off).",
        examples=["2025-01-01"],
    )
    priority: Literal["low", "normal", "high"] | None = Field(
        default=None,
        description="Share of contended GPUs: the train and trial tasks' Airflow priority_weight and, on "
        "Kubernetes, the PriorityClass trainpipe-<priority> (and Kueue's WorkloadPriorityClass of the same name "
        "with training.kubernetes.queue). The platform may cap it. Unset: normal in Airflow, no class on Kubernetes.",
        examples=["high"],
    )
    retries: int = Field(default=1, ge=0, description="Airflow retries per task.", examples=[1])
    retry_delay: Duration = Field(default=timedelta(minutes=5), description="Wait between task tries.", examples=["5m"])
    data: DataSpec = Field(description="The input dataset.", examples=[{"uri": "demo/transactions/transactions.parquet"}])
    validation: ValidationSpec = Field(
        default_factory=ValidationSpec, description="Data checks before training.", examples=[{"max_volume_change": 0.2}]
    )
    training: TrainingSpec = Field(description="What and how to train.", examples=[{"task": "binary_classification"}])
    evaluation: EvaluationSpec = Field(description="Holdout metrics and gates.", examples=[{"metrics": ["auc"]}])
    registration: RegistrationSpec = Field(
        description="Where the model is registered.", examples=[{"model_name": "fraud_detector"}]
    )
    notify: NotifySpec | None = Field(
        default=None,
        description="Messages on gate failure, task failure, pending approval and promotion, sent through "
        "Airflow's notifiers with the connections named here.",
        examples=[{"email": {"to": "ml-oncall@example.com", "conn_id": "smtp_default", "events": ["gate_failure"]}}],
    )
    params: dict[str, ParamSpec] = Field(
        default_factory=dict,
        description="Run parameters shown in 'Trigger DAG w/ config'; each overrides the hyperparameter of the same name "
        f"for that run only. Names: {', '.join(sorted(OVERRIDABLE_PARAMS))}.",
        examples=[{"learning_rate": {"description": "Adam learning rate for this run", "minimum": 0.00001}}],
    )
    tuning: TuningSpec | None = Field(
        default=None,
        description="Hyperparameter search before training: an Optuna study of n_trials trials, then the final "
        "training with the best trial's parameters.",
        examples=[{"n_trials": 20, "max_parallel": 2, "space": {"learning_rate": {"log_uniform": [0.0001, 0.1]}}}],
    )


def overridden_value(spec: PipelineSpec, name: str) -> Any:
    """The spec's current value of the hyperparameter that run parameter ``name`` overrides."""
    value: Any = spec
    for part in OVERRIDABLE_PARAMS[name][0]:
        value = getattr(value, part)
    return value


@functools.cache
def _field_bounds(name: str) -> tuple[ParamBound, ...]:
    return bounds_at(OVERRIDABLE_PARAMS[name][0])


@functools.cache
def bounds_at(path: tuple[str, ...]) -> tuple[ParamBound, ...]:
    """The constraints (ge, gt, le, lt) of the spec field at ``path``, as bounds."""
    model: Any = PipelineSpec
    metadata: list[Any] = []
    for part in path:
        field = model.model_fields[part]
        model, metadata = field.annotation, field.metadata
    keywords: dict[str, BoundKeyword] = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
    return tuple(
        ParamBound(keyword, getattr(constraint, attribute), ".".join(path))
        for constraint in metadata
        for attribute, keyword in keywords.items()
        if hasattr(constraint, attribute)
    )


def param_bounds(name: str, param: ParamSpec) -> tuple[ParamBound, ...]:
    """The tightest lower and upper bound of a run parameter: the spec's declared ``minimum`` and
    ``maximum`` intersected with its field's own constraints, so that the trigger form refuses what
    the run would refuse (``epochs: 0``, ``learning_rate: 0``)."""
    ends: tuple[tuple[BoundKeyword, float | None], ...] = (("minimum", param.minimum), ("maximum", param.maximum))
    declared = [ParamBound(k, v, f"params.{name}.{k}") for k, v in ends if v is not None]
    candidates = [*_field_bounds(name), *declared]
    lows = [b for b in candidates if b.keyword in ("minimum", "exclusiveMinimum")]
    highs = [b for b in candidates if b.keyword in ("maximum", "exclusiveMaximum")]
    # At equal values the exclusive bound is the tighter one.
    tightest = []
    if lows:
        tightest.append(max(lows, key=lambda b: (b.value, b.keyword == "exclusiveMinimum")))
    if highs:
        tightest.append(min(highs, key=lambda b: (b.value, b.keyword != "exclusiveMaximum")))
    return tuple(tightest)
