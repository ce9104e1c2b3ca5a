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

from ..core.memo import cached, frozen, store
from ..model import workload
from ..model.graphs import model_flops_per_token
from ..physics import compute, memory, parallel
from ..physics.compute import attention_core, micro_batch_time
from ..strategy.knobs import SHARD_STAGE, checkpointed_layers, offload_allowed
from ..strategy.layout import CP_ATTENTIONS, Parallelism, pipelines, stage_layers
from ..strategy.stacks import Stack
from .estimate import Grid, Problem, Space, Table, evaluate_grid, ranked, spread


def micro_batch_sizes(per_replica: int) -> np.ndarray:
    """Micro-batch sizes a tensor/pipeline-parallel run can use: the divisors of the replica's
    batch (Megatron-LM requires global batch = micro-batch x micro-batches x dp exactly). Kept
    per process (read-only)."""
    return cached(_DIVISORS, per_replica, lambda: _divisors(per_replica))


_DIVISORS = store()


def _divisors(n: int) -> np.ndarray:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    out = np.array(sorted(set(small + [n // d for d in small])))
    frozen(out)
    return out


def stored_activations(model, seq_len: int, packs: list[tuple], pack: np.ndarray, mb: np.ndarray,
                       act: np.ndarray, stack: Stack) -> np.ndarray:
    """Bytes of one micro-batch's activations that stay stored while later micro-batches run
    (the per-layer part, x the stage's layers): ``layers x (act(L) - act(L-1))``; the rest of
    ``act`` (one layer's recomputed working set, the embedding output) exists once per stage.
    ``act(L-1)`` is computed once per pack and distinct micro-batch size (elementwise in the size:
    the same numbers as per row) and kept per process."""
    flat = np.ravel(mb)
    if (flat[1:] > flat[:-1]).all():  # already distinct and sorted (the candidates): np.unique's answer
        sizes, at = flat, np.arange(flat.size)
    else:
        sizes, at = np.unique(mb, return_inverse=True)
    key = (model, seq_len, tuple(packs), sizes.tobytes(), stack)
    fewer = cached(_FEWER, key, lambda: _fewer_layer_activations(model, seq_len, packs, sizes, stack))
    return np.minimum(model.n_layers * (act - fewer[pack, at.reshape(np.shape(mb))]), act)


_FEWER = store()


def _fewer_layer_activations(model, seq_len: int, packs: list[tuple], sizes: np.ndarray, stack: Stack) -> np.ndarray:
    """(packs, sizes) activation bytes of the view with one layer fewer, under each pack's
    compilation and the problem's stack, as the full ones (``act``) are counted."""
    fewer = model.with_layers(model.n_layers - 1)
    out = np.array([memory.activations(fewer, seq_len, sizes, p, att, ck, c, stack) for p, att, c, ck in packs])
    frozen(out)
    return out


def states_floor(pb: Problem, space: Space, par: Parallelism, offloads: list[str] | None = None) -> float:
    """The least bytes of weights, gradients and optimizer states any allowed strategy keeps on
    one GPU of ``par`` (the bound used to prune layouts that cannot fit); ``offloads``: only
    strategies with these offload choices (default: the space's). Kept per process, keyed by the
    view's fields of ``par`` (tp, sp, pp, ep), its dp x cp ranks and the knobs it reads."""
    key = (pb.model, par.tp, par.sp, par.pp, par.ep, par.etp, par.dp * par.cp, pb.optimizer, pb.stack,
           tuple(space.precisions), tuple(space.shardings), tuple(space.offloads if offloads is None else offloads))
    return cached(_STATES_FLOOR, key, lambda: _states_floor(pb, space, par, offloads))


_STATES_FLOOR = store()


def _states_floor(pb: Problem, space: Space, par: Parallelism, offloads: list[str] | None) -> float:
    v = parallel.view(pb.model, par)
    P = float(v.n_params())
    PL = max(1.0, (P - v.n_embedding_params()) / v.n_layers)
    best = np.inf
    for p in space.precisions:
        for s in space.shardings:
            for o in space.offloads if offloads is None else offloads:
                if offload_allowed(s, o) and (par.pp == 1 or pipelines(pb.stack, s, o)):
                    st = memory.layout_states(v, PL, p, s, o, pb.optimizer, par.dp * par.cp, pb.stack, par.pp > 1)
                    best = min(best, st["weights"] + st["gradients"] + st["optimizer"])
    return best


def offload_floor(pb: Problem, space: Space, par: Parallelism) -> float:
    """Seconds every strategy of ``par`` spends at least in offloaded optimizer steps: 0 when
    some strategy without offload keeps its model states in GPU memory; else the CPU Adam time
    of the fewest parameters a GPU updates (its view's, divided over the dp x cp ranks where the
    optimizer states are sharded), at the node CPU's rate shared as the search shares it."""
    if "none" in space.offloads and states_floor(pb, space, par, ["none"]) <= pb.device.usable_memory:
        return 0.0
    P = float(parallel.view(pb.model, par).n_params())
    local = min((P / (par.dp * par.cp) if SHARD_STAGE[s] >= 1 else P for s in space.shardings
                 if any(o != "none" and offload_allowed(s, o) and (par.pp == 1 or pipelines(pb.stack, s, o))
                        for o in space.offloads)), default=np.inf)
    if not np.isfinite(local):
        return 0.0
    rate = pb.device.profile.cpu_adam_gparams_per_s * 1e9 / parallel.dp_fabric(pb.fabric, par).gpus_per_node
    return local / rate


def async_allowed(pb: Problem, par: Parallelism, async_tp: bool | None) -> bool:
    """Whether asynchronous TP is considered for ``par``: pinned on (any stack: Megatron-LM's
    --tp-comm-overlap, which no stack preset models), or searched where the stack offers it; only
    with tensor and sequence parallelism (both implementations overlap the sequence-parallel
    all-gathers and reduce-scatters)."""
    if not (par.tp > 1 and par.sp) or async_tp is False:
        return False
    return async_tp is True or pb.stack.async_tp != "no"


def _async_tp(pb: Problem, model, packs: list[tuple], pack: np.ndarray, tokens: np.ndarray, tp_mb: np.ndarray,
              passes: np.ndarray, tp: int, pinned: bool | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the tensor-parallel seconds per micro-batch with the collectives overlapped
    (:func:`parallel.async_tp_time`) where that is allowed (torchtitan: compiled packs only) and,
    unless pinned on, faster; and whether it is used. The arrays broadcast together (rows, or a
    :class:`Grid`'s axes)."""
    need_compile = pb.stack.async_tp == "compiled"
    shape = np.broadcast_shapes(np.shape(tokens), pack.shape, tp_mb.shape, passes.shape)
    pack, tp_mb, passes = (np.broadcast_to(x, shape) for x in (pack, tp_mb, passes))
    out, use = tp_mb.copy(), np.zeros(shape, dtype=bool)
    tok = np.broadcast_to(np.asarray(tokens, dtype=float), shape)
    ok = np.array([pb.device.gemm_peak(p) is not None and (c or not need_compile) for p, _a, c, _k in packs])[pack]
    prec = np.array([pk[0] for pk in packs])[pack]
    for p in {pk[0] for pk in packs}:
        sel = ok & (prec == p)
        if not sel.any():
            continue
        u, inv = np.unique(tok[sel], return_inverse=True)  # a few micro-batch sizes
        whole = tuple(x[inv] for x in compute.layer_gemm_times(model, u, p, pb.device))
        split = tuple(x[inv] for x in compute.layer_gemm_times(model, u, p, pb.device, chunks=tp))
        t = parallel.async_tp_time(tp_mb[sel] / passes[sel], whole, split, passes[sel] - 1.0, tp,
                                   pb.stack.async_tp_overlap)
        better = np.full(t.size, True) if pinned else t < tp_mb[sel]
        out[sel] = np.where(better, t, tp_mb[sel])
        use[sel] = better
    return out, use


def _ring_attention(pb: Problem, model, par: Parallelism, seq: int, packs: list[tuple], a: dict,
                    mb: np.ndarray, e: np.ndarray) -> None:
    """Adds context parallelism's attention to the rows ``a`` (in place) of a layout evaluated at
    ``seq`` = seq_len/cp tokens per rank: the view computed one block of attention per pass, the
    rank computes cp (its queries against every key, 1/cp of the causal attention, load-balanced),
    so cp-1 more blocks' time and FLOPs (forward, backward, and the recomputed forward where the
    policy recomputes attention); and the exposed ring exchange (:func:`parallel.cp_ring_time`).
    ``mb``: mean samples per micro-batch (attention is linear in it); ``e``: activation bytes."""
    L = model.n_layers
    ga = a["grad_accum"].astype(float)
    one = np.array([1.0])
    f1, b1, ff1, fb1 = (np.zeros(a["pack"].shape) for _ in range(4))
    rec = np.zeros(a["pack"].shape)
    for k, (p, att, _c, ck) in enumerate(packs):
        sel = a["pack"] == k
        if not sel.any() or pb.device.gemm_peak(p) is None:
            continue
        part = attention_core(model, seq, one, p, att, pb.device, pb.stack)  # one sample, one block per layer
        f1[sel], b1[sel], ff1[sel], fb1[sel] = part.t_fwd[0], part.t_bwd[0], part.fl_fwd[0], part.fl_bwd[0]
        rec[sel] = 1.0 if ck == "selective" else checkpointed_layers(ck, L) / L  # attention recomputed
    more = par.cp - 1
    fwd, bwd = more * f1 * mb * ga, more * b1 * mb * ga
    a["forward"], a["backward"], a["recompute"] = a["forward"] + fwd, a["backward"] + bwd, a["recompute"] + rec * fwd
    a["compute"] = a["compute"] + (1 + rec) * fwd + bwd
    a["hw_flops"] = a["hw_flops"] + more * ((1 + rec) * ff1 + fb1) * mb * ga
    ring = parallel.cp_ring_time(parallel.cp_block_bytes(mb * seq, model.kv_dim, e), par.cp * f1 * mb, par.cp * b1 * mb,
                                 1 + rec, L, par, pb.fabric)
    a["cp_comm"] = ga * ring
    a["step_time"] = a["step_time"] + (1 + rec) * fwd + bwd + a["cp_comm"]


def _node_sharing(pb: Problem, space: Space, model, par: Parallelism, fab, a: dict) -> None:
    """Corrects the rows ``a`` (in place) for what a node shares among all its GPUs, not only the
    gradient group's ``fab.gpus_per_node`` of them that the sub-problem's fabric holds: the host
    RAM holds every GPU's offloaded states, and the CPU runs every GPU's offloaded optimizer step
    (the CPU Adam share of :func:`simulator.physics.optimizer_time.offload_step_time` scales with the GPUs
    per node)."""
    scale = pb.fabric.gpus_per_node / fab.gpus_per_node
    if scale == 1:
        return
    a["host_need"] = a["host_need"] * scale
    a["host_ok"] = a["host_need"] <= pb.host_memory
    offloaded = np.array([o != "none" for o in space.offloads])[a["offload"]]
    if offloaded.any():
        P = float(model.n_params())
        stage = np.array([SHARD_STAGE[x] for x in space.shardings])[a["sharding"]]
        local = np.where(stage >= 1, memory.sharded_params(model, par.dp * par.cp), P)
        rate = pb.device.profile.cpu_adam_gparams_per_s * 1e9 / fab.gpus_per_node  # as the sub-problem counted it
        extra = np.where(offloaded, (scale - 1) * local / rate, 0.0)
        a["offload_time"] = a["offload_time"] + extra
        a["step_time"] = a["step_time"] + extra


def evaluate_layout(pb: Problem, space: Space, par: Parallelism, vps: list[int],
                    async_tp: bool | None = None) -> list[Table]:
    """Arrays of every strategy under ``par`` for each virtual-stage count in ``vps``;
    ``async_tp``: None = asynchronous TP where the stack offers it and it is faster, True = on
    wherever the layout allows it, False = off."""
    return [g.table() for g in layout_grids(pb, space, par, vps, async_tp)]


def layout_grids(pb: Problem, space: Space, par: Parallelism, vps: list[int],
                 async_tp: bool | None = None) -> list[Grid]:
    """:func:`evaluate_layout`'s strategies as :class:`Grid` s (not yet flattened): the layout's
    additions are computed on the axes each varies along."""
    model = parallel.view(pb.model, par)
    fab = parallel.dp_fabric(pb.fabric, par)
    seq = pb.seq_len // par.cp  # tokens of each sequence on one context-parallel rank
    shardings = [s for s in space.shardings if par.pp == 1 or pipelines(pb.stack, s)]
    attentions = [x for x in space.attentions if par.cp == 1 or x in CP_ATTENTIONS]
    sub = dataclasses.replace(space, shardings=shardings, attentions=attentions)
    per_replica = math.ceil(pb.global_batch / par.dp)
    if space.micro_batches is None and (par.tp > 1 or par.pp > 1 or par.cp > 1):
        sub.micro_batches = micro_batch_sizes(per_replica)
    # each of the dp x cp ranks of the gradient group holds the replica's samples at seq/cp tokens
    grid = evaluate_grid(dataclasses.replace(pb, model=model, fabric=fab, seq_len=seq, dp=par.dp * par.cp,
                                             global_batch=pb.global_batch * par.cp, pp=par.pp), sub)
    a = dict(grid.cols)  # the columns, changed below
    if par.pp > 1:  # what pipelines with which offload (layout.pipelines), on the (Z, NO) axes
        a["valid"] = a["valid"] & np.array([[pipelines(pb.stack, s, o) for o in space.offloads]
                                            for s in shardings])[None, None]
    a["sharding"] = np.array([space.shardings.index(s) for s in shardings])[a["sharding"]]
    _node_sharing(pb, space, model, par, fab, a)
    packs = grid.packs
    e, passes = (x[a["pack"]] for x in _pack_factors(tuple(packs), model.n_layers))
    ga = a["grad_accum"].astype(float)
    tokens = per_replica * seq / ga  # mean tokens per micro-batch on one GPU
    h = getattr(pb.model, "hidden", 0)  # other families (no layouts): no TP or stage traffic
    tp_mb = parallel.tp_comm_layers(model, par) * parallel.tp_comm_time(tokens, h, e, par.tp, par.sp, passes,
                                                                         *parallel.tp_link(pb.fabric, par.tp))
    tp_sync, use_async = tp_mb, np.zeros((1, 1, 1, 1), dtype=bool)
    if async_allowed(pb, par, async_tp):
        tp_mb, use_async = _async_tp(pb, model, packs, a["pack"], tokens, tp_mb, passes, par.tp, async_tp)
    a["cp_comm"] = np.zeros((1, 1, 1, 1))
    if par.cp > 1:
        _ring_attention(pb, model, par, seq, packs, a, per_replica / ga, e)
    # expert parallelism: all-to-all dispatch and combine per MoE layer (not the dense ones) and
    # pass, not overlapped unless the stack overlaps it with another micro-batch's compute
    moe_layers = model.n_layers - getattr(model, "first_dense_layers", 0)
    load = pb.model.dispatched_load() if hasattr(pb.model, "dispatched_load") else 1.0  # padded buffers
    ep_mb = moe_layers * parallel.ep_comm_time(tokens / workload.seq_shards(model) * load, h,
                                                   getattr(pb.model, "top_k", 1), e, par, pb.fabric, passes,
                                                   getattr(pb.model, "n_experts", 0), pb.stack.moe_dispatcher,
                                                   getattr(pb.model, "routing", "uniform"))
    if pb.stack.moe_a2a_overlap:
        ep_mb = parallel.ep_overlap_exposed(ep_mb, (a["forward"] + a["backward"] + a["recompute"]) / ga)
    a["ep_comm"] = ga * ep_mb
    a["step_time"] = a["step_time"] + a["ep_comm"]
    t_mb = (a["forward"] + a["backward"] + a["recompute"] + a["cp_comm"] + a["ep_comm"]) / ga
    act, log = a["mem_activations"], a["mem_logits"]
    reserve = memory.allocator_reserve(act, log, pb.stack)
    rest = a["mem_total"] - act - log - reserve
    last_stage = act + log + reserve  # the last stage's one working set and logits
    stored = stored_activations(model, seq, packs, a["pack"], a["micro_batch"], act, pb.stack) if par.pp > 1 else act
    tp_comm, tp_hidden = ga * tp_mb, ga * (tp_sync - tp_mb)
    out = []
    for vp in vps:
        p = par.with_vp(vp)
        p2p_mb = parallel.p2p_time(tokens, h, e, p, pb.fabric)
        bubble = spread(parallel.bubble_time(p.pp, t_mb + tp_mb + p2p_mb, vp, ga), grid.shape[3])
        b = dict(a)
        b["bubble"], b["tp_comm"], b["pp_comm"] = bubble, tp_comm, ga * p2p_mb
        b["tp_comm_hidden"] = tp_hidden
        b["step_time"] = a["step_time"] + bubble + b["tp_comm"] + b["pp_comm"]
        # first stage: in-flight micro-batches' stored activations + one working set; last: one + logits
        first = act + (parallel.in_flight(p.pp, ga, vp) - 1) * stored
        first_f = first + memory.allocator_reserve(first, 0.0, pb.stack)
        first_binds = first_f >= last_stage
        b["mem_activations"] = np.where(first_binds, first, act)
        b["mem_logits"] = np.where(first_binds, 0.0, log)
        b["mem_other"] = a["mem_other"] - reserve + memory.allocator_reserve(b["mem_activations"], b["mem_logits"],
                                                                             pb.stack)
        b["mem_total"] = rest + np.maximum(first_f, last_stage)
        for k, val in (("dp", p.dp), ("tp", p.tp), ("pp", p.pp), ("vp", vp), ("sp", p.sp), ("cp", p.cp), ("ep", p.ep),
                       ("etp", p.etp or 0)):
            b[k] = np.asarray(val)
        b["async_tp"] = use_async
        simpler = np.log2(p.tp) + np.log2(p.pp) + np.log2(p.cp) + (vp - 1)
        out.append(Grid(grid.problem, packs, grid.shardings, grid.offloads, grid.shape,
                        ranked(b, pb.device.usable_memory, simpler)))
    if packs != (every := list(product(space.precisions, space.attentions, space.compiles, space.checkpointings))):
        index = np.array([every.index(pk) for pk in packs])  # the layout's packs among the search's
        out = [Grid(g.problem, g.packs, g.shardings, g.offloads, g.shape, {**g.cols, "pack": index[g.cols["pack"]]})
               for g in out]
    return out


def _pack_factors(packs: tuple[tuple, ...], n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per pack: bytes per activation element, and forward-sized passes per micro-batch (forward +
    backward, and the forward again for every recomputed layer: full, every:K) of a stage of
    ``n_layers`` layers; kept per process (read-only)."""
    return cached(_PACK_FACTORS, (packs, n_layers), lambda: _make_pack_factors(packs, n_layers))


_PACK_FACTORS = store()


def _make_pack_factors(packs: tuple[tuple, ...], n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    e = np.array([workload.act_bytes(pk[0]) for pk in packs], dtype=float)
    passes = np.array([2.0 + checkpointed_layers(pk[3], n_layers) / n_layers for pk in packs])
    frozen(e, passes)
    return e, passes


def _compute_floors(pb: Problem, space: Space, pars: list[Parallelism]) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on the compute seconds of one GPU of each layout: for its replica's whole
    batch B (as one micro-batch) and for one sample, without recomputation, at the fastest
    searched precision, attention and compilation.

    Why these bound every strategy: a micro-batch's time per sample never grows with the
    micro-batch (GEMMs get more efficient with more rows, launches and host time amortize), so
    the micro-batches of a step take at least the time of B samples at once; every micro-batch
    takes at least one sample's time (more work never takes less time); recomputation only adds.
    Under context parallelism the view runs seq/cp tokens and cp attention blocks per layer.
    One vectorized :func:`micro_batch_time` per tensor-parallel view serves all pipeline depths:
    a pass's time is the larger of two sums affine in the stage's layers L (kernels; host
    dispatch), so it is convex in L and f(L) >= f(2) + (L-2) (f(2) - f(1)) for L >= 2, exact
    when the same sum dominates at 1, 2 and L layers."""
    B = np.array([float(math.ceil(pb.global_batch / p.dp)) for p in pars])
    L = np.array([float(stage_layers(pb.model.n_layers, p.pp)[0]) for p in pars])
    full, one = np.full(len(pars), np.inf), np.full(len(pars), np.inf)
    for key in {(p.tp, p.sp, p.cp, p.ep, p.etp) for p in pars}:
        idx = np.array([i for i, p in enumerate(pars) if (p.tp, p.sp, p.cp, p.ep, p.etp) == key])
        mb = np.unique(np.concatenate([[1.0], B[idx]]))
        at_b, at_1 = np.searchsorted(mb, B[idx]), np.searchsorted(mb, 1.0)
        for f1, f2 in _layer_times(pb, space, key, mb):
            fl = np.where(L[idx, None] >= 2, f2 + (L[idx, None] - 2) * (f2 - f1), f1)  # (layouts, mb)
            full[idx] = np.minimum(full[idx], fl[np.arange(idx.size), at_b])
            one[idx] = np.minimum(one[idx], fl[:, at_1])
    return full, one


def _layer_times(pb: Problem, space: Space, key: tuple[int, bool, int, int, int | None],
                 mb: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per searched (supported precision, attention, compilation; compiled only where compiling
    is searched), the seconds of a micro-batch of each of ``mb`` samples on the view of ``key`` =
    (tp, sp, cp, ep, etp) with 1 and with 2 layers (:func:`_view_time`). Kept per process, keyed by
    every input it reads."""
    compiles = [True] if True in space.compiles else list(space.compiles)
    ck = (pb.model, key, pb.seq_len, mb.tobytes(), tuple(space.precisions), tuple(space.attentions),
          tuple(compiles), pb.stack, pb.device.name)
    return cached(_LAYER_TIMES, ck, lambda: _view_layer_times(pb, space, key, mb, compiles), pb.device)


_LAYER_TIMES = store()


def _view_layer_times(pb: Problem, space: Space, key: tuple[int, bool, int, int, int | None], mb: np.ndarray,
                      compiles: list[bool]) -> list[tuple[np.ndarray, np.ndarray]]:
    dev = pb.device
    tp, sp, cp, ep, etp = key
    seq = pb.seq_len // cp
    base = parallel.ShardView(pb.model, Parallelism(1, tp, 1, 1, sp, ep=ep, etp=etp))
    memos: tuple[dict, dict] = ({}, {})
    out = []
    for p, att, c in [(p, att, c) for p in space.precisions if dev.gemm_peak(p) is not None
                      for att in space.attentions if cp == 1 or att in CP_ATTENTIONS for c in compiles]:
        f1, f2 = (_view_time(base.with_layers(n), seq, mb, p, att, c, cp, pb, memo)
                  for n, memo in zip((1, 2), memos, strict=True))
        frozen(f1, f2)
        out.append((f1, f2))
    return out


def _view_time(view, seq: int, mb: np.ndarray, precision: str, attention: str, compiled: bool, cp: int,
               pb: Problem, memo: dict) -> np.ndarray:
    """A micro-batch's seconds on ``view`` without recomputation at ``seq`` tokens per sequence,
    with the cp-1 further attention blocks of context parallelism (affine in the layers too)."""
    t = micro_batch_time(view, seq, mb, precision, attention, compiled, "none", pb.device, memo, pb.stack).total
    if cp > 1:
        part = attention_core(view, seq, mb, precision, attention, pb.device, pb.stack)
        t = t + (cp - 1) * (part.t_fwd + part.t_bwd)
    return t


def _extra_floor(pb: Problem, space: Space, par: Parallelism, one: float, async_tp: bool | None,
                 terms: dict | None = None) -> float:
    """What a layout adds at least to its compute, given a floor ``one`` on one sample's compute:
    the pipeline bubble, (pp-1)/vp micro-batches, each at least one sample's compute and
    tensor-parallel bytes; plus the rest of :func:`_extra_terms` (seconds). ``terms``: a dict
    keeping each layout's :func:`_extra_terms` within one search (None: computed here)."""
    if terms is None:
        batch, sample, offload = _extra_terms(pb, space, par, async_tp)
    else:
        if par not in terms:
            terms[par] = _extra_terms(pb, space, par, async_tp)
        batch, sample, offload = terms[par]
    return batch + float(parallel.bubble_time(par.pp, one + sample, par.vp)) + offload


def _extra_terms(pb: Problem, space: Space, par: Parallelism, async_tp: bool | None) -> tuple[float, float, float]:
    """The parts of :func:`_extra_floor` that do not depend on compute (seconds): the
    tensor-parallel bytes of the replica's whole batch and of one sample at the link's bandwidth
    without latency (less the most asynchronous TP may hide, where allowed: :func:`async_allowed`);
    the CPU optimizer step where the model states fit only offloaded (:func:`offload_floor`)."""
    per_replica = math.ceil(pb.global_batch / par.dp)
    layers = stage_layers(pb.model.n_layers, par.pp)[0]
    bw = parallel.tp_link(pb.fabric, par.tp)[0]

    # asynchronous TP hides at most the overlap fraction of the collectives (parallel.async_tp_time)
    exposed = 1.0 - pb.stack.async_tp_overlap if async_allowed(pb, par, async_tp) else 1.0

    def tp(samples):
        return exposed * layers * float(parallel.tp_comm_time(samples * pb.seq_len / par.cp, pb.model.hidden, 2,
                                                              par.tp, par.sp, 2, bw, 0.0))

    return tp(per_replica), tp(1), offload_floor(pb, space, par)


def _seconds_per_token(pb: Problem, space: Space) -> float:
    """The model's minimum training FLOPs per token at the fastest searched peak and the profile's
    best efficiency of any kernel (seconds per token on one GPU; 0 without a supported precision).
    Kept per process, keyed by the model, sequence length, precisions and device."""
    key = (pb.model, pb.seq_len, tuple(space.precisions), pb.device.name)
    return cached(_PER_TOKEN, key, lambda: _min_seconds_per_token(pb, space), pb.device)


_PER_TOKEN = store()


def _min_seconds_per_token(pb: Problem, space: Space) -> float:
    dev, prof = pb.device, pb.device.profile
    precs = [p for p in space.precisions if dev.gemm_peak(p) is not None]
    if not precs:
        return 0.0
    peak = max(dev.gemm_peak(p) for p in precs)
    kernels = [prof.attention, *prof.attention_kernels.values()]
    eff = min(1.0, max([prof.gemm_for(p).e_max for p in precs]
                       + [e for at in kernels for e in (at.flash_fwd, at.flash_bwd, at.mem_efficient_fwd,
                                                          at.mem_efficient_bwd)]))
    return model_flops_per_token(pb.model, pb.seq_len) / (peak * eff)


def flops_floor(pb: Problem, space: Space, par: Parallelism, async_tp: bool | None = None,
                per_token: float | None = None, terms: dict | None = None) -> float:
    """A cheap lower bound on any strategy's step time under ``par`` (seconds): the GPU's share of
    the model's minimum FLOPs at :func:`_seconds_per_token` (``per_token``, computed when None),
    plus :func:`_extra_floor` (one sample: the batch's share; ``terms`` as there)."""
    per_token = _seconds_per_token(pb, space) if per_token is None else per_token
    per_replica = math.ceil(pb.global_batch / par.dp)
    compute = per_token * per_replica * pb.seq_len / (par.tp * par.pp * par.cp)
    return float(compute) + _extra_floor(pb, space, par, compute / per_replica, async_tp, terms)


def step_floors(pb: Problem, space: Space, pars: list[Parallelism],
                async_tp: bool | None = None, terms: dict | None = None) -> np.ndarray:
    """A tighter lower bound on any strategy's step time under each layout (seconds): the compute
    floors of :func:`_compute_floors` plus :func:`_extra_floor` (``terms`` as there). Layouts
    whose floor exceeds a step already found are never evaluated: none of their strategies could
    win."""
    if pb.device.profile.fresh_memory is not None:  # first-touch page costs: no bound, evaluate all
        return np.zeros(len(pars))
    full, one = _compute_floors(pb, space, pars)
    return np.array([full[i] + _extra_floor(pb, space, par, one[i], async_tp, terms) for i, par in enumerate(pars)])


@dataclasses.dataclass
class LayoutBounds:
    """The layouts a search considers and their bounds: ``groups`` (each layout with vp = 1: its
    virtual-stage counts), ``keep`` (those whose model states can fit, or else the least-memory
    one), ``par_of`` (each kept layout with its most virtual stages), ``cheap`` (its
    :func:`flops_floor`, s; 0 when not pruning), ``prune`` (whether to prune: more than one kept),
    ``terms`` (each layout's :func:`_extra_terms`) and ``tight`` (its :func:`step_floors`, s,
    filled per tensor/context-parallel view when a search first needs it)."""

    groups: dict[Parallelism, list[int]]
    keep: list[Parallelism]
    par_of: dict[Parallelism, Parallelism]
    cheap: dict[Parallelism, float]
    prune: bool
    terms: dict[Parallelism, tuple[float, float, float]]
    tight: dict[Parallelism, float] = dataclasses.field(default_factory=dict)

    def floor(self, pb: Problem, space: Space, key: Parallelism, async_tp: bool | None) -> float:
        """The tight floor of kept layout ``key`` (s; ``pb``, ``space``, ``async_tp``: those these
        bounds are of), computed for its whole tensor/context-parallel view at once when first
        needed."""
        if key not in self.tight:
            view = (key.tp, key.sp, key.cp, key.ep, key.etp)
            same = [k for k in self.keep if (k.tp, k.sp, k.cp, k.ep, k.etp) == view]
            self.tight.update(zip(same, step_floors(pb, space, [self.par_of[k] for k in same], async_tp, self.terms),
                                  strict=True))
        return self.tight[key]


def layout_bounds(pb: Problem, space: Space, layouts: list[Parallelism], prune: bool,
                  async_tp: bool | None) -> LayoutBounds:
    """:class:`LayoutBounds` of ``layouts`` for ``pb`` and ``space``: pure (every value is fixed
    by them), kept per process, keyed by every field of both, the layouts, ``prune`` and
    ``async_tp`` (the device as witness)."""
    mbs = None if space.micro_batches is None else np.asarray(space.micro_batches)
    key = (pb.model, pb.seq_len, pb.global_batch, pb.optimizer, pb.device.name, pb.fabric, pb.host_memory,
           pb.gpu_label, pb.stack, pb.dp, tuple(space.precisions), tuple(space.attentions), tuple(space.compiles),
           tuple(space.checkpointings), tuple(space.shardings), tuple(space.offloads),
           None if mbs is None else (mbs.dtype.str, mbs.tobytes()), tuple(layouts), prune, async_tp)
    return cached(_BOUNDS, key, lambda: _layout_bounds(pb, space, layouts, prune, async_tp), pb.device)


_BOUNDS = store()


def _layout_bounds(pb: Problem, space: Space, layouts: list[Parallelism], prune: bool,
                   async_tp: bool | None) -> LayoutBounds:
    groups: dict[Parallelism, list[int]] = {}
    for par in layouts:
        if par.pp > 1 and not any(pipelines(pb.stack, s) for s in space.shardings):
            continue
        if par.cp > 1 and not any(x in CP_ATTENTIONS for x in space.attentions):
            continue
        groups.setdefault(par.with_vp(1), []).append(par.vp)
    floors = {key: states_floor(pb, space, key) for key in groups}
    keep = [k for k in groups if floors[k] <= pb.device.usable_memory] or [min(floors, key=floors.get)]
    par_of = {k: k.with_vp(max(groups[k])) for k in keep}
    prune = prune and len(keep) > 1
    per_token = _seconds_per_token(pb, space) if prune else 0.0
    terms: dict[Parallelism, tuple[float, float, float]] = {}  # each layout's _extra_terms, once
    cheap = {k: flops_floor(pb, space, par_of[k], async_tp, per_token, terms) for k in keep} if prune \
        else dict.fromkeys(keep, 0.0)
    return LayoutBounds(groups, keep, par_of, cheap, prune, terms)


def evaluate_layouts(pb: Problem, space: Space, layouts: list[Parallelism],
                     prune: bool = True, async_tp: bool | None = None) -> tuple[Table, int]:
    """Evaluate every strategy of ``space`` under every layout that could fit and could win;
    one Table (rows of all evaluated layouts) and the number of layouts evaluated. Layouts are
    taken in order of their :func:`flops_floor`; once that is slower than the fastest feasible step
    found so far, the rest are skipped, and a layout whose :func:`step_floors` is slower is skipped
    (``prune=False`` evaluates every layout that can fit:
    the reference the pruned search is tested against). The least-memory layout is evaluated when
    none can fit, so the cluster still gets its closest plan and reasons."""
    lb = layout_bounds(pb, space, layouts, prune, async_tp)
    groups, keep, cheap, prune = lb.groups, lb.keep, lb.cheap, lb.prune
    parts: list[Grid] = []
    best = np.inf
    done: set[Parallelism] = set()
    for key in sorted(keep, key=cheap.get):
        if cheap[key] > best:
            break
        if prune and np.isfinite(best) and lb.floor(pb, space, key, async_tp) > best:
            continue
        done.add(key)
        for b in layout_grids(pb, space, key, groups[key], async_tp):
            parts.append(b)
            fin = b.cols["rank_key"][np.isfinite(b.cols["rank_key"])]
            best = min(best, float(fin.min()) if fin.size else np.inf)
    # the most promising layout of the other kind (plain data parallelism, or tensor/pipeline),
    # so the winner can be explained against it
    for plain in (True, False):
        rest = [k for k in keep if _plain(k) == plain]
        if rest and not any(k in done for k in rest):
            k = min(rest, key=cheap.get)
            done.add(k)
            parts.extend(layout_grids(pb, space, k, groups[k], async_tp))
    # and of a mixture of experts, the most promising expert-parallel layout, so the winner can be
    # explained against the layout such models are usually trained with
    experts = [k for k in keep if k.ep > 1]
    if experts and not any(k in done for k in experts):
        k = min(experts, key=cheap.get)
        parts.extend(layout_grids(pb, space, k, groups[k], async_tp))
    if not parts:
        raise ValueError("no layout to evaluate: pipelining needs a sharding the stack pipelines "
                         "(layout.pipelines)")
    packs = list(product(space.precisions, space.attentions, space.compiles, space.checkpointings))
    tab = Table.of_grids(parts, pb, packs, list(space.shardings), list(space.offloads))
    return tab, len({tuple(int(p.cols[k].flat[0]) for k in ("dp", "tp", "pp", "vp", "cp", "ep")) for p in parts})


def _plain(par: Parallelism) -> bool:
    """Pure data parallelism: no tensor, pipeline, context or expert parallelism."""
    return par.tp == 1 and par.pp == 1 and par.cp == 1 and par.ep == 1


def _layout_text(tab: Table, i: int) -> str:
    p = tab.parallelism(i)
    return p.describe() or f"data parallelism over all {p.dp} GPUs"


def explain_layout(tab: Table, order: np.ndarray, n_layouts: int, n_evaluated: int, n_gpus: int) -> str:
    """One sentence on why the winning layout won: its bubble and tensor-parallel time, and how
    the best plan of the other kind (pure data parallelism, or tensor/pipeline) compares."""
    dims = "dp × tp × pp" + (" × cp" if (tab.cp > 1).any() else "") + (" (× ep within dp)" if (tab.ep > 1).any() else "")
    head = (f"considered {n_layouts} layouts {dims} = {n_gpus}, evaluated {n_evaluated} (the rest "
            "cannot fit their model states or cannot beat the winner even at peak speed)"
            if n_layouts > n_evaluated else f"evaluated all {n_layouts} layouts {dims} = {n_gpus}")
    if not order.size:
        return head + "; none fits"
    i = int(order[0])
    plain = (tab.tp == 1) & (tab.pp == 1) & (tab.cp == 1) & (tab.ep == 1)
    win_plain = bool(plain[i])
    other = np.nonzero(np.isfinite(tab.rank_key) & (plain != win_plain))[0]
    text = f"{head}; {_layout_text(tab, i)} wins"
    if not win_plain:
        text += (f" (per step: pipeline bubble {tab.bubble[i]:.2f} s, tensor-parallel collectives "
                 f"{tab.tp_comm[i]:.2f} s, stage sends {tab.pp_comm[i]:.2f} s"
                 + (f", ring attention {tab.cp_comm[i]:.2f} s" if tab.cp[i] > 1 else "")
                 + (f", expert all-to-all {tab.ep_comm[i]:.2f} s" if tab.ep[i] > 1 else "")
                 + f" of {tab.step_time[i]:.2f} s)")
    if other.size:
        j = other[np.argmin(tab.rank_key[other])]
        kinds = "tensor/pipeline/context" + ("/expert" if (tab.ep > 1).any() else "")
        text += (f"; the best {kinds if win_plain else 'pure data-parallel'} plan "
                 f"({_layout_text(tab, j)}) takes {tab.step_time[j] / tab.step_time[i]:.2f}× as long")
    elif not win_plain:
        text += "; no pure data-parallel plan fits"
    expert = np.nonzero(tab.ep > 1)[0]
    if expert.size and tab.ep[i] == 1:
        fits = expert[np.isfinite(tab.rank_key[expert])]
        if fits.size:
            j = fits[np.argmin(tab.rank_key[fits])]
            if j != (other[np.argmin(tab.rank_key[other])] if other.size else -1):
                text += (f"; the best expert-parallel plan ({_layout_text(tab, j)}) takes "
                         f"{tab.step_time[j] / tab.step_time[i]:.2f}× as long")
        else:
            text += "; no expert-parallel plan evaluated fits"
    return text
