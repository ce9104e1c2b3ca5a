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

On a GPU the alignment that matters is 16 bytes per leading dimension (the tensor-core kernels'
operand alignment; :data:`simulator.physics.compute.GPU_ALIGN_BYTES`): with n + 1 columns every
row of the output, and of the output gradient both backward GEMMs read, is misaligned. An H200 ran
GPT-2 XL's 50257-column head 4.8-7.1x slower than aligned GEMMs (bf16; calibration/results/h200/
microbench_shapes.csv). ``gemm_align/<precision>/<layout>/<m>x<n>x<k>`` times the three layouts
(``fwd`` x @ W^T, ``dgrad`` g @ W, ``wgrad`` g^T @ x) in each tensor-core precision the device has;
the forward fits ``gemm_misaligned``, the two backward layouts ``gemm_misaligned_bwd``.
"""

from __future__ import annotations

import torch

from ..device import DTYPES
from .base import Bench, RunContext, ok

#: (m, n, k) with n a multiple of 64 and not a power of two: the aligned shape; the misaligned one has n + 1
SHAPES = {"tiny": [(64, 1088, 64)], "quick": [(512, 8256, 128), (512, 12352, 256), (1024, 4160, 256)],
          "thorough": [(512, 8256, 128), (512, 12352, 256), (1024, 4160, 256), (256, 16448, 512),
                       (512, 12352, 512)]}
#: GPU shapes, LM heads as padded vocabularies make them (n = 50304: GPT-2's 50257 padded to a multiple of
#: 64) at the widths of GPT-2 small and XL, and a wide layer; aligned GEMMs of 0.1-1.3 TFLOP
GPU_SHAPES = {"tiny": [(1024, 4160, 256)], "quick": [(4096, 50304, 768), (8192, 50304, 1600)],
              "thorough": [(4096, 50304, 768), (8192, 50304, 1600), (16384, 50304, 2048), (8192, 12352, 4096)]}
#: GEMM layouts timed on a GPU: the forward and the two backward GEMMs of a linear layer
LAYOUTS = ("fwd", "dgrad", "wgrad")


#: alternating rounds of the aligned and the misaligned shape; the round with the median ratio is
#: kept, so a moment when the host stalls (one quick calibration timed the misaligned GEMM 10x
#: slower for a fraction of a second) slows both shapes of a round or is outvoted
ROUNDS = 3


def _call(layout: str, m: int, cols: int, k: int, device, dtype):
    """One GEMM of ``layout`` for a linear layer of ``cols`` outputs over ``k`` inputs on ``m`` rows,
    into a kept output buffer."""
    x = torch.randn(m, k, device=device, dtype=dtype)
    w = torch.randn(cols, k, device=device, dtype=dtype)
    if layout == "fwd":
        out = torch.empty(m, cols, device=device, dtype=dtype)
        return lambda: torch.mm(x, w.t(), out=out)
    g = torch.randn(m, cols, device=device, dtype=dtype)
    if layout == "dgrad":
        out = torch.empty(m, k, device=device, dtype=dtype)
        return lambda: torch.mm(g, w, out=out)
    out = torch.empty(cols, k, device=device, dtype=dtype)
    return lambda: torch.mm(g.t(), x, out=out)


def _bench(precision: str, m: int, n: int, k: int, layout: str = "fwd"):
    def run(ctx: RunContext) -> dict:
        dtype = DTYPES[precision]
        calls = {label: _call(layout, m, cols, k, ctx.device, dtype) for label, cols in (("aligned", n), ("misaligned", n + 1))}
        budget = ctx.settings.budget_s / (2 * ROUNDS)
        rounds = [{label: ctx.time(fn, budget_s=budget) for label, fn in calls.items()} for _ in range(ROUNDS)]
        rounds.sort(key=lambda r: r["misaligned"].fit_s / r["aligned"].fit_s)
        mid = rounds[len(rounds) // 2]
        rec = ok(mid["misaligned"], flops=2.0 * m * (n + 1) * k)
        rec["aligned_s"] = mid["aligned"].fit_s
        rec["aligned_flops"] = 2.0 * m * n * k
        rec["round_ratios"] = [r["misaligned"].fit_s / r["aligned"].fit_s for r in rounds]
        rec["layout"] = layout
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """CPU: forward fp32 only (half-precision GEMMs on a CPU without native support run other
    kernels). GPU: the three layouts in each tensor-core precision the device has (tf32, bf16, fp16;
    fp32's CUDA-core kernel ran a misaligned head at full speed on an H200)."""
    if ctx.dev.kind == "cpu":
        return [Bench(f"gemm_align/fp32/{m}x{n}x{k}", "gemm_align", {"precision": "fp32", "m": m, "n": n, "k": k},
                      _bench("fp32", m, n, k), ctx.est(4.0 * m * n * k, "flops", 8.0 * m * n))
                for m, n, k in SHAPES[ctx.settings.mode]]
    precs = [p for p in ctx.dev.precisions if p in ("tf32", "bf16", "fp16")]
    return [Bench(f"gemm_align/{p}/{lay}/{m}x{n}x{k}", "gemm_align",
                  {"precision": p, "layout": lay, "m": m, "n": n, "k": k}, _bench(p, m, n, k, lay),
                  ctx.est(4.0 * m * n * k, "flops", 4.0 * (m * n + n * k + m * k)))
            for p in precs for lay in LAYOUTS for m, n, k in GPU_SHAPES[ctx.settings.mode]]
