"""The base of every spec model: unknown keys refused, frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
