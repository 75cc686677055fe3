"""Great Expectations expectation arguments, checked at the spec stage without importing GE.

Each GE 1.x expectation is a pydantic (v1) model whose fields are its arguments. Importing
great_expectations takes seconds (9-13 s measured on a busy 2-core machine), far too slow for DAG
parsing, so :func:`generate_table` reads those models once and ``expectation_arguments.json`` keeps
the result: per expectation, each argument with whether it is required and the types it accepts,
and the groups of which at least one must be set (``min_value`` or ``max_value``). The spec stage
checks names, unknown and missing arguments and argument types against it, in microseconds; a test
regenerates the table from the installed GE and requires it to equal the committed file, so a GE
upgrade that changes an expectation fails that test until the table is regenerated with::

    python tools/gen_expectation_table.py

Type checks follow pydantic v1's own coercion rules for the values YAML can produce (``"1.5"`` is
a valid float, ``1`` a valid bool, a list of pairs a valid mapping), so nothing GE accepts is
refused; a test compares the two verdicts on a set of probe values for every argument of every
expectation. Rules GE checks beyond types (a field's own validator, such as a valid strftime format,
and the inside of nested models such as ``windows``) are left to GE when the validate task builds
the suite (``trainpipe.steps.validate.quality.build_expectation``).

One deliberate exception to "nothing GE accepts is refused": arguments that would make the validate
task evaluate a spec's text (a row condition outside GE's own grammar, a suite-parameter expression,
a remote JSON-schema reference, a query) are refused (:func:`evaluated_text_problems`): a spec's text
is data, never code.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

TABLE_FILE = Path(__file__).with_name("expectation_arguments.json")

Problem = tuple[tuple[str | int, ...], str]  # (path below the expectation's arguments, message)


@functools.cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE_FILE.read_text(encoding="utf-8"))


def known_names() -> frozenset[str]:
    return frozenset(_table()["expectations"])


def argument_problems(name: str, kwargs: dict[str, Any]) -> tuple[list[Problem], list[str]]:
    """Problems of ``kwargs`` for expectation ``name`` (a known name): ``(argument problems, missing
    messages)``. Argument problems carry the argument's name as path; missing ones belong to the
    expectation itself."""
    table = _table()
    entry = table["expectations"][name]
    arguments: dict[str, str] = entry["arguments"]
    problems: list[Problem] = []
    suggested: set[str] = set()
    for key, value in kwargs.items():
        type_name = arguments.get(key)
        if type_name is None:
            close = difflib.get_close_matches(str(key), list(arguments), n=1, cutoff=0.6)
            hint = f"did you mean `{close[0]}`?" if close else f"{name} takes {', '.join(sorted(arguments))}"
            problems.append(((key,), f"unknown argument `{key}`; {hint}"))
            suggested.update(close)
        elif not any(_accepts(kind, value) for kind in table["types"][type_name]):
            problems.append(((key,), f"must be {_describe(table['types'][type_name])}, got {value!r}"))
    # A required argument that a misspelling's "did you mean" already names is not reported twice.
    missing = [f"{name} needs argument `{argument}`; add it"
               for argument in entry["required"] if argument not in kwargs and argument not in suggested]
    for group in entry["one_of"]:
        if all(kwargs.get(argument) is None for argument in group):
            missing.append(f"{name} needs at least one of {' or '.join(f'`{a}`' for a in group)}; add one")
    return problems, missing


# ---------------------------------------------------------------------------------------------
# Arguments that reach an evaluator. A spec's text is data: nothing in it may become code, a query
# or a request. The spec stage reports these problems (with the rest) and trainpipe.steps.validate.quality checks
# them again before it builds an expectation, so a plan that skipped the spec stage is refused too.

REFUSED_EXPECTATIONS = {
    "unexpected_rows_expectation": "runs the SQL text of `unexpected_rows_query`, and a spec's text is never run; "
    "express the rule with column expectations (e.g. expect_column_values_to_be_between with a row_condition)",
    "expect_query_results_to_match_comparison": "runs the SQL text of its queries against data sources, and a spec's "
    "text is never run; compare the snapshot with column expectations or drift checks instead",
    "expect_table_row_count_to_equal_other_table": "reads another table than the snapshot; check the row count with "
    "expect_table_row_count_to_be_between, or data.volume_change",
}

# Great Expectations' own condition grammar (great_expectations.expectations.legacy_row_conditions),
# matched whole: GE ignores text after the first condition, trainpipe refuses it.
_GE_VALUE_CHARS = r"A-Za-z0-9\xc0-\xd6\xd8-\xf6\xf8-\xff!#$%&()*+,\-./:;<=>?@\[\\\]^_`{|}~ \t"
_GE_CONDITION = re.compile(
    r'col\("(?P<column>[^"\n\r]*)"\)\s*(?:(?P<notnull>(?i:\.notnull\(\)))'
    r"|(?P<op>>=|<=|==|!=|>|<)\s*(?:[+-]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?"
    rf'|(?P<quoted>"[{_GE_VALUE_CHARS}]+"|\'[{_GE_VALUE_CHARS}]+\')'
    rf'|date\((?:"[{_GE_VALUE_CHARS}]+"|\'[{_GE_VALUE_CHARS}]+\')\)))'
)
GE_PARSERS = ("great_expectations", "great_expectations__experimental__")
_OPERATORS = ("==", "!=", "<", "<=", ">", ">=", "IN", "NOT_IN")
_CONDITION_KEYS = {"comparison": {"column", "operator", "parameter"}, "nullity": {"column", "is_null"},
                   "and": {"conditions"}, "or": {"conditions"}}
_MAX_CONDITIONS = 100  # great_expectations.expectations.row_conditions.MAX_CONDITIONS
_GRAMMAR_HINT = ("write it in Great Expectations' condition grammar with `condition_parser: great_expectations`: "
                 "`col(\"amount\") > 0`, `col(\"country\") == \"DE\"` or `col(\"email\").notnull()`, or as a mapping "
                 "{type: comparison, column: {name: amount}, operator: '>', parameter: 0}")
_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")


def evaluated_text_problems(name: str, kwargs: dict[str, Any]) -> tuple[list[Problem], list[str]]:
    """What of expectation ``name`` would make the validate task evaluate a spec's text, in the shape
    of :func:`argument_problems`: ``(argument problems, messages about the expectation itself)``."""
    refused = [f"{name} {REFUSED_EXPECTATIONS[name]}"] if name in REFUSED_EXPECTATIONS else []
    return unsafe_argument_problems(kwargs), refused


def unsafe_argument_problems(kwargs: dict[str, Any]) -> list[Problem]:
    """Arguments that would make the validate task evaluate a spec's text: a row condition that is
    not Great Expectations' own grammar (pandas and spark parsers hand the text to
    ``DataFrame.query``, which runs Python; a backtick in a column name breaks out of pandas'
    quoting), a suite parameter expression (``{$PARAMETER: ...}``, evaluated by GE's arithmetic
    parser; trainpipe passes no suite parameters) and a JSON schema that refers to another document
    (``jsonschema`` fetches remote references)."""
    problems: list[Problem] = []
    parser = kwargs.get("condition_parser")
    if parser is not None and parser not in GE_PARSERS:
        problems.append((("condition_parser",), f"{parser!r} hands the condition text to an evaluator that can run code "
                         f"(DataFrame.query for pandas), and a spec's text is never run; {_GRAMMAR_HINT}"))
    condition = kwargs.get("row_condition")
    if isinstance(condition, str):
        if parser not in GE_PARSERS:
            if parser is None:
                problems.append((("row_condition",), "a text condition without `condition_parser: great_expectations` "
                                 f"goes to DataFrame.query, which can run code; {_GRAMMAR_HINT}"))
        else:
            problems.extend((("row_condition",), message) for message in _text_condition_problems(condition))
    elif isinstance(condition, dict):
        count = [0]
        problems.extend((("row_condition", *path), message)
                        for path, message in _mapping_condition_problems(condition, count))
        if count[0] > _MAX_CONDITIONS:
            problems.append((("row_condition",), f"{count[0]} conditions; at most {_MAX_CONDITIONS} are allowed"))
    elif condition is not None:
        problems.append((("row_condition",), f"must be a condition text or mapping, got {condition!r}"))
    for key, value in kwargs.items():
        if isinstance(value, dict) and "$PARAMETER" in value:
            problems.append(((key, "$PARAMETER"), "suite parameters are evaluated as expressions and trainpipe passes "
                             "none, so this could only fail or compute; write the value itself"))
    schema = kwargs.get("json_schema")
    if isinstance(schema, dict):
        problems.extend((("json_schema", *path), message) for path, message in _schema_ref_problems(schema))
    return problems


def _column_problems(name: Any) -> list[str]:
    if not isinstance(name, str) or not name:
        return [f"must be a non-empty column name, got {name!r}"]
    if "`" in name or "\n" in name or "\r" in name:
        # pandas quotes odd column names in backticks: one inside the name ends the quoting.
        return [f"a column name in a condition cannot contain a backtick or a line break, got {name!r}"]
    return []


def _text_condition_problems(text: str) -> list[str]:
    match = _GE_CONDITION.fullmatch(text.strip())
    if match is None:
        return [f"{text!r} is not Great Expectations' condition grammar (one condition, nothing after it); "
                f"{_GRAMMAR_HINT}"]
    return _column_problems(match["column"])


def _scalar_ok(value: Any) -> bool:
    # The pandas engine writes the parameter into the query with repr(): only plain values read back as themselves.
    return isinstance(value, str | int) or (isinstance(value, float) and math.isfinite(value))


def _mapping_condition_problems(condition: Any, count: list[int]) -> list[Problem]:
    if not isinstance(condition, dict):
        return [((), f"must be a condition mapping, got {condition!r}")]
    kind = condition.get("type")
    if kind == "pass_through" or "pass_through_filter" in condition:
        return [((), f"a pass_through condition goes to DataFrame.query as text, which can run code; {_GRAMMAR_HINT}")]
    if kind not in _CONDITION_KEYS:
        return [(("type",) if "type" in condition else (), f"type must be one of {', '.join(_CONDITION_KEYS)}, "
                 f"got {kind!r}")]
    problems: list[Problem] = []
    keys = _CONDITION_KEYS[kind]
    problems += [((key,), f"unknown key in a {kind} condition; it takes {', '.join(sorted(keys))}")
                 for key in condition if key != "type" and key not in keys]
    problems += [((), f"a {kind} condition needs `{key}`; add it") for key in sorted(keys) if key not in condition]
    if kind in ("and", "or"):
        items = condition.get("conditions")
        if not isinstance(items, list) or not items:
            return [*problems, (("conditions",), f"must be a non-empty list of conditions, got {items!r}")]
        for index, item in enumerate(items):
            problems += [(("conditions", index, *path), message)
                         for path, message in _mapping_condition_problems(item, count)]
        return problems
    count[0] += 1
    column = condition.get("column")
    if "column" in condition:
        if not isinstance(column, dict) or set(column) != {"name"}:
            problems.append((("column",), f"must be a mapping {{name: <column>}}, got {column!r}"))
        else:
            problems += [(("column", "name"), message) for message in _column_problems(column["name"])]
    if kind == "nullity":
        if "is_null" in condition and not isinstance(condition["is_null"], bool):
            problems.append((("is_null",), f"must be true or false, got {condition['is_null']!r}"))
        return problems
    operator, parameter = condition.get("operator"), condition.get("parameter")
    if "operator" in condition and operator not in _OPERATORS:
        problems.append((("operator",), f"must be one of {', '.join(_OPERATORS)}, got {operator!r}"))
    if operator in ("IN", "NOT_IN"):
        if not isinstance(parameter, list) or not all(_scalar_ok(v) and not isinstance(v, bool) for v in parameter):
            problems.append((("parameter",), f"{operator} takes a list of strings or numbers, got {parameter!r}"))
    elif "parameter" in condition and not _scalar_ok(parameter):
        problems.append((("parameter",), f"must be a string, a finite number or true/false, got {parameter!r}"))
    return problems


def _schema_ref_problems(schema: Any, path: tuple[str | int, ...] = ()) -> list[Problem]:
    problems: list[Problem] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in _REF_KEYS and not (isinstance(value, str) and value.startswith("#")):
                problems.append(((*path, key), f"{value!r} refers to another document, which jsonschema would fetch "
                                 "(a request from the worker); refer only inside this schema (`#/$defs/...`)"))
            else:
                problems.extend(_schema_ref_problems(value, (*path, key)))
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            problems.extend(_schema_ref_problems(value, (*path, index)))
    return problems


# ---------------------------------------------------------------------------------------------
# pydantic v1's coercions, for the values YAML produces (None, bool, int, float, str, list, dict,
# date, datetime). Each mirrors the v1 validator named in its comment.

_BOOL_TRUE = {1, "1", "on", "t", "true", "y", "yes"}
_BOOL_FALSE = {0, "0", "off", "f", "false", "n", "no"}
_DATE = re.compile(r"(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})$")
_DATETIME = re.compile(
    r"(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})[T ](?P<hour>\d{1,2}):(?P<minute>\d{1,2})"
    r"(?::(?P<second>\d{1,2})(?:\.(?P<microsecond>\d{1,6})\d{0,6})?)?(?P<tzinfo>Z|[+-]\d{2}(?::?\d{2})?)?$"
)
_MAX_TIMESTAMP = 3e20  # pydantic.v1.datetime_parse.MAX_NUMBER: beyond it a number is datetime.max/min
_MS_WATERSHED = 2e10  # pydantic.v1.datetime_parse.MS_WATERSHED: above it, milliseconds (and so on)
_SEQUENCES = (list, tuple, set, frozenset)  # pydantic.v1.utils.sequence_like, for YAML's values


def _text(value: Any) -> Any:
    """Bytes (YAML !!binary) as text, as v1's validators decode them; anything else unchanged."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value


def _as_str(value: Any) -> str | None:  # str_validator
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return _text(value) if isinstance(value, bytes) else None


def _as_number(value: Any, integer: bool) -> float | None:  # int_validator, float_validator
    try:
        return int(value) if integer else float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _timestamp_ok(value: Any) -> bool | None:
    """get_numeric + from_unix_seconds: True/False for a number (or numeric string), None otherwise."""
    if isinstance(value, int | float):
        number = value
    else:
        try:
            number = float(value)
        except ValueError:
            return None
        except TypeError:
            return False
    if abs(number) > _MAX_TIMESTAMP:
        return True
    while abs(number) > _MS_WATERSHED:
        number /= 1000
    try:
        datetime(1970, 1, 1) + timedelta(seconds=number)  # nan raises, as in from_unix_seconds
    except (ValueError, OverflowError):
        return False
    return True


def _date_ok(value: Any) -> bool:  # parse_date
    if isinstance(value, date):
        return True
    numeric = _timestamp_ok(value)
    if numeric is not None:
        return numeric
    value = _text(value)
    match = _DATE.match(value) if isinstance(value, str) else None
    try:
        return match is not None and bool(date(**{k: int(v) for k, v in match.groupdict().items()}))
    except ValueError:
        return False


def _datetime_ok(value: Any) -> bool:  # parse_datetime
    if isinstance(value, datetime):
        return True
    numeric = _timestamp_ok(value)
    if numeric is not None:
        return numeric
    value = _text(value)
    match = _DATETIME.match(value) if isinstance(value, str) else None
    if match is None:
        return False
    parts = match.groupdict()
    zone, fraction = parts.pop("tzinfo"), parts.pop("microsecond")
    fields = {k: int(v) for k, v in parts.items() if v is not None}
    try:
        tz = None
        if zone and zone != "Z":
            minutes = int(zone[1:3]) * 60 + (int(zone[-2:]) if len(zone) > 3 else 0)
            tz = timezone(timedelta(minutes=minutes if zone[0] == "+" else -minutes))
        datetime(**fields, microsecond=int(fraction.ljust(6, "0")) if fraction else 0, tzinfo=tz)
    except ValueError:
        return False
    return True


def _in_bounds(number: float, kind: dict[str, Any]) -> bool:  # number_size_validator
    return all((
        "gt" not in kind or number > kind["gt"],
        "ge" not in kind or number >= kind["ge"],
        "lt" not in kind or number < kind["lt"],
        "le" not in kind or number <= kind["le"],
    ))


def _accepts(kind: dict[str, Any], value: Any) -> bool:
    """Whether pydantic v1 would accept ``value`` for one alternative of an argument's type."""
    match kind["kind"]:
        case "any":
            return True
        case "null":
            return value is None
        case "str":  # strict: strict_str_validator; else str_validator; then constr_length_validator
            text = value if isinstance(value, str) else None if kind.get("strict") else _as_str(value)
            return text is not None and kind.get("min_length", 0) <= len(text) <= kind.get("max_length", math.inf)
        case "int" | "float":
            number = _as_number(value, kind["kind"] == "int")
            return number is not None and _in_bounds(number, kind)
        case "bool":  # bool_validator
            if value is True or value is False:
                return True
            value = _text(value)
            try:
                return (value.lower() if isinstance(value, str) else value) in _BOOL_TRUE | _BOOL_FALSE
            except TypeError:
                return False
        case "dict" | "model":  # dict_validator; a model takes a mapping (its fields are GE's to check)
            try:
                dict(value)
            except (TypeError, ValueError):
                return False
            return True
        case "list":  # list_validator, then each item
            items = kind.get("items")
            return isinstance(value, _SEQUENCES) and (items is None or all(any(_accepts(k, v) for k in items) for v in value))
        case "set":  # set_validator: set(value) needs hashable items
            if not isinstance(value, _SEQUENCES):
                return False
            try:
                set(value)
            except TypeError:
                return False
            return True
        case "tuple":  # a fixed-length tuple: one type per position
            items = kind.get("items")
            if not isinstance(value, _SEQUENCES):
                return False
            if items is None:
                return True
            return len(value) == len(items) and all(
                any(_accepts(k, v) for k in alts) for alts, v in zip(items, value, strict=True))
        case "enum":  # Literal or Enum: one of the values
            return value in kind["values"]
        case "instance":
            return False
        case "date":
            return _date_ok(value)
        case "datetime":
            return _datetime_ok(value)
    raise ValueError(f"unknown argument kind {kind['kind']!r} in {TABLE_FILE.name}")


def _describe_one(kind: dict[str, Any]) -> str:
    match kind["kind"]:
        case "null":
            return "null"
        case "str":
            return "a non-empty string" if kind.get("min_length") == 1 and "max_length" not in kind else "a string"
        case "int" | "float":
            noun = "a whole number" if kind["kind"] == "int" else "a number"
            limits = [f"{symbol} {kind[key]:g}" for key, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
                      if key in kind]
            return f"{noun} {' and '.join(limits)}" if limits else noun
        case "bool":
            return "true or false"
        case "dict":
            return "a mapping"
        case "model":
            return f"a mapping ({kind['name']})"
        case "list" | "set":
            items = kind.get("items")
            return f"a list of {_plural(items)}" if items else "a list"
        case "tuple":
            return f"a list of {len(kind['items'])} values" if kind.get("items") else "a list"
        case "enum":
            return "one of " + ", ".join(repr(v) for v in kind["values"])
        case "instance":
            return f"a {kind['name']} object"
        case "date":
            return "a date"
        case "datetime":
            return "a date and time"
    return kind["kind"]


def _plural(items: list[dict[str, Any]]) -> str:
    names = {"str": "strings", "int": "whole numbers", "float": "numbers", "bool": "booleans", "dict": "mappings"}
    return " or ".join(dict.fromkeys(names.get(k["kind"], "values") for k in items if k["kind"] != "null"))


def _describe(kinds: list[dict[str, Any]]) -> str:
    # Plain values first, then mappings (mostly GE's {$PARAMETER: name} form), null last.
    order = {"dict": 1, "model": 1, "null": 2}
    words = list(dict.fromkeys(_describe_one(k) for k in sorted(kinds, key=lambda k: order.get(k["kind"], 0))))
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


# ---------------------------------------------------------------------------------------------
# the generator: GE's models -> the table (imports great_expectations; never at DAG parse)


def _kinds(tp: Any) -> list[dict[str, Any]]:
    """A field type of a GE expectation (pydantic v1) as a list of alternative kinds."""
    import enum
    import typing
    from collections import abc

    from pydantic.v1 import BaseModel as V1Model
    from pydantic.v1.types import ConstrainedFloat, ConstrainedInt, ConstrainedStr

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return [{"kind": "null"}]
    if tp is typing.Any:
        return [{"kind": "any"}]
    if origin is typing.Union:
        kinds = [kind for arg in args for kind in _kinds(arg)]
        return [kind for index, kind in enumerate(kinds) if kind not in kinds[:index]]
    if origin is typing.Annotated:
        constraints = [a for a in args[1:] if _has_constraints(a)]
        if constraints:
            raise NotImplementedError(f"constraints inside {tp!r}: teach trainpipe.spec.expectations to check them")
        return _kinds(args[0])
    if origin is typing.Literal:
        return [{"kind": "enum", "values": list(args)}]
    if origin in (list, abc.Sequence, set, frozenset) or tp in (list, set, frozenset, tuple):
        kind = "set" if (origin or tp) in (set, frozenset) else "list"
        return [{"kind": kind, **({"items": _kinds(args[0])} if args and args[0] is not typing.Any else {})}]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return [{"kind": "list", "items": _kinds(args[0])}]
        return [{"kind": "tuple", "items": [_kinds(arg) for arg in args]}]
    if origin is dict or tp is dict:
        if args and args != (str, typing.Any):
            raise NotImplementedError(f"typed mapping {tp!r}: teach trainpipe.spec.expectations to check it")
        return [{"kind": "dict"}]
    if isinstance(tp, type):
        if issubclass(tp, ConstrainedStr):
            if tp.regex or tp.strip_whitespace or tp.to_lower or tp.to_upper:
                raise NotImplementedError(f"string rule of {tp!r}: teach trainpipe.spec.expectations to check it")
            limits = {k: getattr(tp, k) for k in ("min_length", "max_length") if getattr(tp, k) is not None}
            return [{"kind": "str", **({"strict": True} if tp.strict else {}), **limits}]
        if issubclass(tp, ConstrainedFloat | ConstrainedInt):
            if tp.strict or tp.multiple_of is not None or getattr(tp, "allow_inf_nan", None) is False:
                raise NotImplementedError(f"number rule of {tp!r}: teach trainpipe.spec.expectations to check it")
            bounds = {k: getattr(tp, k) for k in ("gt", "ge", "lt", "le") if getattr(tp, k) is not None}
            return [{"kind": "float" if issubclass(tp, ConstrainedFloat) else "int", **bounds}]
        if issubclass(tp, enum.Enum):
            return [{"kind": "enum", "values": [member.value for member in tp]}]
        if issubclass(tp, V1Model):
            return [{"kind": "model", "name": tp.__name__}]
        if not tp.__module__.startswith("builtins") and not issubclass(tp, str | int | float | date):
            # An arbitrary class (pydantic's arbitrary_types_allowed): only an instance of it passes,
            # which no YAML value is.
            return [{"kind": "instance", "name": tp.__name__}]
        for python_type, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"),
                                  (datetime, "datetime"), (date, "date")):
            if tp is python_type:
                return [{"kind": name}]
    raise NotImplementedError(f"argument type {tp!r}: teach trainpipe.spec.expectations to check it")


def _has_constraints(annotation: Any) -> bool:
    from pydantic.v1.fields import FieldInfo

    if not isinstance(annotation, FieldInfo):
        return False
    keys = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "min_items", "max_items", "regex")
    return any(getattr(annotation, key, None) is not None for key in keys)


def _sample(kinds: list[dict[str, Any]], n: int = 0) -> Any:
    """A value the kinds accept (the ``n``-th such, for list items), preferring plain values over
    mappings (GE's suite parameters)."""
    ordered = sorted(kinds, key=lambda k: k["kind"] in ("null", "dict", "model", "any", "instance"))
    kind = ordered[0]
    match kind["kind"]:
        case "str":
            return "abcdefgh"[n] * max(1, kind.get("min_length", 1))
        case "int" | "float":
            low = kind.get("ge", kind.get("gt", 0) + (1 if "gt" in kind else 0)) + n
            return int(low) if kind["kind"] == "int" else float(low)
        case "bool":
            return True
        case "list" | "set":  # two distinct items: some expectations need at least two columns
            return [_sample(kind["items"], i) for i in range(2)] if kind.get("items") else ["a", "b"]
        case "tuple":
            return [_sample(alts, i) for i, alts in enumerate(kind.get("items") or [[{"kind": "str"}]])]
        case "enum":
            return kind["values"][0]
        case "date":
            return date(2024, 1, 1 + n)
        case "datetime":
            return datetime(2024, 1, 1 + n, 12, 0)
        case "null":
            return None
    return {}


def _errors(cls: Any, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """GE's own validation errors for ``cls(**kwargs)`` (empty when it builds)."""
    import warnings

    from pydantic import ValidationError as V2ValidationError
    from pydantic.v1 import ValidationError as V1ValidationError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # condition_parser is deprecated; building it warns
        try:
            cls(**kwargs)
        except (V1ValidationError, V2ValidationError) as error:
            return [dict(e) for e in error.errors()]
    return []


def _type_name(kinds: list[dict[str, Any]]) -> str:
    """A readable key for a list of kinds, e.g. ``float(ge=0.0,le=1.0)|dict``: the table names each
    distinct argument type once, so a GE upgrade's diff reads as type changes."""
    def one(kind: dict[str, Any]) -> str:
        name = kind["kind"]
        if name in ("model", "instance"):
            return f"{name}:{kind['name']}"
        if name == "enum":
            return f"enum({','.join(json.dumps(v) for v in kind['values'])})"
        if name == "tuple" and kind.get("items"):
            return f"tuple[{','.join(_type_name(alts) for alts in kind['items'])}]"
        if name in ("list", "set") and kind.get("items"):
            return f"{name}[{_type_name(kind['items'])}]"
        options = [k if v is True else f"{k}={v}" for k, v in sorted(kind.items()) if k != "kind"]
        return f"{name}({','.join(options)})" if options else name
    return "|".join(one(kind) for kind in kinds)


def _entry(cls: Any, types: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    arguments: dict[str, str] = {}
    kinds_of: dict[str, list[dict[str, Any]]] = {}
    for name, field in cls.__fields__.items():
        kinds = _kinds(field.outer_type_)
        if field.allow_none and {"kind": "null"} not in kinds:
            kinds.append({"kind": "null"})
        kinds_of[name] = kinds
        arguments[name] = _type_name(kinds)
        types[arguments[name]] = kinds
    required = {name: _sample(kinds_of[name]) for name, field in cls.__fields__.items() if field.required}
    errors = _errors(cls, required)
    if errors and not all(error["loc"] == ("__root__",) for error in errors):
        raise NotImplementedError(f"{cls.__name__} refuses sample arguments {required}: {errors}")
    # A cross-argument rule (a root validator) refuses the required arguments alone: find which
    # optional arguments, each on its own, satisfy it. That is an "at least one of" group.
    one_of = []
    if errors:
        group = [name for name, kinds in kinds_of.items()
                 if name not in required and not _errors(cls, {**required, name: _sample(kinds)})]
        if not group:
            raise NotImplementedError(f"{cls.__name__}: no single argument satisfies {errors}")
        one_of.append(group)
    return {"arguments": arguments, "required": sorted(required), "one_of": one_of}


def generate_table(classes: dict[str, type]) -> dict[str, Any]:
    """The table from the installed Great Expectations' expectation ``classes`` by snake_case name
    (``trainpipe.steps.validate.quality`` finds them; passed in, so the spec stage never imports the run-time module)."""
    from importlib.metadata import version

    types: dict[str, list[dict[str, Any]]] = {}
    expectations = {name: _entry(classes[name], types) for name in sorted(classes)}
    return {
        "great_expectations": version("great_expectations"),
        "generated_by": "python tools/gen_expectation_table.py",
        "expectations": expectations,
        "types": types,
    }


def render_table(table: dict[str, Any]) -> str:
    """One argument per line; each type's kinds on one line."""
    types = {name: json.dumps(kinds, sort_keys=True, default=str) for name, kinds in table["types"].items()}
    text = json.dumps({**table, "types": {name: f"@{name}@" for name in types}}, indent=1, sort_keys=True)
    for name, kinds in types.items():
        text = text.replace(json.dumps(f"@{name}@"), kinds, 1)
    return text + "\n"
