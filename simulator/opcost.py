"""Time, FLOPs and saved activations of a family's operations (``simulator/families``).

The consumer side of the operation layer: ``compute``, ``memory`` and ``estimate`` hand every
non-transformer spec to these functions (the transformer keeps its original path for now; its
operations give the same numbers, ``tests/test_families.py``). Pure and vectorized over the
micro-batch size. Seconds, FLOPs, bytes. DESIGN.md "Physics" 1-4.
"""

from __future__ import annotations

import numpy as np

from . import kernels, workload
from .device import Device
from .families import Knobs, family_of
from .families.base import Graph, Op

#: Knob value of ``attention`` for families without attention (the knob is not searched).
NO_ATTENTION = "n/a"


def graph(model, seq_len: int, mb, precision: str, attention: str, compiled: bool) -> Graph:
    """The family's operations of one micro-batch of ``mb`` samples (array); the last few graphs
    are kept, since a search asks for the same one per knob combination."""
    mb = np.asarray(mb, dtype=float)
    key = (model, seq_len, mb.tobytes(), precision, attention, compiled)
    g = _GRAPHS.get(key)
    if g is None:
        g = family_of(model).graph(model, mb, seq_len, Knobs(precision, attention, compiled))
        if len(_GRAPHS) >= 64:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        _GRAPHS[key] = g
    return g


_GRAPHS: dict = {}


def _op_times(op: Op, dev: Device, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one repetition, without kernel launches.

    GEMMs: shape-dependent efficiency of the profile, backward = the two GEMMs (m,k,n), (k,n,m).
    Fused attention: FLOPs at the profile's attention efficiency (FlashAttention on the tensor
    peak in half precision, the memory-efficient kernel on CUDA cores otherwise). Scan, conv and
    elementwise ops: roofline of their FLOPs on the CUDA-core fp32 peak and their bytes at the
    profile's bandwidth efficiency.
    """
    prof = dev.profile
    bw, bw_eff = dev.mem_bw, prof.memory_bw_eff
    if op.kind == "gemm":
        g = prof.gemm_for(precision)
        peak, e = dev.gemm_peak(precision), workload.act_bytes(precision)
        w = np.asarray(op.batch, float)

        def t(m, n, k):
            return w * kernels.gemm_time(m, n, k, peak, g.e_max, g.x_half, e, bw, bw_eff, 0.0)

        m = np.asarray(op.m, float)
        return t(m, op.n, op.k), t(m, op.k, op.n) + t(op.k, op.n, m)
    if op.kind == "attention":
        if precision in ("bf16", "fp16"):
            peak, e_f, e_b = dev.gemm_peak(precision), prof.attention.flash_fwd, prof.attention.flash_bwd
        else:
            peak = dev.peak_flops["fp32"]
            e_f, e_b = prof.attention.mem_efficient_fwd, prof.attention.mem_efficient_bwd
        return op.fwd_flops() / (peak * e_f), op.bwd_flops() / (peak * e_b)
    peak = dev.peak_flops["fp32"]
    t_f = np.maximum(op.fwd_flops() / peak, np.asarray(op.bytes_fwd, float) / (bw * bw_eff))
    t_b = np.maximum(op.bwd_flops() / peak, np.asarray(op.bytes_bwd, float) / (bw * bw_eff))
    return t_f, t_b


def micro_batch_time(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, compiled: bool,
                     checkpointing: str, dev: Device, memo: dict | None = None):
    """Seconds of one micro-batch (forward, backward, recomputation) and executed FLOPs.

    A pass takes the longer of the device's kernel time and the host's dispatch time (kernel
    launches x the profile's overhead; on a CPU device one after the other). Recomputation: full
    checkpointing re-runs every block op's forward, other policies the ops that name them; ops
    marked ``always`` (kernels that recompute by design, e.g. mamba-ssm's conv and delta) re-run
    in every backward, on top of any checkpointing.
    """
    from .compute import MicroBatchTime

    mb = np.asarray(mb, dtype=float)
    memo = {} if memo is None else memo
    key = ("ops", precision, attention, compiled)
    if key not in memo:
        memo[key] = _timed(graph(model, seq_len, mb, precision, attention, compiled), dev, precision, memo)
    timed = memo[key]
    prof = dev.profile
    launch = 1e-6 * (prof.compiled_launch_overhead_us if compiled else prof.launch_overhead_us)
    serial = prof.device.kind == "cpu"

    def pass_time(rows, which):
        t = sum((r[which][0] for r in rows), 0.0 * mb)
        k = sum(r[which][1] for r in rows)
        return t + k * launch if serial else np.maximum(t, k * launch)

    fwd = pass_time(timed, "fwd")
    bwd = pass_time(timed, "bwd")
    rerun = [r for r in timed if r["block"] and (checkpointing == "full" or checkpointing in r["recompute"])]
    always = [r for r in timed if "always" in r["recompute"]]
    rec = (pass_time(rerun, "fwd") if rerun else 0.0 * mb) + (pass_time(always, "fwd") if always else 0.0 * mb)
    hw = sum((r["fl_fwd"] + r["fl_bwd"] for r in timed), 0.0 * mb) \
        + sum((r["fl_fwd"] for r in rerun + always), 0.0 * mb)
    z = np.zeros_like(mb)
    return MicroBatchTime(fwd + z, bwd + z, rec + z, hw + z)


def _timed(g: Graph, dev: Device, precision: str, memo: dict) -> list[dict]:
    rows = []
    for b in g.blocks:
        for op in b.ops:
            rows.append(_row(op, float(b.repeat) * op.count, True, dev, precision, memo, b.name))
    for op in g.outside:
        rows.append(_row(op, op.count, False, dev, precision, memo, ""))
    return rows


def _row(op: Op, reps: float, in_block: bool, dev: Device, precision: str, memo: dict, where: str) -> dict:
    if op.kind == "gemm":  # a GEMM's time depends on its shape and the precision only
        key = ("op-gemm", precision, where, op.name)
        if key not in memo:
            memo[key] = _op_times(op, dev, precision)
        t_f, t_b = memo[key]
    else:
        t_f, t_b = _op_times(op, dev, precision)
    return {"fwd": (reps * t_f, reps * op.kernels_fwd), "bwd": (reps * t_b, reps * op.kernels_bwd),
            "fl_fwd": reps * op.fwd_flops(), "fl_bwd": reps * op.bwd_flops(), "block": in_block,
            "recompute": op.recompute}


def activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, checkpointing: str,
                compiled: bool = False) -> np.ndarray:
    """Bytes saved for backward at its start (all blocks and the ops outside them).

    No checkpointing: every op's ``saved``. Full: each block repetition keeps its input, plus one
    repetition's working set of the largest block. Another policy: the ops it re-runs keep
    nothing, except one repetition of the largest (live while its block runs backward). Ops
    marked ``always`` never keep their outputs.
    """
    g = graph(model, seq_len, mb, precision, attention, compiled)
    z = np.zeros_like(np.asarray(mb, dtype=float))

    def saved(ops, drop=lambda op: False):
        return sum((op.count * np.asarray(op.saved, float) for op in ops if not drop(op)), z)

    outside = saved(g.outside)
    if checkpointing == "full":
        trunk = sum((b.repeat * np.asarray(b.input_bytes, float) for b in g.blocks), z)
        work = np.max([saved(b.ops) for b in g.blocks], axis=0) if g.blocks else z
        return trunk + work + outside
    rerun = (lambda op: checkpointing in op.recompute) if checkpointing != "none" else (lambda op: False)
    kept = sum((b.repeat * saved(b.ops, rerun) for b in g.blocks), z)
    live = np.max([saved([op for op in b.ops if rerun(op)]) for b in g.blocks], axis=0) if g.blocks else z
    return kept + live + outside


def logits_bytes(model, seq_len: int, mb: np.ndarray, precision: str, compiled: bool) -> np.ndarray:
    """Logits and loss buffers of one micro-batch (bytes), from the family's graph."""
    g = graph(model, seq_len, mb, precision, family_of(model).attentions[-1], compiled)
    return np.asarray(g.logits_bytes, float) + np.zeros_like(np.asarray(mb, dtype=float))


def palm_flops_per_token(model, seq_len: int) -> float:
    """6 N per token where each weight is used once per token (Mamba); the model's FLOPs where
    weights are reused across positions (convolutions: ``Family.six_n`` False)."""
    if family_of(model).six_n:
        return 6.0 * model.n_params()
    return model_flops_per_token(model, seq_len)


def model_flops_per_token(model, seq_len: int) -> float:
    """The model's minimum training FLOPs per token: 3 x every op's forward FLOPs (GEMMs, fused
    attention, scans, convolutions) of one sample; ConvNeXt: per image (its seq_len is 1)."""
    fam = family_of(model)
    g = graph(model, seq_len, np.array([1.0]), "bf16", fam.attentions[-1], False)
    fwd = sum(float(reps * op.fwd_flops().ravel()[0]) for op, reps in g.all_ops())
    return 3.0 * fwd / seq_len
