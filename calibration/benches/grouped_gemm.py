"""Grouped GEMMs of a mixture of experts' experts against one GEMM of all their rows.

``grouped_gemm/<precision>/<g>x<m>x<n>x<k>``: ``g`` groups (the experts on one GPU), each
``(m x k) @ (k x n)`` with its own weight (``m``: the tokens routed to one local expert,
``tokens x top_k / experts per GPU``), as one ``torch._grouped_mm`` call where this PyTorch has it
(CUDA: the grouped kernel Megatron-Core and torchtitan run; CPU: its reference path), else as a loop
of ``torch.mm`` over the groups (what a stack without a grouped kernel runs); and, as the
reference, one ``torch.mm`` of all ``g x m`` rows through one weight (the same FLOPs). The two are
timed in alternating rounds and the round with the median ratio is kept (:data:`ROUNDS`, as
:mod:`calibration.benches.gemm_align` does). The record carries both times, the rows per group and
which call ran (``impl``); the fit (:func:`calibration.fit.fit_grouped`) is the profile's
``grouped_gemm_m_half``: the rows per group at which the grouped call takes twice the reference
(time ratio ``1 + m_half / m``: a tile of rows that a group fills only partly, and the work of
setting up each group, weigh more the fewer rows each group has).

Sizes by rows per group: 16 to 2048 (fine-grained experts at small micro-batches to Mixtral's
eight large ones), ``n x k`` an expert's gate-and-up projection of hidden 1024-2048.
"""

from __future__ import annotations

import torch

from ..device import DTYPES
from .base import Bench, RunContext, ok

#: (groups, rows per group, n, k): the grouped shapes timed per mode
SHAPES = {"tiny": [(4, 16, 64, 32), (4, 128, 64, 32)],
          "quick": [(16, 32, 1536, 1024), (16, 128, 1536, 1024), (16, 512, 1536, 1024), (8, 2048, 1536, 1024)],
          "thorough": [(16, 16, 1536, 1024), (16, 32, 1536, 1024), (16, 64, 1536, 1024), (16, 128, 1536, 1024),
                       (16, 256, 1536, 1024), (16, 512, 1536, 1024), (8, 1024, 2816, 2048),
                       (8, 2048, 2816, 2048)]}
#: CPU: smaller widths (the reference path is a loop of CPU GEMMs; seconds per call otherwise)
CPU_SHAPES = {"tiny": SHAPES["tiny"],
              "quick": [(8, 16, 512, 256), (8, 64, 512, 256), (8, 256, 512, 256), (4, 1024, 512, 256)],
              "thorough": [(8, 16, 512, 256), (8, 32, 512, 256), (8, 64, 512, 256), (8, 128, 512, 256),
                           (8, 256, 512, 256), (4, 1024, 512, 256)]}
#: alternating rounds of the grouped and the reference call; the median ratio's round is kept
ROUNDS = 3


def grouped_call(a: torch.Tensor, b: torch.Tensor, rows: int):
    """(callable, impl) of the grouped GEMM of ``a`` (g*rows x k) by the g weights ``b`` (g x k x n):
    ``torch._grouped_mm`` with the groups' row offsets where it runs on these tensors, else a loop
    of ``torch.mm`` writing each group's rows of one output."""
    g = b.shape[0]
    offs = torch.arange(rows, g * rows + 1, rows, device=a.device, dtype=torch.int32)
    if hasattr(torch, "_grouped_mm"):
        try:
            torch._grouped_mm(a, b, offs=offs)
            return (lambda: torch._grouped_mm(a, b, offs=offs)), "grouped_mm"
        except (RuntimeError, NotImplementedError, TypeError):
            pass
    out = torch.empty(a.shape[0], b.shape[2], device=a.device, dtype=a.dtype)
    parts = [(a[i * rows:(i + 1) * rows], b[i], out[i * rows:(i + 1) * rows]) for i in range(g)]

    def loop():
        for x, w, o in parts:
            torch.mm(x, w, out=o)

    return loop, "mm_loop"


def _bench(precision: str, groups: int, rows: int, n: int, k: int):
    def run(ctx: RunContext) -> dict:
        dtype = DTYPES[precision]
        a = torch.randn(groups * rows, k, device=ctx.device, dtype=dtype)
        b = torch.randn(groups, k, n, device=ctx.device, dtype=dtype)
        dense_out = torch.empty(groups * rows, n, device=ctx.device, dtype=dtype)
        grouped, impl = grouped_call(a, b, rows)
        calls = {"grouped": grouped, "dense": lambda: torch.mm(a, b[0], out=dense_out)}
        budget = ctx.settings.budget_s / (2 * ROUNDS)
        rounds = [{label: ctx.time(fn, budget_s=budget) for label, fn in calls.items()} for _ in range(ROUNDS)]
        rounds.sort(key=lambda r: r["grouped"].fit_s / r["dense"].fit_s)
        mid = rounds[len(rounds) // 2]
        rec = ok(mid["grouped"], flops=2.0 * groups * rows * n * k)
        rec.update(dense_s=mid["dense"].fit_s, rows=float(rows), impl=impl,
                   round_ratios=[r["grouped"].fit_s / r["dense"].fit_s for r in rounds])
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """The run's precision for GEMMs that set a step: the first half precision on a GPU, fp32 on
    a CPU (half-precision GEMMs there run other kernels)."""
    precs = ["fp32"] if ctx.dev.kind == "cpu" else ctx.half
    shapes = (CPU_SHAPES if ctx.dev.kind == "cpu" else SHAPES)[ctx.settings.mode]
    return [Bench(f"grouped_gemm/{p}/{g}x{m}x{n}x{k}", "grouped_gemm",
                  {"precision": p, "groups": g, "m": m, "n": n, "k": k}, _bench(p, g, m, n, k),
                  ctx.est(4.0 * g * m * n * k * ROUNDS, "flops", 4.0 * g * (m * k + k * n + m * n)))
            for p in precs for g, m, n, k in shapes]
