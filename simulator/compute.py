"""Time of one micro-batch's forward and backward on one device (roofline + profile efficiencies).

Pure and vectorized over the micro-batch size. Seconds and FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels, workload
from .device import Device
from .workload import Gemm, MemOps


@dataclass(frozen=True)
class MicroBatchTime:
    """Per micro-batch: seconds of forward, backward, recomputation; executed FLOPs."""

    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray
    hw_flops: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.fwd + self.bwd + self.recompute


class _Ctx:
    """Per-(device, precision, compile) constants used by every op."""

    def __init__(self, dev: Device, precision: str, compiled: bool):
        prof = dev.profile
        self.peak = dev.gemm_peak(precision)
        g = prof.gemm_for(precision)
        self.e_max, self.x_half = g.e_max, g.x_half
        self.bw = dev.mem_bw
        self.bw_eff = prof.memory_bw_eff
        self.launch = 1e-6 * (prof.compiled_launch_overhead_us if compiled else prof.launch_overhead_us)
        self.e = workload.act_bytes(precision)


def _gemm_time(c: _Ctx, g: Gemm, transpose: str = "fwd") -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) of a GEMM's forward, or of its two backward GEMMs."""
    m, n, k = g.m, g.n, g.k
    shapes = [(m, n, k)] if transpose == "fwd" else [(m, k, n), (np.full_like(m, k), n, m)]
    t = 0.0
    flops = 0.0
    for mm, nn, kk in shapes:
        one = kernels.gemm_time(mm, nn, kk, c.peak, c.e_max, c.x_half, c.e, c.bw, c.bw_eff, 0.0)
        t = t + g.count * (c.launch + g.batch * one)
        flops = flops + g.count * g.batch * 2.0 * mm * nn * kk
    return t, flops


def _mem_time(c: _Ctx, ops: MemOps) -> np.ndarray:
    return kernels.memory_bound_time(ops.nbytes, c.bw, c.bw_eff, c.launch, ops.kernels)


def micro_batch_time(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                     compiled: bool, checkpointing: str, dev: Device, half_params: bool,
                     n_params: float) -> MicroBatchTime:
    """Seconds for one micro-batch of ``mb`` samples (array) under the given knobs.

    Full checkpointing re-runs every layer's forward during backward; selective re-runs
    only the attention core (Korthikanti et al. 2022).
    """
    mb = np.asarray(mb, dtype=float)
    c = _Ctx(dev, precision, compiled)
    prof = dev.profile
    tokens = mb * seq_len

    # Transformer-layer GEMMs.
    lf = lb = lfl = lbl = 0.0
    for g in workload.layer_gemms(model, tokens):
        t, f = _gemm_time(c, g, "fwd")
        lf, lfl = lf + t, lfl + f
        t, f = _gemm_time(c, g, "bwd")
        lb, lbl = lb + t, lbl + f

    # Attention core.
    fused = attention == "sdpa"
    if fused:
        if precision in ("bf16", "fp16"):
            peak, e_f, e_b = c.peak, prof.attention.flash_fwd, prof.attention.flash_bwd
        else:  # SDPA on fp32 inputs picks the memory-efficient kernel on CUDA cores
            peak = dev.peak_flops["fp32"]
            e_f, e_b = prof.attention.mem_efficient_fwd, prof.attention.mem_efficient_bwd
        af_fl = workload.attention_flops_fwd(model, mb, seq_len, fused=True)
        ab_fl = 2.5 * af_fl
        af = af_fl / (peak * e_f) + model.n_layers * c.launch
        ab = ab_fl / (peak * e_b) + model.n_layers * c.launch
    else:
        af = ab = af_fl = ab_fl = 0.0
        for g in workload.eager_attention_gemms(model, mb, seq_len):
            t, f = _gemm_time(c, g, "fwd")
            af, af_fl = af + t, af_fl + f
            t, f = _gemm_time(c, g, "bwd")
            ab, ab_fl = ab + t, ab_fl + f
        sf, sb = workload.eager_softmax_bytes(model, mb, seq_len, c.e)
        af = af + _mem_time(c, sf)
        ab = ab + _mem_time(c, sb)

    # Bandwidth-bound layer ops.
    ef, eb = workload.layer_elementwise(model, mb, seq_len, c.e, compiled)
    ef_t, eb_t = _mem_time(c, ef), _mem_time(c, eb)

    # Outside the layers: embeddings, head GEMMs, loss, autocast weight casts.
    hf = hb = hfl = hbl = 0.0
    for g in workload.head_gemms(model, mb, seq_len):
        t, f = _gemm_time(c, g, "fwd")
        hf, hfl = hf + t, hfl + f
        t, f = _gemm_time(c, g, "bwd")
        hb, hbl = hb + t, hbl + f
    lsf, lsb = workload.loss_bytes(model, mb, seq_len, c.e, compiled)
    emf, emb = workload.embedding_bytes(model, mb, seq_len, c.e)
    cast = workload.autocast_cast_bytes(n_params, precision, half_params)
    cast_t = cast.nbytes / (c.bw * c.bw_eff) + 4 * model.n_layers * c.launch * (cast.nbytes > 0)
    hf = hf + _mem_time(c, lsf) + _mem_time(c, emf) + cast_t
    hb = hb + _mem_time(c, lsb) + _mem_time(c, emb)

    layer_fwd = lf + af + ef_t
    if checkpointing == "full":
        rec, rec_fl = layer_fwd, lfl + af_fl
    elif checkpointing == "selective":
        rec, rec_fl = af, af_fl
    else:
        rec, rec_fl = 0.0 * mb, 0.0 * mb
    fwd = layer_fwd + hf
    bwd = lb + ab + eb_t + hb
    hw = lfl + lbl + af_fl + ab_fl + hfl + hbl + rec_fl
    z = np.zeros_like(mb)
    return MicroBatchTime(fwd + z, bwd + z, rec + z, hw + z)
