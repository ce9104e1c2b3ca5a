"""Wall-clock timing of one callable, synchronising the device so kernel time is counted.

Built on :class:`torch.utils.benchmark.Timer` (``blocked_autorange``) for fast calls;
slow calls (one call longer than a fraction of the budget) are timed individually so a
benchmark never runs much longer than its time budget. All times are seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    """Result of :func:`measure`: per-call seconds."""

    median_s: float  # median seconds per call
    iqr_s: float  # interquartile range of per-call seconds (0 if too few samples)
    min_s: float  # fastest per-call seconds observed
    samples: int  # number of timed samples (blocks or single calls)
    calls: int  # total timed calls
    times: tuple[float, ...] = ()  # per-call seconds of each timed sample (spread, resampling)

    @property
    def fit_s(self) -> float:
        """The per-call seconds a profile is fitted to: the median. The simulator predicts a typical
        step and ``validate`` measures the median step; on a host shared with other guests (SMT
        siblings, memory bandwidth), whose speed varies by up to 2x from second to second without
        any CPU time showing as used, the fastest call catches its best moments only."""
        return self.median_s

    @classmethod
    def of_calls(cls, times: list[float]) -> Timing:
        """The timing of single calls that took ``times`` seconds each."""
        return cls(statistics.median(times), _iqr(times), min(times), len(times), len(times), tuple(times))

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["times"] = list(self.times)
        return d


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """Return a function that waits for all queued work on ``device`` (no-op on CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _sync_timer(sync: Callable[[], None]) -> Callable[[], float]:
    def timer() -> float:
        sync()
        return time.perf_counter()

    return timer


def _iqr(values: list[float]) -> float:
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def measure(fn: Callable[[], object], budget_s: float, device: torch.device | str = "cpu",
            *, min_runs: int = 3, warmup: int = 1) -> Timing:
    """Time ``fn()`` per call within roughly ``budget_s`` seconds (plus warm-up).

    ``warmup`` untimed calls run first (compilation, allocator, caches), then up to three
    single calls are timed to estimate the cost of one call. If one call takes more than
    ``budget_s / min_runs``, calls are timed one by one (each synchronised) until there
    are ``min_runs``; otherwise ``blocked_autorange`` repeats blocks of back-to-back calls
    for ``budget_s`` seconds, synchronising the device at block boundaries.
    """
    sync = synchronizer(device)
    timer = _sync_timer(sync)
    for _ in range(max(1, warmup)):
        fn()
    single: list[float] = []
    while len(single) < 3 and sum(single) < budget_s / 2:
        t0 = timer()
        fn()
        single.append(timer() - t0)
    if min(single) * min_runs >= budget_s:
        while len(single) < min_runs:
            t0 = timer()
            fn()
            single.append(timer() - t0)
        return Timing.of_calls(single)
    t = benchmark.Timer(stmt="fn()", globals={"fn": fn}, timer=timer,
                        num_threads=torch.get_num_threads())
    m = t.blocked_autorange(min_run_time=budget_s)
    per_call = list(m.times)
    return Timing(float(m.median), _iqr(per_call), float(min(per_call)), len(per_call),
                  int(len(per_call) * m.number_per_run), tuple(float(x) for x in per_call))
