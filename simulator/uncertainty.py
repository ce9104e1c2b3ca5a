"""Prediction intervals from a profile's validation residuals."""

from __future__ import annotations

import math

import numpy as np


def interval(days: float, validation, level: float = 0.8) -> tuple[float, float] | None:
    """(low, high) days at ``level`` coverage from log(measured/predicted time) residuals.

    The residual quantiles scale the point estimate: a profile whose validation found real
    runs 10-30% slower than predicted widens the interval upward. None without residuals.
    """
    if validation is None or len(validation.log_ratio_residuals) < 3 or not math.isfinite(days):
        return None
    r = np.asarray(validation.log_ratio_residuals, dtype=float)
    lo, hi = np.quantile(r, [(1 - level) / 2, 1 - (1 - level) / 2])
    return days * math.exp(min(lo, 0.0)), days * math.exp(max(hi, 0.0))
