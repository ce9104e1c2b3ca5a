"""Published runs of a model family other than the transformer, and the interval they widen.

:func:`interval` is the union of the profile's 80% interval and the family's own held-out
residuals (``data/family_validation.json``); :mod:`simulator.validation.family_validation` re-predicts them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from pydantic import Field

from ..core.strict import StrictModel
from ..hardware.rates import _fit, _raw, fitted_group
from . import uncertainty


class FamilyRun(StrictModel):
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
        """The run's settings as :func:`simulator.answer.api.simulate` pins (one GPU, eager, no
        checkpointing or offload, AdamW, one optimizer step per batch)."""
        return dict(precision="bf16", compile=False, micro_batch=self.batch, global_batch=self.batch,
                    seq_len=self.seq_len, steps=1, optimizer="adamw", sharding="ddp",
                    checkpointing="none", offload="none")


class FamilyValidation(StrictModel):
    """A family's published runs: the model they trained, the stack, the source and the runs."""

    family: str
    model: dict  # spec fields, as :func:`simulator.model.families.spec_from_dict` reads them
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


@lru_cache(maxsize=1)
def load() -> dict[str, FamilyValidation]:
    """Family name -> its published runs, from ``data/family_validation.json``."""
    out = {}
    for entry in _raw()["families"]:
        v = FamilyValidation.model_validate(entry)
        out[v.family] = v
    return out


def clear_cache() -> None:
    for f in (_raw, load, _fit):
        f.cache_clear()


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
