"""Benchmark definitions. Each :class:`Bench` measures one point and returns a record.

A record is a JSON-able dict with at least ``status`` ('ok' or 'unsupported') and, when
ok, ``time_s`` (seconds per call: the median timed sample, :attr:`calibration.timing.Timing.fit_s`;
the fastest and the spread are kept under ``timing``) plus the work it did (``flops`` and/or
``bytes``) so fitting never needs to re-derive it. Keys are stable strings such as
``gemm/bf16/2048x3072x768``; the measurements file is keyed by them, which is what
``--resume`` relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from simulator.strategy import HALF_PRECISIONS

from ..device import DeviceContext


class TooSlow(Exception):
    """Raised by a bench that predicts it would exceed the per-call time cap (not recorded)."""


@dataclass
class Settings:
    """Size of a calibration run."""

    mode: str  # "quick" | "thorough" | "tiny" (tests)
    budget_s: float  # timing budget per benchmark point, seconds
    max_call_s: float  # skip points predicted to take longer than this per call, seconds
    compile: bool = True  # try torch.compile benchmarks
    min_runs: int = 3  # timed calls when one call is long compared with the budget
    model: object | None = None  # ModelSpec whose shapes to add (``calibrate --for-model``)
    rounds: int = 1  # timed rounds of the benches that set most of a step (calibration.runner)


@dataclass
class RunContext:
    """Shared state benches read: device, settings, and results measured so far."""

    dev: DeviceContext
    settings: Settings
    results: dict[str, dict] = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.dev.device

    @property
    def half(self) -> list[str]:
        """The device's first half-precision type (bf16 before fp16), or none: the one autocast
        type the benches that time mixed precision run in."""
        return [p for p in self.dev.precisions if p in HALF_PRECISIONS][:1]

    def time(self, fn: Callable[[], object], budget_s: float | None = None, warmup: int = 1):
        """Time ``fn`` with this run's budget; returns :class:`calibration.timing.Timing`."""
        from ..timing import measure

        return measure(fn, self.settings.budget_s if budget_s is None else budget_s, self.device,
                       min_runs=self.settings.min_runs, warmup=warmup)

    def est(self, work: float = 0.0, kind: str = "flops", alloc_bytes: float = 0.0) -> float:
        """A-priori wall seconds of one bench (for the ETA): budget, warm-up and timed calls
        at a guessed device rate, plus filling ``alloc_bytes`` of random inputs."""
        cuda = self.dev.kind == "cuda"
        rate = {"flops": 1e14 if cuda else 5e10, "bytes": 1e12 if cuda else 5e9}[kind]
        call = min(work / rate, self.settings.max_call_s)
        fill = alloc_bytes / (5e10 if cuda else 4e8)
        return 1.5 * self.settings.budget_s + (3 + self.settings.min_runs) * call + fill + 0.02

    def best_rate(self, prefix: str, work: str = "flops") -> float | None:
        """Highest work/second among ok results whose key starts with ``prefix``."""
        best = None
        for key, rec in self.results.items():
            if key.startswith(prefix) and rec.get("status") == "ok" and rec.get(work):
                rate = rec[work] / rec["time_s"]
                best = rate if best is None else max(best, rate)
        return best

    def check_time(self, prefix: str, work: float, kind: str = "flops") -> None:
        """Raise :class:`TooSlow` if ``work`` at the best rate seen so far exceeds the cap."""
        rate = self.best_rate(prefix, kind)
        if rate and work / rate > self.settings.max_call_s:
            raise TooSlow(f"predicted {work / rate:.1f} s per call > cap {self.settings.max_call_s:g} s")


@dataclass
class Bench:
    """One benchmark point. ``run(ctx)`` returns the record (without key/group/params)."""

    key: str
    group: str
    params: dict
    run: Callable[[RunContext], dict]
    est_s: float  # rough wall seconds, for the progress bar's ETA


def ok(timing, **work: float) -> dict:
    """Build an 'ok' record from a :class:`calibration.timing.Timing` and work counters."""
    rec = {"status": "ok", "time_s": timing.fit_s, "stat": "median", **{k: float(v) for k, v in work.items()}}
    rec["timing"] = timing.as_dict()
    return rec


def unsupported(reason: str) -> dict:
    """Record that the device/torch build cannot run this point (kept; skipped on resume)."""
    return {"status": "unsupported", "reason": reason.strip().splitlines()[0][:300] if reason else ""}


def plan(ctx: RunContext, groups: list[str] | None = None) -> list[Bench]:
    """All benchmarks for this device and mode, in execution order."""
    from . import attention, bandwidth, dispatch, gemm, gemm_align, host, optimizer, stepops

    benches: list[Bench] = []
    benches += bandwidth.plan(ctx)  # launch overhead + bandwidth first: the fits need them
    benches += gemm.plan(ctx)
    benches += gemm_align.plan(ctx)
    benches += attention.plan(ctx)
    benches += optimizer.plan(ctx)
    benches += stepops.plan(ctx)
    benches += host.plan(ctx)
    benches += dispatch.plan(ctx)
    # torch.compile last: compilation leaves worker processes and threads behind that
    # should not share the machine with the eager measurements
    benches = [b for b in benches if b.group != "compiled"] + [
        b for b in benches if b.group == "compiled"]
    if groups:
        benches = [b for b in benches if b.group in groups]
    return benches
