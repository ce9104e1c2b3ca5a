"""Optimizer-step benchmarks: ``torch.optim.AdamW`` per implementation, and CPU Adam.

Parameters mimic transformer layers of hidden size h (QKV, output, MLP up/down weights
and biases, two LayerNorms), fp32, with gradients present. Implementations:
'for_loop' (foreach=False), 'foreach' (foreach=True), 'fused' (fused=True, where the
device supports it).

Bytes per parameter (``ADAM_BYTES_PER_PARAM``): an fp32 AdamW step reads the parameter,
its gradient and both moments (4 x 4 B) and writes the parameter and both moments
(3 x 4 B): 28 B/param of memory traffic. ``bytes`` in records = 28 x params; fitting
divides by the device bandwidth to get ``optimizer_bw_eff``.
"""

from __future__ import annotations

import torch

from . import Bench, RunContext, ok, unsupported

ADAM_BYTES_PER_PARAM = 28  # fp32: read p, g, m, v (16 B) + write p, m, v (12 B)
IMPLS = ("for_loop", "foreach", "fused")

SIZES: dict[str, tuple[int, list[int]]] = {  # hidden size, layer counts
    "tiny": (128, [1]),
    "quick": (512, [1]),
    "thorough": (1024, [1, 2, 4, 8]),
}


def layer_shapes(h: int) -> list[tuple[int, ...]]:
    """Parameter shapes of one transformer layer with hidden size ``h``."""
    return [(3 * h, h), (3 * h,), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,),
            (h,), (h,), (h,), (h,)]


def make_params(h: int, layers: int, device: torch.device) -> list[torch.Tensor]:
    """fp32 parameters (with random gradients) for ``layers`` layers of hidden size ``h``."""
    params = []
    for _ in range(layers):
        for shape in layer_shapes(h):
            p = torch.randn(shape, device=device) * 0.02
            p.requires_grad_(True)
            p.grad = torch.randn_like(p) * 1e-3
            params.append(p)
    return params


def _adamw(params: list[torch.Tensor], impl: str) -> torch.optim.Optimizer:
    kw = {"for_loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **kw)


def _bench(impl: str, h: int, layers: int, device_type: str):
    def run(ctx: RunContext) -> dict:
        device = torch.device("cpu") if device_type == "cpu" else ctx.device
        params = make_params(h, layers, device)
        n = sum(p.numel() for p in params)
        try:
            opt = _adamw(params, impl)
            with torch.no_grad():
                opt.step()
        except (RuntimeError, ValueError) as exc:
            return unsupported(f"AdamW {impl} on {device.type}: {exc}")
        t = ctx.time(opt.step) if device == ctx.device else _time_cpu(ctx, opt.step)
        return ok(t, params=n, tensors=len(params), bytes=float(ADAM_BYTES_PER_PARAM * n))

    return run


def _time_cpu(ctx: RunContext, fn) -> object:
    from ..timing import measure

    return measure(fn, ctx.settings.budget_s, "cpu", min_runs=ctx.settings.min_runs)


def plan(ctx: RunContext) -> list[Bench]:
    """AdamW on the device per implementation and size; CPU Adam when the device is a GPU."""
    h, layer_counts = SIZES[ctx.settings.mode]
    b = ctx.settings.budget_s
    benches = []
    for impl in IMPLS:
        for layers in layer_counts:
            benches.append(Bench(f"optimizer/{impl}/h{h}x{layers}", "optimizer",
                                 {"impl": impl, "hidden": h, "layers": layers},
                                 _bench(impl, h, layers, ctx.device.type),
                                 ctx.est(ADAM_BYTES_PER_PARAM * 12.6e6 * layers * (h / 1024) ** 2,
                                         "bytes", 8.0 * 12.6e6 * layers * (h / 1024) ** 2)))
    if ctx.dev.kind != "cpu":  # on a CPU device the optimizer benches above are CPU Adam
        for impl in ("fused", "foreach"):
            for layers in layer_counts:
                benches.append(Bench(f"cpu_adam/{impl}/h{h}x{layers}", "cpu_adam",
                                     {"impl": impl, "hidden": h, "layers": layers},
                                     _bench(impl, h, layers, "cpu"),
                                     b + 0.5 + 2.0 * layers * (h / 1024) ** 2))
    return benches
