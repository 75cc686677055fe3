"""The base of every spec model: unknown keys refused, frozen, and no infinite or NaN number (YAML's
``.inf`` and ``.nan`` would pass every bound check and fail later, far from the line)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)
