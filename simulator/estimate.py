"""Vectorized evaluation of a whole strategy space for one model, recipe and cluster.

Every strategy (precision x attention x compile x checkpointing x sharding x offload x
micro-batch) becomes one element of flat numpy arrays: step time and its parts (seconds),
memory per GPU by component (bytes), feasibility. No I/O
docs/architecture.md, physics 1-7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from itertools import product

import numpy as np

from . import communication as comm
from . import fresh_memory, memory, workload
from .compute import micro_batch_time
from .device import Device
from .stacks import Stack, default_stack
from .strategy import SHARD_STAGE, Strategy, checkpointing_rank, offload_allowed

#: Bytes a sharded/unsharded Adam-family step moves per parameter (read master weights,
#: gradient, moments; write weights, moments; plus a half copy in mixed precision), and the
#: gradient-norm clipping pass (read for the norm, read + write to scale: 3 x grad bytes).
OPT_MOMENT_BYTES = {"adam": 8, "adamw": 8, "lion": 4, "sgd": 4}
OPT_KERNELS_PER_LAYER = 12


@dataclass(frozen=True)
class Problem:
    """What is being trained on what: everything but the strategy."""

    model: object  # ModelSpec
    seq_len: int
    global_batch: int  # sequences per optimizer step
    optimizer: str
    device: Device
    fabric: comm.Fabric
    host_memory: float  # bytes of host RAM per node available for offloaded states
    gpu_label: str  # e.g. "RTX 3090 24 GB" for messages
    stack: Stack = field(default_factory=default_stack)  # the training software (not searched)

    @property
    def n_gpus(self) -> int:
        return self.fabric.n

    @property
    def per_gpu_batch(self) -> int:
        """Samples each GPU processes per optimizer step (the slowest rank's share)."""
        return math.ceil(self.global_batch / self.n_gpus)


@dataclass
class Space:
    """Values of each knob to evaluate (a pinned knob has one value)."""

    precisions: list[str]
    attentions: list[str]
    compiles: list[bool]
    checkpointings: list[str]
    shardings: list[str]
    offloads: list[str]
    micro_batches: np.ndarray | None = None  # None = 1..per-GPU batch

    @property
    def size_without_mb(self) -> int:
        return (len(self.precisions) * len(self.attentions) * len(self.compiles)
                * len(self.checkpointings) * len(self.shardings) * len(self.offloads))


@dataclass
class Table:
    """Flat arrays, one element per evaluated strategy."""

    problem: Problem
    packs: list[tuple[str, str, bool, str]]
    shardings: list[str]
    offloads: list[str]
    a: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.a["step_time"].size)

    def strategy(self, i: int) -> Strategy:
        p, att, c, ck = self.packs[int(self.a["pack"][i])]
        layout = {k: int(self.a[k][i]) for k in ("dp", "tp", "pp", "vp") if k in self.a}
        if "sp" in self.a:
            layout["sequence_parallel"] = bool(self.a["sp"][i])
        return Strategy(precision=p, attention=att, compile=c, checkpointing=ck,
                        sharding=self.shardings[int(self.a["sharding"][i])],
                        offload=self.offloads[int(self.a["offload"][i])],
                        micro_batch=int(self.a["micro_batch"][i]), grad_accum=int(self.a["grad_accum"][i]),
                        **layout)


def _layer_params(model) -> float:
    emb = model.n_embedding_params() if hasattr(model, "n_embedding_params") else 0
    return max(1.0, (model.n_params() - emb) / model.n_layers)


def evaluate(pb: Problem, space: Space) -> Table:
    """Evaluate every strategy of ``space`` on ``pb``
    returns a Table of flat arrays."""
    model, dev, fab = pb.model, pb.device, pb.fabric
    n, B, seq = pb.n_gpus, pb.per_gpu_batch, pb.seq_len
    P = float(model.n_params())
    PL = _layer_params(model)
    L = model.n_layers
    packs = list(product(space.precisions, space.attentions, space.compiles, space.checkpointings))
    K = len(packs)
    supported = np.array([dev.gemm_peak(pk[0]) is not None for pk in packs])

    # --- micro-batch candidates: pinned, or every size whose activations could fit at all
    # (activation and logit memory are linear in the micro-batch, so one sample decides the bound)
    if space.micro_batches is not None:
        mbs = np.asarray(space.micro_batches, dtype=int)
    else:
        one = np.array([1.0])
        per_sample = min(float((memory.activations(model, seq, one, p, att, ck, c, pb.stack)
                                + memory.logits_bytes(model, seq, one, p, c, pb.stack))[0])
                         for (p, att, c, ck), ok in zip(packs, supported, strict=True) if ok) \
            if supported.any() else 1.0
        floor_states = min(sum(memory.model_states(P, PL, p, "zero3", "all", pb.optimizer, n)[k]
                               for k in ("weights", "gradients", "optimizer")) for p in space.precisions)
        room = dev.usable_memory - floor_states
        last_fit = int(room // (per_sample * (1 + pb.stack.fragmentation))) if room > 0 else 1
        mbs = np.arange(1, min(B, max(1, last_fit)) + 1)
    M = mbs.size
    ga = np.ceil(B / mbs).astype(int)  # (M,)
    last = B - (ga - 1) * mbs  # size of the last (possibly smaller) micro-batch
    mb_eval = np.unique(np.concatenate([mbs, last])).astype(float)  # sizes to evaluate
    E = mb_eval.size
    mi = np.searchsorted(mb_eval, mbs)
    li = np.searchsorted(mb_eval, last)

    # --- per pack, per evaluated micro-batch size: compute time and activation memory
    fwd = np.full((K, E), np.inf)
    bwd = np.full((K, E), np.inf)
    rec = np.full((K, E), np.inf)
    hw = np.full((K, E), np.inf)
    act = np.full((K, E), np.inf)
    logit = np.full((K, E), np.inf)
    cast = np.zeros(K)
    memo: dict = {}
    for i, (p, att, c, ck) in enumerate(packs):
        if not supported[i]:
            continue
        t = micro_batch_time(model, seq, mb_eval, p, att, c, ck, dev, memo, pb.stack)
        fwd[i], bwd[i], rec[i], hw[i] = t.fwd, t.bwd, t.recompute, t.hw_flops
        act[i] = memory.activations(model, seq, mb_eval, p, att, ck, c, pb.stack)
        logit[i] = memory.logits_bytes(model, seq, mb_eval, p, c, pb.stack)
        # autocast weight casts once per micro-batch, only where the weights stay fp32 (DDP)
        cast[i] = float(workload.autocast_cast_bytes(P, p, half_params=False).nbytes) / (
            dev.mem_bw * dev.profile.bw_eff("cast"))

    grad_fresh, opt_fresh = fresh_memory.step_fresh(model, dev.profile)  # fresh pages (CPU), per step

    def step_sum(x):  # (K,B) per-micro-batch quantity -> (K,M) per optimizer step
        return (ga - 1) * x[:, mi] + x[:, li]

    tmb = fwd + bwd + rec
    compute = step_sum(tmb) + grad_fresh  # (K,M); gradients are allocated once per step
    hw_step = step_sum(hw)

    Z, NO = len(space.shardings), len(space.offloads)
    shape = (K, M, Z, NO)
    prec = [pk[0] for pk in packs]
    stage = np.array([SHARD_STAGE[s] for s in space.shardings])
    # model states depend on the precision only (not attention, compile or checkpointing): one
    # row per distinct precision, gathered to packs
    precs = list(dict.fromkeys(prec))
    pi = np.array([precs.index(p) for p in prec])
    # weights kept fp32 and cast by autocast each micro-batch (DDP; PyTorch's ZeRO in some stacks)
    fp32p = np.array([[memory.autocast_fp32_params(p, s, pb.stack) for s in space.shardings] for p in precs])[pi]

    # --- model states (K, Z, NO) and host RAM
    D = len(precs)
    w, g, o, host = (np.zeros((D, Z, NO)) for _ in range(4))
    gc = np.zeros((D, Z))
    wc = np.zeros((D, Z))
    for i, p in enumerate(precs):
        for j, s in enumerate(space.shardings):
            wb, gb, _ = memory.state_bytes_per_param(p, s, pb.optimizer, pb.stack)
            gc[i, j], wc[i, j] = gb, wb
            for k, off in enumerate(space.offloads):
                st = memory.model_states(P, PL, p, s, off, pb.optimizer, n, pb.stack)
                w[i, j, k], g[i, j, k], o[i, j, k], host[i, j, k] = (
                    st["weights"], st["gradients"], st["optimizer"], st["host"])
    w, g, o, host, gc, wc = w[pi], g[pi], o[pi], host[pi], gc[pi], wc[pi]

    # --- communication (K, M, Z)
    bwd_mb = (bwd + rec)[:, mi][:, :, None]
    bwd_last = (bwd + rec)[:, li][:, :, None]
    fwd_mb = fwd[:, mi][:, :, None]
    fwd_last = fwd[:, li][:, :, None]
    gaz = ga[None, :, None]
    grad_bytes = (P * gc)[:, None, :]
    w_bytes = (P * wc)[:, None, :]
    # collectives are issued in pieces, each paying the latency and each a unit of overlap:
    # DDP buckets of 25 MiB (bucket_cap_mb default), DeepSpeed ZeRO buckets of 5e8 elements,
    # ZeRO-3 / FSDP one gather / reduce-scatter per unit (L layers + the root)
    buckets = np.maximum(1.0, np.ceil(grad_bytes / (25.0 * memory.MIB)))
    zbuckets = max(1.0, math.ceil(P / memory.ZERO_BUCKET_ELEMENTS))
    exposed_comm = np.zeros((K, M, Z))
    exposed = partial(comm.exposed, overlap=fab.overlap)
    if n > 1:
        ar = comm.all_reduce(fab, grad_bytes, buckets)
        rs_z = comm.gather_or_scatter(fab, grad_bytes, zbuckets)
        ag_z = comm.gather_or_scatter(fab, w_bytes, zbuckets)
        rs_l = comm.gather_or_scatter(fab, grad_bytes, L + 1)
        ag_l = comm.gather_or_scatter(fab, w_bytes, L + 1)
        # ZeRO-3 / FSDP gather and reduce unit by unit: L layers and the root unit (embeddings,
        # head); the root is gathered first and reduced last, so its collective (or one layer's,
        # if larger) can never hide behind compute
        # the last bucket to fill cannot overlap: at worst a full bucket (monotone in model size)
        ar_bucket = comm.all_reduce(fab, np.minimum(grad_bytes, 25.0 * memory.MIB))
        rs_bucket = comm.gather_or_scatter(fab, np.minimum(grad_bytes, memory.ZERO_BUCKET_ELEMENTS * gc[:, None, :]))
        unit = max(P - L * PL, PL) / P
        ag_unit = comm.gather_or_scatter(fab, w_bytes * unit)
        rs_unit = comm.gather_or_scatter(fab, grad_bytes * unit)
        per_mb = lambda c, win_mb, win_last, floor: (  # noqa: E731
            (gaz - 1) * exposed(c, win_mb, floor) + exposed(c, win_last, floor))
        for j, s in enumerate(space.shardings):
            sl = (slice(None), slice(None), slice(j, j + 1))
            if s == "ddp":
                e = exposed(ar[sl], bwd_last, ar_bucket[sl])
            elif s == "zero1":
                e = exposed(rs_z[sl], bwd_last, rs_bucket[sl]) + ag_z[sl]
            elif s == "zero2":
                e = per_mb(rs_z[sl], bwd_mb, bwd_last, rs_bucket[sl]) + ag_z[sl]
            elif s == "fsdp-grad-op":
                e = per_mb(ag_l[sl], fwd_mb, fwd_last, ag_unit[sl]) + per_mb(rs_l[sl], bwd_mb, bwd_last, rs_unit[sl])
            else:  # zero3 / fsdp-full: gather in forward, gather + reduce-scatter in backward
                e = per_mb(ag_l[sl], fwd_mb, fwd_last, ag_unit[sl]) \
                    + per_mb(ag_l[sl] + rs_l[sl], bwd_mb, bwd_last, rs_unit[sl])
            exposed_comm[:, :, j] = np.broadcast_to(e, (K, M, 1))[:, :, 0]

    # --- optimizer step and offload (K, Z, NO) / (K, M, Z, NO)
    prof = dev.profile
    local = np.where(stage >= 1, P / n, P)[None, :, None]  # params each rank updates
    opt_bytes = np.zeros((K, Z, 1))
    for i, p in enumerate(prec):
        for j in range(Z):
            gb = gc[i, j]
            # a half copy of the updated weights, where ZeRO/FSDP keep fp32 masters (DDP's casts
            # happen per micro-batch, see cast_step)
            half_copy = 2.0 if p in ("bf16", "fp16") and not fp32p[i, j] else 0.0
            opt_bytes[i, j, 0] = 4 + gb + OPT_MOMENT_BYTES[pb.optimizer] * 2 + 4 + half_copy + 3 * gb
    opt_eff = prof.optimizer_bw_eff.get("foreach", min(prof.optimizer_bw_eff.values()))
    # launches: PyTorch's foreach Adam(W) issues about a dozen multi-tensor kernels (moment updates,
    # bias corrections, sqrt, division, parameter update, weight decay) per group of tensors; one
    # group per layer is assumed here (the bandwidth term dominates for any model worth simulating)
    share = local / P  # (1, Z, 1) fraction of the parameters each rank updates
    loop = fresh_memory.optimizer_loop_time(model, prof)  # per-tensor host loop, where calibrated
    gpu_opt = local * opt_bytes / (dev.mem_bw * opt_eff) + share * opt_fresh + (
        OPT_KERNELS_PER_LAYER * L * 1e-6 * prof.launch_overhead_us if loop is None else share * loop)
    offl = np.array(space.offloads)[None, None, :]
    cpu_rate = prof.cpu_adam_gparams_per_s * 1e9 / fab.gpus_per_node  # node's CPU shared by its GPUs
    off_step = np.where(offl != "none",
                        local / cpu_rate + local * (gc + wc)[:, :, None] / dev.host_bw, 0.0)
    optimizer_t = np.where(offl == "none", gpu_opt, 0.0)  # (K,Z,NO); offloaded steps run on the CPU
    optimizer_t = np.broadcast_to(optimizer_t, (K, Z, NO))
    stream = (2 * P * wc / n + P * gc / n)[:, :, None] / dev.host_bw  # per micro-batch, offload 'all'
    win = (tmb[:, mi])[:, :, None, None]
    win_last = (tmb[:, li])[:, :, None, None]
    stream4 = np.where(offl == "all", stream, 0.0)[:, None, :, :]
    offload_t = off_step[:, None, :, :] + (gaz[..., None] - 1) * comm.exposed(stream4, win, stream4 / L) \
        + comm.exposed(stream4, win_last, stream4 / L)

    cast_step = (cast[:, None] * ga[None, :])[:, :, None] * fp32p[:, None, :]  # (K,M,Z)

    # --- assemble (K, M, Z, NO)
    comp4 = (compute[:, :, None] + cast_step)[..., None]
    step = comp4 + exposed_comm[..., None] + optimizer_t[:, None] + offload_t
    act4 = act[:, mi][:, :, None, None]
    log4 = logit[:, mi][:, :, None, None]
    mem_w = np.broadcast_to(w[:, None], shape)
    mem_g = np.broadcast_to(g[:, None], shape)
    mem_o = np.broadcast_to(o[:, None], shape)
    buffers = np.array([[memory.comm_buffers(P, p, sh, n, pb.stack) + memory.autocast_weight_copies(P, p, sh, pb.stack)
                         for sh in space.shardings] for p in precs])[pi]  # (K, Z)
    other = buffers[:, None, :, None] + pb.stack.fragmentation * act4
    total = mem_w + mem_g + mem_o + act4 + log4 + other
    valid = np.array([[offload_allowed(s, off) for off in space.offloads] for s in space.shardings])
    valid4 = np.broadcast_to(valid[None, None] & supported[:, None, None, None], shape)
    host_need = host[:, None] * fab.gpus_per_node  # per node
    host_ok = np.broadcast_to(host_need <= pb.host_memory, shape)
    fits = total <= dev.usable_memory
    feasible = valid4 & fits & host_ok

    tab = Table(problem=pb, packs=packs, shardings=list(space.shardings), offloads=list(space.offloads))
    idx = np.indices(shape)
    bc = lambda x: np.broadcast_to(x, shape).ravel()  # noqa: E731
    tab.a = {
        "pack": idx[0].ravel(), "sharding": idx[2].ravel(), "offload": idx[3].ravel(),
        "micro_batch": bc(mbs[None, :, None, None]), "grad_accum": bc(ga[None, :, None, None]),
        "step_time": bc(step), "compute": bc(comp4), "exposed_comm": bc(exposed_comm[..., None]),
        "optimizer": bc(optimizer_t[:, None]), "offload_time": bc(offload_t),
        "forward": bc(step_sum(fwd)[:, :, None, None]), "backward": bc((step_sum(bwd) + grad_fresh)[:, :, None, None]),
        "recompute": bc(step_sum(rec)[:, :, None, None]),
        "hw_flops": bc(hw_step[:, :, None, None]),
        "mem_weights": bc(mem_w), "mem_gradients": bc(mem_g), "mem_optimizer": bc(mem_o),
        "mem_activations": bc(act4), "mem_logits": bc(log4), "mem_other": bc(other), "mem_total": bc(total),
        "host_need": bc(host_need),
        "valid": valid4.ravel(), "fits": bc(fits), "host_ok": host_ok.ravel(), "feasible": feasible.ravel(),
    }
    # Simplicity rank breaks ties: no offload, no checkpointing, plain DDP, larger micro-batch.
    ck_rank = np.array([checkpointing_rank(pk[3]) for pk in packs])
    rank = (tab.a["offload"] * 100 + ck_rank[tab.a["pack"]] * 10 + stage[tab.a["sharding"]]
            + 1.0 - tab.a["micro_batch"] / (mbs.max() + 1.0)).astype(float)
    tab.a["rank"] = rank
    tab.a["rank_key"] = np.where(feasible.ravel(), tab.a["step_time"] * (1 + 1e-9 * rank), np.inf)
    return tab
