"""Attention benchmarks: ``scaled_dot_product_attention`` per SDPA backend, causal.

Backends: 'flash' (FlashAttention), 'efficient' (memory-efficient), 'math' (eager
reference, materialises the s x s scores). Directions: 'fwd' and 'fwdbwd' (forward then
backward through ``torch.autograd.grad``). Unsupported backend/dtype combinations (e.g.
'efficient' on CPU) are recorded as 'unsupported', not errors.

FLOP convention (the same as ``simulator.workload.attention_flops_fwd`` and
``simulator.compute``): forward = 4*b*heads*s^2*d, halved for causal masking (what fused
kernels execute); backward = 2.5x forward (FlashAttention recomputes the scores), so
fwd+bwd = 3.5x forward. The 'math' backend computes the full square but is counted the
same way.

Precisions (how the simulator uses the profile): bf16/fp16 training runs the 'flash'
fields against the half-precision peak, fp32/tf32 runs the 'mem_efficient' fields against
the fp32 peak. So 'flash' is measured in the mixed-precision dtype and 'efficient' in
fp32; where 'efficient' is unsupported (CPU), 'flash' is also measured in fp32 because
that is the fused kernel SDPA dispatches fp32 inputs to there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import DTYPES
from . import Bench, RunContext, ok, unsupported

BACKENDS = ("flash", "efficient", "math")
BWD_FLOPS_FACTOR = 2.5  # backward FLOPs / forward FLOPs (fused attention)

GRIDS: dict[str, dict[str, list[int]]] = {
    "tiny": {"seq": [128], "head_dim": [64], "batch": [1], "heads": [2]},
    "quick": {"seq": [256, 512, 1024], "head_dim": [64], "batch": [1], "heads": [8]},
    "thorough": {"seq": [256, 512, 1024, 2048, 4096, 8192], "head_dim": [64, 128],
                 "batch": [1, 4], "heads": [16]},
}
CUDA_QUICK = {"seq": [512, 1024, 2048, 4096], "head_dim": [64, 128], "batch": [4], "heads": [16]}


def attention_precision(precisions: list[str]) -> str:
    """Precision the profile's attention efficiencies are fitted in (mixed-precision dtype)."""
    for p in ("bf16", "fp16", "fp32"):
        if p in precisions:
            return p
    return precisions[0]


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """Forward FLOPs of attention scores and values: 4*b*heads*s^2*d (x0.5 if causal)."""
    f = 4.0 * batch * heads * seq * seq * head_dim
    return f * 0.5 if causal else f


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[name]


def _bench(backend: str, direction: str, precision: str, b: int, h: int, s: int, d: int):
    def run(ctx: RunContext) -> dict:
        from torch.nn.attention import sdpa_kernel

        f_fwd = attention_flops(b, h, s, d)
        flops = f_fwd if direction == "fwd" else (1.0 + BWD_FLOPS_FACTOR) * f_fwd
        if backend == "math":  # materialised scores: b*h*s*s elements (+ softmax, + grads)
            need = b * h * s * s * 4 * (4 if direction == "fwdbwd" else 2)
            if need > 0.25 * ctx.dev.usable_memory_gib * 2**30:
                return unsupported(f"math backend needs ~{need / 2**30:.1f} GiB for scores")
        ctx.check_time(f"attention/{backend}/{direction}/{precision}/", flops)
        dtype = DTYPES[precision]
        grad = direction == "fwdbwd"
        q, k, v = (torch.randn(b, h, s, d, device=ctx.device, dtype=dtype, requires_grad=grad)
                   for _ in range(3))
        go = torch.randn(b, h, s, d, device=ctx.device, dtype=dtype)

        def fwd() -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwdbwd() -> object:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return torch.autograd.grad(out, (q, k, v), go)

        fn = fwd if direction == "fwd" else fwdbwd
        with sdpa_kernel(_backend(backend)):
            try:
                fn()
            except RuntimeError as exc:
                return unsupported(f"{backend} {precision} on {ctx.device.type}: {exc}")
            t = ctx.time(fn)
        return ok(t, flops=flops, flops_fwd=f_fwd)

    return run


def combos(ctx: RunContext) -> list[tuple[str, str]]:
    """(backend, precision) pairs to measure."""
    mode = ctx.settings.mode
    half = attention_precision(ctx.dev.precisions)
    if mode == "thorough":
        precs = [p for p in ctx.dev.precisions if p != "tf32"]
        return [(b, p) for b in BACKENDS for p in precs]
    pairs = [("flash", half), ("efficient", "fp32"), ("math", half)]
    if ctx.dev.kind == "cpu" and half != "fp32":
        pairs.append(("flash", "fp32"))  # SDPA's fused kernel for fp32 on CPU
    return pairs


def plan(ctx: RunContext) -> list[Bench]:
    """Benches for every (backend, precision) pair x direction x shape."""
    mode = ctx.settings.mode
    grid = CUDA_QUICK if (mode == "quick" and ctx.dev.kind == "cuda") else GRIDS[mode]
    pts = [(b, h, s, d) for b in grid["batch"] for h in grid["heads"]
           for s in grid["seq"] for d in grid["head_dim"]]
    pts.sort(key=lambda p: (p[0] * p[1] * p[2] * p[2] * p[3], p))
    benches = []
    for backend, precision in combos(ctx):
        for direction in ("fwd", "fwdbwd"):
            for b, h, s, d in pts:
                key = f"attention/{backend}/{direction}/{precision}/b{b}h{h}s{s}d{d}"
                params = {"backend": backend, "direction": direction, "precision": precision,
                          "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True}
                benches.append(Bench(key, "attention", params,
                                     _bench(backend, direction, precision, b, h, s, d),
                                     ctx.est(4.5 * attention_flops(b, h, s, d), "flops",
                                             4.0 * b * h * s * d * 4)))
    return benches
