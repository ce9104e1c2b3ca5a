"""Benchmark: a full strategy search for one model and cluster (warm), in milliseconds.

    python bench/bench_search.py [--model pythia-1b] [--gpus 8x3090] [--repeat 50] [--stack NAME]

Prints the median and minimum wall-clock time and the minimum CPU time of this process (on a
shared machine the CPU time is the steadier figure: it does not count time spent waiting for a
core), with the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from simulator.answer.api import run_search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pythia-1b")
    ap.add_argument("--gpus", default="8x3090")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--stack", default=None)
    a = ap.parse_args()
    knobs = {"stack": a.stack} if a.stack else {}
    res = run_search(a.model, a.gpus, **knobs)  # warm caches (catalog, presets, profile)
    wall, cpu = [], []
    for _ in range(a.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_search(a.model, a.gpus, **knobs)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{a.model} on {a.gpus}: {res.n_evaluated:,} strategies, {res.order.size:,} feasible; "
          f"median {statistics.median(wall):.1f} ms, min {min(wall):.1f} ms wall, min {min(cpu):.1f} ms CPU "
          f"over {a.repeat} warm runs (load average {load})")


if __name__ == "__main__":
    main()
