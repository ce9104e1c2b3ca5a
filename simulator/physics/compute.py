"""Time of one micro-batch's forward and backward on one device: the operations of the model's
family (``simulator/model/families``, built by :func:`simulator.model.graphs.graph`) at the profile's
efficiencies (roofline; docs/architecture.md, physics 1-3).

Pure and vectorized over the micro-batch size. Seconds and FLOPs. Parts that do not depend on
a knob are computed once per search (``memo``): a GEMM's time depends on its shape and the
precision only, the rest of the graph on precision, attention, compilation and stack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.vocab import FP8, MIXED_PRECISIONS, base_precision
from ..hardware.device import Device
from ..hardware.rates import atomic_rate
from ..model import workload
from ..model.families.base import Graph, Op
from ..model.graphs import graph
from ..strategy.knobs import checkpointed_layers
from ..strategy.stacks import Stack, get_stack
from . import fresh_memory, kernels

#: Half-efficiency sequence length of FlashAttention-2 without the causal mask, relative to causal:
#: 91 / 381 tokens, least-squares fits of e * d/(d + d_half) * s/(s + s_half) to the FA2 forward
#: bars (head dim 64 and 128, seq 512-16k, H100 SXM5 BF16) of Shah et al. 2024 (FlashAttention-3,
#: arXiv 2407.08608, fig. 5), non-causal and causal panels.
NONCAUSAL_SEQ_HALF = 0.24
#: Cache-line size of x86-64 and most ARM server cores, bytes (Intel 64 and IA-32 Architectures
#: Optimization Reference Manual; AMD Software Optimization Guide for EPYC): on a CPU, output rows
#: whose length is not a multiple of it take the profile's ``gemm_misaligned`` factor.
CACHE_LINE_BYTES = 64
#: Operand alignment of a GPU's tensor-core GEMM kernels, bytes: leading dimensions that are
#: multiples of 16 bytes (8 half or 4 fp32 elements; NVIDIA Deep Learning Performance guide, "Matrix
#: Multiplication Background", Tensor Core requirements; the alignment torch.compile's Inductor pads
#: matmul operands to, torch/_inductor/fx_passes/pad_mm.py get_alignment_size_dtype). On a GPU a GEMM
#: whose weight dimension n or k is not a multiple of it takes the profile's ``gemm_misaligned`` and
#: ``gemm_misaligned_bwd`` factors.
GPU_ALIGN_BYTES = 16
#: Host time per kernel of an eager training pass beyond the launch (module calls, autograd
#: recording, autocast), forward and backward, us, for ops at a graph break (``Op.graph_break``:
#: Hugging Face's expert loop, whose host time is what makes it slow) on a profile that has not
#: calibrated its own (``train_fwd_kernel_us_amp``, ``train_bwd_kernel_us_amp``): measured by
#: calibration/benches/dispatch.py under autocast on an H200 node (calibration/profiles/nvidia-h200.json,
#: 2026-12-04: 33.3 and 17.2 us). The catalog profiles leave it out of the other ops, whose host
#: time the device hides in all but small models.
EAGER_TRAIN_KERNEL_US = (33.3, 17.2)


@dataclass(frozen=True)
class MicroBatchTime:
    """Per micro-batch: seconds of forward, backward, recomputation; executed FLOPs."""

    fwd: np.ndarray
    bwd: np.ndarray
    recompute: np.ndarray
    hw_flops: np.ndarray
    #: seconds per micro-batch the device waits for the host inside those passes (each pass's host
    #: dispatch time beyond its kernel time; 0 where the device is the bottleneck, and on CPUs). Plans
    #: report it (breakdown_s host_wait) and call a step host-bound by it; collectives queued on the
    #: stream would run in it, which the search does not count yet (docs/small_model_runs.md)
    host_idle: np.ndarray | float = 0.0

    @property
    def total(self) -> np.ndarray:
        return self.fwd + self.bwd + self.recompute


def fused_attention_rate(dev: Device, precision: str, head_dim: float, seq_len: float,
                         causal: bool, kernel: str = "flash") -> tuple[float, np.ndarray, np.ndarray]:
    """(peak FLOP/s, forward efficiency, backward efficiency) of fused attention (SDPA) for one
    head size (elements), sequence length (tokens) and mask: FlashAttention on the tensor peak in
    half precision (bf16 under fp8: attention stays in bf16), the memory-efficient kernel on CUDA
    cores on fp32 inputs; the profile's efficiencies (in half precision the stack's ``kernel``'s,
    :meth:`simulator.hardware.profile.Profile.attention_kernel`) scaled by
    :func:`simulator.physics.kernels.attention_efficiency`. ``seq_half`` describes
    causal kernels (decoder training); without the mask the score tiles are full from the first
    one, so the sequence dependence is weaker (:data:`NONCAUSAL_SEQ_HALF`)."""
    if precision in MIXED_PRECISIONS:  # the stack's ``kernel``: cuDNN's where the profile times it apart
        a = dev.profile.attention_kernel(kernel)
        peak, e_f, e_b = dev.gemm_peak(base_precision(precision)), a.flash_fwd, a.flash_bwd
        d_half, s_half = a.head_dim_half, a.seq_half
    else:
        a = dev.profile.attention
        peak, e_f, e_b = dev.peak_flops["fp32"], a.mem_efficient_fwd, a.mem_efficient_bwd
        d_half = a.head_dim_half if a.mem_efficient_head_dim_half is None else a.mem_efficient_head_dim_half
        s_half = a.seq_half if a.mem_efficient_seq_half is None else a.mem_efficient_seq_half
    shape = (head_dim, seq_len, d_half, s_half * (1.0 if causal else NONCAUSAL_SEQ_HALF))
    return peak, kernels.attention_efficiency(e_f, *shape), kernels.attention_efficiency(e_b, *shape)


def op_times(op: Op, dev: Device, precision: str, compiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one repetition of ``op``, without kernel launches.

    GEMMs: :func:`gemm_times` in :func:`gemm_precision` (``compiled``: under torch.compile, which pads
    misaligned GEMMs on a GPU). Fused attention: its FLOPs at :func:`fused_attention_rate`.
    Scan, conv and elementwise ops: roofline of their FLOPs on the CUDA-core fp32 peak and their
    bytes at the profile's bandwidth efficiency (of the op's ``bandwidth`` class where the
    profile calibrates one); fp32 atomic adds of a backward (``atomics_bwd``) add their time at
    the GPU's atomic rate (:func:`simulator.hardware.rates.atomic_rate`).
    """
    if op.kind == "gemm":
        t_f, t_b = gemm_times([op], dev, gemm_precision(op, precision), compiled)
        return t_f[0], t_b[0]
    prof = dev.profile
    bw, bw_eff = dev.mem_bw, prof.memory_bw_eff
    if op.kind == "attention":
        peak, e_f, e_b = fused_attention_rate(dev, precision, op.head_dim, op.seq, op.causal, op.attention_kernel)
        return op.fwd_flops() / (peak * e_f), op.bwd_flops() / (peak * e_b)
    peak = dev.peak_flops["fp32"]
    eff_bw = bw * (prof.bw_eff(op.bandwidth) if op.bandwidth else bw_eff)
    eff_bw_b = bw * prof.bw_eff(op.bandwidth_bwd) if op.bandwidth_bwd else eff_bw
    t_f = np.maximum(op.fwd_flops() / peak, np.asarray(op.bytes_fwd, float) / eff_bw)
    t_b = np.maximum(op.bwd_flops() / peak, np.asarray(op.bytes_bwd, float) / eff_bw_b)
    if np.any(np.asarray(op.atomics_bwd) > 0):  # serialized behind the kernel's scans (see Op)
        t_b = t_b + np.asarray(op.atomics_bwd, float) / (atomic_rate(prof) * 1e9)
    return t_f, t_b


def micro_batch_time(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, compiled: bool,
                     checkpointing: str, dev: Device, memo: dict | None = None,
                     stack: Stack | str | None = None) -> MicroBatchTime:
    """Seconds of one micro-batch of ``mb`` samples (array) under the given knobs (forward,
    backward, recomputation) and executed FLOPs, any family.

    A host CPU dispatches kernels asynchronously to an accelerator: a pass takes the longer of the
    device's kernel time and the host's dispatch time (kernel launches x the profile's overhead,
    eager or per fused kernel under torch.compile; small models in eager mode are
    dispatch-bound). On a CPU device the same cores do both, one after the other. Each block
    repetition adds the profile's host time (``layer_overhead_us``: module dispatch, FSDP/DDP
    hooks; fitted end to end, 0 in microbenchmark profiles) to every pass.

    Recomputation during backward: full and every:K re-run the whole forward (and its host time)
    of the checkpointed repetitions of each block (all, floor(R/K)); selective and op re-run the
    ops that name them (the transformer: selective its attention core, Korthikanti et al. 2022;
    op, torchtitan's op-level policy, what is not a matmul or fused attention); ops marked
    ``always`` (kernels that recompute by design, e.g. mamba-ssm's conv and delta) re-run in every
    backward, on top of any checkpointing. ``stack`` (default hf-trainer) decides whether eager
    norms write fp32 and whether the loss is one fused kernel. On CPU devices with a
    ``fresh_memory`` fit, first touches of fresh pages are added (:mod:`simulator.physics.fresh_memory`).
    ``memo``: a dict shared by the calls of one search (one model, sequence length and ``mb``).
    """
    mb = np.asarray(mb, dtype=float)
    memo = {} if memo is None else memo
    stack = get_stack(stack)
    key = ("ops", precision, attention, compiled, stack)
    if key not in memo:
        memo[key] = _timed(graph(model, seq_len, mb, precision, attention, compiled, stack), dev, precision,
                           compiled, memo, stack.eager_dispatch(compiled))
    tm: _Timed = memo[key]
    g = tm.graph
    share = {i: checkpointed_layers(checkpointing, b.repeat) / max(b.repeat, 1) for i, b in enumerate(g.blocks)}
    if any(share.values()):  # layer-granular: whole repetitions re-run
        rerun = [r for r in tm.rows if r.block is not None and share[r.block]]
        scale = [share[r.block] for r in rerun]
        rec = tm.pass_time(rerun, "fwd", scale) + tm.host * sum(share[i] * b.repeat for i, b in enumerate(g.blocks))
    else:
        rerun = [r for r in tm.rows if r.block is not None and checkpointing in r.recompute]
        scale = [1.0] * len(rerun)
        rec = tm.pass_time(rerun, "fwd", scale) if rerun else 0.0 * mb
    idle = tm.idle + (tm.idle_time(rerun, "fwd", scale) if rerun else 0.0)
    rec = rec + tm.always_time
    hw = tm.hw + sum((s * r.fl_fwd for s, r in zip(scale, rerun, strict=True)), 0.0 * mb)
    fwd, bwd = tm.fwd, tm.bwd
    prof = dev.profile
    if prof.fresh_memory is not None:  # first touches of fresh host pages (CPU devices)
        key = ("fresh", precision, attention, checkpointing)
        if key not in memo:
            memo[key] = fresh_memory.micro_batch_fresh(model, seq_len, mb, precision, attention, checkpointing, prof)
        fwd, bwd, rec = fwd + memo[key][0], bwd + memo[key][1], rec + memo[key][2]
    z = np.zeros_like(mb)
    return MicroBatchTime(fwd + z, bwd + z, rec + z, hw + z, idle + z)


@dataclass(frozen=True)
class CoreTime:
    """Seconds of the forward and backward (without kernel launches) and FLOPs of a group of ops."""

    t_fwd: np.ndarray
    t_bwd: np.ndarray
    fl_fwd: np.ndarray
    fl_bwd: np.ndarray


def attention_core(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, dev: Device,
                   stack: Stack | str | None = None) -> CoreTime:
    """The attention core of one micro-batch of ``mb`` samples (array), all blocks: the ops that
    selective checkpointing re-runs (Korthikanti et al. 2022: the fused kernel, or eager
    attention's scores, softmax and values). Context parallelism runs it once more per further
    key/value block of the ring. ``stack``: the training stack (None: the default), which picks the kernel."""
    mb = np.asarray(mb, dtype=float)
    tm = _timed(graph(model, seq_len, mb, precision, attention, False, stack), dev, precision, False, {}, True)
    core = [r for r in tm.rows if r.block is not None and "selective" in r.recompute]
    z = np.zeros_like(mb)
    return CoreTime(*(sum((getattr(r, f) for r in core), z) for f in ("t_fwd", "t_bwd", "fl_fwd", "fl_bwd")))


def _timed(g: Graph, dev: Device, precision: str, compiled: bool, memo: dict, eager_host: bool) -> _Timed:
    """The graph's ops timed on ``dev``; the last few are kept (with their graph and device), so
    a search repeated with other pins, or the same layout's view asked again, times them once.
    ``eager_host``: whether eager PyTorch issues the kernels (:meth:`simulator.strategy.stacks.Stack.eager_dispatch`)."""
    key = (id(g), precision, compiled, eager_host)
    hit = _TIMED.get(key)
    if hit is not None and hit[0] is g and (hit[1] is dev or hit[1] == dev):
        return hit[2]
    tm = _Timed(g, dev, precision, compiled, memo, eager_host)
    if len(_TIMED) >= 256:
        _TIMED.pop(next(iter(_TIMED)))
    _TIMED[key] = (g, dev, tm)
    return tm


_TIMED: dict = {}


@dataclass(frozen=True)
class _Row:
    """One op per micro-batch: seconds and kernel launches of each pass, FLOPs, its block (None:
    outside the trunk) and the policies that re-run it."""

    t_fwd: np.ndarray
    k_fwd: float
    t_bwd: np.ndarray
    k_bwd: float
    fl_fwd: np.ndarray
    fl_bwd: np.ndarray
    block: int | None
    recompute: frozenset[str]
    graph_break: bool = False


class _Timed:
    """A graph's ops timed on a device, and what does not depend on checkpointing: the forward
    and backward passes with the host time per block repetition, the FLOPs of both, and the
    re-runs of ops marked ``always``."""

    def __init__(self, g: Graph, dev: Device, precision: str, compiled: bool, memo: dict, eager_host: bool):
        prof = dev.profile
        self.graph = g
        self.launch = 1e-6 * (prof.launch_overhead_us if eager_host else prof.compiled_launch_overhead_us)
        # eager training passes: host work around each kernel (module calls, views, autograd), where calibrated
        fwd_us, bwd_us = prof.train_fwd_kernel_us, prof.train_bwd_kernel_us
        if precision in MIXED_PRECISIONS and prof.train_fwd_kernel_us_amp is not None:  # autocast's own
            fwd_us, bwd_us = prof.train_fwd_kernel_us_amp, prof.train_bwd_kernel_us_amp
        self.extra = {"fwd": 1e-6 * (fwd_us or 0.0) if eager_host else 0.0,
                      "bwd": 1e-6 * (bwd_us or 0.0) if eager_host else 0.0}
        # ops at a graph break run eagerly under torch.compile too (Op.graph_break), at the eager
        # training host time per kernel: the profile's, else EAGER_TRAIN_KERNEL_US
        e_f, e_b = (fwd_us, bwd_us or 0.0) if fwd_us is not None else EAGER_TRAIN_KERNEL_US
        self.eager_kernel = {"fwd": 1e-6 * prof.launch_overhead_us + 1e-6 * e_f,
                             "bwd": 1e-6 * prof.launch_overhead_us + 1e-6 * e_b}
        self.serial = prof.device.kind == "cpu"
        self.host = 1e-6 * prof.layer_overhead_us
        placed = [(op, float(b.repeat) * op.count, i, b.name) for i, b in enumerate(g.blocks) for op in b.ops]
        placed += [(op, op.count, None, "") for op in g.outside]
        _time_gemms([(op, where) for op, _, _, where in placed if op.kind == "gemm"], dev, precision, compiled, memo)
        self.rows = [_row(op, reps, i, dev, precision, compiled, memo, where) for op, reps, i, where in placed]
        reps = sum(b.repeat for b in g.blocks)
        self.fwd = self.pass_time(self.rows, "fwd") + self.host * reps
        self.bwd = self.pass_time(self.rows, "bwd") + self.host * reps
        self.idle = self.idle_time(self.rows, "fwd") + self.idle_time(self.rows, "bwd")
        always = [r for r in self.rows if "always" in r.recompute]
        self.always_time = self.pass_time(always, "fwd") if always else 0.0
        self.hw = sum(r.fl_fwd + r.fl_bwd for r in self.rows) + sum(r.fl_fwd for r in always)

    def idle_time(self, rows: list[_Row], which: str, scale: list[float] | None = None) -> np.ndarray | float:
        """Seconds of one pass over ``rows`` in which the device waits for the host's dispatch:
        the host time of the rows not at a graph break beyond their kernel time (those at a graph
        break sync the host in the forward and leave nothing queued). 0 on a CPU, whose cores do
        both in turn."""
        if self.serial:
            return 0.0
        t, host = self._device_and_host(rows, which, scale)
        return np.maximum(host - t, 0.0)

    def _device_and_host(self, rows: list[_Row], which: str, scale: list[float] | None):
        """(kernel seconds, host dispatch seconds) of one pass over the ``rows`` not at a graph break."""
        w = [1.0] * len(rows) if scale is None else scale
        rest = [(s, r) for s, r in zip(w, rows, strict=True) if not r.graph_break]
        fwd = which == "fwd"
        t = sum(s * (r.t_fwd if fwd else r.t_bwd) for s, r in rest)
        k = sum(s * (r.k_fwd if fwd else r.k_bwd) for s, r in rest)
        return t, k * (self.launch + self.extra[which])

    def pass_time(self, rows: list[_Row], which: str, scale: list[float] | None = None) -> np.ndarray:
        """Seconds of one pass over ``rows`` (each x its ``scale``): the longer of the device's
        kernel time and the host's dispatch time (on a CPU device, their sum).

        Rows at a graph break (``Op.graph_break``: Hugging Face's eager expert loop) dispatch at
        the eager host time per kernel even when compiled. Their forward waits for the device at
        each of its host syncs, so it overlaps nothing else: it adds the longer of its own device
        and host times to the rest's (a loop of identical iterations, each the longer of the two).
        Their backward has no sync: its device and host times join the rest's."""
        w = [1.0] * len(rows) if scale is None else scale
        fwd = which == "fwd"
        t, host = self._device_and_host(rows, which, scale)
        loop = [(s, r) for s, r in zip(w, rows, strict=True) if r.graph_break]
        if not loop:
            return t + host if self.serial else np.maximum(t, host)
        t_loop = sum(s * (r.t_fwd if fwd else r.t_bwd) for s, r in loop)
        host_loop = sum(s * (r.k_fwd if fwd else r.k_bwd) for s, r in loop) * self.eager_kernel[which]
        if self.serial:
            return t + host + t_loop + host_loop
        if fwd:
            return np.maximum(t, host) + np.maximum(t_loop, host_loop)
        return np.maximum(t + t_loop, host + host_loop)


def layer_gemm_times(model, tokens, precision: str, dev: Device, chunks: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per micro-batch of the view's layer GEMMs (all its layers) on ``tokens`` rows
    (array): forward, and backward (input gradient + weight gradient), timed as
    :func:`gemm_pass_times` times every GEMM. ``chunks``: the forward and input-gradient GEMMs
    run as that many pieces of tokens/chunks rows each (asynchronous TP's decomposition); the
    weight gradient, a reduction over the tokens, is not split."""
    t = np.asarray(tokens, dtype=float)
    gemms = workload.layer_gemms(model, t)
    count = np.array([float(g.count) for g in gemms]).reshape((-1,) + (1,) * t.ndim)
    t_f, t_d, t_w = gemm_pass_times([dataclasses.replace(g, m=t / chunks) for g in gemms], dev, precision)
    if chunks != 1:
        t_w = gemm_pass_times(gemms, dev, precision)[2]
    return (count * chunks * t_f).sum(axis=0), (count * (chunks * t_d + t_w)).sum(axis=0)


def gemm_times(ops: list[Op], dev: Device, precision: str, compiled: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one repetition of each GEMM op (first axis), all at once:
    :func:`gemm_pass_times` with the backward's two GEMMs added."""
    t_f, t_d, t_w = gemm_pass_times(ops, dev, precision, compiled)
    return t_f, t_d + t_w


def misaligned_gemms(n: np.ndarray, k: np.ndarray, batch: np.ndarray, elem_bytes: int, kind: str,
                     compiled: bool) -> np.ndarray:
    """Which GEMMs of weight dimensions ``n`` x ``k`` (``batch`` copies each; arrays broadcast) run
    misaligned. On a CPU: output rows that are not whole cache lines (n x ``elem_bytes`` not a multiple
    of :data:`CACHE_LINE_BYTES`; Inductor pads no CPU matmul: pad_mm's check_device wants CUDA or XPU).
    On a GPU: n or k x ``elem_bytes`` not a multiple of :data:`GPU_ALIGN_BYTES`, for single GEMMs (what
    was measured: linear layers, GPT-2's 50257-token head), and none under torch.compile, whose
    Inductor pads such operands to the alignment (``shape_padding``, on by default)."""
    if kind == "cpu":
        return np.mod(n * elem_bytes, CACHE_LINE_BYTES) != 0
    off = (np.mod(n * elem_bytes, GPU_ALIGN_BYTES) != 0) | (np.mod(k * elem_bytes, GPU_ALIGN_BYTES) != 0)
    return off & (np.asarray(batch) == 1) & (not compiled)


def gemm_pass_times(ops: Sequence[Op | workload.Gemm], dev: Device, precision: str,
                    compiled: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, input-gradient, weight-gradient) seconds of one repetition of each GEMM op
    (first axis): the profile's shape-dependent efficiency (forward layout; the input gradient
    (m,k,n) in the backward layout, the weight gradient (n,k,m) in the weight-gradient layout),
    or the operand traffic if slower; misaligned GEMMs (:func:`misaligned_gemms`, ``compiled``: under
    torch.compile) take the profile's ``gemm_misaligned`` factor forward and ``gemm_misaligned_bwd``
    on both backward GEMMs. ``batch`` GEMMs of an op are ``batch`` times one GEMM
    of m rows; a grouped op's (``Op.grouped``), where the profile calibrates
    ``grouped_gemm_m_half`` h, one GEMM of all batch x m rows in each pass times 1 + h/m."""
    prof = dev.profile
    g, gb, gw = prof.gemm_for(precision), prof.gemm_bwd_for(precision), prof.gemm_wgrad_for(precision)
    peak, e = dev.gemm_peak(precision), workload.act_bytes(precision)
    bw, bw_eff = dev.mem_bw, prof.bw_eff("gemm")
    shape = np.broadcast_shapes(*(np.shape(op.m) for op in ops), *(np.shape(op.batch) for op in ops))
    m = np.stack([np.broadcast_to(np.asarray(op.m, float), shape) for op in ops])
    w = np.stack([np.broadcast_to(np.asarray(op.batch, float), shape) for op in ops])
    n = np.array([float(op.n) for op in ops]).reshape((-1,) + (1,) * len(shape))
    k = np.array([float(op.k) for op in ops]).reshape(n.shape)

    weight = n * k * e  # the layer's weight: the operand or output unblocked kernels stream

    def t(mm, nn, kk, eff, walks=False):
        # input gradient g @ W: a reference kernel's dot products walk a column of W (kk long, nn apart)
        walk = kernels.strided_walk_factor(nn, kk, e, eff.strided) if walks and eff.strided else 1.0
        return w * kernels.gemm_time(mm, nn, kk, peak, eff.e_max, eff.x_half, e, bw, bw_eff, 0.0,
                                     eff.operand_half_bytes, eff.operand_floor, weight, walk, eff.halves, eff.k_power)

    batch = w  # copies per op, before a grouped op's become one GEMM
    h = prof.grouped_gemm_m_half.get(precision)
    grouped = np.array([h is not None and getattr(op, "grouped", False) for op in ops]).reshape(n.shape)
    if grouped.any():
        factor = np.where(grouped, 1.0 + h / np.maximum(m, 1.0), 1.0)
        m_f = np.where(grouped, w * m, m)  # a grouped op as one GEMM of all its rows and weights
        weight = np.where(grouped, w * weight, weight)
        w = np.where(grouped, 1.0, w)
    else:
        factor, m_f = 1.0, m

    t_f, t_d, t_w = factor * t(m_f, n, k, g), factor * t(m_f, k, n, gb, walks=True), factor * t(n, k, m_f, gw)
    if grouped.any():  # still at least each group's operands, weight (or its gradient) and output moved once
        t_f, t_d, t_w = (np.where(grouped, np.maximum(tt, batch * kernels.gemm_traffic_time(*mnk, e, bw, bw_eff)), tt)
                         for tt, mnk in ((t_f, (m, n, k)), (t_d, (m, k, n)), (t_w, (n, k, m))))
    mis_f, mis_b = prof.gemm_misaligned.get(precision, 1.0), prof.gemm_misaligned_bwd.get(precision, 1.0)
    if mis_f != 1.0 or mis_b != 1.0:  # GPT-2's 50257-token head
        off = misaligned_gemms(n, k, batch, e, prof.device.kind, compiled)
        t_f, t_d, t_w = t_f * np.where(off, mis_f, 1.0), t_d * np.where(off, mis_b, 1.0), t_w * np.where(off, mis_b, 1.0)
    return t_f, t_d, t_w


def _gemm_key(precision: str, compiled: bool, where: str, op: Op) -> tuple:
    return ("gemm", precision, compiled, where, op.name)


def gemm_precision(op: Op, precision: str) -> str:
    """The precision a GEMM op runs in under the training ``precision``: FP8 for an FP8 linear
    layer's GEMMs under fp8, else the precision of the rest (bf16 under fp8: attention's, the
    head's and the router's GEMMs)."""
    return FP8 if precision == FP8 and op.fp8_linear else base_precision(precision)


def _time_gemms(ops: list[tuple[Op, str]], dev: Device, precision: str, compiled: bool, memo: dict) -> None:
    """Times the GEMM ops (each with its block's name) not yet in ``memo``, one call per
    :func:`gemm_precision`: a GEMM's time depends on its shape, that precision and (misaligned
    GEMMs, which torch.compile pads on a GPU) compilation only, so a search times each once."""
    todo = [(op, where) for op, where in ops if _gemm_key(precision, compiled, where, op) not in memo]
    for p in dict.fromkeys(gemm_precision(op, precision) for op, _ in todo):
        part = [(op, where) for op, where in todo if gemm_precision(op, precision) == p]
        t_f, t_b = gemm_times([op for op, _ in part], dev, p, compiled)
        for i, (op, where) in enumerate(part):
            memo[_gemm_key(precision, compiled, where, op)] = (t_f[i], t_b[i])


def _row(op: Op, reps: float, block: int | None, dev: Device, precision: str, compiled: bool, memo: dict,
         where: str) -> _Row:
    if op.kind == "gemm":  # the same shape in every graph of a search: one row
        key = ("gemm-row", precision, compiled, where, op.name)
        if key not in memo:
            t_f, t_b = memo[_gemm_key(precision, compiled, where, op)]
            fl = reps * op.fwd_flops()
            memo[key] = _Row(reps * t_f, reps * op.kernels_fwd, reps * t_b, reps * op.kernels_bwd, fl, 2.0 * fl,
                             block, op.recompute, op.graph_break)
        return memo[key]
    t_f, t_b = op_times(op, dev, precision)
    return _Row(reps * t_f, reps * op.kernels_fwd, reps * t_b, reps * op.kernels_bwd, reps * op.fwd_flops(),
                reps * op.bwd_flops(), block, op.recompute, op.graph_break)
