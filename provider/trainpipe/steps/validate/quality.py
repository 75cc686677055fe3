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
from dataclasses import dataclass, field
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
    built = _build_suite(expectations, required_columns, field_path)
    outcomes = _run_suite(df, built)
    return ValidationReport(success=all(o.success for o in outcomes), outcomes=outcomes, rows=len(df))


_Built = tuple[str, dict[str, Any], "Expectation"]


def _build_suite(expectations: list[tuple[str, dict[str, Any]]], required_columns: list[str],
                 field_path: str) -> list[_Built]:
    built: list[_Built] = []
    entries = [("expect_column_to_exist", {"column": column}, None) for column in required_columns]
    entries += [(name, kwargs, index) for index, (name, kwargs) in enumerate(expectations)]
    for name, kwargs, index in entries:
        path = f"{field_path}[{index}]" if index is not None else "required_columns"
        built.append((name, dict(kwargs), build_expectation(name, kwargs, field_path=path)))
    return built


def _run_suite(df: pd.DataFrame, built: list[_Built]) -> list[ExpectationOutcome]:
    """The outcomes of ``built`` on ``df``, in their order (one ephemeral GE context)."""
    if not built:
        return []
    for position, (_, _, expectation) in enumerate(built):
        expectation.meta = {**(expectation.meta or {}), _INDEX_KEY: position}
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
    return outcomes


# ---------------------------------------------------------------------------------------------
# A version too large for memory (a manifest): one streamed pass decides what sums and bounds over its
# row groups decide exactly; the other expectations (a mean, a median, a unique share ...) run in GE on a
# seeded uniform sample of the version, and their observed text says so.

# Arguments that change no outcome; any other (row_condition, result_format, windows ...) sends the
# expectation to the sample, where GE applies it as it always does.
_INERT_ARGUMENTS = frozenset({"meta", "notes", "description"})
_BOUNDS = frozenset({"min_value", "max_value", "strict_min", "strict_max"})
_EXACT_ARGUMENTS: dict[str, frozenset[str]] = {
    "expect_column_to_exist": frozenset({"column"}),
    "expect_table_row_count_to_be_between": _BOUNDS,
    "expect_table_row_count_to_equal": frozenset({"value"}),
    "expect_column_values_to_not_be_null": frozenset({"column", "mostly"}),
    "expect_column_values_to_be_between": _BOUNDS | {"column", "mostly"},
    "expect_column_values_to_be_in_set": frozenset({"column", "value_set", "mostly"}),
    "expect_column_values_to_not_be_in_set": frozenset({"column", "value_set", "mostly"}),
    "expect_column_min_to_be_between": _BOUNDS | {"column"},
    "expect_column_max_to_be_between": _BOUNDS | {"column"},
}
# GE keeps the first 20 unexpected values (result_format SUMMARY).
_PARTIAL_UNEXPECTED = 20


@dataclass(frozen=True, slots=True)
class _Result:
    """What :func:`_format_observed` reads of a GE validation result, made from streamed counts."""

    success: bool
    result: dict[str, Any]
    exception_info: dict[str, Any] = field(default_factory=dict)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _within(value: Any, kwargs: Mapping[str, Any]) -> bool:
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and (value <= low if kwargs.get("strict_min") else value < low):
        return False
    return not (high is not None and (value >= high if kwargs.get("strict_max") else value > high))


@dataclass(slots=True)
class _Tally:
    """One exact expectation's counts over the row groups seen so far."""

    name: str
    kwargs: dict[str, Any]
    elements: int = 0
    missing: int = 0
    unexpected: int = 0
    examples: list[Any] = field(default_factory=list)
    extreme: Any = None

    def update(self, frame: pd.DataFrame) -> None:
        self.elements += len(frame)
        if self.name.startswith("expect_table_"):
            return
        column = frame[self.kwargs["column"]]
        if self.name == "expect_column_values_to_not_be_null":
            self.unexpected += int(column.isna().sum())
            return
        present = column.dropna()
        self.missing += len(column) - len(present)
        if self.name in ("expect_column_min_to_be_between", "expect_column_max_to_be_between"):
            if len(present):
                low = self.name == "expect_column_min_to_be_between"
                value = present.min() if low else present.max()
                if self.extreme is None or (value < self.extreme if low else value > self.extreme):
                    self.extreme = value
            return
        if self.name == "expect_column_values_to_be_between":
            bad = present[~_between_mask(present, self.kwargs)]
        else:
            inside = present.isin(list(self.kwargs["value_set"]))
            bad = present[~inside] if self.name == "expect_column_values_to_be_in_set" else present[inside]
        self.unexpected += len(bad)
        if len(self.examples) < _PARTIAL_UNEXPECTED:
            self.examples.extend(bad.iloc[: _PARTIAL_UNEXPECTED - len(self.examples)].tolist())

    def decided(self) -> bool:
        """False when the counts cannot say what GE says (a min of no value): the sample decides, as it
        holds the same nothing."""
        return not (self.name.endswith(("_min_to_be_between", "_max_to_be_between")) and self.extreme is None)

    def result(self) -> _Result:
        if self.name.startswith("expect_table_"):
            rows = self.elements
            ok = rows == self.kwargs["value"] if self.name.endswith("_to_equal") else _within(rows, self.kwargs)
            return _Result(ok, {"observed_value": rows})
        if self.name.endswith(("_min_to_be_between", "_max_to_be_between")):
            return _Result(_within(self.extreme, self.kwargs), {"observed_value": _plain(self.extreme)})
        mostly = float(self.kwargs.get("mostly", 1.0))
        considered = self.elements - self.missing
        # GE's rule: no row (or no non-null row) to judge is vacuously a success.
        ok = considered == 0 or (considered - self.unexpected) / considered >= mostly
        return _Result(ok, {"element_count": self.elements, "missing_count": self.missing,
                            "unexpected_count": self.unexpected, "partial_unexpected_list": list(self.examples)})


def _between_mask(present: pd.Series, kwargs: Mapping[str, Any]) -> Any:
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    inside = present == present  # all True, same index
    if low is not None:
        inside &= present > low if kwargs.get("strict_min") else present >= low
    if high is not None:
        inside &= present < high if kwargs.get("strict_max") else present <= high
    return inside


def _exact(name: str, kwargs: Mapping[str, Any], frame: pd.DataFrame) -> bool:
    """Whether streamed counts decide this expectation exactly as GE would on the whole version (else: the
    sample). ``frame``: the first row group, for the columns and their types."""
    from trainpipe.steps.validate.drift import is_numeric

    allowed = _EXACT_ARGUMENTS.get(name)
    if allowed is None or not set(kwargs) <= allowed | _INERT_ARGUMENTS:
        return False
    if name == "expect_column_to_exist":
        return True
    if name.startswith("expect_table_"):
        return all(_number(kwargs.get(k)) for k in ("value", "min_value", "max_value") if kwargs.get(k) is not None)
    column = kwargs.get("column")
    if column not in frame.columns:
        return False  # GE's own error text, from the sample
    if "value_set" in kwargs:
        values = kwargs["value_set"]
        return isinstance(values, list | tuple | set) and all(v is None or isinstance(v, str | int | float | bool)
                                                              for v in values)
    if _BOUNDS & set(kwargs):
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        bounds_ok = all(v is None or _number(v) for v in (low, high)) and (low is not None or high is not None)
        # GE refuses min > max with an error: the sample gives its words.
        return bounds_ok and is_numeric(frame[column]) and not (low is not None and high is not None and low > high)
    return True


class StreamedSuite:
    """The expectations of a version read one row group at a time: ``update`` with each, then ``report``
    with the version's seeded sample. Spec problems raise :class:`SpecError` at construction, as
    :func:`validate_dataframe` does."""

    def __init__(self, *, expectations: list[tuple[str, dict[str, Any]]], required_columns: list[str],
                 field_path: str = "validation.expectations") -> None:
        self._built = _build_suite(expectations, required_columns, field_path)
        self._tallies: list[_Tally | None] | None = None
        self._columns: list[str] = []
        self.rows = 0

    def update(self, frame: pd.DataFrame) -> None:
        if self._tallies is None:
            self._columns = [str(c) for c in frame.columns]
            self._tallies = [_Tally(name, kwargs) if _exact(name, kwargs, frame) else None
                             for name, kwargs, _ in self._built]
        self.rows += len(frame)
        for tally in self._tallies:
            if tally is not None and tally.name != "expect_column_to_exist":
                tally.update(frame)

    @property
    def sampled(self) -> list[str]:
        """The names of the expectations GE judges on the sample."""
        tallies = self._tallies or [None] * len(self._built)
        return [name for (name, _, _), t in zip(self._built, tallies, strict=True) if t is None or not t.decided()]

    def report(self, sample: pd.DataFrame) -> ValidationReport:
        """Exact outcomes from the counts, the others from GE on ``sample`` (their observed text names it)."""
        tallies = self._tallies or [None] * len(self._built)
        outcomes: list[ExpectationOutcome | None] = []
        on_sample = []
        for position, ((name, kwargs, expectation), tally) in enumerate(zip(self._built, tallies, strict=True)):
            if tally is None or not tally.decided():
                on_sample.append((position, (name, kwargs, expectation)))
                outcomes.append(None)
                continue
            if name == "expect_column_to_exist":
                result = _Result(kwargs["column"] in self._columns, {})
            else:
                result = tally.result()
            outcomes.append(ExpectationOutcome(name=name, kwargs=kwargs, success=result.success,
                                               observed=_format_observed(name, kwargs, result, self._columns)))
        prefix = f"sample of {len(sample)} of {self.rows} rows"
        for (position, _), outcome in zip(on_sample, _run_suite(sample, [b for _, b in on_sample]), strict=True):
            observed = f"{prefix}: {outcome.observed}" if outcome.observed else prefix
            outcomes[position] = ExpectationOutcome(name=outcome.name, kwargs=outcome.kwargs,
                                                    success=outcome.success, observed=observed)
        done = [o for o in outcomes if o is not None]
        return ValidationReport(success=all(o.success for o in done), outcomes=done, rows=self.rows)


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
