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

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


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

    Warm-up calls run first (compilation, allocator, caches). If one call takes more than
    ``budget_s / min_runs``, ``min_runs`` calls are timed one by one (each synchronised);
    otherwise ``blocked_autorange`` repeats blocks of calls for ``budget_s`` seconds and the
    device is synchronised at block boundaries (throughput of back-to-back launches).
    """
    sync = synchronizer(device)
    timer = _sync_timer(sync)
    t_warm = 0.0
    for _ in range(max(1, warmup)):
        t0 = timer()
        fn()
        t_warm = timer() - t0
    if t_warm * min_runs >= budget_s:
        times = []
        for _ in range(min_runs):
            t0 = timer()
            fn()
            times.append(timer() - t0)
        return Timing(statistics.median(times), _iqr(times), min(times), len(times), len(times))
    t = benchmark.Timer(stmt="fn()", globals={"fn": fn}, timer=timer,
                        num_threads=torch.get_num_threads())
    m = t.blocked_autorange(min_run_time=budget_s)
    per_call = list(m.times)
    return Timing(float(m.median), _iqr(per_call), float(min(per_call)), len(per_call),
                  int(len(per_call) * m.number_per_run))
