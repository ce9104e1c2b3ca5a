"""How quiet the host was while a measurement ran: CPU time taken by everything else.

The 1-minute load average counts the measuring process's own threads (a training step on every
core reads as a busy machine) and lags by a minute, so quietness is measured over the interval
instead: the CPU seconds all processes spent (``/proc/stat``: user, nice, system, irq, softirq
and steal, which is time the hypervisor gave to other guests) minus that of this process and its
descendants (``/proc/<pid>/stat``: torch.compile's worker pool, a ``torchrun`` child), per wall
second, in cores. Linux only; elsewhere the figures are None.

A virtual machine can also run slower with no CPU time used on it at all, while other guests share
its physical cores: :func:`host_speed` times a probe GEMM against the profile's prediction for it.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import numpy as np

from simulator.core.errors import UsageError

#: other processes may use this share of the cores before a CPU timing is flagged as taken on a
#: busy machine (a tenth of two cores slows a two-thread benchmark by about a tenth at most)
QUIET_SHARE = 0.1
#: a host running below this share of its calibrated speed (:func:`host_speed`) makes CPU timings
#: unrepresentative of the profile (a fifth slower than calibrated: as much as our error budget)
SLOW_SHARE = 0.8
#: timed rounds, a whole pass apart, of what `calibrate` and `validate` measure on a CPU (each keeps
#: the median round): a shared host's speed moves by 20-50% for seconds and by 10-15% for minutes
#: at a time without any CPU time showing as used (a 2-core Zen 4 guest, 2026-12-02: one
#: calibration's rounds of a bench a median x1.24-1.30 apart; the same training steps measured
#: 0.87x and 1.13x as long a quarter of an hour apart)
CPU_ROUNDS = 3
#: the most rounds `--rounds` accepts
MAX_ROUNDS = 9


def default_rounds(device_kind: str) -> int:
    """Rounds on a device of ``device_kind`` ('cpu', 'cuda') unless asked otherwise:
    :data:`CPU_ROUNDS` on a CPU, 1 on a GPU (a dedicated device, whose speed holds)."""
    return CPU_ROUNDS if device_kind == "cpu" else 1


def check_rounds(rounds: int | None, what: str = "--rounds") -> None:
    """UsageError unless ``rounds`` is None or 1 to :data:`MAX_ROUNDS`."""
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int)
                               or not 1 <= rounds <= MAX_ROUNDS):
        raise UsageError(f"{what} must be an integer 1 to {MAX_ROUNDS}, got {rounds!r}")


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used by the whole host and by this process tree at a monotonic wall time (s)."""

    wall_s: float
    host_s: float
    own_s: float


def sample() -> CpuSample | None:
    """The host's and this process tree's CPU seconds now, or None without ``/proc/stat``."""
    try:
        with open("/proc/stat") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    if len(ticks) < 8:
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait (guest time is inside user)
    return CpuSample(time.monotonic(), busy / hz, _tree_ticks(os.getpid()) / hz)


def _tree_ticks(root: int) -> int:
    """CPU ticks of process ``root`` and its live descendants, with the children each has reaped
    (``/proc/<pid>/stat`` utime, stime, cutime, cstime)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        parent[int(entry)] = int(fields[1])
        ticks[int(entry)] = sum(int(v) for v in fields[11:15])
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier += kids
    return sum(ticks.get(p, 0) for p in tree)


def other_cores(start: CpuSample | None, end: CpuSample | None) -> float | None:
    """Cores' worth of CPU that other processes (and other guests, as steal) used between two
    samples, rounded to 0.01; None if either sample is missing or no time passed."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    other = (end.host_s - start.host_s) - (end.own_s - start.own_s)
    return round(max(0.0, other / (end.wall_s - start.wall_s)), 2)


def is_busy(cores: float | None, n_cpus: int | None = None) -> bool:
    """Whether ``cores`` of other work exceed :data:`QUIET_SHARE` of the machine's cores."""
    return cores is not None and cores > QUIET_SHARE * (n_cpus or os.cpu_count() or 1)


#: the probe GEMM (tokens, out, in) of :func:`host_speed`: one of `calibrate --quick`'s grid
#: points (512 tokens through GPT-2 small's MLP up-projection), about 10 ms on a 2-core CPU
PROBE_SHAPE = (512, 3072, 768)
#: probe calls per reading
PROBE_CALLS = 5
#: fp32 elements of the probe copy (128 MiB read, 128 MiB written: mostly beyond a last-level cache)
PROBE_COPY_ELEMENTS = 1 << 25


def host_speed(profile) -> float | None:
    """How fast the host runs now against the calibration: the lower of two ratios of the
    profile's predicted time to the median measured time, an fp32 :data:`PROBE_SHAPE` forward
    GEMM's and a :data:`PROBE_COPY_ELEMENTS` copy's (1: as calibrated; 0.6: the host runs at 60%,
    as a VM does while other guests share its cores or its memory bandwidth, which no CPU time on
    this guest shows: the GEMM probe read 0.9-1.1 while copies ran 35% slower). None where the
    profile has no fp32 GEMM fit."""
    pred = probe_prediction(profile)
    if pred is None:
        return None
    # 4 bytes read and 4 written per element, at the copy kernel's fitted rate (bw_eff_ops "gemm" is
    # the copy's efficiency: calibration.build)
    copy = 8.0 * PROBE_COPY_ELEMENTS / (profile.device.mem_bw_gbs * 1e9 * profile.bw_eff("gemm"))
    return round(min(pred / probe_seconds(), copy / copy_seconds()), 2)


def probe_prediction(profile) -> float | None:
    """The profile's seconds for the probe GEMM (None without an fp32 fit on a CPU)."""
    from simulator.hardware.device import device_from_profile
    from simulator.model import workload
    from simulator.physics import compute

    if "fp32" not in profile.gemm or profile.device.kind != "cpu":
        return None
    m, n, k = PROBE_SHAPE
    return float(np.asarray(compute.gemm_pass_times(
        [workload.Gemm("probe", np.array([float(m)]), float(n), float(k), 1)],
        device_from_profile(profile), "fp32")[0]).ravel()[0])


def probe_seconds() -> float:
    """Median seconds of :data:`PROBE_CALLS` probe GEMMs on this CPU, after one untimed call."""
    import statistics

    import torch
    import torch.nn.functional as F

    m, n, k = PROBE_SHAPE
    x, w = torch.randn(m, k), torch.randn(n, k)
    F.linear(x, w)
    times = []
    for _ in range(PROBE_CALLS):
        t0 = time.perf_counter()
        F.linear(x, w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@functools.cache
def _copy_buffers():
    import torch

    x = torch.ones(PROBE_COPY_ELEMENTS)
    y = torch.empty_like(x)
    y.copy_(x)  # fault the pages in once: the probe times copies, not first touches
    return x, y


def copy_seconds() -> float:
    """Median seconds of :data:`PROBE_CALLS` copies of :data:`PROBE_COPY_ELEMENTS` fp32 elements
    (buffers kept for the process, so repeated probes fault nothing in)."""
    import statistics

    x, y = _copy_buffers()
    times = []
    for _ in range(PROBE_CALLS):
        t0 = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: probe times that change by more than this factor between the start and the end of a calibration
#: mean the host changed speed while it measured: the profile mixes two machines; a fitted profile
#: whose prediction for the probe GEMM differs from those readings by more than it
#: (:func:`calibrated_level`) describes the host at another speed than the probes read
DRIFT_FACTOR = 1.2


def probe_pair() -> tuple[float, float]:
    """Seconds of the probe GEMM and of the probe copy now (:func:`probe_seconds`, :func:`copy_seconds`)."""
    return probe_seconds(), copy_seconds()


def calibrated_level(profile, readings: list[float]) -> float | None:
    """The profile's predicted seconds for the probe GEMM over the geometric mean of the probe GEMM
    ``readings`` (seconds) taken while it was calibrated: 1 where its benchmarks saw the host at the
    speed the probes read; 0.7 where they caught it 30% faster (a profile that predicts every later step
    that much too fast while the host runs as the probes read). None without an fp32 fit or readings."""
    pred = probe_prediction(profile)
    if pred is None or not readings:
        return None
    return pred / float(np.exp(np.mean(np.log(readings))))


def drift(start: tuple[float, float], end: tuple[float, float]) -> float:
    """The larger factor by which the probe GEMM or copy changed between two :func:`probe_pair`
    readings (1: steady)."""
    return max(max(a / b, b / a) for a, b in zip(start, end, strict=True))
