"""Published training runs of a model family other than the transformer, and their residuals.

The profiles' intervals come from transformer runs (``Profile.validation``). A family with
published runs of its own (Mamba: fla-org/flash-linear-attention#32) widens its predictions'
interval with its own residuals: :func:`interval` is the union of the profile's 80% interval and
the family's, so the headline is never more optimistic than the family's own validation.

``data/family_validation.json`` holds, per family, the measured runs (typed in from their source,
settings the source does not state labelled INFERRED in ``note``) and the predictions and residuals
derived from them, which only this command writes::

    python -m simulator.family_validation

A test re-predicts every run and fails when the stored predictions no longer match the physics.
"""

from __future__ import annotations

import argparse
import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from pydantic import Field

from . import uncertainty
from .atomic import write_atomic
from .profile import _Strict

DATA = "data/family_validation.json"


class FamilyRun(_Strict):
    """One published run: its settings, measured tokens/s and the derived prediction."""

    gpu: str
    batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    measured_tokens_per_s: float = Field(gt=0)
    predicted_tokens_per_s: float | None = Field(default=None, gt=0)  # written by this module
    #: log(measured / predicted time) = log(predicted / measured tokens/s), held out from any fit
    #: on these runs (leave one run out) where one was made
    log_ratio: float | None = None

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
    command: str = "python -m simulator.family_validation"
    date: str | None = None
    runs: list[FamilyRun]

    @property
    def log_ratio_residuals(self) -> list[float]:
        return [r.log_ratio for r in self.runs if r.log_ratio is not None]

    def text(self) -> str:
        """'7 published mamba runs (real runs 1.6-3.1x slower than predicted): source'."""
        ratios = np.exp(self.log_ratio_residuals)
        lo, hi = float(ratios.min()), float(ratios.max())

        def word(x):
            return f"{x:.1f}x slower" if x >= 1 else f"{1 / x:.1f}x faster"

        span = word(lo) if abs(hi - lo) < 0.05 else (
            f"{lo:.1f}–{hi:.1f}x slower" if lo >= 1 else f"{word(lo)} to {word(hi)}")
        return f"{len(ratios)} published {self.family} runs (real runs {span} than predicted): {self.source}"


def _path() -> Path:
    return Path(str(resources.files("simulator").joinpath(DATA)))


@lru_cache(maxsize=1)
def load() -> dict[str, FamilyValidation]:
    """Family name -> its published runs, from ``data/family_validation.json``."""
    raw = json.loads(_path().read_text(encoding="utf-8"))
    out = {}
    for entry in raw["families"]:
        v = FamilyValidation.model_validate(entry)
        out[v.family] = v
    return out


def for_family(family: str) -> FamilyValidation | None:
    """The family's published runs with residuals (at least 3), or None."""
    v = load().get(family)
    return v if v is not None and len(v.log_ratio_residuals) >= 3 else None


def interval(days: float, profile_validation, family: str, level: float = 0.8
             ) -> tuple[tuple[float, float] | None, str | None]:
    """((low, high) days, where it came from) at ``level`` coverage: the profile's interval,
    widened to include the family's own published residuals where it has any."""
    iv = uncertainty.interval(days, profile_validation, level)
    fam = for_family(family)
    if fam is None or not math.isfinite(days):
        return iv, None
    lo, hi = uncertainty.bounds(fam.log_ratio_residuals, level)
    lo, hi = days * math.exp(lo), days * math.exp(hi)
    if iv is not None:
        lo, hi = min(lo, iv[0]), max(hi, iv[1])
    return (lo, hi), fam.text()


def predict(v: FamilyValidation, run: FamilyRun, profile=None) -> float:
    """Predicted tokens/s of one published run under its stated settings."""
    from .api import simulate
    from .families import spec_from_dict

    knobs = run.knobs()
    if profile is not None:
        knobs["profile"] = profile
    return float(simulate(spec_from_dict(v.model), f"1x{run.gpu}", stack=v.stack, **knobs).tokens_per_s)


def rebuild(path: Path | None = None, date: str | None = None) -> dict[str, FamilyValidation]:
    """Re-predict every stored run and write predictions and residuals back (atomically)."""
    import datetime

    path = path or _path()
    raw = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for entry in raw["families"]:
        v = FamilyValidation.model_validate(entry)
        runs = []
        for r in v.runs:
            pred = predict(v, r)
            runs.append(r.model_copy(update={"predicted_tokens_per_s": pred,
                                             "log_ratio": math.log(pred / r.measured_tokens_per_s)}))
        out.append(v.model_copy(update={"runs": runs,
                                        "date": date or datetime.date.today().isoformat()}))
    text = json.dumps({"families": [v.model_dump() for v in out]}, indent=1) + "\n"
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    load.cache_clear()
    return {v.family: v for v in out}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m simulator.family_validation",
                                 description="Re-predict the families' published runs and store the residuals.")
    ap.parse_args(argv)
    for v in rebuild().values():
        print(v.text())
        for r in v.runs:
            print(f"  {r.gpu} batch {r.batch} seq {r.seq_len}: measured {r.measured_tokens_per_s:,.0f}, "
                  f"predicted {r.predicted_tokens_per_s:,.0f} tok/s ({math.exp(r.log_ratio) - 1:+.0%})")


if __name__ == "__main__":
    main()
