"""Prediction intervals from a profile's validation residuals."""

from __future__ import annotations

import math

import numpy as np

#: coverage of the intervals every answer prints (and `validate` checks draws against)
LEVEL = 0.8


def bounds(log_residuals, level: float = LEVEL, widen: float = 1.0) -> tuple[float, float]:
    """(low, high) quantiles of log(measured/predicted time) residuals at ``level`` coverage, the
    spread about their median multiplied by ``widen`` (>1 where the residuals are borrowed from
    another GPU); the interval always contains the point estimate (0)."""
    r = np.asarray(log_residuals, dtype=float)
    med = float(np.median(r))
    r = med + widen * (r - med)
    lo, hi = np.quantile(r, [(1 - level) / 2, 1 - (1 - level) / 2])
    return min(float(lo), 0.0), max(float(hi), 0.0)


def interval(days: float, validation, level: float = LEVEL) -> tuple[float, float] | None:
    """(low, high) days at ``level`` coverage from log(measured/predicted time) residuals.

    The residual quantiles scale the point estimate: a profile whose validation found real
    runs 10-30% slower than predicted widens the interval upward. None without residuals.
    """
    if validation is None or len(validation.log_ratio_residuals) < 3 or not math.isfinite(days):
        return None
    lo, hi = bounds(validation.log_ratio_residuals, level, getattr(validation, "widen", 1.0))
    return days * math.exp(lo), days * math.exp(hi)
