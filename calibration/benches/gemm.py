"""GEMM benchmarks: C(m x n) = A(m x k) @ B(k x n) per precision, over an (m, n, k) grid.

The grid has square GEMMs, thin GEMMs (small m, as in small micro-batches) and the shapes
of preset transformer layers: for hidden size h and t tokens per micro-batch, the forward
QKV (t, 3h, h), output (t, h, h), MLP up (t, 4h, h) and down (t, h, 4h) projections and
the weight-gradient GEMM of the MLP up projection (4h, h, t). Work: flops = 2*m*n*k.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ..device import DTYPES
from ..timing import Timing
from . import Bench, RunContext, ok

GRIDS: dict[str, dict[str, list[int]]] = {
    "tiny": {"square": [64, 128, 256], "thin_m": [], "hidden": [], "tokens": []},
    "quick": {"square": [128, 256, 512, 1024, 2048], "thin_m": [16, 64],
              "hidden": [256, 768], "tokens": [512, 2048]},
    "thorough": {"square": [128, 256, 512, 1024, 2048, 4096, 8192],
                 "thin_m": [1, 8, 16, 32, 64, 128, 256],
                 "hidden": [768, 1024, 2048, 4096], "tokens": [512, 1024, 2048, 4096, 8192]},
}


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
#: sysfs cache directory of the first CPU (Linux)
SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


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


def last_level_cache_bytes(root: str = SYSFS_CACHE) -> int | None:
    """Size of this CPU's largest cache in bytes (sysfs ``size``, e.g. ``32768K``), or None."""
    from pathlib import Path

    sizes = []
    for d in Path(root).glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


#: a CPU GEMM bench cycles its second operand through copies totalling this many times the last
#: level cache, so each call reads it from memory as a training step does (a layer's weight was
#: last touched a whole step earlier; a saved activation, a whole forward earlier)
COLD_LLC_FACTOR = 2
#: at most this many copies of the operand, and at most this many bytes of them
COLD_MAX_COPIES = 64
COLD_MAX_BYTES = 1 << 30


def cold_copies(operand_bytes: float, cold_bytes: int) -> int:
    """Copies of an operand of ``operand_bytes`` to cycle through so that together they span
    ``cold_bytes`` (1: no cycling)."""
    if cold_bytes <= 0 or operand_bytes <= 0:
        return 1
    return int(max(1, min(COLD_MAX_COPIES, -(-cold_bytes // int(operand_bytes)), COLD_MAX_BYTES // int(operand_bytes))))


def _cycled(t: torch.Tensor, copies: int) -> Iterator[torch.Tensor]:
    """Endless cycle over ``copies`` copies of ``t``, held in one allocation: a pool of at least
    the mmap threshold is mapped and unmapped whole, so it leaves no free space in the heap for
    later allocations (the fresh-memory bench) to reuse."""
    if copies == 1:
        return itertools.cycle([t])
    pool = t.new_empty((copies, *t.shape))
    pool.copy_(t.expand(copies, *t.shape))
    return itertools.cycle(pool.unbind(0))


def model_tokens(n: int, k: int, flop_cap: float, most: int = 512) -> int:
    """Largest power-of-two token count (16..``most``) whose (tokens, n, k) GEMM stays under
    ``flop_cap`` FLOPs, so a big model's shapes fit a quick calibration of a small device."""
    t = most
    while t > 16 and 2.0 * t * n * k > flop_cap:
        t //= 2
    return t


def model_shapes(model, flop_cap: float = 4e9) -> set[tuple[int, int, int]]:
    """Forward GEMMs of one layer of ``model`` and its LM head (tokens per :func:`model_tokens`)."""

    h, f = model.hidden, model.ffn_hidden
    up = 2 * f if model.gated_mlp else f
    nk = [(h + 2 * model.kv_dim, h), (h, h), (up, h), (h, f), (model.vocab_size, h)]
    return {(model_tokens(n, k, flop_cap), n, k) for n, k in nk}


def shapes(mode: str, model=None, flop_cap: float = 4e9) -> list[tuple[int, int, int]]:
    """(m, n, k) shapes for ``mode`` (plus ``model``'s), ascending in FLOPs, without duplicates."""
    g = GRIDS[mode]
    out: set[tuple[int, int, int]] = {(s, s, s) for s in g["square"]}
    out |= set(HEAD_SHAPES[mode]) | set(BWD_SHAPES[mode])
    if model is not None:
        out |= model_shapes(model, flop_cap)
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


def _bench(precision: str, m: int, n: int, k: int, cache: dict[str, int] | None = None, cold_bytes: int = 0):
    """Time an (m, n, k) GEMM in the three operand layouts a training step runs it in, and
    report their mean: forward ``F.linear`` (x @ W^T, weight stored (n, k)), input gradient
    (g @ W, both row-major) and weight gradient (g^T @ x, first operand transposed). On GPUs the
    three are close; on CPUs the library picks different kernels per layout (oneDNN's bf16
    ``F.linear`` runs ~10x faster than bf16 ``torch.mm`` on an AVX2 CPU), so timing only one
    layout would misdescribe training. ``cold_bytes`` (CPUs): the second operand (the weight; in
    the weight-gradient layout the saved activation) cycles through :func:`cold_copies`, so it
    comes from memory, not from a last-level cache that a warm benchmark fits in."""

    def run(ctx: RunContext) -> dict:
        flops = 2.0 * m * n * k
        ctx.check_time(f"gemm/{precision}/", flops)
        dtype = DTYPES[precision]
        x = torch.randn(m, k, device=ctx.device, dtype=dtype)
        w = torch.randn(n, k, device=ctx.device, dtype=dtype)  # nn.Linear weight layout
        b = torch.randn(k, n, device=ctx.device, dtype=dtype)
        xt = torch.randn(k, m, device=ctx.device, dtype=dtype)
        copies = cold_copies(n * k * x.element_size(), cold_bytes)
        nw, nb = _cycled(w, copies), _cycled(b, copies)
        layouts = {
            "linear_nt": lambda: F.linear(x, next(nw)),
            "mm_nn": lambda: torch.mm(x, next(nb)),
            "mm_tn": lambda: torch.mm(xt.t(), next(nb)),
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
        if copies > 1:
            rec["operand_copies"] = copies
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """One bench per (precision, shape)."""
    benches = []
    cache = cache_geometry() if ctx.dev.kind == "cpu" else None
    llc = last_level_cache_bytes() if ctx.dev.kind == "cpu" else None
    cold = COLD_LLC_FACTOR * llc if llc else 0
    for precision in ctx.dev.precisions:
        cap = 4e9 if ctx.dev.kind == "cpu" else 4e12  # FLOPs of one model-shaped GEMM call
        extra = FP32_SHAPES[ctx.settings.mode] if precision == "fp32" else []
        if cache and precision in ("bf16", "fp16"):
            extra = WALK_SHAPES[ctx.settings.mode]
        for m, n, k in sorted(set(shapes(ctx.settings.mode, ctx.settings.model, cap)) | set(extra),
                              key=lambda s: (s[0] * s[1] * s[2], s)):
            benches.append(Bench(f"gemm/{precision}/{m}x{n}x{k}", "gemm",
                                 {"precision": precision, "m": m, "n": n, "k": k},
                                 _bench(precision, m, n, k, cache, cold),
                                 ctx.est(2.0 * m * n * k, "flops", 2.0 * (m * k + k * n))))
    return benches
