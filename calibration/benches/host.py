"""Host <-> device copies: pinned and pageable, per message size.

On CUDA: ``dst.copy_(src, non_blocking=True)`` from a pinned (page-locked) or pageable
host buffer to device memory (h2d), and device to pinned host (d2h). ``bytes`` = bytes
transferred (one way). On CPU there is no device link; a host-to-host ``copy_`` between
two buffers stands in as a proxy ("memcpy proxy"), so offload estimates for a CPU
"device" use host memory bandwidth for one-way bytes.
"""

from __future__ import annotations

import torch

from .base import Bench, RunContext, ok, unsupported

SIZES: dict[str, list[int]] = {  # bytes, CUDA (small sizes pin down the latency)
    "tiny": [1 << 20],
    "quick": [1 << 20, 1 << 24, 1 << 27],
    "thorough": [1 << 16, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30],
}
CPU_SIZES: dict[str, list[int]] = {  # bytes; beyond the caches, as offloaded states are
    "tiny": [1 << 20],
    "quick": [1 << 24, 1 << 26],
    "thorough": [1 << 24, 1 << 26, 1 << 28, 1 << 30],
}


def _bench(kind: str, nbytes: int):
    def run(ctx: RunContext) -> dict:
        n = nbytes // 4
        if ctx.dev.kind == "cpu":
            src = torch.randn(n)
            dst = torch.empty(n)
            t = ctx.time(lambda: dst.copy_(src))
            rec = ok(t, bytes=float(n * 4))
            rec["proxy"] = "host memcpy (no device link on CPU)"
            return rec
        pinned = kind in ("h2d_pinned", "d2h_pinned")
        try:
            host = torch.empty(n, pin_memory=pinned).normal_()
        except RuntimeError as exc:
            return unsupported(f"pinned host memory unavailable: {exc}")
        dev = torch.empty(n, device=ctx.device)
        if kind.startswith("h2d"):
            t = ctx.time(lambda: dev.copy_(host, non_blocking=pinned))
        else:
            t = ctx.time(lambda: host.copy_(dev, non_blocking=pinned))
        return ok(t, bytes=float(n * 4))

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """h2d pinned/pageable and d2h pinned on CUDA; one memcpy proxy series on CPU."""
    kinds = ["h2d_memcpy_proxy"] if ctx.dev.kind == "cpu" else ["h2d_pinned", "h2d_pageable",
                                                                "d2h_pinned"]
    sizes = (CPU_SIZES if ctx.dev.kind == "cpu" else SIZES)[ctx.settings.mode]
    return [Bench(f"host/{kind}/{nb}", "host", {"kind": kind, "bytes": nb}, _bench(kind, nb),
                  ctx.est(2.0 * nb, "bytes", nb))
            for kind in kinds for nb in sizes]
