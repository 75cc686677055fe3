"""A run parameter's bound, as the plan carries it: plain data, no pydantic, so that a plan (and a DAG
holding one) unpickled from the plan cache does not import the spec models (ADR 0012)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

BoundKeyword = Literal["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"]


@dataclass(frozen=True, slots=True)
class ParamBound:
    """One JSON Schema bound of a run parameter, and where it comes from."""

    keyword: BoundKeyword
    value: float
    # "params.<name>.minimum"/"maximum" when the spec declared it, else the hyperparameter's own
    # field (e.g. "training.epochs"), whose constraint a run's value must meet as well.
    source: str

    def admits(self, value: float) -> bool:
        return {
            "minimum": value >= self.value,
            "exclusiveMinimum": value > self.value,
            "maximum": value <= self.value,
            "exclusiveMaximum": value < self.value,
        }[self.keyword]

    def describe(self) -> str:
        symbol = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[self.keyword]
        # Whole bounds in full (4194304, not 4.1943e+06): the number a user can copy into the spec.
        exact = isinstance(self.value, int) or (float(self.value).is_integer() and abs(self.value) < 1e15)
        shown = str(int(self.value)) if exact else f"{self.value:g}"
        return f"{symbol} {shown}"
