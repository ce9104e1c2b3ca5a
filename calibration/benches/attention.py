"""Attention benchmarks: ``scaled_dot_product_attention`` per SDPA backend, causal.

Backends: 'flash' (FlashAttention), 'efficient' (memory-efficient), 'math' (eager
reference, materialises the s x s scores). Directions: 'fwd' and 'fwdbwd' (forward then
backward through ``torch.autograd.grad``). Unsupported backend/dtype combinations (e.g.
'efficient' on CPU) are recorded as 'unsupported', not errors.

FLOP convention (the same as ``simulator.model.workload.attention_flops_fwd`` and
``simulator.physics.compute``): forward = 4*b*heads*s^2*d, halved for causal masking (what fused
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
from .base import Bench, RunContext, ok, unsupported

BACKENDS = ("flash", "efficient", "math")
BWD_FLOPS_FACTOR = 2.5  # backward FLOPs / forward FLOPs (fused attention)

# (batch, heads, seq, head_dim) points: head size x sequence x batch*heads, chosen so that the
# efficiency's dependence on head size (head_dim_half) and on sequence (seq_half) is identifiable
POINTS: dict[str, list[tuple[int, int, int, int]]] = {
    "tiny": [(1, 2, 128, 64), (1, 2, 256, 32)],
    "quick": [(1, 8, 128, 64), (1, 8, 512, 64), (1, 8, 1024, 64), (1, 4, 2048, 64), (1, 8, 512, 32),
              (1, 8, 512, 128), (4, 4, 256, 32)],
    "thorough": [(b, h, s, d) for b, h in ((1, 16), (4, 16)) for s in (256, 512, 1024, 2048, 4096, 8192)
                 for d in (32, 64, 128)],
}
#: CUDA: 4 x 16 heads to 4k tokens, and 16k tokens x 16 heads at 8k (training shapes; head sizes 64 and 128)
CUDA_QUICK = ([(4, 16, s, d) for s in (512, 1024, 2048, 4096) for d in (64, 128)] + [(8, 16, 1024, 32)]
              + [(2, 16, 8192, d) for d in (64, 128)])
SECONDARY = 3  # points of the sweep kept for the backends/precisions not used for the shape fit


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


def _backend(name: str, device_type: str = "cpu"):
    """The SDPA backends a bench allows. 'flash' on CUDA: the fused half-precision kernels SDPA picks by
    default, cuDNN's where torch has it (on Hopper training steps run cuDNN's sm90 flash kernels, about
    twice FlashAttention-2's speed at 4k-16k tokens: calibration/results/h200) else FlashAttention."""
    from torch.nn.attention import SDPBackend

    if name == "flash" and device_type == "cuda" and hasattr(SDPBackend, "CUDNN_ATTENTION"):
        return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]
    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[name]


def _allow(sdpa_kernel, backends):
    """``sdpa_kernel`` allowing ``backends``, a list tried in its order where torch can be told one."""
    if isinstance(backends, list):
        try:
            return sdpa_kernel(backends, set_priority=True)
        except TypeError:  # torch before set_priority: its own order among those allowed
            return sdpa_kernel(backends)
    return sdpa_kernel(backends)


def _bench(backend: str, direction: str, precision: str, b: int, h: int, s: int, d: int,
           guard: bool = True):
    def run(ctx: RunContext) -> dict:
        from torch.nn.attention import sdpa_kernel

        f_fwd = attention_flops(b, h, s, d)
        flops = f_fwd if direction == "fwd" else (1.0 + BWD_FLOPS_FACTOR) * f_fwd
        if backend == "math":  # materialised scores: b*h*s*s elements (+ softmax, + grads)
            need = b * h * s * s * 4 * (4 if direction == "fwdbwd" else 2)
            if need > 0.25 * ctx.dev.usable_memory_gib * 2**30:
                return unsupported(f"math backend needs ~{need / 2**30:.1f} GiB for scores")
        if guard:  # the shape-fit sweep is sized in advance; one slow early point must not cut it
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
        with _allow(sdpa_kernel, _backend(backend, ctx.device.type)):
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


def shape_fit_combo(ctx: RunContext) -> tuple[str, str]:
    """(backend, precision) whose sweep fits ``head_dim_half`` and ``seq_half``: the fused kernel
    in fp32 on a CPU (where bf16 kernels are emulated), in the mixed-precision dtype on a GPU."""
    if ctx.dev.kind == "cpu":
        return ("flash", "fp32")
    return ("flash", attention_precision(ctx.dev.precisions))


def plan(ctx: RunContext) -> list[Bench]:
    """Benches for every (backend, precision) pair x direction x shape."""
    mode = ctx.settings.mode
    pts = list(CUDA_QUICK if (mode == "quick" and ctx.dev.kind == "cuda") else POINTS[mode])
    model = ctx.settings.model
    if model is not None:  # the asked-about model's head size and sequence (capped on a CPU)
        seq = min(model.default_seq_len, 1024 if ctx.dev.kind == "cpu" else 8192)
        pts.append((1, min(model.n_heads, 16), seq, model.head_dim))
    pts = sorted(set(pts), key=lambda p: (p[0] * p[1] * p[2] * p[2] * p[3], p))
    main = shape_fit_combo(ctx)
    benches = []
    for backend, precision in combos(ctx):
        # the full sweep where the shape dependence is fitted; a few points elsewhere (quick)
        use = pts if (backend, precision) == main or mode == "thorough" else pts[:SECONDARY]
        for direction in ("fwd", "fwdbwd"):
            for b, h, s, d in use:
                key = f"attention/{backend}/{direction}/{precision}/b{b}h{h}s{s}d{d}"
                params = {"backend": backend, "direction": direction, "precision": precision,
                          "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True}
                benches.append(Bench(key, "attention", params,
                                     _bench(backend, direction, precision, b, h, s, d,
                                            guard=(backend, precision) != main or mode == "thorough"),
                                     ctx.est(4.5 * attention_flops(b, h, s, d), "flops",
                                             4.0 * b * h * s * d * 4)))
    return benches
