"""Prediction intervals from a profile's validation residuals."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.errors import UsageError
from ..hardware import catalog as hardware
from ..strategy.stacks import for_published
from .plan import format_days

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


# --- which residuals match the user's situation ---------------------------------------------

#: The highest model FLOPs utilization (this simulator's convention: Plan.mfu) any bundled published
#: run reached: karpathy/llm.c GPT-2 774M (d36) on 8 x A100 80GB SXM, published_runs_more.csv:63
#: (measured tokens/s x model FLOPs per token / dense bf16 peak). DESIGN: real large-model training
#: reaches roughly 35-65% MFU on A100/H100. tests/test_uncertainty.py recomputes it from the runs.
MFU_CEILING = 0.607
MFU_CEILING_RUN = "llm.c's GPT-2 774M on 8 × A100"


def plausible_low(days: float, min_days: float) -> float:
    """The fewest days an interval's low end may show: ``min_days`` (the floor at 100% of peak,
    overheads included) at the best MFU any published run reached (:data:`MFU_CEILING`), but never
    above the point estimate ``days`` (which :func:`mfu_warning` flags instead)."""
    return min(days, min_days / MFU_CEILING)


def mfu_warning(mfu: float, days: float, min_days: float) -> str | None:
    """A note when the predicted MFU is above what any published run reached; None otherwise."""
    if not (math.isfinite(mfu) and mfu > MFU_CEILING):
        return None
    return (f"the estimate assumes MFU {mfu:.0%}, above the best any published run in our data reached "
            f"({MFU_CEILING:.0%}, {MFU_CEILING_RUN}); treat {_days(days)} days as optimistic: at "
            f"{MFU_CEILING:.0%} MFU the run takes {_days(min_days / MFU_CEILING)} days")


#: Share of a step the GPUs spend waiting for the host's kernel dispatch beyond which a plan is called
#: host-bound (:func:`host_bound_note`), and measured over predicted step time there: the median and the
#: 90th percentile over the 500 of vTrain's 1,440 measured small-GPT iterations on one A100 node
#: (VIA-Research/vTrain data/ground_truth_single.csv, a local copy: bench/vtrain_dev_check.py) whose
#: predicted wait is at least that share (1.06 at the median below it; docs/small_model_runs.md,
#: 2026-12-08). The host time per kernel is measured on one host only, so where it dominates the
#: prediction is as good as that figure: the interval's high end is held at the 90th percentile.
HOST_BOUND_SHARE = 0.10
HOST_BOUND_SLOW = 1.21
HOST_BOUND_SLOW_P90 = 1.74


def host_bound_note(host_wait_s: float, step_s: float, days: float) -> str | None:
    """A note when the GPUs wait for the host's kernel dispatch for more than
    :data:`HOST_BOUND_SHARE` of the step (``host_wait_s`` of ``step_s`` seconds: small models,
    eager dispatch, small micro-batches); None otherwise."""
    if not (step_s > 0 and host_wait_s > HOST_BOUND_SHARE * step_s):
        return None
    return (f"host-bound: the GPUs wait for the host's kernel dispatch {host_wait_s / step_s:.0%} of each step, "
            f"and host time per kernel is measured on one host only (eager PyTorch on the H200 node); on the "
            f"small-model runs we check against, this regime ran {HOST_BOUND_SLOW - 1:.0%} slower than predicted "
            f"at the median (docs/small_model_runs.md): treat {_days(days)} days as optimistic, or raise the "
            "micro-batch (or compile) to leave the regime")


def _days(d: float) -> str:
    return format_days(d)


@dataclass(frozen=True)
class Residuals:
    """The log(measured/predicted time) residuals an interval is built from, and where they come
    from in plain words (:func:`for_profile`)."""

    log_ratio_residuals: list[float]
    widen: float  # spread multiplier (>1: no run on this chip itself)
    words: str  # 'published training runs of ... each predicted by a fit that had not seen ...'

    @property
    def n(self) -> int:
        return len(self.log_ratio_residuals)


def _project(source: str) -> str:
    """'mosaicml/llm-foundry (H100 table)' -> 'llm-foundry': a project's name without its owner."""
    # the published runs need pandas: imported here, not at start-up (simulate --help, usage errors)
    from .runs import source_key

    return source_key(source).split("/")[-1]


def _listing(names) -> str:
    """'a', 'a and b', 'a, b and c'."""
    names = list(dict.fromkeys(names))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@lru_cache(maxsize=1)
def _dev_runs() -> dict[str, tuple[str, str | None, str]]:
    """Bundled published dev runs (simulable): run id -> (project, stack preset that claims the
    run's software or None, GPU id). A run whose software no preset claims (llm.c, simulated with
    the default stack) has None: it does not make the default stack a fitted one."""
    from .runs import default_runs, simulable  # pandas, imported here: see _project

    out = {}
    for _, r in simulable(default_runs()).iterrows():
        try:
            stack = for_published(str(r["stack"])).name
        except UsageError:
            stack = None
        out[str(r["run"])] = (_project(r["source"]), stack, str(r["gpu"]))
    return out


def heldout_pool():
    """(residuals, projects, GPU ids) of every bundled dev run predicted by a fit that had not
    seen its source (leave one source out), as the catalog profiles of GPUs without runs of their
    own hold them (``python -m calibration.from_runs rebuild-defaults``); None when the catalog
    holds no such profile. Projects and GPUs are None when the runs no longer match the stored
    residuals (the catalog was built from other runs)."""
    for g in hardware.list_gpus():
        try:
            prof = hardware.default_profile(g)
        except UsageError:  # a user's catalog GPU without a default profile
            continue
        v = prof.validation
        if prof.fit is None and v is not None and v.widen > 1.0 and len(v.log_ratio_residuals) >= 3:
            runs = list(_dev_runs().values())
            if len(runs) != len(v.log_ratio_residuals):
                return list(v.log_ratio_residuals), None, None
            return list(v.log_ratio_residuals), [r[0] for r in runs], [r[2] for r in runs]
    return None


def _chip(gpu_ids) -> str:
    """'A100 and H100' from catalog GPU ids."""
    return _listing(sorted({g.split("-")[0].upper() for g in gpu_ids}))


#: Spread multiplier of the leave-one-source-out residuals where they stand for software the fit
#: has not seen. Each of those residuals comes from a fit that saw the other sources, and a new
#: software stack brings its own bias: the pool's 80% interval, built without a source, covers 79% of
#: that source's runs at 1.0 (per source: llm-foundry 85%, llm.c 75%, flash-attention 62%,
#: Megatron-LM 62%), 86% at 1.1 (90%, 100%, 75%, 62%) and 92% at 1.25 (2026-12-05, once llm.c's
#: cuDNN attention made its H100 run agree with llm-foundry's: leave-one-source-out 16.5% -> 10.3%;
#: 1.25 had covered 74% before). ASSUMPTION: a judgement, held to 70-90% held-out coverage by
#: tests/test_uncertainty.py.
UNSEEN_STACK_WIDEN = 1.1


def _widen_words(chip_widen: float, stack_widen: float, gpu: str) -> str:
    """'; the range is N times as wide as their spread: ...' (empty without a multiplier)."""
    why = (["your software was not among the fitted runs"] if stack_widen > 1.0 else []) + (
        [f"no training run on {gpu} itself was available"] if chip_widen > 1.0 else [])
    if not why:
        return ""
    return f"; the range is {chip_widen * stack_widen:.3g} times their spread, as {' and '.join(why)}"


def for_profile(profile, stack, gpu: str) -> Residuals | None:
    """The residuals that match the user's situation (DESIGN, Trust): a fitted profile's
    leave-one-run-out residuals only where the user's software ``stack`` is among the fitted
    runs' stacks; else every published run's leave-one-source-out residuals (an unseen stack),
    their spread times :data:`UNSEEN_STACK_WIDEN` and the profile's own multiplier (a carried-over
    fit). Profiles without a fit: a catalog GPU without runs holds the same leave-one-source-out
    pool, widened for the chip (and here for the unseen stack too); a calibrated machine keeps
    its own measured steps. ``stack``: a :class:`simulator.strategy.stacks.Stack`; ``gpu``: the chip's
    name, for the words. None without residuals."""
    v = profile.validation
    if v is None or len(v.log_ratio_residuals) < 3:
        return None
    fit = profile.fit
    dev = _dev_runs()
    pool = heldout_pool()
    if fit is not None and fit.runs and all(r in dev for r in fit.runs):
        fitted = [dev[r] for r in fit.runs]
        if stack.name in {s for _, s, _ in fitted if s is not None} or pool is None:
            return Residuals(list(v.log_ratio_residuals), v.widen,
                             f"training runs published with {_listing(p for p, _, _ in fitted)} on "
                             f"{_chip(g for _, _, g in fitted)}, each predicted by a fit without it"
                             + _widen_words(v.widen, 1.0, gpu))
        res, projects, gpus = pool
        return Residuals(res, v.widen * UNSEEN_STACK_WIDEN,
                         _unseen_words(projects, gpus, stack.display) + _widen_words(v.widen, UNSEEN_STACK_WIDEN, gpu))
    if fit is None and v.widen > 1.0 and pool is not None and pool[0] == list(v.log_ratio_residuals):
        return Residuals(list(v.log_ratio_residuals), v.widen * UNSEEN_STACK_WIDEN,
                         _unseen_words(pool[1], pool[2], None) + _widen_words(v.widen, UNSEEN_STACK_WIDEN, gpu))
    return Residuals(list(v.log_ratio_residuals), v.widen, v.source)


def _unseen_words(projects, gpus, stack: str | None) -> str:
    """Words for the leave-one-source-out pool; ``stack``: the user's software's display name."""
    what = (f"training runs published with {_listing(projects)} on {_chip(gpus)}" if projects else
            "published training runs")
    why = f" (your software, {stack}, is not among them)" if stack else ""
    return f"{what}, each predicted by a fit that had not seen its software{why}"
