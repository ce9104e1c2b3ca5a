"""What every benchmark module shares: settings, the run context, a bench point and its records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from simulator.core.vocab import HALF_PRECISIONS
from simulator.model.spec import ModelSpec

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
    model: ModelSpec | None = None  # the model whose shapes to add (``calibrate --for-model``)
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
