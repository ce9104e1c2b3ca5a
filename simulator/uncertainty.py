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


def left_out_coverage(groups, level: float = LEVEL) -> list[float | None]:
    """Per group of log(measured/predicted time) residuals, the share of them inside the ``level``
    interval (:func:`bounds`) built from all the other groups' residuals: whether an interval
    covers, as it claims, cases it was not built from (groups of one run: leave one run out; one
    measurement of a suite each: leave one draw of the host out). None for an empty group or one
    whose others hold fewer than 3 residuals."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    out: list[float | None] = []
    for i, own in enumerate(arrays):
        others = np.concatenate([a for j, a in enumerate(arrays) if j != i] or [np.empty(0)])
        if not own.size or others.size < 3:
            out.append(None)
            continue
        lo, hi = bounds(others, level)
        out.append(float(np.mean((own >= lo) & (own <= hi))))
    return out


def interval(days: float, validation, level: float = LEVEL) -> tuple[float, float] | None:
    """(low, high) days at ``level`` coverage from log(measured/predicted time) residuals.

    The residual quantiles scale the point estimate: a profile whose validation found real
    runs 10-30% slower than predicted widens the interval upward. None without residuals.
    """
    if validation is None or len(validation.log_ratio_residuals) < 3 or not math.isfinite(days):
        return None
    lo, hi = bounds(validation.log_ratio_residuals, level, getattr(validation, "widen", 1.0))
    return days * math.exp(lo), days * math.exp(hi)
