"""Fits the hf-trainer stack's caching-allocator reserve to the traced Hugging Face steps.

Each row of ``calibration/results/hf_memory_trace.csv`` holds a step's traced allocated peak and
the least device memory it runs in under PyTorch's CUDA caching allocator
(``allocator_device_bytes``, :func:`calibration.allocator_replay.smallest_device`). The simulator
predicts a plan's allocated peak and adds a reserve: ``fragmentation`` x activations +
``loss_fragmentation`` x the logit and loss buffers held at the peak (``simulator/data/stacks.yaml``).
This picks the two fractions, on a 0.01 grid, that give the smallest mean |error| of the plan's
total against the replayed device memory while under-stating no step by more than
:data:`FLOOR` (memory is never under-promised), and reports it in-sample and leave-one-step-out.

    python -m calibration.allocator_fit
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

TRACE = Path(__file__).parent / "results" / "hf_memory_trace.csv"
FLOOR = -0.04  # the most a fitted total may under-state a step's replayed device memory
GIB = 1024**3


def rows() -> list[dict[str, str]]:
    """The traced steps."""
    with TRACE.open() as fh:
        return list(csv.DictReader(fh))


def plan_memory(row: dict[str, str]) -> dict[str, float]:
    """The hf-trainer plan's ``memory_gib`` for a traced step: one H200, one micro-batch, DDP, AdamW,
    the step's precision, attention and checkpointing, uncompiled."""
    from simulator.answer.api import simulate
    from simulator.model.hf_config import model_from_hf_config

    cfg = json.loads(row["config"])
    spec = model_from_hf_config(cfg, name=row["model"])
    vision = cfg["model_type"] in ("vit", "convnext")
    seq = (getattr(spec, "fixed_seq_len", None) or spec.default_seq_len) if vision else int(row["side"])
    mb = int(row["micro_batch"])
    plan = simulate(spec, "1xh200", seq_len=seq, global_batch=mb, micro_batch=mb, steps=1, optimizer="adamw",
                    precision=row["precision"], attention=row["attention"], compile=False,
                    checkpointing=row["checkpointing"], sharding="ddp", offload="none", stack="hf-trainer")
    return plan.memory_gib


def fit(allocated: np.ndarray, activations: np.ndarray, logits: np.ndarray, device: np.ndarray,
        floor: float = FLOOR) -> tuple[float, float]:
    """(fragmentation, loss_fragmentation) on a 0.01 grid: the smallest mean |total / device - 1|
    with total = allocated + f x activations + g x logits and no step below ``floor``; where no pair
    keeps every step above it, the pair with the highest worst step."""
    f = np.arange(0.0, 0.5001, 0.01)[:, None, None]
    g = np.arange(0.0, 1.0001, 0.01)[None, :, None]
    err = (allocated + f * activations + g * logits) / device - 1.0
    worst, mean = err.min(axis=2), np.abs(err).mean(axis=2)
    score = np.where(worst >= floor, mean, np.inf) if (worst >= floor).any() else -worst
    i, j = np.unravel_index(np.argmin(score), score.shape)
    return float(f[i, 0, 0]), float(g[0, j, 0])


def main() -> int:
    data = [(plan_memory(r), int(r["allocator_device_bytes"]) / GIB, r) for r in rows()]
    alloc, act, logit, device = (np.array(x) for x in zip(*[(m["allocated"], m["activations"], m["logits"], d)
                                                            for m, d, _ in data], strict=True))
    f, g = fit(alloc, act, logit, device)
    err = (alloc + f * act + g * logit) / device - 1.0
    loo = []
    for i in range(len(device)):
        keep = np.arange(len(device)) != i
        fi, gi = fit(alloc[keep], act[keep], logit[keep], device[keep])
        loo.append((alloc[i] + fi * act[i] + gi * logit[i]) / device[i] - 1.0)
    loo = np.array(loo)
    for (_, d, r), e in zip(data, err, strict=True):
        print(f"{r['model']:24s} {r['side']:>5s} x {r['micro_batch']:>3s} {r['precision']:5s} {r['attention']:6s} "
              f"{r['checkpointing']:5s} runs in {d:7.2f} GiB, predicted {e:+.1%}")
    print(f"fragmentation {f:.2f} of activations, loss_fragmentation {g:.2f} of logits: mean |error| "
          f"{np.abs(err).mean():.1%} (worst {err.min():+.1%} / {err.max():+.1%}); leave-one-step-out "
          f"{np.abs(loo).mean():.1%} (worst {loo.min():+.1%} / {loo.max():+.1%}) over {len(device)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
