"""Where a training step's time goes: measured per operation class beside the simulator's prediction.

``python -m calibration.opcompare --profile P --suite S --config ID`` builds the configuration's
model (:mod:`calibration.torch_model`), runs warm-up steps, profiles one training step with
``torch.profiler`` (CPU activities, input shapes) and groups every operator's self time by
operation class and phase (forward, backward including recomputation, optimizer). Beside it, the
simulator's time of the same classes from its operation list (:mod:`simulator.model.graphs`,
:mod:`simulator.physics.compute`, :mod:`simulator.physics.fresh_memory`) for the same profile. The profiler adds
its own overhead per operator (a few microseconds), so measured totals run slightly above an
unprofiled step; the unprofiled phase times (median of 3 steps) are printed too. ``--top N``
lists the operators with the most self time and, for each layer and head GEMM, the same call
timed warm and in isolation (what a microbenchmark sees), with the ratio in-step / isolated per
GEMM class: above 1 where operands arrive cold or the step's other work slows the GEMM.
``--faults N`` runs one more step under :class:`FaultTracer` and lists the N operators whose
outputs took the most fresh pages (minor page faults), against the ``fresh`` class.

Classes: ``gemm.fwd`` / ``gemm.dgrad`` / ``gemm.wgrad`` (the layer projections in their three
layouts), ``head.*`` (the LM head GEMMs, the vocabulary-wide ones), ``attention`` (fused SDPA, or
eager attention's batched GEMMs), ``softmax`` (eager attention's scale, mask and softmax over the
s x s scores), ``elementwise`` (norms, residual adds, activations, rotary, layout copies),
``loss`` (log-softmax and NLL over the logits), ``embedding``, ``host`` (operator wrappers,
views, autograd bookkeeping and the untraced Python between operators; predicted: kernels x the
profile's per-kernel host time), ``fresh`` (predicted first touches of fresh pages; measured
they fall inside the operators that touch them, so the measured column shows minor page faults
x 4 KiB at the profile's fault rate as a separate line), ``optimizer``. Seconds per step (all
micro-batches).

Exit status: 0 success, 1 runtime failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

from simulator.core.errors import UsageError, UsageParser, run_cli

from . import host_alloc
from .host_alloc import ALLOCATORS

PHASES = ("fwd", "bwd", "opt")
CLASSES = ("gemm.fwd", "gemm.dgrad", "gemm.wgrad", "head.fwd", "head.dgrad", "head.wgrad", "attention",
           "softmax", "elementwise", "loss", "embedding", "host", "fresh", "optimizer")
_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
_SDPA = ("scaled_dot_product", "_flash_attention", "_efficient_attention")
_SOFTMAX = {"aten::_softmax", "aten::_softmax_backward_data", "aten::softmax", "aten::masked_fill",
            "aten::masked_fill_"}
_LOSS = {"aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward",
         "aten::nll_loss_backward", "aten::nll_loss2d_forward", "aten::nll_loss2d_backward"}
_EMBED = ("embedding", "index_select", "index_add", "index_put", "_unique", "sort", "cumsum")
#: operators whose own time is dispatch and bookkeeping, never data movement
_HOST = ("aten::view", "aten::_unsafe_view", "aten::t", "aten::transpose", "aten::reshape", "aten::expand",
         "aten::as_strided", "aten::detach", "aten::split", "aten::split_with_sizes", "aten::chunk",
         "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::empty",
         "aten::empty_like", "aten::empty_strided", "aten::linear", "aten::matmul", "aten::alias",
         "aten::unbind", "aten::numpy_T", "aten::resolve_conj", "aten::resolve_neg", "aten::_reshape_alias",
         "aten::lift_fresh", "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense",
         "aten::scaled_dot_product_attention", "aten::cross_entropy_loss", "aten::nll_loss_nd",
         "aten::nll_loss", "aten::log_softmax", "aten::dropout", "aten::to", "aten::contiguous",
         "aten::layer_norm", "aten::rms_norm", "aten::zeros", "aten::full", "aten::scalar_tensor",
         "aten::ones_like", "aten::zeros_like", "aten::ones", "aten::new_zeros", "aten::new_empty",
         "aten::new_empty_strided")


def _dims(shapes: Sequence[Sequence[int]]) -> list[list[int]]:
    return [list(s) for s in shapes if isinstance(s, (list, tuple))]


def classify(name: str, shapes: Sequence[Sequence[int]], phase: str, tokens: int, vocab: int,
             seq_len: int, parent: str = "") -> str:
    """Operation class of one profiled operator (``name`` as torch.profiler reports it, its input
    ``shapes``, the name of the operator or autograd node that called it, ``parent``) in
    ``phase``; ``tokens`` = micro-batch x sequence, ``vocab`` and ``seq_len`` of the configuration
    (they tell the LM head, the loss and eager attention's s x s tensors apart).

    A GEMM called by an autograd node (``...Backward0``) is a backward GEMM, else a forward one
    (in the backward phase: recomputation). mm(a [X, Y], b [Y, Z]) of a linear layer of width n:
    forward X = tokens, Z = n; input gradient X = tokens, Y = n; weight gradient X = n, Y = tokens.
    The LM head is the layer whose n is the vocabulary."""
    if phase == "opt":
        return "optimizer"
    dims = _dims(shapes)
    if name in _GEMM_OPS:
        mats = [d for d in dims if len(d) >= 2]
        if name in ("aten::bmm", "aten::baddbmm") or any(len(d) >= 3 for d in mats) or len(mats) < 2:
            return "attention"
        (x, y), (_, z) = mats[-2][-2:], mats[-1][-2:]  # mm(a, b); addmm(bias, a, b)
        if "Backward" not in parent:
            return f"{'head' if z == vocab else 'gemm'}.fwd"
        if y == tokens and x != tokens:
            return f"{'head' if x == vocab else 'gemm'}.wgrad"
        return f"{'head' if y == vocab else 'gemm'}.dgrad"
    if any(k in name for k in _SDPA):
        return "attention"
    if name.startswith("autograd::") or name.startswith("torch::autograd") or name.endswith("Backward0") \
            or name.endswith("Backward1") or name in _HOST or name.startswith("opcompare::") \
            or not name.startswith("aten::"):
        return "host"
    if name in _LOSS:
        return "loss"
    if any(k in name for k in _EMBED):
        return "embedding"
    if name in _SOFTMAX or any(len(d) >= 2 and d[-1] == seq_len and d[-2] == seq_len for d in dims):
        return "softmax"
    if any(len(d) == 2 and d[0] == vocab and d[1] != vocab for d in dims):
        return "embedding"  # the embedding gradient's zeros and a tied head's gradient sum ([vocab, hidden])
    if any(len(d) == 2 and d[-1] == vocab for d in dims):
        return "loss"  # the logits' fp32 copy, the loss gradient's zeros and other vocabulary-wide work
    return "elementwise"


# ---------------------------------------------------------------------------- measuring
def measure(cfg, warmup: int = 2, trace_faults: bool = False) -> dict[str, Any]:
    """Profile one training step of ``cfg`` (a :class:`calibration.validate.suite.Config`, one CPU
    process): per phase and class the operators' self seconds (all micro-batches), ``dtypes`` each
    listed operator's first input dtype as the profiler names it; ``wall`` the
    unprofiled phase seconds (median of 3 steps), ``faults`` minor page faults per phase of the
    profiled step; with ``trace_faults`` also ``fault_ops``: one more step's minor page faults per
    (phase, operator, output shape), :class:`FaultTracer`, most first."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from .torch_model import build_model, warm_up

    torch.manual_seed(0)
    model = build_model(cfg.spec, cfg.attention, cfg.checkpointing, device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    amp = torch.bfloat16 if cfg.precision == "bf16" else None
    gen = torch.Generator().manual_seed(1)
    v = cfg.spec.vocab_size
    data = [(torch.randint(0, v, (cfg.micro_batch, cfg.seq_len), generator=gen),
             torch.randint(0, v, (cfg.micro_batch, cfg.seq_len), generator=gen)) for _ in range(cfg.grad_accum)]
    faults = dict.fromkeys(PHASES, 0)

    def mark(phase: str, fn) -> float:
        FaultTracer.phase = phase
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        with record_function(f"opcompare::{phase}"):
            fn()
        faults[phase] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        return time.perf_counter() - t0

    def step() -> dict[str, float]:
        out = dict.fromkeys(PHASES, 0.0)
        for x, y in data:
            box: dict[str, Any] = {}

            def fwd(x=x, y=y, box=box) -> None:
                with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                    box["loss"] = model(x, y) / cfg.grad_accum

            out["fwd"] += mark("fwd", fwd)
            out["bwd"] += mark("bwd", lambda box=box: box["loss"].backward())

        def optim() -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["opt"] += mark("opt", optim)
        return out

    from .benches.stepops import prime_host_allocator

    prime_host_allocator()
    warm_up(step, opt, warmup)
    walls = [step() for _ in range(3)]
    wall = {p: statistics.median(w[p] for w in walls) for p in PHASES}
    for p in PHASES:
        faults[p] = 0
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        profiled = step()
    fault_ops: list[tuple[tuple[str, str, str], int]] = []
    if trace_faults:
        tracer = FaultTracer()
        marks = faults.copy()
        with tracer:
            step()
        fault_ops = tracer.counts.most_common()
        faults.update(marks)
    ranges = sorted((ev.time_range.start, ev.time_range.end, ev.name.split("::", 1)[1])
                    for ev in prof.events() if ev.name.startswith("opcompare::"))
    tokens, seq = cfg.micro_batch * cfg.seq_len, cfg.seq_len
    by: dict[str, dict[str, float]] = {p: defaultdict(float) for p in PHASES}
    ops: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    dtypes: dict[tuple[str, str, str, str], str] = {}
    for ev in prof.events():
        start = ev.time_range.start
        phase = next((p for a, b, p in ranges if a <= start <= b), None)
        if phase is None:
            continue
        parent = ev.cpu_parent.name if ev.cpu_parent is not None else ""
        cls = classify(ev.name, ev.input_shapes or [], phase, tokens, v, seq, parent)
        by[phase][cls] += ev.self_cpu_time_total * 1e-6
        key = (phase, cls, ev.name, str(_dims(ev.input_shapes or [])))
        row = ops[key]
        dtypes.setdefault(key, next((d for d in getattr(ev, "input_dtypes", None) or [] if d), ""))
        row[0] += ev.self_cpu_time_total * 1e-6
        row[1] += 1
    top = sorted(((k, t, n) for k, (t, n) in ops.items()), key=lambda r: -r[1])
    isolated = {k: isolated_gemm_s(k[1], json.loads(k[3]), dtypes.get(k, "")) for k, _, _ in top
                if k[2] in _GEMM_OPS and k[1] != "attention"}
    return {"classes": {p: dict(c) for p, c in by.items()}, "wall": wall, "profiled_wall": profiled,
            "faults": faults, "top": top, "isolated": isolated, "dtypes": dtypes, "fault_ops": fault_ops}


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class FaultTracer(TorchDispatchMode):
    """A torch dispatch mode counting the minor page faults (fresh 4 KiB pages the kernel maps in)
    of every aten operator, keyed by (phase, operator, output shape): which tensors of a real step
    land on fresh pages, against :mod:`simulator.physics.fresh_memory`'s account of them."""

    phase = ""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        f0 = _minflt()
        out = func(*args, **(kwargs or {}))
        n = _minflt() - f0
        # the profiler's own record_function ops (phase marks) pass through the mode too; their
        # occasional fault is the instrument's, not the step's
        if n and func.namespace != "profiler":
            self.counts[(FaultTracer.phase, str(func), str(list(getattr(out, "shape", []))))] += n
        return out


def format_faults(measured: dict[str, Any], n: int) -> str:
    """The ``n`` operators whose outputs took the most fresh pages in the traced step (MiB)."""
    lines = [f"\nfresh pages per operator in one traced step (phase MiB operator output shape), top {n}"]
    for (phase, op, shape), count in measured["fault_ops"][:n]:
        lines.append(f"  {phase:<3} {count * 4096 / 2**20:8.1f}  {op} {shape}")
    return "\n".join(lines)


#: the profiler's names of the input dtypes a GEMM runs in (``FunctionEvent.input_dtypes``) -> torch's
_PROFILER_DTYPES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64"}


def isolated_gemm_s(cls: str, shapes: list[list[int]], dtype: str = "", reps: int = 3) -> float | None:
    """Seconds of one warm, repeated call of a profiled GEMM (``shapes`` as the profiler recorded
    them, ``dtype`` its first input's dtype as the profiler names it; fp32 when unknown) in the
    layout its class runs in: forward ``x @ W^T`` (weight stored (n, k)), input gradient ``g @ W``
    and weight gradient ``g^T @ x`` (first operand transposed), plus the bias of an ``addmm``; the
    fastest of ``reps`` after one warm-up. What a microbenchmark sees of the same GEMM, for
    comparison with its time inside the step (under autocast, in bf16 as the step ran it)."""
    import torch

    mats = [d for d in shapes if len(d) == 2]
    if len(mats) < 2:
        return None
    dt = getattr(torch, _PROFILER_DTYPES.get(dtype, "float32"))
    (x, y), (_, z) = mats[-2], mats[-1]
    bias = torch.zeros(z, dtype=dt) if len(mats) > 2 or any(len(d) == 1 for d in shapes) else None
    if cls.endswith(".fwd"):
        a, b = torch.randn(x, y, dtype=dt), torch.randn(z, y, dtype=dt).t()
    elif cls.endswith(".wgrad"):
        a, b = torch.randn(y, x, dtype=dt).t(), torch.randn(y, z, dtype=dt)
    else:
        a, b = torch.randn(x, y, dtype=dt), torch.randn(y, z, dtype=dt)

    def call() -> None:
        torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)

    call()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


# ---------------------------------------------------------------------------- predicting
def predict(cfg, profile) -> dict[str, Any]:
    """The simulator's seconds per phase and class for ``cfg`` (all micro-batches of a step) on
    ``profile``'s device, from the same operation list and efficiencies as
    :func:`simulator.physics.compute.micro_batch_time`; ``total`` its forward, backward + recomputation
    and optimizer time from :func:`calibration.validate.predicting.predict`."""
    from simulator.hardware.device import device_from_profile
    from simulator.model.graphs import graph
    from simulator.physics import compute, fresh_memory
    from simulator.strategy.knobs import checkpointed_layers
    from simulator.strategy.stacks import get_stack

    from .validate.predicting import predict as predict_step

    dev = device_from_profile(profile)
    mb = np.array([float(cfg.micro_batch)])
    ga = cfg.grad_accum
    stack = get_stack(None)
    g = graph(cfg.spec, cfg.seq_len, mb, cfg.precision, cfg.attention, cfg.compile, stack)
    tm = compute._timed(g, dev, cfg.precision, cfg.compile, {}, stack.eager_dispatch(cfg.compile))
    out: dict[str, dict[str, float]] = {p: defaultdict(float) for p in PHASES}
    placed = [(op, float(b.repeat) * op.count, i) for i, b in enumerate(g.blocks) for op in b.ops]
    placed += [(op, float(op.count), None) for op in g.outside]
    share = {i: checkpointed_layers(cfg.checkpointing, b.repeat) / max(b.repeat, 1) for i, b in enumerate(g.blocks)}
    per_kernel = {p: tm.launch + tm.extra[p] for p in ("fwd", "bwd")}
    for op, reps, block in placed:
        rerun = 0.0
        if block is not None:
            rerun = share[block] if any(share.values()) else float(cfg.checkpointing in op.recompute)
        if op.kind == "gemm":
            f, d, w = compute.gemm_pass_times([op], dev, cfg.precision, cfg.compile)
            cls = "head" if block is None else ("attention" if op.recompute else "gemm")
            tf, td, tw = (float(x[0].ravel()[0]) * reps * ga for x in (f, d, w))
            if cls == "attention":
                out["fwd"]["attention"] += tf
                out["bwd"]["attention"] += td + tw + rerun * tf
            else:
                out["fwd"][f"{cls}.fwd"] += tf
                out["bwd"][f"{cls}.dgrad"] += td
                out["bwd"][f"{cls}.wgrad"] += tw
                out["bwd"][f"{cls}.fwd" if cls == "head" else "gemm.fwd"] += rerun * tf
        else:
            tf, tb = (float(np.asarray(x).ravel()[0]) * reps * ga for x in compute.op_times(op, dev, cfg.precision))
            cls = {"attention": "attention", "softmax": "softmax", "loss": "loss",
                   "embedding": "embedding"}.get(op.name, "elementwise")
            out["fwd"][cls] += tf
            out["bwd"][cls] += tb + rerun * tf
        out["fwd"]["host"] += reps * op.kernels_fwd * per_kernel["fwd"] * ga
        out["bwd"]["host"] += (reps * op.kernels_bwd * per_kernel["bwd"] + rerun * reps * op.kernels_fwd
                               * per_kernel["fwd"]) * ga
    reps = sum(b.repeat for b in g.blocks)
    out["fwd"]["host"] += tm.host * reps * ga
    out["bwd"]["host"] += tm.host * reps * ga * (1.0 + sum(share[i] * b.repeat for i, b in enumerate(g.blocks)) / reps)
    if profile.fresh_memory is not None:
        ff, fb, fr = fresh_memory.micro_batch_fresh(cfg.spec, cfg.seq_len, mb, cfg.precision, cfg.attention,
                                                cfg.checkpointing, profile)
        out["fwd"]["fresh"] += float(np.asarray(ff).ravel()[0]) * ga
        out["bwd"]["fresh"] += (float(np.asarray(fb).ravel()[0]) + float(np.asarray(fr).ravel()[0])) * ga \
            + fresh_memory.step_fresh(cfg.spec, profile)[0]
    step = predict_step(cfg, profile)
    if step.get("step") is not None:
        out["opt"]["optimizer"] = float(step["opt"])
    total = {"fwd": step.get("fwd"), "bwd": None if step.get("bwd") is None else step["bwd"] + step["rec"],
             "opt": step.get("opt")}
    return {"classes": {p: dict(c) for p, c in out.items()}, "total": total}


# ---------------------------------------------------------------------------- report
def format_report(cfg, measured: dict[str, Any], predicted: dict[str, Any], fault_gbs: float | None) -> str:
    """Table of measured (profiled self time) and predicted seconds per phase and class, in ms."""
    lines = [f"{cfg.id}: milliseconds per step (backward includes recomputation); "
             "err = predicted / measured - 1"]
    for p in PHASES:
        m, q = measured["classes"][p], predicted["classes"][p]
        lines.append(f"\n{p:<12} {'measured':>9} {'predicted':>9} {'err':>7}")
        for c in CLASSES:
            a, b = m.get(c, 0.0), q.get(c, 0.0)
            if a < 5e-5 and b < 5e-5:
                continue
            err = f"{100 * (b / a - 1):+6.0f}%" if a > 0 else "     —"
            lines.append(f"  {c:<10} {a * 1e3:9.2f} {b * 1e3:9.2f} {err}")
        sm, sq = sum(m.values()), sum(q.values())
        lines.append(f"  {'sum':<10} {sm * 1e3:9.2f} {sq * 1e3:9.2f} {100 * (sq / sm - 1) if sm else 0:+6.0f}%")
        tot = predicted["total"].get(p)
        lines.append(f"  unprofiled step {measured['wall'][p] * 1e3:.2f} ms (profiled "
                     f"{measured['profiled_wall'][p] * 1e3:.2f}); simulator's {p} "
                     + ("—" if tot is None else f"{tot * 1e3:.2f} ms"))
        if fault_gbs:
            lines.append(f"  minor page faults {measured['faults'][p]} (x 4 KiB at {fault_gbs:.2f} GB/s = "
                         f"{measured['faults'][p] * 4096 / (fault_gbs * 1e9) * 1e3:.2f} ms, inside the classes)")
    return "\n".join(lines)


def format_top(measured: dict[str, Any], n: int) -> str:
    """The ``n`` operators (name and input shapes, per phase and class) with the most self time;
    for GEMMs also the same calls' time warm and in isolation (``isolated``), and per GEMM class
    the ratio in-step / isolated."""
    lines = [f"\ntop {n} operators by self time (phase class calls ms [isolated warm ms] name shapes)"]
    iso = measured.get("isolated", {})
    for key, t, calls in measured["top"][:n]:
        phase, cls, name, shapes = key
        one = iso.get(key)
        extra = f"[{one * calls * 1e3:7.2f}]" if one else " " * 9
        lines.append(f"  {phase:<3} {cls:<11} {calls:4d} {t * 1e3:8.2f} {extra}  {name} {shapes}")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for key, t, calls in measured["top"]:
        if iso.get(key):
            sums[key[1]][0] += t
            sums[key[1]][1] += iso[key] * calls
    if sums:
        lines.append("GEMMs in the step / the same calls warm in isolation: " + ", ".join(
            f"{c} {a / b:.2f}" for c, (a, b) in sorted(sums.items()) if b > 0))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="opcompare", description="Per-operation-class measured vs predicted time of one "
                "training step of a validation suite's configuration (CPU).")
    p.add_argument("--profile", required=True, type=Path, help="calibration profile JSON")
    p.add_argument("--suite", required=True, type=Path, help="validation suite YAML")
    p.add_argument("--config", required=True, help="config id (or a unique substring) of the suite")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps after the first, which creates the optimizer's "
                   "state, before the timed and profiled steps (default 2)")
    p.add_argument("--top", type=int, default=0, help="also list the N operators with the most self time")
    p.add_argument("--faults", type=int, default=0,
                   help="trace one more step's page faults per operator and list the N largest")
    p.add_argument("--allocator", choices=ALLOCATORS, default=None,
                   help="how the C allocator treats freed memory (calibration/host_alloc.py; default: the "
                        "setting the profile was measured with)")
    return p


def pick(configs: list, key: str):
    """The config whose id is ``key``, else the one containing it; UsageError otherwise."""
    exact = [c for c in configs if c.id == key]
    hits = exact or [c for c in configs if key in c.id]
    if len(hits) != 1:
        ids = ", ".join(c.id for c in (hits or configs))
        raise UsageError(f"--config {key!r} matches {len(hits)} configs; choose one of: {ids}")
    return hits[0]


def run(a: argparse.Namespace, relaunch: bool = False) -> int:
    from simulator.hardware.profile import load_profile

    from .validate.suite import load_suite

    profile = load_profile(a.profile)
    cfg = pick(load_suite(a.suite).configs, a.config)
    if cfg.compile or cfg.precision not in ("fp32", "bf16"):
        raise UsageError(f"config {cfg.id!r}: opcompare profiles eager fp32/bf16 steps only")
    if a.warmup < 1:
        raise UsageError(f"--warmup must be >= 1, got {a.warmup}")
    if relaunch:
        host_alloc.relaunch_for(a.allocator or host_alloc.recorded(profile.provenance))
    measured = measure(cfg, a.warmup, trace_faults=a.faults > 0)
    predicted = predict(cfg, profile)
    fm = profile.fresh_memory
    print(format_report(cfg, measured, predicted, fm.gbs if fm is not None else None))
    if a.top > 0:
        print(format_top(measured, a.top))
    if a.faults > 0:
        print(format_faults(measured, a.faults))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from_cli = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("opcompare", lambda: run(build_parser().parse_args(argv), relaunch=from_cli))


if __name__ == "__main__":
    sys.exit(main())
