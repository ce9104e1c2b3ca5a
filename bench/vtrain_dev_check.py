"""Dev check, not a fit: vTrain's measured Megatron-LM iterations of small GPTs on 2-8 A100s against
the simulator's prediction under each run's recorded layout.

    python bench/vtrain_dev_check.py

Rows: VIA-Research/vTrain (MICRO 2024) ``data/ground_truth_single.csv`` at commit f8dda847, the 24-layer
rows of hidden 2048 (GPT-3 XL shape, 1.3B) and 1024 (GPT-3 Medium shape, 350M): GPUs, TP, PP, DP, micro-batch,
global batch, iteration ms, 16 heads, 1024 tokens, one node. Inferred, not stated in the CSV: A100 80 GB SXM
in an NVSwitch node, fp16 (vTrain's model replica calls ``.half()``), full recomputation (its configs'
``use_checkpoint``), vocabulary 50257, no FlashAttention and no sequence parallelism. Megatron-LM stack,
DDP. Nothing here is fitted: it checks physics that comes from elsewhere (2026-12-08: 14.4% mean
absolute error, 5.9% fast on average; 14.6% and 7.9% before the stack's gradient reduce ran after
backward, 22.3% and 16.5% before eager PyTorch's measured host time per kernel was carried to the A100). ``--csv`` runs every row of a local copy of the file (the repository
keeps only these 28): docs/small_model_runs.md has what it shows.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from simulator.answer.api import simulate
from simulator.answer.runs import megatron_gpt

SOURCE = "VIA-Research/vTrain data/ground_truth_single.csv (commit f8dda8473a48b373b1d25f51f52d685bff5150c5)"
#: (GPUs, layers, hidden, TP, PP, DP, micro-batch, global batch, measured iteration ms)
ROWS = [
    (8, 24, 2048, 1, 1, 8, 1, 16, 215.029881), (8, 24, 2048, 1, 2, 4, 2, 16, 229.995616),
    (8, 24, 2048, 1, 2, 4, 1, 16, 257.464671), (8, 24, 2048, 1, 4, 2, 2, 16, 290.195093),
    (8, 24, 2048, 1, 4, 2, 1, 16, 312.344108), (8, 24, 2048, 2, 1, 4, 2, 16, 252.687217),
    (8, 24, 2048, 2, 1, 4, 1, 16, 361.925037), (8, 24, 2048, 2, 2, 2, 4, 16, 254.324849),
    (8, 24, 2048, 2, 2, 2, 1, 16, 408.274972), (8, 24, 2048, 2, 4, 1, 8, 16, 365.103388),
    (8, 24, 2048, 4, 1, 2, 4, 16, 264.092062), (8, 24, 2048, 4, 1, 2, 2, 16, 293.094406),
    (8, 24, 2048, 4, 1, 2, 1, 16, 611.081013), (8, 24, 2048, 4, 2, 1, 8, 16, 298.675811),
    (8, 24, 2048, 4, 2, 1, 1, 16, 662.628966), (8, 24, 2048, 8, 1, 1, 8, 16, 325.49918),
    (8, 24, 2048, 8, 1, 1, 4, 16, 467.602073), (8, 24, 2048, 8, 1, 1, 2, 16, 775.623297),
    (8, 24, 2048, 8, 1, 1, 1, 16, 1883.691016), (8, 24, 2048, 1, 1, 8, 4, 128, 1023.862999),
    (4, 24, 2048, 4, 1, 1, 8, 16, 384.937801), (4, 24, 2048, 4, 1, 1, 1, 16, 1208.107121),
    (2, 24, 2048, 1, 2, 1, 1, 16, 843.725128), (8, 24, 1024, 1, 1, 8, 1, 16, 171.025621),
    (8, 24, 1024, 2, 2, 2, 4, 16, 131.620118), (8, 24, 1024, 8, 1, 1, 8, 16, 230.202133),
    (8, 24, 1024, 8, 1, 1, 1, 16, 1949.864466), (8, 24, 1024, 1, 1, 8, 4, 128, 565.803208),
]


def predicted_ms(n: int, layers: int, hidden: int, tp: int, pp: int, mb: int, gb: int) -> float:
    """The simulator's iteration time (ms) of one vTrain row under its recorded layout."""
    model = megatron_gpt(f"gpt-{layers}x{hidden}", layers, hidden, 16, 50257, 1024)
    plan = simulate(model, f"{n}xa100-80gb-sxm", stack="megatron-lm", precision="fp16", global_batch=gb,
                    seq_len=1024, steps=1, tp=tp, pp=pp, vp=1, micro_batch=mb, checkpointing="full",
                    sharding="ddp", offload="none", attention="eager", compile=True,
                    sequence_parallel=False if tp > 1 else None)
    return plan.step_time_s * 1e3


def read_rows(path: Path) -> list[tuple]:
    """Every row of a local copy of vTrain's ground_truth_single.csv (columns: GPUs, global batch, micro batch,
    hidden, heads, layers, sequence length, TP, DP, PP, iteration ms), as :data:`ROWS` tuples."""
    out = []
    with path.open(newline="") as f:
        for r in list(csv.reader(f))[1:]:
            n, gb, mb, h, _, layers, _, tp, dp, pp = (int(x) for x in r[:10])
            out.append((n, layers, h, tp, pp, dp, mb, gb, float(r[10])))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, help="a local copy of vTrain's data/ground_truth_single.csv (all 1,440 "
                    "rows, 12-24 layers): print the error by TP, micro-batch and hidden size instead of the table")
    args = ap.parse_args(argv)
    rows = read_rows(args.csv) if args.csv else ROWS
    errors = [predicted_ms(n, layers, h, tp, pp, mb, gb) / ms - 1.0 for n, layers, h, tp, pp, dp, mb, gb, ms in rows]
    print(f"source: {args.csv or SOURCE}")
    if args.csv:
        for name, at in (("TP", 3), ("micro-batch", 6), ("hidden", 2), ("PP", 4)):
            groups: dict[int, list[float]] = defaultdict(list)
            for row, err in zip(rows, errors, strict=True):
                groups[row[at]].append(err)
            print(f"{name}: " + ", ".join(f"{k} {sum(map(abs, v)) / len(v):.1%} ({sum(v) / len(v):+.1%}, n={len(v)})"
                                          for k, v in sorted(groups.items())))
    else:
        print("| GPUs | model | TP | PP | DP | micro-batch | measured ms | predicted ms | error |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for (n, layers, hidden, tp, pp, dp, mb, _, ms), err in zip(rows, errors, strict=True):
            print(f"| {n} | {layers} x {hidden} | {tp} | {pp} | {dp} | {mb} | {ms:.1f} | {ms * (1 + err):.1f} | "
                  f"{err:+.1%} |")
    print(f"mean absolute error {sum(abs(e) for e in errors) / len(errors):.1%}, "
          f"mean signed {sum(errors) / len(errors):+.1%} over {len(errors)} runs (negative: predicted fast)")


if __name__ == "__main__":
    main()
