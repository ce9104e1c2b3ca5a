"""Time of one micro-batch's forward and backward on one device (roofline + profile efficiencies).

Pure and vectorized over the micro-batch size. Seconds and FLOPs. Parts that do not depend on
a knob are computed once per search (``memo``): GEMMs depend only on precision, attention on
precision and backend, bandwidth-bound ops on precision and compilation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import fresh_memory, kernels, workload
from .device import Device
from .models import ModelSpec
from .stacks import Stack, get_stack
from .strategy import checkpointed_layers
from .workload import Gemm, MemOps

#: FlashAttention's backward executes 5 matmuls of the forward's size against the forward's 2
#: (it recomputes the scores): 2.5x the forward FLOPs (Dao 2023, FlashAttention-2, sec. 3.1.2).
FLASH_BWD_FLOPS = 2.5
#: Half-efficiency sequence length of FlashAttention-2 without the causal mask, relative to causal:
#: 91 / 381 tokens, least-squares fits of e * d/(d + d_half) * s/(s + s_half) to the FA2 forward
#: bars (head dim 64 and 128, seq 512-16k, H100 SXM5 BF16) of Shah et al. 2024 (FlashAttention-3,
#: arXiv 2407.08608, fig. 5), non-causal and causal panels.
NONCAUSAL_SEQ_HALF = 0.24


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


@dataclass(frozen=True)
class _Part:
    """Seconds (without kernel launches), FLOPs and kernel counts of a group of ops."""

    t_fwd: np.ndarray
    t_bwd: np.ndarray
    fl_fwd: np.ndarray
    fl_bwd: np.ndarray
    k_fwd: float
    k_bwd: float


def _gemm_part(dev: Device, precision: str, gemms: list[Gemm], B: int) -> _Part:
    """All GEMMs of ``gemms`` at once: forward (m,n,k); backward: input gradient (m,k,n) in the
    profile's backward layout, weight gradient (n,k,m) in its weight-gradient layout."""
    peak = dev.gemm_peak(precision)
    prof = dev.profile
    fw, dg, wg = prof.gemm_for(precision), prof.gemm_bwd_for(precision), prof.gemm_wgrad_for(precision)
    e = workload.act_bytes(precision)
    bw, bw_eff = dev.mem_bw, dev.profile.memory_bw_eff
    m = np.stack([np.broadcast_to(np.asarray(g.m, float), (B,)) for g in gemms])  # (G, B)
    n = np.array([float(g.n) for g in gemms])[:, None]
    k = np.array([float(g.k) for g in gemms])[:, None]
    w = np.stack([np.broadcast_to(np.asarray(g.batch, float), (B,)) for g in gemms]) \
        * np.array([float(g.count) for g in gemms])[:, None]  # repetitions per micro-batch

    weight = n * k * e  # the layer's weight: the operand or output the unblocked kernels stream

    def t(mm, nn, kk, g):
        return (w * kernels.gemm_time(mm, nn, kk, peak, g.e_max, g.x_half, e, bw, bw_eff, 0.0,
                                      g.operand_half_bytes, g.operand_floor, weight)).sum(0)

    kk_full = np.broadcast_to(k, m.shape)
    nn_full = np.broadcast_to(n, m.shape)
    fl = (w * 2.0 * m * n * k).sum(0)
    t_f = t(m, nn_full, kk_full, fw)
    t_b = t(m, kk_full, nn_full, dg) + t(nn_full, kk_full, m, wg)
    count = float(sum(g.count for g in gemms))
    return _Part(t_f, t_b, fl, 2.0 * fl, count, 2.0 * count)


def _mem_part(dev: Device, fwd: MemOps, bwd: MemOps, op: str = "elementwise") -> _Part:
    eff_bw = dev.mem_bw * dev.profile.bw_eff(op)
    z = np.zeros_like(np.asarray(fwd.nbytes, float))
    return _Part(fwd.nbytes / eff_bw, bwd.nbytes / eff_bw, z, z, float(fwd.kernels), float(bwd.kernels))


def _sum(*parts: _Part) -> _Part:
    return _Part(sum(p.t_fwd for p in parts), sum(p.t_bwd for p in parts), sum(p.fl_fwd for p in parts),
                 sum(p.fl_bwd for p in parts), sum(p.k_fwd for p in parts), sum(p.k_bwd for p in parts))


def _attention_part(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, dev: Device) -> _Part:
    prof = dev.profile
    if attention == "sdpa":
        a = prof.attention
        if precision in ("bf16", "fp16"):
            peak, e_f, e_b = dev.gemm_peak(precision), a.flash_fwd, a.flash_bwd
        else:  # SDPA on fp32 inputs picks the memory-efficient kernel on CUDA cores
            peak, e_f, e_b = dev.peak_flops["fp32"], a.mem_efficient_fwd, a.mem_efficient_bwd
        # seq_half describes causal kernels (decoder training); without the mask the score tiles
        # are full from the first one, so the sequence dependence is weaker
        s_half = a.seq_half * (1.0 if workload.is_causal(model) else NONCAUSAL_SEQ_HALF)
        shape = (model.head_dim, seq_len, a.head_dim_half, s_half)
        e_f, e_b = kernels.attention_efficiency(e_f, *shape), kernels.attention_efficiency(e_b, *shape)
        fl = workload.attention_flops_fwd(model, mb, seq_len, fused=True)
        return _Part(fl / (peak * e_f), FLASH_BWD_FLOPS * fl / (peak * e_b), fl, FLASH_BWD_FLOPS * fl,
                     float(model.n_layers), float(model.n_layers))
    g = _gemm_part(dev, precision, workload.eager_attention_gemms(model, mb, seq_len), mb.size)
    sf, sb = workload.eager_softmax_bytes(model, mb, seq_len, workload.act_bytes(precision))
    return _sum(g, _mem_part(dev, sf, sb, "softmax"))


def micro_batch_time(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                     compiled: bool, checkpointing: str, dev: Device, memo: dict | None = None,
                     stack: Stack | None = None) -> MicroBatchTime:
    """Seconds for one micro-batch of ``mb`` samples (array) under the given knobs.

    Recomputation during backward: full re-runs every layer's forward, every:K the forward of
    floor(L/K) layers; selective re-runs only the attention core (Korthikanti et al. 2022); op
    (torchtitan's op-level policy) re-runs what is not a matmul or fused attention: the norms,
    activations, rotary and residual kernels, and eager attention's scores and softmax. Each
    kernel costs the profile's launch overhead (eager, or per fused kernel under torch.compile).
    ``stack`` (default hf-trainer) decides whether eager norms write fp32 and whether the loss
    is one fused kernel.
    """
    if not isinstance(model, ModelSpec):  # other families: through their operations
        from . import opcost

        return opcost.micro_batch_time(model, seq_len, mb, precision, attention, compiled, checkpointing, dev, memo,
                                       stack)
    mb = np.asarray(mb, dtype=float)
    memo = {} if memo is None else memo
    stack = get_stack(stack)
    e = workload.act_bytes(precision)
    B = mb.size

    def cached(key, fn):
        if key not in memo:
            memo[key] = fn()
        return memo[key]

    layers = cached(("gemm", precision), lambda: _gemm_part(dev, precision, workload.layer_gemms(model, mb * seq_len), B))
    heads_g = workload.head_gemms(model, mb, seq_len)
    head = cached(("head", precision), lambda: _gemm_part(dev, precision, heads_g, B) if heads_g
                  else _Part(0 * mb, 0 * mb, 0 * mb, 0 * mb, 0.0, 0.0))
    attn = cached(("attn", precision, attention), lambda: _attention_part(model, seq_len, mb, precision, attention, dev))

    fp32_norm, fused_loss = stack.fp32_norm(e, compiled), stack.fused_loss

    def elementwise():
        lf, lb = workload.layer_elementwise(model, mb, seq_len, e, compiled, fp32_norm)
        return _mem_part(dev, lf, lb)

    def outside():
        lsf, lsb = workload.loss_bytes(model, mb, seq_len, e, compiled, fused_loss)
        emf, emb = workload.embedding_bytes(model, mb, seq_len, e)
        return _sum(_mem_part(dev, lsf, lsb, "loss"), _mem_part(dev, emf, emb, "embedding"))

    elem = cached(("elem", precision, compiled, fp32_norm), elementwise)
    out = cached(("outside", precision, compiled, fused_loss), outside)
    prof = dev.profile
    launch = 1e-6 * (prof.compiled_launch_overhead_us if compiled else prof.launch_overhead_us)
    # eager training passes: host work around each kernel (module calls, views, autograd), where calibrated
    extra = {"fwd": 0.0 if compiled else 1e-6 * (prof.train_fwd_kernel_us or 0.0),
             "bwd": 0.0 if compiled else 1e-6 * (prof.train_bwd_kernel_us or 0.0)}

    # A host CPU dispatches kernels asynchronously to an accelerator: a pass takes the longer of
    # the device's kernel time and the host's dispatch time (small models in eager mode are
    # dispatch-bound; that is what torch.compile and fusion remove). On a CPU device the same
    # cores do both, one after the other.
    serial = prof.device.kind == "cpu"

    def pass_time(parts: list[_Part], which: str):
        t = sum(p.t_fwd if which == "fwd" else p.t_bwd for p in parts)
        k = sum(p.k_fwd if which == "fwd" else p.k_bwd for p in parts)
        per_kernel = launch + extra[which]
        return t + k * per_kernel if serial else np.maximum(t, k * per_kernel)

    # host time per layer and pass that the device waits for (module dispatch, FSDP/DDP hooks);
    # fitted end to end (profile.layer_overhead_us, 0 in microbenchmark profiles)
    host = 1e-6 * prof.layer_overhead_us * model.n_layers
    c = checkpointed_layers(checkpointing, model.n_layers)
    if c:
        share = c / model.n_layers
        rec = share * (pass_time([layers, attn, elem], "fwd") + host)
        rec_fl = share * (layers.fl_fwd + attn.fl_fwd)
    elif checkpointing == "selective":
        rec, rec_fl = pass_time([attn], "fwd"), attn.fl_fwd
    elif checkpointing == "op":
        eager = attention == "eager"
        rec = pass_time([elem, attn] if eager else [elem], "fwd")
        rec_fl = attn.fl_fwd if eager else 0.0 * mb
    else:
        rec, rec_fl = 0.0 * mb, 0.0 * mb
    fwd = pass_time([layers, attn, elem, head, out], "fwd") + host
    bwd = pass_time([layers, attn, elem, head, out], "bwd") + host
    if prof.fresh_memory is not None:  # first touches of fresh host pages (CPU devices)
        fr_f, fr_b = cached(("fresh", precision, attention, checkpointing), lambda: fresh_memory.micro_batch_fresh(
            model, seq_len, mb, precision, attention, checkpointing, prof))
        fwd, bwd = fwd + fr_f, bwd + fr_b
    hw = layers.fl_fwd + layers.fl_bwd + attn.fl_fwd + attn.fl_bwd + head.fl_fwd + head.fl_bwd + rec_fl
    z = np.zeros_like(mb)
    return MicroBatchTime(fwd + z, bwd + z, rec + z, hw + z)
