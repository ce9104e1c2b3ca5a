"""GEMM benchmarks: C(m x n) = A(m x k) @ B(k x n) per precision, over an (m, n, k) grid.

The grid has square GEMMs, thin GEMMs (small m, as in small micro-batches) and the shapes
of preset transformer layers: for hidden size h and t tokens per micro-batch, the forward
QKV (t, 3h, h), output (t, h, h), MLP up (t, 4h, h) and down (t, h, 4h) projections and
the weight-gradient GEMM of the MLP up projection (4h, h, t). Work: flops = 2*m*n*k.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..device import DTYPES
from ..timing import Timing
from .base import Bench, RunContext, ok
from .cold import SYSFS_CACHE, cold_bytes, cold_inputs, fresh_outputs

GRIDS: dict[str, dict[str, list[int]]] = {
    "tiny": {"square": [64, 128, 256], "thin_m": [], "hidden": [], "tokens": []},
    "quick": {"square": [128, 256, 512, 1024, 2048], "thin_m": [16, 64],
              "hidden": [256, 768], "tokens": [512, 2048]},
    "thorough": {"square": [128, 256, 512, 1024, 2048, 4096, 8192],
                 "thin_m": [1, 8, 16, 32, 64, 128, 256],
                 "hidden": [768, 1024, 2048, 4096], "tokens": [512, 1024, 2048, 4096, 8192]},
}


#: CUDA only, on top of GRIDS: the GEMMs of real layers, so the largest shapes reach saturation (an H200's
#: quick grid stopped at 2048^3, 0.66 of peak, where layer GEMMs run at 0.74-0.77 and the fit extrapolated
#: e_max to the peak): QKV (t, 3h, h), MLP up (t, 4h, h) and down (t, h, 4h) of hidden sizes h at t tokens
#: per micro-batch, squares and an LM head (tokens, vocabulary, hidden); each timed in the three layouts.
#: Quick: 9 shapes x 4 precisions, about 60 s on an H200 (its quick run took 0.9-1.7 s per GEMM bench,
#: 187 s in all; the shapes' own time is ~11 s of it at 51-700 TFLOP/s), so --quick stays near 4 minutes
GPU_LAYERS: dict[str, dict[str, list]] = {
    "tiny": {"hidden": [], "tokens": [], "square": [], "head": []},
    "quick": {"hidden": [768, 4096], "tokens": [16384], "square": [4096, 8192],
              "head": [(8192, 50304, 2048)]},
    "thorough": {"hidden": [768, 1024, 2048, 2560, 4096], "tokens": [4096, 16384], "square": [4096, 8192, 16384],
                 "head": [(8192, 50304, 2048), (8192, 128256, 4096)]},
}
#: tokens per micro-batch of a --for-model shape at most (CPU, GPU): a GPU trains at thousands
MODEL_TOKENS = {"cpu": 512, "cuda": 16384}
#: LM-head shapes (tokens, vocabulary, hidden): a wide n over a thin k, as small models have
HEAD_SHAPES = {"tiny": [], "quick": [(256, 8192, 128), (512, 4096, 256)],
               "thorough": [(256, 8192, 128), (512, 4096, 256), (1024, 32768, 256), (2048, 50304, 512)]}
#: Backward-layout shapes, few FLOPs each: large (k x n) operands (the LM head's input gradient
#: g @ W reduces over the vocabulary; unblocked kernels slow down once the operand leaves the
#: caches), large (m x n) outputs with short reductions (the weight gradient g^T @ x reduces over
#: the tokens of a micro-batch; outputs of 4-32 MiB, as a large vocabulary's head has)
_BWD_QUICK = [(8, 256, 65536), (8, 1024, 16384), (16, 512, 8192), (8192, 256, 64), (16384, 512, 32),
              (32768, 256, 32), (8192, 1024, 32)]
BWD_SHAPES = {"tiny": [], "quick": _BWD_QUICK, "thorough": _BWD_QUICK + [(32, 768, 50304), (32768, 512, 128)]}
#: fp32 only (cheap there; hours in an unblocked bf16 layout): a micro-batch of 64-256 tokens through
#: weights of 12-64 MiB, which run below what the thickness alone predicts on a CPU
FP32_SHAPES = {"tiny": [], "quick": [(64, 4096, 1024), (128, 3072, 1024), (128, 16384, 1024), (256, 4096, 2048)],
               "thorough": [(64, 4096, 1024), (128, 3072, 1024), (128, 16384, 1024), (256, 4096, 2048)]}


#: CPU, half precision only: the input-gradient layout's reference kernel (no bf16 BLAS) walks a
#: column of the (k x n) operand, n elements apart, per dot product; its speed depends on how many
#: L1/L2 sets that stride reaches and on the column's length k (kernels.strided_walk_factor).
#: Strides of 384-2304 bytes (n = 192..1152 in bf16) that reach 16-32 L1 sets, of 1-3 KiB that reach
#: 2-8, and columns from 1/8 to ~8 times what the L2 keeps at the stride; m = 16-32 tokens (the
#: kernel's speed does not depend on m), each under ~0.3 s
WALK_SHAPES = {"tiny": [], "quick": [(32, 192, 1536), (32, 384, 512), (32, 384, 4096), (16, 384, 16384),
                                     (32, 640, 1024), (32, 1152, 512), (32, 768, 512), (32, 512, 512),
                                     (32, 1024, 256), (32, 512, 2048), (16, 768, 3072)]}
WALK_SHAPES["thorough"] = WALK_SHAPES["quick"] + [(32, 320, 4096), (32, 576, 2048), (32, 1536, 384),
                                                  (32, 2560, 512), (16, 384, 24576)]


def cache_geometry(root: str = SYSFS_CACHE) -> dict[str, int] | None:
    """L1 data and L2 cache geometry of this CPU from Linux sysfs: line bytes, sets and ways
    (``{"line_bytes", "l1_sets", "l1_ways", "l2_sets", "l2_ways"}``), None where unreadable."""
    from pathlib import Path

    out: dict[str, int] = {}
    for d in sorted(Path(root).glob("index*")):
        try:
            level, kind = int((d / "level").read_text()), (d / "type").read_text().strip()
            sets, ways = int((d / "number_of_sets").read_text()), int((d / "ways_of_associativity").read_text())
            line = int((d / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        if (level, kind) in ((1, "Data"), (2, "Unified")) and sets > 0 and ways > 0:
            out |= {f"l{level}_sets": sets, f"l{level}_ways": ways, "line_bytes": line}
    return out if len(out) == 5 else None


def model_tokens(n: int, k: int, flop_cap: float, most: int = 512) -> int:
    """Largest power-of-two token count (16..``most``) whose (tokens, n, k) GEMM stays under
    ``flop_cap`` FLOPs, so a big model's shapes fit a quick calibration of a small device."""
    t = most
    while t > 16 and 2.0 * t * n * k > flop_cap:
        t //= 2
    return t


def model_shapes(model, flop_cap: float = 4e9, most: int = 512) -> set[tuple[int, int, int]]:
    """Forward GEMMs of one layer of ``model`` and its LM head (tokens per :func:`model_tokens`, at most ``most``)."""

    h, f = model.hidden, model.ffn_hidden
    up = 2 * f if model.gated_mlp else f
    nk = [(h + 2 * model.kv_dim, h), (h, h), (up, h), (h, f), (model.vocab_size, h)]
    return {(model_tokens(n, k, flop_cap, most), n, k) for n, k in nk}


def gpu_layer_shapes(mode: str) -> set[tuple[int, int, int]]:
    """The (m, n, k) shapes :data:`GPU_LAYERS` adds to ``mode``'s grid on a GPU."""
    g = GPU_LAYERS[mode]
    out = {(s, s, s) for s in g["square"]} | set(g["head"])
    for h in g["hidden"]:
        for t in g["tokens"]:
            out |= {(t, 3 * h, h), (t, 4 * h, h), (t, h, 4 * h)}
    return out


def shapes(mode: str, model=None, flop_cap: float = 4e9, kind: str = "cpu") -> list[tuple[int, int, int]]:
    """(m, n, k) shapes for ``mode`` on a device of ``kind`` ('cpu', or 'cuda': :func:`gpu_layer_shapes`
    too), plus ``model``'s, ascending in FLOPs, without duplicates."""
    g = GRIDS[mode]
    out: set[tuple[int, int, int]] = {(s, s, s) for s in g["square"]}
    out |= set(HEAD_SHAPES[mode]) | set(BWD_SHAPES[mode])
    if kind == "cuda":
        out |= gpu_layer_shapes(mode)
    if model is not None:
        out |= model_shapes(model, flop_cap, MODEL_TOKENS.get(kind, MODEL_TOKENS["cpu"]))
    thin_nk = 1024 if mode == "quick" else 4096
    out |= {(m, thin_nk, thin_nk) for m in g["thin_m"]}
    for h in g["hidden"]:
        for t in g["tokens"]:
            out |= {(t, 4 * h, h), (t, h, 4 * h), (4 * h, h, t)}
            if mode == "thorough":
                out |= {(t, 3 * h, h), (t, h, h), (t, 4 * h, h), (h, 4 * h, t)}
    return sorted(out, key=lambda s: (s[0] * s[1] * s[2], s))


@contextlib.contextmanager
def precision_mode(precision: str, device: torch.device) -> Iterator[None]:
    """Enable TF32 matmuls only for 'tf32' (CUDA); restore the previous setting after."""
    if device.type != "cuda":
        yield
        return
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def _bench(precision: str, m: int, n: int, k: int, cache: dict[str, int] | None = None, cold: int = 0):
    """Time an (m, n, k) GEMM in the three operand layouts a training step runs it in, and
    report their mean: forward ``F.linear`` (x @ W^T, weight stored (n, k)), input gradient
    (g @ W, both row-major) and weight gradient (g^T @ x, first operand transposed). On GPUs the
    three are close; on CPUs the library picks different kernels per layout (oneDNN's bf16
    ``F.linear`` runs ~10x faster than bf16 ``torch.mm`` on an AVX2 CPU), so timing only one
    layout would misdescribe training. ``cold`` (CPUs, bytes): the second operand (the weight; in
    the weight-gradient layout the saved activation) comes from :func:`~.cold.cold_inputs`,
    and each output lands in memory last used ``cold`` bytes ago (:func:`~.cold.fresh_outputs`),
    as in a step, not in a last-level cache that a warm benchmark fits in."""

    def run(ctx: RunContext) -> dict:
        flops = 2.0 * m * n * k
        ctx.check_time(f"gemm/{precision}/", flops)
        dtype = DTYPES[precision]
        x = torch.randn(m, k, device=ctx.device, dtype=dtype)
        w = torch.randn(n, k, device=ctx.device, dtype=dtype)  # nn.Linear weight layout
        b = torch.randn(k, n, device=ctx.device, dtype=dtype)
        xt = torch.randn(k, m, device=ctx.device, dtype=dtype)
        nw, nb = cold_inputs(w, cold), cold_inputs(b, cold)
        out = m * n * x.element_size()
        layouts = {
            "linear_nt": fresh_outputs(lambda: F.linear(x, next(nw)), out, cold),
            "mm_nn": fresh_outputs(lambda: torch.mm(x, next(nb)), out, cold),
            "mm_tn": fresh_outputs(lambda: torch.mm(xt.t(), next(nb)), out, cold),
        }
        budget = ctx.settings.budget_s / len(layouts)
        with precision_mode(precision, ctx.device):
            times = [ctx.time(fn, budget_s=budget) for fn in layouts.values()]
        mean = Timing(median_s=sum(t.median_s for t in times) / 3, iqr_s=max(t.iqr_s for t in times),
                      min_s=sum(t.min_s for t in times) / 3, samples=min(t.samples for t in times),
                      calls=sum(t.calls for t in times))
        rec = ok(mean, flops=flops)
        rec["layouts_s"] = {name: t.fit_s for name, t in zip(layouts, times, strict=True)}
        rec["layouts_times"] = {name: list(t.times) for name, t in zip(layouts, times, strict=True)}
        if cache:
            rec["cache"] = cache
        if cold:
            rec["cold_bytes"] = cold
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """One bench per (precision, shape)."""
    benches = []
    cache = cache_geometry() if ctx.dev.kind == "cpu" else None
    cold = cold_bytes(ctx.dev.kind)
    for precision in ctx.dev.precisions:
        cap = 4e9 if ctx.dev.kind == "cpu" else 4e12  # FLOPs of one model-shaped GEMM call
        extra = FP32_SHAPES[ctx.settings.mode] if precision == "fp32" else []
        if cache and precision in ("bf16", "fp16"):
            extra = WALK_SHAPES[ctx.settings.mode]
        for m, n, k in sorted(set(shapes(ctx.settings.mode, ctx.settings.model, cap, ctx.dev.kind)) | set(extra),
                              key=lambda s: (s[0] * s[1] * s[2], s)):
            benches.append(Bench(f"gemm/{precision}/{m}x{n}x{k}", "gemm",
                                 {"precision": precision, "m": m, "n": n, "k": k},
                                 _bench(precision, m, n, k, cache, cold),
                                 ctx.est(2.0 * m * n * k, "flops", 2.0 * (m * k + k * n))))
    return benches
