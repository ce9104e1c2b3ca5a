"""How quiet the host was while a measurement ran: CPU time taken by everything else.

The 1-minute load average counts the measuring process's own threads (a training step on every
core reads as a busy machine) and lags by a minute, so quietness is measured over the interval
instead: the CPU seconds all processes spent (``/proc/stat``: user, nice, system, irq, softirq
and steal, which is time the hypervisor gave to other guests) minus that of this process and its
descendants (``/proc/<pid>/stat``: torch.compile's worker pool, a ``torchrun`` child), per wall
second, in cores. Linux only; elsewhere the figures are None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: other processes may use this share of the cores before a CPU timing is flagged as taken on a
#: busy machine (a tenth of two cores slows a two-thread benchmark by about a tenth at most)
QUIET_SHARE = 0.1


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
