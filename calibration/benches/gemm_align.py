"""Forward-layout GEMMs whose output rows are not whole cache lines.

``gemm_align/<precision>/<m>x<n>x<k>``: ``torch.mm(x, W^T)`` (the ``F.linear`` layout, weight
stored (n, k)) into a preallocated output, once with n a multiple of 64 elements and once with
n + 1 (as GPT-2's 50257-token vocabulary makes the LM head). Odd row lengths leave every output
row on its own offset within a 64-byte cache line, so the blocked kernel's vector stores split
lines; an AVX2 CPU runs such GEMMs 1.1-1.7x slower (measured on the 2-core EPYC, 2026-12-01),
though the FLOPs differ by 1/n. The two shapes are timed in alternating rounds and the round with
the median ratio is kept (:data:`ROUNDS`). The record carries both times; the fit
(:func:`calibration.fit.fit_ratio`) is the profile's ``gemm_misaligned``. The output is written
into a kept buffer, so first touches of fresh pages (``fresh_memory``) stay out of it. Outputs of
16-24 MiB, well beyond the per-core caches, as an LM head's logits are.

The aligned width is a multiple of 64 but not a power of two (a power of two or a multiple of
4096, plus 64), as padded vocabularies (50304, 32064) are: output rows whose stride is a power of
two map onto few cache sets and run slow for that reason alone. On a Zen 5 EPYC (2026-12-02) a
256 x 16384 x 256 GEMM ran 1.12x *slower* than its 16385-column twin, so the former 8192- and
16384-column pairs fitted x1.01, while the GPT-2 head's 512 x 50257 x 256 and x 768 ran 1.15-1.19x
slower than with 50304 columns. Head-like shapes measured 1.0-1.26x and the quick pairs below
1.02-1.24x: the ratio depends on the kernel's blocking of each shape, so several shapes are timed
and the fit is their geometric mean.
"""

from __future__ import annotations

import torch

from ..device import DTYPES
from .base import Bench, RunContext, ok

#: (m, n, k) with n a multiple of 64 and not a power of two: the aligned shape; the misaligned one has n + 1
SHAPES = {"tiny": [(64, 1088, 64)], "quick": [(512, 8256, 128), (512, 12352, 256), (1024, 4160, 256)],
          "thorough": [(512, 8256, 128), (512, 12352, 256), (1024, 4160, 256), (256, 16448, 512),
                       (512, 12352, 512)]}


#: alternating rounds of the aligned and the misaligned shape; the round with the median ratio is
#: kept, so a moment when the host stalls (one quick calibration timed the misaligned GEMM 10x
#: slower for a fraction of a second) slows both shapes of a round or is outvoted
ROUNDS = 3


def _bench(precision: str, m: int, n: int, k: int):
    def run(ctx: RunContext) -> dict:
        dtype = DTYPES[precision]
        calls = {}
        for label, cols in (("aligned", n), ("misaligned", n + 1)):
            x = torch.randn(m, k, device=ctx.device, dtype=dtype)
            w = torch.randn(cols, k, device=ctx.device, dtype=dtype)
            out = torch.empty(m, cols, device=ctx.device, dtype=dtype)
            calls[label] = lambda x=x, w=w, out=out: torch.mm(x, w.t(), out=out)
        budget = ctx.settings.budget_s / (2 * ROUNDS)
        rounds = [{label: ctx.time(fn, budget_s=budget) for label, fn in calls.items()} for _ in range(ROUNDS)]
        rounds.sort(key=lambda r: r["misaligned"].fit_s / r["aligned"].fit_s)
        mid = rounds[len(rounds) // 2]
        rec = ok(mid["misaligned"], flops=2.0 * m * (n + 1) * k)
        rec["aligned_s"] = mid["aligned"].fit_s
        rec["aligned_flops"] = 2.0 * m * n * k
        rec["round_ratios"] = [r["misaligned"].fit_s / r["aligned"].fit_s for r in rounds]
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """fp32 only (half-precision GEMMs on a CPU without native support run other kernels)."""
    if ctx.dev.kind != "cpu":
        return []
    return [Bench(f"gemm_align/fp32/{m}x{n}x{k}", "gemm_align", {"precision": "fp32", "m": m, "n": n, "k": k},
                  _bench("fp32", m, n, k), ctx.est(4.0 * m * n * k, "flops", 8.0 * m * n))
            for m, n, k in SHAPES[ctx.settings.mode]]
