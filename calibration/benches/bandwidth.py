"""Bandwidth-bound ops, kernel launch overhead, and their torch.compile'd counterparts.

Bytes moved (``bytes`` in records) are the minimum traffic of the op as eager PyTorch
executes it, with E bytes per element and N elements:

=================  =====  =========================================================
op                 bytes  kernels (eager)
=================  =====  =========================================================
copy (dst.copy_)   2NE    1  (read src, write dst; defines measured CPU bandwidth)
add (a + b)        3NE    1
gelu               2NE    1
layer_norm         2NE    1  (rows of 1024; weight/bias traffic ignored)
rms_norm           2NE    1  (if ``F.rms_norm`` exists)
softmax            2NE    1  (rows of 1024)
cross_entropy      2NE    2  (log_softmax writes log-probs, nll reads one per row;
                              logits T x 50304)
=================  =====  =========================================================

MLP activations (``activation/<act>/<precision>/<n>``): GELU, its tanh approximation and SiLU,
2NE bytes, in fp32 and the device's half type, on layer-sized tensors: each fits its own
bandwidth class (``simulator.hardware.profile.ACTIVATION_CLASSES``), as the tanh approximation is
compute-bound on a CPU. Their backward kernels (``activation_bwd/...``: ``aten::gelu_backward``,
``aten::silu_backward``, what autograd runs) read the output gradient and the input and write
the input gradient, 3NE bytes, the input read cold (saved a forward earlier), and fit the
``.bwd`` classes: a compute-bound activation's backward costs what its arithmetic does, not what
its bytes say.

Launch overhead: a loop of 100 ops on one-element tensors, per op (``time_s`` is per op),
i.e. the host-side cost per eager kernel that dominates small models. Compiled: the same
kind of tiny chain (8 elementwise ops) under ``torch.compile`` becomes one fused kernel;
its per-call time is the compiled launch overhead. Compilation failures (no C++
compiler, no Triton) are recorded as 'unsupported'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from simulator.core.vocab import HALF_PRECISIONS

from ..device import DTYPES
from .base import Bench, RunContext, ok, unsupported
from .cold import cold_bytes, cold_inputs, fresh_outputs

VOCAB = 50304
ROW = 1024
TINY_LOOP = 100

SIZES: dict[str, list[int]] = {  # elements; GPUs get larger sizes (L2 caches of 40-60 MB)
    "tiny": [1 << 16, 1 << 18],
    "quick": [1 << 22, 1 << 24, 1 << 26],
    "thorough": [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28],
}
CUDA_SIZES: dict[str, list[int]] = {
    "tiny": [1 << 20, 1 << 22],
    "quick": [1 << 24, 1 << 26, 1 << 28],
    "thorough": [1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30],
}
# elements of the ``activation/`` benches: an MLP activation of 256-4k tokens x 1-4k wide, whose
# output the heap holds (below the mmap threshold), as in a training step
ACT_SIZES: dict[str, list[int]] = {"tiny": [1 << 16], "quick": [1 << 20, 1 << 22],
                                   "thorough": [1 << 18, 1 << 20, 1 << 22]}
# activations timed apart (ReLU moves bytes like any elementwise op: the elementwise class)
BENCH_ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
# their backward kernels, as autograd calls them: (output gradient, input) -> input gradient
ACTIVATION_BWD_FNS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gelu": lambda g, x: torch.ops.aten.gelu_backward(g, x),
    "gelu_tanh": lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate="tanh"),
    "silu": lambda g, x: torch.ops.aten.silu_backward(g, x),
}
# op -> (bytes per element moved, eager kernels per call)
OPS: dict[str, tuple[int, int]] = {
    "copy": (2, 1), "add": (3, 1), "gelu": (2, 1), "layer_norm": (2, 1),
    "rms_norm": (2, 1), "softmax": (2, 1), "cross_entropy": (2, 2),
}


def _make_op(op: str, n: int, dtype: torch.dtype, device: torch.device, cold: int = 0) -> Callable[[], object]:
    """Allocate inputs for ``op`` over ``n`` elements and return the call to time. ``cold``
    (CPUs, bytes): outputs land in memory last used that many bytes ago, as in a step
    (:mod:`.cold`)."""
    if op == "cross_entropy":
        rows = max(1, n // VOCAB)
        logits = torch.randn(rows, VOCAB, device=device, dtype=dtype)
        target = torch.randint(0, VOCAB, (rows,), device=device)
        return lambda: F.cross_entropy(logits, target)  # a scalar out; its log-probs freed within
    x = torch.randn(n // ROW, ROW, device=device, dtype=dtype)
    if op == "copy":
        ys = cold_inputs(torch.empty_like(x), cold)
        return lambda: next(ys).copy_(x)
    return fresh_outputs(_op_call(op, x), x.numel() * x.element_size(), cold)


def _op_call(op: str, x: torch.Tensor) -> Callable[[], object]:
    """The call of ``op`` on ``x`` (rows of :data:`ROW`)."""
    if op == "add":
        y = torch.randn_like(x)
        return lambda: x + y
    if op == "gelu":
        return lambda: F.gelu(x)
    if op == "softmax":
        return lambda: F.softmax(x, dim=-1)
    w = torch.ones(ROW, device=x.device, dtype=x.dtype)
    if op == "layer_norm":
        b = torch.zeros(ROW, device=x.device, dtype=x.dtype)
        return lambda: F.layer_norm(x, (ROW,), w, b)
    if op == "rms_norm":
        return lambda: F.rms_norm(x, (ROW,), w)
    raise ValueError(op)


def _elements(op: str, n: int) -> int:
    return max(1, n // VOCAB) * VOCAB if op == "cross_entropy" else (n // ROW) * ROW


def _bw_bench(op: str, n: int, precision: str):
    def run(ctx: RunContext) -> dict:
        if op == "rms_norm" and not hasattr(F, "rms_norm"):
            return unsupported("torch.nn.functional.rms_norm not available in this torch")
        dtype = DTYPES[precision]
        per_el, kernels = OPS[op]
        el = _elements(op, n)
        nbytes = float(per_el * el * torch.finfo(dtype).bits // 8)
        if nbytes > 0.5 * ctx.dev.usable_memory_gib * 2**30:
            return unsupported(f"needs {nbytes / 2**30:.1f} GiB, more than half of device memory")
        ctx.check_time("bandwidth/", nbytes, "bytes")
        fn = _make_op(op, n, dtype, ctx.device, cold_bytes(ctx.dev.kind))
        t = ctx.time(fn)
        return ok(t, bytes=nbytes, kernels=kernels, elements=el)

    return run


def _launch_bench(op: str):
    def run(ctx: RunContext) -> dict:
        x = torch.ones(1, device=ctx.device)
        one = {"add": lambda: x + x, "mul": lambda: x * 2.0, "relu": lambda: torch.relu(x),
               "neg": lambda: torch.neg(x)}[op]

        def loop() -> None:
            for _ in range(TINY_LOOP):
                one()

        t = ctx.time(loop)
        rec = ok(t, ops=TINY_LOOP)
        rec["time_s"] = t.fit_s / TINY_LOOP  # per op
        return rec

    return run


def _chain(x: torch.Tensor) -> torch.Tensor:
    """Eight elementwise ops; fused into one kernel under torch.compile."""
    y = x * 2.0 + 1.0
    y = torch.sin(y) * 3.0
    y = torch.relu(y) - x
    return torch.tanh(y) + 0.5


def _compile(fn: Callable, dynamic: bool) -> Callable:
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, dynamic=dynamic)


def _act_bench(act: str, n: int, precision: str):
    def run(ctx: RunContext) -> dict:
        from ..torch_model import ACTIVATION_FNS

        dtype = DTYPES[precision]
        x = torch.randn(n // ROW, ROW, device=ctx.device, dtype=dtype)
        fn = ACTIVATION_FNS[act]
        t = ctx.time(fresh_outputs(lambda: fn(x), x.numel() * x.element_size(), cold_bytes(ctx.dev.kind)))
        return ok(t, bytes=float(2 * n * x.element_size()), kernels=1, elements=n)

    return run


def _act_bwd_bench(act: str, n: int, precision: str):
    def run(ctx: RunContext) -> dict:
        dtype = DTYPES[precision]
        x = torch.randn(n // ROW, ROW, device=ctx.device, dtype=dtype)
        g = torch.randn_like(x)  # the output gradient, just written by the down projection's backward
        cold = cold_bytes(ctx.dev.kind)
        xs = cold_inputs(x, cold)  # the saved input, last touched a whole forward earlier
        fn = ACTIVATION_BWD_FNS[act]
        t = ctx.time(fresh_outputs(lambda: fn(g, next(xs)), x.numel() * x.element_size(), cold))
        return ok(t, bytes=float(3 * n * x.element_size()), kernels=1, elements=n)

    return run


def _compiled_launch(ctx: RunContext) -> dict:
    x = torch.ones(8, device=ctx.device)
    try:
        f = _compile(_chain, dynamic=False)
        f(x)
    except Exception as exc:  # noqa: BLE001 - any compile failure means "not available here"
        return unsupported(f"torch.compile failed: {type(exc).__name__}: {exc}")
    t = ctx.time(lambda: f(x), warmup=3)
    return ok(t, fused_kernels=1, eager_ops=8)


def _compiled_bw(op: str, sizes: list[int], precision: str):
    def run(ctx: RunContext) -> dict:
        dtype = DTYPES[precision]
        points = []
        try:
            w = torch.ones(ROW, device=ctx.device, dtype=dtype)
            fn = {"gelu": lambda x: F.gelu(x),
                  "layer_norm": lambda x: F.layer_norm(x, (ROW,), w)}[op]
            f = _compile(fn, dynamic=True)
            for n in sizes:
                x = torch.randn(n // ROW, ROW, device=ctx.device, dtype=dtype)
                f(x)
                t = ctx.time(lambda x=x: f(x), warmup=2)
                points.append({"elements": n, "bytes": float(2 * n * x.element_size()),
                               "time_s": t.fit_s, "timing": t.as_dict()})
        except Exception as exc:  # noqa: BLE001
            return unsupported(f"torch.compile failed: {type(exc).__name__}: {exc}")
        best = min(points, key=lambda p: p["time_s"] / p["bytes"])
        return {"status": "ok", "time_s": best["time_s"], "bytes": best["bytes"], "points": points}

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """Launch overhead, eager bandwidth ops, compiled variants (moved last by ``plan``)."""
    mode = ctx.settings.mode
    b = ctx.settings.budget_s
    benches = [Bench(f"launch/eager/{op}", "launch", {"op": op, "loop": TINY_LOOP},
                     _launch_bench(op), b + 0.05) for op in ("add", "mul", "relu", "neg")]
    sizes_all = (CUDA_SIZES if ctx.dev.kind == "cuda" else SIZES)[mode]
    precs = ["fp32"] if mode != "thorough" else ["fp32"] + [p for p in ctx.dev.precisions if p in HALF_PRECISIONS]
    for precision in precs:
        for n in sizes_all:
            for op in OPS:
                benches.append(Bench(f"bandwidth/{op}/{precision}/{n}", "bandwidth",
                                     {"op": op, "precision": precision, "elements": n},
                                     _bw_bench(op, n, precision),
                                     ctx.est(OPS[op][0] * 4.0 * n, "bytes", 4.0 * n)))
    for precision in ["fp32", *ctx.half]:
        for act in BENCH_ACTIVATIONS:
            for n in ACT_SIZES[mode]:
                benches.append(Bench(f"activation/{act}/{precision}/{n}", "bandwidth",
                                     {"op": act, "precision": precision, "elements": n},
                                     _act_bench(act, n, precision), ctx.est(2 * 4.0 * n, "bytes", 4.0 * n)))
                benches.append(Bench(f"activation_bwd/{act}/{precision}/{n}", "bandwidth",
                                     {"op": act, "precision": precision, "elements": n},
                                     _act_bwd_bench(act, n, precision), ctx.est(3 * 4.0 * n, "bytes", 4.0 * n)))
    if ctx.settings.compile:
        benches.append(Bench("compiled/launch/chain8", "compiled", {"eager_ops": 8},
                             _compiled_launch, 20.0))
        sizes = sizes_all[-2:] if mode == "quick" else sizes_all
        cops = ["gelu"] if mode != "thorough" else ["gelu", "layer_norm"]
        for op in cops:
            benches.append(Bench(f"compiled/bandwidth/{op}/fp32", "compiled",
                                 {"op": op, "precision": "fp32", "sizes": sizes},
                                 _compiled_bw(op, sizes, "fp32"), 10.0 + len(sizes) * b))
    return benches
