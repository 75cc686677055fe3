"""Data-quality checks of a dataset snapshot with Great Expectations 1.x.

A spec lists expectations by their snake_case name and keyword arguments, for example
``expect_column_values_to_be_between: {column: amount, min_value: 0}``; :func:`validate_dataframe`
runs them, after an ``expect_column_to_exist`` for each required column, in a throwaway
(ephemeral) Great Expectations context and returns a :class:`ValidationReport`.

Importing great_expectations costs about 4 s of CPU (pandas, pydantic, sqlalchemy, altair ...), so
this module imports it only inside the functions that use it: DAG files may import
``trainpipe.steps.validate.quality`` freely. Once imported, a validation of 20,000 rows against a dozen
expectations takes 0.15-0.3 s, of which building the context, datasource and suite is ~0.05 s.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainpipe.errors import SpecError

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.expectations import Expectation

_INDEX_KEY = "trainpipe_index"
# GE's registry of its public API (for its own docs) logs one INFO line per nested function it skips:
# 214 of a validate task's 267 lines. Only this logger is quietened; GE's other logging is untouched.
_GE_API_DOCS_LOGGER = "great_expectations._docs_decorators"
_MAX_EXAMPLES = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectationOutcome:
    """The result of one expectation: its name and arguments as written, and what was observed."""

    name: str
    kwargs: dict[str, Any]
    success: bool
    observed: str

    def line(self) -> str:
        verdict = "PASS" if self.success else "FAIL"
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.kwargs.items())
        observed = f": {self.observed}" if self.observed else ""
        return f"{verdict} {self.name}({arguments}){observed}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReport:
    """Every expectation's outcome, in the order they were given (required columns first)."""

    success: bool
    outcomes: list[ExpectationOutcome]
    rows: int

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [outcome for outcome in self.outcomes if not outcome.success]

    def summary(self) -> str:
        """A header line, then one ``PASS``/``FAIL`` line per expectation with its observed value."""
        passed = len(self.outcomes) - len(self.failures)
        verdict = "passed" if self.success else "FAILED"
        header = f"validation {verdict}: {passed}/{len(self.outcomes)} expectations met on {self.rows} rows"
        return "\n".join([header, *(outcome.line() for outcome in self.outcomes)])


def note_text(outcome: ExpectationOutcome) -> str:
    """A failed expectation in a few words, for the run's note: its name, its column, what was observed
    (without the examples): ``expect_column_values_to_be_between(amount): 12 of 3000 values unexpected (0.4%)``."""
    column = outcome.kwargs.get("column")
    observed = outcome.observed.split(", e.g. ", 1)[0].split("; columns present: ", 1)[0]
    return f"{outcome.name}({column if column is not None else ''})" + (f": {observed}" if observed else "")


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@functools.cache
def _quiet_ge_api_docs_registry() -> None:
    import logging

    logging.getLogger(_GE_API_DOCS_LOGGER).setLevel(logging.WARNING)


def _expectation_classes() -> dict[str, type[Expectation]]:
    _quiet_ge_api_docs_registry()
    import great_expectations.expectations as gxe
    from great_expectations.expectations import Expectation

    classes: dict[str, type[Expectation]] = {}
    for attribute in dir(gxe):
        candidate = getattr(gxe, attribute)
        if isinstance(candidate, type) and issubclass(candidate, Expectation) and candidate is not Expectation:
            # expectation_type is the registered name; one deprecated class leaves it empty.
            name = getattr(candidate, "expectation_type", "") or _snake_case(candidate.__name__)
            classes[name] = candidate
    return classes


def expectation_names() -> frozenset[str]:
    """The snake_case names of every expectation class in ``great_expectations.expectations``.

    Computed on first call (which imports great_expectations) and cached.
    """
    return frozenset(_expectation_classes())


def expectation_class(name: str, *, field_path: str = "expectations") -> type[Expectation]:
    """The expectation class for a snake_case ``name``; an unknown name is a :class:`SpecError`
    that suggests the nearest known name (a CamelCase class name gets its snake_case form)."""
    classes = _expectation_classes()
    if isinstance(name, str) and name in classes:
        return classes[name]
    text = _snake_case(name) if isinstance(name, str) and not name.islower() else str(name)
    close = [text] if text in classes else difflib.get_close_matches(text, list(classes), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see great_expectations.expectations for the list"
    raise SpecError(f"{field_path}: unknown expectation {name!r}{hint}")


def _describe_pydantic_errors(
    cls: type[Expectation], kwargs: Mapping[str, Any], errors: Iterable[Mapping[str, Any]]
) -> str:
    """One clause per bad argument; of a union's several complaints only the first is kept."""
    fields = [name for name in getattr(cls, "__fields__", {}) if name not in ("id", "rendered_content")]
    problems: dict[str, str] = {}
    for error in errors:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "__root__")
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "value_error.extra":
            message = "unknown argument"
            close = difflib.get_close_matches(location, fields, n=1)
            if close:
                message += f", did you mean {close[0]!r}?"
        elif location in kwargs:
            message = f"{message} (got {kwargs[location]!r})"
        key = location or message
        problems.setdefault(key, f"{location}: {message}" if location else message)
    return "; ".join(problems.values())


def build_expectation(
    name: str, kwargs: Mapping[str, Any], *, field_path: str = "expectations"
) -> Expectation:
    """Construct expectation ``name`` with ``kwargs``; any problem is a :class:`SpecError`
    naming ``field_path``, the expectation and each bad argument. Spec loaders can use it to
    check expectations before any data exists."""
    cls = expectation_class(name, field_path=field_path)
    if not isinstance(kwargs, Mapping):
        raise SpecError(f"{field_path}: {name}: arguments must be a mapping, got {type(kwargs).__name__}")
    _refuse_evaluated_text(name, kwargs, field_path=field_path)
    from pydantic import ValidationError as PydanticValidationError
    from pydantic.v1 import ValidationError as PydanticV1ValidationError

    try:
        expectation = cls(**kwargs)
    except (PydanticV1ValidationError, PydanticValidationError) as error:
        raise SpecError(f"{field_path}: {name}: {_describe_pydantic_errors(cls, kwargs, error.errors())}") from None
    except (TypeError, ValueError) as error:
        raise SpecError(f"{field_path}: {name}: {error}") from None
    from great_expectations.expectations.row_conditions import PassThroughCondition

    # GE turns a text condition it does not parse itself into a pass-through for DataFrame.query:
    # whatever the arguments looked like, that never reaches validation.
    if isinstance(getattr(expectation, "row_condition", None), str | PassThroughCondition):
        raise SpecError(f"{field_path}: {name}.row_condition: Great Expectations would hand this condition to "
                        "DataFrame.query as text, which can run code; use its condition grammar")
    return expectation


def _refuse_evaluated_text(name: str, kwargs: Mapping[str, Any], *, field_path: str) -> None:
    """The spec stage's checks of arguments that reach an evaluator (``trainpipe.spec.expectations``),
    again here: a plan that did not come through the spec stage (a stale cache, a hand-made plan)
    still never makes the validate task run a spec's text."""
    from trainpipe.spec import expectations as rules

    problems, refused = rules.evaluated_text_problems(name, dict(kwargs))
    messages = [*refused, *(f"{name}.{'.'.join(str(part) for part in path)}: {message}" for path, message in problems)]
    if messages:
        raise SpecError("; ".join(f"{field_path}: {message}" for message in messages))


def _plain(value: Any) -> Any:
    """numpy scalars to Python ones, so reprs read ``0.05`` and not ``np.float64(0.05)``."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _percent(part: int, whole: int) -> str:
    return f" ({100 * part / whole:.3g}%)" if whole else ""


def _format_observed(name: str, kwargs: Mapping[str, Any], result: Any, columns: list[str]) -> str:
    info = result.exception_info or {}
    if "raised_exception" not in info and info:
        # One entry per failed metric: keep the first message.
        info = next(iter(info.values()))
    if info.get("raised_exception"):
        message = str(info.get("exception_message") or "unknown error").strip()
        return f"error: {message.removeprefix('Error: ')}"
    details = result.result or {}
    if name == "expect_column_to_exist" and not result.success:
        # Not listed: data.uri may name any file the worker can read, and a CSV's header is its first line.
        return f"column {kwargs.get('column')!r} is missing ({len(columns)} columns present)"
    if "observed_value" in details:
        return f"observed {_plain(details['observed_value'])!r}"
    if "unexpected_count" in details and "element_count" in details:
        unexpected, total = int(details["unexpected_count"] or 0), int(details["element_count"] or 0)
        missing = int(details.get("missing_count") or 0)
        if name == "expect_column_values_to_not_be_null":
            return f"{unexpected} of {total} values null" + _percent(unexpected, total)
        # Map expectations other than the null checks skip nulls: count against non-null values.
        checked = total - missing
        text = f"{unexpected} of {checked} {'non-null ' if missing else ''}values unexpected"
        text += _percent(unexpected, checked)
        examples = _plain(details.get("partial_unexpected_list") or [])[:_MAX_EXAMPLES]
        if examples:
            text += f", e.g. {examples!r}"
        return text + (f"; {missing} null" if missing else "")
    return ""


def validate_dataframe(
    df: pd.DataFrame,
    *,
    expectations: list[tuple[str, dict[str, Any]]],
    required_columns: list[str],
    field_path: str = "validation.expectations",
) -> ValidationReport:
    """Validate ``df`` against ``expect_column_to_exist`` for each of ``required_columns``, then
    ``expectations`` (``(snake_case_name, kwargs)`` pairs), in one ephemeral GE context.

    An unknown name or bad arguments raise :class:`SpecError` (``field_path[i]`` names the entry)
    before anything runs. Data problems never raise: a missing column, or an expectation whose
    metric cannot be computed, is a failed outcome whose ``observed`` says why.
    """
    built: list[tuple[str, dict[str, Any], Expectation]] = []
    entries = [("expect_column_to_exist", {"column": column}, None) for column in required_columns]
    entries += [(name, kwargs, index) for index, (name, kwargs) in enumerate(expectations)]
    for position, (name, kwargs, index) in enumerate(entries):
        path = f"{field_path}[{index}]" if index is not None else "required_columns"
        expectation = build_expectation(name, kwargs, field_path=path)
        expectation.meta = {**(expectation.meta or {}), _INDEX_KEY: position}
        built.append((name, dict(kwargs), expectation))

    _quiet_ge_api_docs_registry()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas(name="trainpipe").add_dataframe_asset(name="snapshot")
    batch = asset.add_batch_definition_whole_dataframe("whole").get_batch(batch_parameters={"dataframe": df})
    suite = gx.ExpectationSuite(name="trainpipe", expectations=[expectation for _, _, expectation in built])
    results = batch.validate(suite)

    by_position = {r.expectation_config.meta[_INDEX_KEY]: r for r in results.results}
    columns = [str(column) for column in df.columns]
    outcomes = []
    for position, (name, kwargs, _) in enumerate(built):
        result = by_position[position]
        outcomes.append(
            ExpectationOutcome(
                name=name,
                kwargs=kwargs,
                success=bool(result.success),
                observed=_format_observed(name, kwargs, result, columns),
            )
        )
    return ValidationReport(success=all(o.success for o in outcomes), outcomes=outcomes, rows=len(df))


def volume_change(current_rows: int, previous_rows: int | None) -> float | None:
    """Relative change ``|current - previous| / previous``; None without a previous count.

    A previous count of 0 gives 0.0 when the current one is 0 too and ``inf`` otherwise.
    """
    if previous_rows is None:
        return None
    if current_rows < 0 or previous_rows < 0:
        raise ValueError(f"row counts must be >= 0, got current={current_rows} previous={previous_rows}")
    if previous_rows == 0:
        return 0.0 if current_rows == 0 else math.inf
    return abs(current_rows - previous_rows) / previous_rows
