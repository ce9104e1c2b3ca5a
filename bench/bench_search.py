"""Benchmark: a full strategy search for one model and cluster (warm), in milliseconds.

    python bench/bench_search.py [--model pythia-1b] [--gpus 8x3090] [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

from simulator.api import run_search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pythia-1b")
    ap.add_argument("--gpus", default="8x3090")
    ap.add_argument("--repeat", type=int, default=50)
    a = ap.parse_args()
    res = run_search(a.model, a.gpus)  # warm caches (catalog, presets, profile)
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        res = run_search(a.model, a.gpus)
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"{a.model} on {a.gpus}: {res.n_evaluated:,} strategies, {res.order.size:,} feasible; "
          f"median {statistics.median(times):.1f} ms, min {min(times):.1f} ms over {a.repeat} warm runs")


if __name__ == "__main__":
    main()
