"""Search over dp x tp x pp layouts, jointly with every other knob.

One vectorized :func:`estimate.evaluate` per (tp, pp, sp) on the GPU's view of the model
(:class:`parallel.ShardView`) over its data-parallel group's links (:func:`parallel.dp_fabric`);
then per layout (and virtual-stage count) the pipeline bubble, the tensor-parallel collectives, the
stage-to-stage sends and the first/last stage's memory are added. Layouts whose model states
cannot fit even fully sharded are never evaluated. Units: seconds, bytes.
"""

from __future__ import annotations

import dataclasses
import math
from itertools import product

import numpy as np

from . import memory, parallel, workload
from .compute import micro_batch_time
from .estimate import Problem, Space, Table, evaluate
from .opcost import model_flops_per_token
from .strategy import checkpointed_layers, offload_allowed

#: Sharding modes that combine with pipeline parallelism: Megatron's data-parallel gradient
#: all-reduce (DDP) and its distributed optimizer (ZeRO-1); DeepSpeed refuses ZeRO-2/3 with
#: pipelining, and FSDP does not pipeline.
PIPELINE_SHARDINGS = ("ddp", "zero1")



def micro_batch_sizes(per_replica: int) -> np.ndarray:
    """Micro-batch sizes a tensor/pipeline-parallel run can use: the divisors of the replica's
    batch (Megatron-LM requires global batch = micro-batch x micro-batches x dp exactly)."""
    small = [d for d in range(1, math.isqrt(per_replica) + 1) if per_replica % d == 0]
    return np.array(sorted(set(small + [per_replica // d for d in small])))


def stored_activations(model, seq_len: int, packs: list[tuple], pack: np.ndarray, mb: np.ndarray,
                       act: np.ndarray) -> np.ndarray:
    """Bytes of one micro-batch's activations that stay stored while later micro-batches run
    (the per-layer part, x the stage's layers): ``layers x (act(L) - act(L-1))``; the rest of
    ``act`` (one layer's recomputed working set, the embedding output) exists once per stage."""
    fewer = model.with_layers(model.n_layers - 1)
    out = np.empty_like(act)
    for k, (p, att, _c, ck) in enumerate(packs):
        sel = pack == k
        if sel.any():
            out[sel] = model.n_layers * (act[sel] - memory.activations(fewer, seq_len, mb[sel], p, att, ck))
    return np.minimum(out, act)


def states_floor(pb: Problem, space: Space, par: parallel.Parallelism) -> float:
    """The least bytes of weights, gradients and optimizer states any allowed strategy keeps on
    one GPU of ``par`` (the bound used to prune layouts that cannot fit)."""
    v = parallel.view(pb.model, par)
    P = float(v.n_params())
    PL = max(1.0, (P - v.n_embedding_params()) / v.n_layers)
    shardings = [s for s in space.shardings if par.pp == 1 or s in PIPELINE_SHARDINGS]
    best = np.inf
    for p in space.precisions:
        for s in shardings:
            for o in space.offloads:
                if offload_allowed(s, o):
                    st = memory.model_states(P, PL, p, s, o, pb.optimizer, par.dp, pb.stack)
                    best = min(best, st["weights"] + st["gradients"] + st["optimizer"])
    return best


def evaluate_layout(pb: Problem, space: Space, par: parallel.Parallelism, vps: list[int]) -> list[Table]:
    """Every strategy under ``par``, one Table for each virtual-stage count in ``vps``."""
    model = parallel.view(pb.model, par)
    fab = parallel.dp_fabric(pb.fabric, par)
    shardings = [s for s in space.shardings if par.pp == 1 or s in PIPELINE_SHARDINGS]
    sub = dataclasses.replace(space, shardings=shardings)
    if space.micro_batches is None and (par.tp > 1 or par.pp > 1):
        sub.micro_batches = micro_batch_sizes(math.ceil(pb.global_batch / par.dp))
    tab = evaluate(dataclasses.replace(pb, model=model, fabric=fab, dp=par.dp), sub)
    packs = tab.packs
    tab = tab.with_columns(sharding=np.array([space.shardings.index(s) for s in shardings])[tab.sharding])
    e = np.array([workload.act_bytes(pk[0]) for pk in packs], dtype=float)[tab.pack]
    # forward + backward, and the forward again for every recomputed layer (full, every:K)
    passes = np.array([2.0 + checkpointed_layers(pk[3], model.n_layers) / model.n_layers for pk in packs])[tab.pack]
    ga = tab.grad_accum.astype(float)
    tokens = math.ceil(pb.global_batch / par.dp) * pb.seq_len / ga  # mean tokens per micro-batch
    h = getattr(pb.model, "hidden", 0)  # other families (no layouts): no TP or stage traffic
    tp_mb = model.n_layers * parallel.tp_comm_time(tokens, h, e, par.tp, par.sp, passes,
                                                   pb.fabric.intra_busbw, pb.fabric.intra_alpha)
    t_mb = (tab.forward + tab.backward + tab.recompute) / ga
    act, log = tab.mem_activations, tab.mem_logits
    F = 1 + pb.stack.fragmentation
    rest = tab.mem_total - act * F - log
    stored = stored_activations(model, pb.seq_len, packs, tab.pack, tab.micro_batch, act) if par.pp > 1 else act
    out = []
    for vp in vps:
        p = dataclasses.replace(par, vp=vp)
        p2p_mb = parallel.p2p_time(tokens, h, e, p, pb.fabric)
        bubble = (p.pp - 1) / vp * (t_mb + tp_mb + p2p_mb)
        tp_comm, pp_comm = ga * tp_mb, ga * p2p_mb
        step_time = tab.step_time + bubble + tp_comm + pp_comm
        # first stage: in-flight micro-batches' stored activations + one working set; last: one + logits
        first = act + (parallel.in_flight(p.pp, ga, vp) - 1) * stored
        first_binds = first * F >= act * F + log
        mem_activations = np.where(first_binds, first, act)
        mem_total = rest + np.maximum(first * F, act * F + log)
        fits = mem_total <= pb.device.usable_memory
        feasible = tab.valid & fits & tab.host_ok
        simpler = np.log2(p.tp) + np.log2(p.pp) + (vp - 1)
        n = ga.size
        out.append(tab.with_columns(
            bubble=bubble, tp_comm=tp_comm, pp_comm=pp_comm, step_time=step_time,
            mem_activations=mem_activations, mem_logits=np.where(first_binds, 0.0, log),
            mem_other=tab.mem_other + pb.stack.fragmentation * (mem_activations - act), mem_total=mem_total,
            fits=fits, feasible=feasible,
            dp=np.full(n, p.dp), tp=np.full(n, p.tp), pp=np.full(n, p.pp), vp=np.full(n, vp), sp=np.full(n, p.sp),
            rank_key=np.where(feasible, step_time * (1 + 1e-9 * (tab.rank + 1000 * simpler)), np.inf)))
    return out


def _extra_floor(pb: Problem, par: parallel.Parallelism, compute: float, layers: int) -> float:
    """What a layout adds at least to ``compute`` seconds: the smallest pipeline bubble (one sample
    per micro-batch) and the tensor-parallel bytes at the link's bandwidth without latency."""
    per_replica = math.ceil(pb.global_batch / par.dp)
    bubble = compute * parallel.bubble_fraction(par.pp, per_replica, par.vp)
    tp = layers * parallel.tp_comm_time(per_replica * pb.seq_len, pb.model.hidden, 2, par.tp, par.sp, 2,
                                        pb.fabric.intra_busbw, 0.0)
    return float(bubble + tp)


def flops_floor(pb: Problem, space: Space, par: parallel.Parallelism) -> float:
    """A cheap lower bound on any strategy's step time under ``par`` (seconds): the GPU's share of
    the model's minimum FLOPs at the fastest searched peak and the profile's best efficiency of any
    kernel, plus :func:`_extra_floor`."""
    dev, prof = pb.device, pb.device.profile
    peak = max((dev.gemm_peak(p) or 0.0) for p in space.precisions)
    at = prof.attention
    eff = min(1.0, max([prof.gemm_for(p).e_max for p in space.precisions]
                       + [at.flash_fwd, at.flash_bwd, at.mem_efficient_fwd, at.mem_efficient_bwd]))
    tokens = math.ceil(pb.global_batch / par.dp) * pb.seq_len
    compute = model_flops_per_token(pb.model, pb.seq_len) * tokens / (par.tp * par.pp) / (peak * eff)
    return float(compute) + _extra_floor(pb, par, compute, parallel.stage_layers(pb.model.n_layers, par.pp)[0])


def step_floor(pb: Problem, space: Space, par: parallel.Parallelism) -> float:
    """A tighter lower bound (seconds): the replica's whole batch as one micro-batch without
    recomputation, on the fastest searched precision, attention and compilation (a micro-batch's
    time is subadditive: GEMMs only get more efficient with more rows, launches amortize), plus
    :func:`_extra_floor`. Layouts whose floor exceeds a step already found are never evaluated:
    none of their strategies could win."""
    model = parallel.view(pb.model, par)
    mb = np.array([float(math.ceil(pb.global_batch / par.dp))])
    compiles = [True] if True in space.compiles else list(space.compiles)
    memo: dict = {}  # the GEMMs are shared by every attention and compilation choice
    compute = min(float(micro_batch_time(model, pb.seq_len, mb, p, att, c, "none", pb.device, memo,
                                         pb.stack).total[0])
                  for p in space.precisions if pb.device.gemm_peak(p) is not None
                  for att in space.attentions for c in compiles)
    return compute + _extra_floor(pb, par, compute, model.n_layers)


def evaluate_layouts(pb: Problem, space: Space, layouts: list[parallel.Parallelism]) -> tuple[Table, int]:
    """Evaluate every strategy of ``space`` under every layout that could fit and could win;
    one Table (rows of all evaluated layouts) and the number of layouts evaluated. Layouts are
    taken in order of their :func:`step_floor`; one whose floor is slower than the fastest
    feasible step found so far is skipped. The least-memory layout is evaluated when none can fit,
    so the cluster still gets its closest plan and reasons."""
    groups: dict[tuple, list[int]] = {}
    for par in layouts:
        if par.pp > 1 and not any(s in PIPELINE_SHARDINGS for s in space.shardings):
            continue
        groups.setdefault((par.dp, par.tp, par.pp, par.sp), []).append(par.vp)
    floors = {key: states_floor(pb, space, parallel.Parallelism(key[0], key[1], key[2], 1, key[3])) for key in groups}
    keep = [k for k in groups if floors[k] <= pb.device.usable_memory] or [min(floors, key=floors.get)]
    par_of = {k: parallel.Parallelism(k[0], k[1], k[2], max(groups[k]), k[3]) for k in keep}
    cheap = {k: flops_floor(pb, space, par_of[k]) for k in keep} if len(keep) > 1 else {keep[0]: 0.0}
    parts: list[Table] = []
    best = np.inf
    done: set[tuple] = set()
    for key in sorted(keep, key=cheap.get):
        if cheap[key] > best:
            break
        if np.isfinite(best) and step_floor(pb, space, par_of[key]) > best:
            continue
        done.add(key)
        for b in evaluate_layout(pb, space, parallel.Parallelism(key[0], key[1], key[2], 1, key[3]), groups[key]):
            parts.append(b)
            fin = b.rank_key[np.isfinite(b.rank_key)]
            best = min(best, float(fin.min()) if fin.size else np.inf)
    # the most promising layout of the other kind (plain data parallelism, or tensor/pipeline),
    # so the winner can be explained against it
    for plain in (True, False):
        rest = [k for k in keep if (k[1] == 1 and k[2] == 1) == plain]
        if rest and not any(k in done for k in rest):
            k = min(rest, key=cheap.get)
            parts.extend(evaluate_layout(pb, space, parallel.Parallelism(k[0], k[1], k[2], 1, k[3]), groups[k]))
    if not parts:
        raise ValueError("no layout to evaluate: pipelining needs --sharding ddp or zero1")
    packs = list(product(space.precisions, space.attentions, space.compiles, space.checkpointings))
    tab = Table.concat(parts, pb, packs, list(space.shardings), list(space.offloads))
    return tab, len({(int(p.dp[0]), int(p.tp[0]), int(p.pp[0]), int(p.vp[0])) for p in parts})


def _layout_text(tab: Table, i: int) -> str:
    p = tab.parallelism(i)
    return p.describe() or f"data parallelism over all {p.dp} GPUs"


def explain_layout(tab: Table, order: np.ndarray, n_layouts: int, n_evaluated: int, n_gpus: int) -> str:
    """One sentence on why the winning layout won: its bubble and tensor-parallel time, and how
    the best plan of the other kind (pure data parallelism, or tensor/pipeline) compares."""
    head = (f"considered {n_layouts} layouts dp × tp × pp = {n_gpus}, evaluated {n_evaluated} (the rest "
            "cannot fit their model states or cannot beat the winner even at peak speed)"
            if n_layouts > n_evaluated else f"evaluated all {n_layouts} layouts dp × tp × pp = {n_gpus}")
    if not order.size:
        return head + "; none fits"
    i = int(order[0])
    plain = (tab.tp == 1) & (tab.pp == 1)
    win_plain = bool(plain[i])
    other = np.nonzero(np.isfinite(tab.rank_key) & (plain != win_plain))[0]
    text = f"{head}; {_layout_text(tab, i)} wins"
    if not win_plain:
        text += (f" (per step: pipeline bubble {tab.bubble[i]:.2f} s, tensor-parallel collectives "
                 f"{tab.tp_comm[i]:.2f} s, stage sends {tab.pp_comm[i]:.2f} s of {tab.step_time[i]:.2f} s)")
    if other.size:
        j = other[np.argmin(tab.rank_key[other])]
        text += (f"; the best {'tensor/pipeline' if win_plain else 'pure data-parallel'} plan "
                 f"({_layout_text(tab, j)}) takes {tab.step_time[j] / tab.step_time[i]:.2f}× as long")
    elif not win_plain:
        text += "; no pure data-parallel plan fits"
    return text
