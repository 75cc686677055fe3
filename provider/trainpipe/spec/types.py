"""Value types shared by the spec models (friendly YAML forms normalised early)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, WithJsonSchema

_DURATION_PART = re.compile(r"(\d+)\s*([smhdw])")
_DURATION_FULL = re.compile(r"^\s*(\d+\s*[smhdw]\s*)+$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Longer than any sensible window, timeout or delay, and far below what timedelta and Airflow's date
# arithmetic can hold (a retry_delay of 10**20 s would overflow when the retry is scheduled).
MAX_DURATION_SECONDS = 3650 * 86400


def parse_duration(value: Any) -> Any:
    """``"30d"``, ``"1h30m"``, ``"20m"`` or whole seconds -> ``timedelta``."""
    if isinstance(value, timedelta) or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"a duration must be positive, got {value}")
        return _bounded(value, value)
    if isinstance(value, str) and _DURATION_FULL.fullmatch(value):
        seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(value))
        if seconds <= 0:
            raise ValueError(f"a duration must be positive, got {value!r}")
        return _bounded(seconds, value)
    raise ValueError(f"expected a duration such as '30d', '20m', '1h30m' or whole seconds, got {value!r}")


def _bounded(seconds: int, value: Any) -> timedelta:
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"a duration must be at most 3650d (10 years), got {value!r}")
    return timedelta(seconds=seconds)


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*(\d+\s*[smhdw]\s*)+$"},
                {"type": "integer", "exclusiveMinimum": 0},
            ],
            "description": "A duration: '30d', '20m', '1h30m' (s, m, h, d, w) or whole seconds.",
        }
    ),
]


# Where the trainer runs: the local launcher (torchrun on this worker) or Kubernetes (a Pod or an Indexed Job).
Launcher = Literal["local", "kubernetes"]
