"""Time, FLOPs and saved activations of a family's operations (``simulator/families``).

The consumer side of the operation layer: ``compute``, ``memory`` and ``estimate`` hand every
non-transformer spec to these functions (the transformer keeps its original path for now; its
operations give the same numbers, ``tests/test_families.py``). Pure and vectorized over the
micro-batch size. Seconds, FLOPs, bytes. docs/architecture.md, physics 1-4.
"""

from __future__ import annotations

import numpy as np

from . import kernels, workload
from .compute import NONCAUSAL_SEQ_HALF, MicroBatchTime
from .device import Device
from .families import Knobs, family_of
from .families.base import Graph, Op
from .stacks import Stack, get_stack
from .strategy import checkpointed_layers


def graph(model, seq_len: int, mb, precision: str, attention: str, compiled: bool,
          stack: Stack | str | None = None) -> Graph:
    """The family's operations of one micro-batch of ``mb`` samples (array) under ``stack``
    (default hf-trainer); the last few graphs are kept, since a search asks for the same one per
    knob combination."""
    mb = np.asarray(mb, dtype=float)
    stack = get_stack(stack)
    key = (model, seq_len, mb.tobytes(), precision, attention, compiled, stack)
    g = _GRAPHS.get(key)
    if g is None:
        g = family_of(model).graph(model, mb, seq_len, Knobs(precision, attention, compiled, stack))
        if len(_GRAPHS) >= 64:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        _GRAPHS[key] = g
    return g


_GRAPHS: dict = {}


def _op_times(op: Op, dev: Device, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one repetition, without kernel launches.

    GEMMs: shape-dependent efficiency of the profile, backward = the two GEMMs (m,k,n), (k,n,m).
    Fused attention: FLOPs at the profile's attention efficiency for the op's head size and
    sequence (FlashAttention on the tensor peak in half precision, the memory-efficient kernel on
    CUDA cores otherwise; without a causal mask the sequence dependence is weaker, as in
    ``compute``). Scan, conv and elementwise ops: roofline of their FLOPs on the CUDA-core fp32
    peak and their bytes at the profile's bandwidth efficiency.
    """
    prof = dev.profile
    bw, bw_eff = dev.mem_bw, prof.memory_bw_eff
    if op.kind == "gemm":
        g, gb = prof.gemm_for(precision), prof.gemm_bwd_for(precision)  # forward, backward layouts
        peak, e = dev.gemm_peak(precision), workload.act_bytes(precision)
        w = np.asarray(op.batch, float)

        def t(m, n, k, eff):
            return w * kernels.gemm_time(m, n, k, peak, eff.e_max, eff.x_half, e, bw, bw_eff, 0.0)

        m = np.asarray(op.m, float)
        return t(m, op.n, op.k, g), t(m, op.k, op.n, gb) + t(op.k, op.n, m, gb)
    if op.kind == "attention":
        a = prof.attention
        if precision in ("bf16", "fp16"):
            peak, e_f, e_b = dev.gemm_peak(precision), a.flash_fwd, a.flash_bwd
        else:
            peak, e_f, e_b = dev.peak_flops["fp32"], a.mem_efficient_fwd, a.mem_efficient_bwd
        s_half = a.seq_half * (1.0 if op.causal else NONCAUSAL_SEQ_HALF)
        shape = (op.head_dim, op.seq, a.head_dim_half, s_half)
        e_f, e_b = kernels.attention_efficiency(e_f, *shape), kernels.attention_efficiency(e_b, *shape)
        return op.fwd_flops() / (peak * e_f), op.bwd_flops() / (peak * e_b)
    peak = dev.peak_flops["fp32"]
    t_f = np.maximum(op.fwd_flops() / peak, np.asarray(op.bytes_fwd, float) / (bw * bw_eff))
    t_b = np.maximum(op.bwd_flops() / peak, np.asarray(op.bytes_bwd, float) / (bw * bw_eff))
    return t_f, t_b


def micro_batch_time(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, compiled: bool,
                     checkpointing: str, dev: Device, memo: dict | None = None,
                     stack: Stack | str | None = None) -> MicroBatchTime:
    """Seconds of one micro-batch (forward, backward, recomputation) and executed FLOPs.

    A pass takes the longer of the device's kernel time and the host's dispatch time (kernel
    launches x the profile's overhead; on a CPU device one after the other), plus the profile's
    host time per block repetition (``layer_overhead_us``: module dispatch, FSDP/DDP hooks).
    Recomputation: full and every:K re-run the whole forward (and its host time) of the
    checkpointed repetitions of each block (all, floor(R/K)); selective and op re-run the ops
    that name them; ops marked ``always`` (kernels that recompute by design, e.g. mamba-ssm's
    conv and delta) re-run in every backward, on top of any checkpointing.
    """
    mb = np.asarray(mb, dtype=float)
    memo = {} if memo is None else memo
    stack = get_stack(stack)
    key = ("ops", precision, attention, compiled, stack)
    if key not in memo:
        g = graph(model, seq_len, mb, precision, attention, compiled, stack)
        memo[key] = (g, _timed(g, dev, precision, memo))
    g, timed = memo[key]
    prof = dev.profile
    launch = 1e-6 * (prof.compiled_launch_overhead_us if compiled else prof.launch_overhead_us)
    serial = prof.device.kind == "cpu"
    host = 1e-6 * prof.layer_overhead_us

    def pass_time(rows, which, scale=None):
        w = [1.0] * len(rows) if scale is None else scale
        t = sum((s * r[which][0] for s, r in zip(w, rows, strict=True)), 0.0 * mb)
        k = sum(s * r[which][1] for s, r in zip(w, rows, strict=True))
        return t + k * launch if serial else np.maximum(t, k * launch)

    reps = sum(b.repeat for b in g.blocks)
    fwd = pass_time(timed, "fwd") + host * reps
    bwd = pass_time(timed, "bwd") + host * reps
    share = {i: checkpointed_layers(checkpointing, b.repeat) / b.repeat for i, b in enumerate(g.blocks)}
    if any(share.values()):  # layer-granular: whole repetitions re-run
        rerun = [r for r in timed if r["block"] is not None and share[r["block"]]]
        scale = [share[r["block"]] for r in rerun]
        rec = pass_time(rerun, "fwd", scale) + host * sum(share[i] * b.repeat for i, b in enumerate(g.blocks))
    else:
        rerun = [r for r in timed if r["block"] is not None and checkpointing in r["recompute"]]
        scale = [1.0] * len(rerun)
        rec = pass_time(rerun, "fwd") if rerun else 0.0 * mb
    always = [r for r in timed if "always" in r["recompute"]]
    if always:
        rec = rec + pass_time(always, "fwd")
    hw = sum((r["fl_fwd"] + r["fl_bwd"] for r in timed), 0.0 * mb) \
        + sum((s * r["fl_fwd"] for s, r in zip(scale, rerun, strict=True)), 0.0 * mb) \
        + sum((r["fl_fwd"] for r in always), 0.0 * mb)
    z = np.zeros_like(mb)
    return MicroBatchTime(fwd + z, bwd + z, rec + z, hw + z)


def _timed(g: Graph, dev: Device, precision: str, memo: dict) -> list[dict]:
    rows = []
    for i, b in enumerate(g.blocks):
        for op in b.ops:
            rows.append(_row(op, float(b.repeat) * op.count, i, dev, precision, memo, b.name))
    for op in g.outside:
        rows.append(_row(op, op.count, None, dev, precision, memo, ""))
    return rows


def _row(op: Op, reps: float, block: int | None, dev: Device, precision: str, memo: dict, where: str) -> dict:
    if op.kind == "gemm":  # a GEMM's time depends on its shape and the precision only
        key = ("op-gemm", precision, where, op.name)
        if key not in memo:
            memo[key] = _op_times(op, dev, precision)
        t_f, t_b = memo[key]
    else:
        t_f, t_b = _op_times(op, dev, precision)
    return {"fwd": (reps * t_f, reps * op.kernels_fwd), "bwd": (reps * t_b, reps * op.kernels_bwd),
            "fl_fwd": reps * op.fwd_flops(), "fl_bwd": reps * op.bwd_flops(), "block": block,
            "recompute": op.recompute}


def activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, checkpointing: str,
                compiled: bool = False, stack: Stack | str | None = None) -> np.ndarray:
    """Bytes saved for backward at its start (all blocks and the ops outside them), plus the
    working set of the one block repetition being rebuilt during backward.

    Per block of R repetitions that each save S bytes: none keeps R x S. full / every:K: the c
    checkpointed repetitions (R, floor(R/K)) keep only their input, the others S. selective /
    op: every repetition keeps what the policy keeps of each op (:meth:`Op.kept_under`). Where
    a policy drops something, one repetition at a time is rebuilt around what it kept (S less
    that), the largest such block's. With one repetition every policy holds what none holds.
    """
    g = graph(model, seq_len, mb, precision, attention, compiled, stack)
    z = np.zeros_like(np.asarray(mb, dtype=float))

    def total(ops, policy="none"):
        return sum((op.count * np.asarray(op.kept_under(policy), float) for op in ops), z)

    trunk, live = z, [z]
    for b in g.blocks:
        full = total(b.ops)
        c = checkpointed_layers(checkpointing, b.repeat)
        if c:
            kept = np.asarray(b.input_bytes, float) + z
        elif checkpointing != "none":
            c, kept = b.repeat, total(b.ops, checkpointing)
        else:
            kept = full
        trunk = trunk + (b.repeat - c) * full + c * kept
        if c:
            live.append(full - kept)
    return trunk + np.max(live, axis=0) + total(g.outside)


def logits_bytes(model, seq_len: int, mb: np.ndarray, precision: str, compiled: bool,
                 stack: Stack | str | None = None) -> np.ndarray:
    """Logits and loss buffers of one micro-batch (bytes), from the family's graph."""
    g = graph(model, seq_len, mb, precision, family_of(model).attentions[-1], compiled, stack)
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
