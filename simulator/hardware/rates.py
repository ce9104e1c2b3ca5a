"""Device rates fitted on published runs rather than measured by microbenchmarks.

``fp32_atomic_rate`` (mamba-ssm's scan backward: fp32 atomicAdds into dB and dC), one value per
GPU group, fitted by ``python -m calibration.family_fit`` into ``data/family_validation.json``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path

from pydantic import Field

from ..core.strict import StrictModel

DATA = "data/family_validation.json"


class GroupRate(StrictModel):
    """One GPU group's fitted rate and the catalog GPUs it applies to (same chip)."""

    value: float = Field(gt=0)  # 1e9 fp32 atomic adds per second
    gpus: list[str]
    runs: int = Field(ge=0)


class AtomicFit(StrictModel):
    """``fp32_atomic_rate`` fitted on the families' published runs, one value per GPU group."""

    parameter: str = "fp32_atomic_rate"
    unit: str = "1e9 fp32 atomicAdds into global memory per second, sustained under contention"
    bounds: tuple[float, float]
    groups: dict[str, GroupRate]
    fallback: str
    mape_in_sample: float
    mape_loo: float
    mape_cross_gpu: float


def _path() -> Path:
    return Path(str(resources.files("simulator").joinpath(DATA)))


@lru_cache(maxsize=1)
def _raw() -> dict:
    return json.loads(_path().read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _fit() -> AtomicFit | None:
    raw = _raw().get("atomic_fit")
    return AtomicFit.model_validate(raw) if raw else None


def fitted_group(gpu_id: str | None) -> str | None:
    """The GPU group whose fitted ``fp32_atomic_rate`` applies to ``gpu_id``, or None."""
    fit = _fit()
    if fit is None or gpu_id is None:
        return None
    return next((g for g, r in fit.groups.items() if gpu_id in r.gpus), None)


def atomic_rate(profile) -> float:
    """Sustained fp32 atomicAdd rate (1e9 adds/s) of the profile's GPU: the profile's own
    ``fp32_atomic_rate`` (``calibrate --from-runs``), else the family fit's value for its GPU
    group, else (ASSUMPTION, no data for this chip) the lowest fitted value, the slower answer;
    infinite (no time) before any fit exists."""
    if profile.fp32_atomic_rate is not None:
        return float(profile.fp32_atomic_rate)
    fit = _fit()
    if fit is None or not fit.groups:
        return math.inf
    g = fitted_group(profile.device.gpu_id)
    return fit.groups[g].value if g is not None else min(r.value for r in fit.groups.values())
