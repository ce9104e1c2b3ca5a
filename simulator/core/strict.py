"""The pydantic base class of every validated file and catalog entry."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """A pydantic model that refuses unknown fields and non-finite numbers (NaN, inf) in any
    float field, list or map. Subclass with ``frozen=True`` for immutable (hashable) entries."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _all_finite(self):  # reject NaN / inf anywhere in numeric fields, lists and maps included
        for name, value in self:
            items = (value.values() if isinstance(value, dict) else value
                     if isinstance(value, (list, tuple)) else [value])
            for v in items:
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"{name} must be finite, got {v}")
        return self
