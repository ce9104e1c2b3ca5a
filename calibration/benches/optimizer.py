"""Optimizer-step benchmarks: ``torch.optim.AdamW`` per implementation, and CPU Adam.

Parameters mimic transformer layers of hidden size h (QKV, output, MLP up/down weights
and biases, two LayerNorms), fp32, with gradients present. Implementations:
'for_loop' (foreach=False), 'foreach' (foreach=True), 'fused' (fused=True, where the
device supports it).

Bytes per parameter (``ADAM_BYTES_PER_PARAM``): an fp32 AdamW step reads the parameter,
its gradient and both moments (4 x 4 B) and writes the parameter and both moments
(3 x 4 B): 28 B/param of memory traffic. ``bytes`` in records = 28 x params; fitting
divides by the device bandwidth to get ``optimizer_bw_eff``. On a CPU the records also carry
``fault_bytes``: host memory faulted in per call (minor page faults x page size, measured), so
that fitting subtracts what fresh pages cost instead of guessing whether the allocator reused
them (:func:`counting_faults`).
"""

from __future__ import annotations

import mmap
import resource
from collections.abc import Callable

import torch

from .base import Bench, RunContext, ok, unsupported

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


def kernel_counts_faults() -> bool:
    """Whether this kernel reports minor page faults in ``getrusage``: a fresh anonymous mapping
    of 4 MiB (huge pages refused, so each 4 KiB page faults once) is written and its faults
    counted. Some sandboxes (gVisor among them) always report 0, and some hosts serve
    allocations from memory already mapped; a count of 0 there means "not measured", not
    "no fresh pages"."""
    size = 4 << 20
    with mmap.mmap(-1, size) as buf:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            buf.madvise(mmap.MADV_NOHUGEPAGE)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for off in range(0, size, resource.getpagesize()):
            buf[off] = 1
        faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return faulted * resource.getpagesize() >= size // 2


def counting_faults(fn: Callable[[], object]) -> tuple[Callable[[], None], Callable[[], float | None]]:
    """``fn`` wrapped to count the host page faults of each call, and a function returning the
    fewest bytes one call faulted in so far (minor faults x page size; 0 before any call): the
    fastest call, whose time the record keeps, is the one whose temporaries the allocator reused
    most. The kernel zeroes and maps every such page: the fresh-page cost of that call. Where
    the kernel does not count faults (:func:`kernel_counts_faults`) the count is ``None``, and
    fitting models the fresh pages instead (:func:`calibration.build._faulted_s`)."""
    counts: list[int] = []
    counted = kernel_counts_faults()

    def wrapped() -> None:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

    def fault_bytes() -> float | None:
        if not counted:
            return None
        return float(min(counts) * resource.getpagesize()) if counts else 0.0

    return wrapped, fault_bytes


#: Bytes written between timed optimizer calls on a CPU so that they start, as in training, with
#: the parameters, gradients and moments out of the caches (a forward and backward pass touches
#: far more than the last-level cache in between): at least this many, and
#: :data:`calibration.benches.cold.COLD_LLC_FACTOR` times the last-level cache where sysfs tells it
#: (a 300 MiB L3 kept a 128 MiB flush's victims).
FLUSH_BYTES = 128 << 20


def flush_bytes() -> int:
    """Bytes to write between timed calls so that their data leaves the caches."""
    from .cold import cold_bytes

    return max(FLUSH_BYTES, cold_bytes("cpu"))


def time_cold(ctx: RunContext, fn: Callable[[], object]):
    """Time ``fn`` on a CPU with the caches flushed (:func:`flush_bytes` written) before each call,
    outside the timed interval: one warm-up call, then calls until the run's budget is spent
    and at least ``min_runs`` are timed. Returns a :class:`calibration.timing.Timing`."""
    import time

    from ..timing import Timing

    flush = torch.empty(flush_bytes() // 4)
    fn()
    times: list[float] = []
    while len(times) < ctx.settings.min_runs or sum(times) < ctx.settings.budget_s:
        flush.fill_(1.0)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return Timing.of_calls(times)


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
        step, faults = counting_faults(opt.step)
        t = ctx.time(step) if device == ctx.device else _time_cpu(ctx, step)
        return ok(t, params=n, tensors=len(params), bytes=float(ADAM_BYTES_PER_PARAM * n), fault_bytes=faults())

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
