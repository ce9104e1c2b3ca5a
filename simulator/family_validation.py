"""Published training runs of a model family other than the transformer, their residuals, and
the GPU parameters fitted on them.

The profiles' intervals come from transformer runs (``Profile.validation``). A family with
published runs of its own (Mamba: fla-org/flash-linear-attention#32) widens its predictions'
interval with its own held-out residuals: :func:`interval` is the union of the profile's 80%
interval and the family's, so the headline is never more optimistic than the family's own
validation.

``data/family_validation.json`` holds, per family, the measured runs (typed in from their source,
settings the source does not state labelled INFERRED in ``note``), and, written only by the
command below, the fitted ``fp32_atomic_rate`` per GPU group (mamba-ssm's scan backward: fp32
atomicAdds into dB and dC; fitted with ``calibrate --from-runs``'s bounded least squares) and the
predictions and held-out residuals::

    python -m calibration.family_fit

A test re-predicts every run and fails when the stored predictions no longer match the physics.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import Field

from . import uncertainty
from .profile import _Strict

DATA = "data/family_validation.json"


class FamilyRun(_Strict):
    """One published run: its settings, measured tokens/s and the derived prediction."""

    gpu: str
    batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    measured_tokens_per_s: float = Field(gt=0)
    predicted_tokens_per_s: float | None = Field(default=None, gt=0)  # written by this module
    #: log(measured / predicted time) = log(predicted / measured tokens/s) with the rate fitted on
    #: the other runs of its GPU group (leave one run out): the residuals of a GPU with a fitted rate
    log_ratio: float | None = None
    #: the same with the rate fitted on the other GPU group's runs only (leave one GPU group out):
    #: the residuals of a GPU whose rate is the fallback (:func:`atomic_rate`)
    log_ratio_cross_gpu: float | None = None
    log_ratio_in_sample: float | None = None

    def knobs(self) -> dict:
        """The run's settings as :func:`simulator.api.simulate` pins (one GPU, eager, no
        checkpointing or offload, AdamW, one optimizer step per batch)."""
        return dict(precision="bf16", compile=False, micro_batch=self.batch, global_batch=self.batch,
                    seq_len=self.seq_len, steps=1, optimizer="adamw", sharding="ddp",
                    checkpointing="none", offload="none")


class FamilyValidation(_Strict):
    """A family's published runs: the model they trained, the stack, the source and the runs."""

    family: str
    model: dict  # spec fields, as :func:`simulator.families.spec_from_dict` reads them
    stack: str
    source: str
    note: str
    command: str = "python -m calibration.family_fit"
    date: str | None = None
    runs: list[FamilyRun]

    def residuals(self, cross_gpu: bool = False) -> list[float]:
        """Held-out log(measured / predicted time): leave one run out, or (``cross_gpu``) leave the
        run's GPU group out."""
        vals = [r.log_ratio_cross_gpu if cross_gpu else r.log_ratio for r in self.runs]
        return [v for v in vals if v is not None]

    @property
    def log_ratio_residuals(self) -> list[float]:
        return self.residuals()

    def text(self, cross_gpu: bool = False) -> str:
        """'7 published mamba runs (held out: real runs 0.9-1.2x ... than predicted): source'."""
        ratios = np.exp(self.residuals(cross_gpu))
        lo, hi = float(ratios.min()), float(ratios.max())

        def word(x):
            return f"{x:.1f}x slower" if x >= 1 else f"{1 / x:.1f}x faster"

        span = word(lo) if abs(hi - lo) < 0.05 else (
            f"{lo:.1f}–{hi:.1f}x slower" if lo >= 1 else f"{word(lo)} to {word(hi)}")
        how = ", each predicted with the other GPU's fitted rate" if cross_gpu else ", each held out of the fit"
        return (f"{len(ratios)} published {self.family} runs{how if _fit() else ''} (real runs {span} than "
                f"predicted): {self.source}")


class GroupRate(_Strict):
    """One GPU group's fitted rate and the catalog GPUs it applies to (same chip)."""

    value: float = Field(gt=0)  # 1e9 fp32 atomic adds per second
    gpus: list[str]
    runs: int = Field(ge=0)


class AtomicFit(_Strict):
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
def load() -> dict[str, FamilyValidation]:
    """Family name -> its published runs, from ``data/family_validation.json``."""
    out = {}
    for entry in _raw()["families"]:
        v = FamilyValidation.model_validate(entry)
        out[v.family] = v
    return out


@lru_cache(maxsize=1)
def _fit() -> AtomicFit | None:
    raw = _raw().get("atomic_fit")
    return AtomicFit.model_validate(raw) if raw else None


def clear_cache() -> None:
    for f in (_raw, load, _fit):
        f.cache_clear()


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


def for_family(family: str) -> FamilyValidation | None:
    """The family's published runs with residuals (at least 3), or None."""
    v = load().get(family)
    return v if v is not None and len(v.log_ratio_residuals) >= 3 else None


def interval(days: float, profile_validation, family: str, gpu_id: str | None = None, level: float = uncertainty.LEVEL
             ) -> tuple[tuple[float, float] | None, str | None]:
    """((low, high) days, where it came from) at ``level`` coverage: the profile's interval,
    widened to include the family's own held-out residuals where it has any (leave one run out
    on a GPU with a fitted rate; leave the GPU group out on any other GPU)."""
    iv = uncertainty.interval(days, profile_validation, level)
    fam = for_family(family)
    if fam is None or not math.isfinite(days):
        return iv, None
    cross = _fit() is not None and fitted_group(gpu_id) is None
    res = fam.residuals(cross) or fam.residuals()
    lo, hi = uncertainty.bounds(res, level)
    lo, hi = days * math.exp(lo), days * math.exp(hi)
    if iv is not None:
        lo, hi = min(lo, iv[0]), max(hi, iv[1])
    return (lo, hi), fam.text(cross)


def predict(v: FamilyValidation, run: FamilyRun) -> float:
    """Predicted tokens/s of one published run under its stated settings (default profile)."""
    from .api import simulate
    from .families import spec_from_dict

    return float(simulate(spec_from_dict(v.model), f"1x{run.gpu}", stack=v.stack, **run.knobs()).tokens_per_s)
