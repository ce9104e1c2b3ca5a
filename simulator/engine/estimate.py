"""Vectorized evaluation of a whole strategy space for one model, recipe and cluster.

Every strategy (precision x attention x compile x checkpointing x sharding x offload x
micro-batch) becomes one element of the flat numpy columns of a :class:`Table`: step time and its
parts (seconds), memory per GPU by component (bytes), feasibility. :func:`evaluate` runs named
steps, each a pure function over arrays shaped (packs K, micro-batches M, shardings Z, offloads
NO): micro-batch candidates, compute per pack, model states, the data-parallel group's
collectives and optimizer step, the sharding schedule's exposed communication and offload
(:mod:`simulator.physics.optimizer_time`), assembly with feasibility, and ranking. No I/O.
docs/architecture.md, physics 1-7. The steps that do not depend on the micro-batch sizes (or
depend only on a pack's) are kept per process, keyed by every input they read
(:mod:`simulator.core.memo`); every strategy's own arithmetic runs on each evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from itertools import product

import numpy as np

from ..core.memo import cached, frozen, store
from ..core.vocab import MIXED_PRECISIONS, PRECISIONS
from ..hardware.device import Device
from ..model import workload
from ..model.families import AnySpec
from ..physics import communication as comm
from ..physics import fresh_memory, memory, optimizer_time
from ..physics.compute import micro_batch_time
from ..physics.parallel import ShardView
from ..strategy.knobs import (
    SHARD_STAGE,
    Strategy,
    checkpointed_layers,
    checkpointing_rank,
    offload_allowed,
)
from ..strategy.layout import Parallelism
from ..strategy.stacks import Stack, default_stack


@dataclass(frozen=True)
class Problem:
    """What is being trained on what: everything but the strategy."""

    model: AnySpec | ShardView  # the model, or the share of it one GPU of a layout holds
    seq_len: int
    global_batch: int  # sequences per optimizer step
    optimizer: str
    device: Device
    fabric: comm.Fabric
    host_memory: float  # bytes of host RAM per node available for offloaded states
    gpu_label: str  # e.g. "RTX 3090 24 GB" for messages
    stack: Stack = field(default_factory=default_stack)  # the training software (not searched)
    dp: int | None = None  # data-parallel ranks; None: every GPU of the fabric
    pp: int = 1  # pipeline stages the model (a ShardView) is one of; 1: not pipelined

    @property
    def n_gpus(self) -> int:
        return self.fabric.n

    @property
    def dp_ranks(self) -> int:
        """Data-parallel ranks: the batch is split and the states are sharded over them (the
        fabric's GPUs unless a layout says otherwise; the fabric then describes the links of one
        data-parallel group, whose node count may round up)."""
        return self.dp if self.dp is not None else self.n_gpus

    @property
    def per_gpu_batch(self) -> int:
        """Samples each data-parallel rank processes per optimizer step (the slowest rank's share)."""
        return math.ceil(self.global_batch / self.dp_ranks)


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


@dataclass(frozen=True, eq=False)
class Table:
    """Every evaluated strategy, one element of each column per strategy (flat numpy arrays of
    equal length). Units: seconds per optimizer step (times), FLOPs per step on the busiest GPU
    (``hw_flops``), bytes per GPU (``mem_*``), bytes of host RAM per node (``host_need``)."""

    problem: Problem
    packs: list[tuple[str, str, bool, str]]  # (precision, attention, compile, checkpointing)
    shardings: list[str]
    offloads: list[str]
    # the strategy: indices into packs, shardings and offloads; micro-batch size (samples) and count
    pack: np.ndarray
    sharding: np.ndarray
    offload: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    # step time and its parts (s per optimizer step); compute = forward + backward + recompute (forward
    # and backward each hold half of autocast's casts, recompute its re-casts)
    step_time: np.ndarray
    compute: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    recompute: np.ndarray
    exposed_comm: np.ndarray
    optimizer: np.ndarray
    offload_time: np.ndarray
    hw_flops: np.ndarray
    host_idle: np.ndarray  # s per step the GPU waits for the host's kernel dispatch inside the passes
    # memory per GPU (bytes) and offloaded states per node (bytes)
    mem_weights: np.ndarray
    mem_gradients: np.ndarray  # live at the peak (memory.gradients_at_peak)
    mem_optimizer: np.ndarray
    mem_activations: np.ndarray
    mem_logits: np.ndarray
    mem_other: np.ndarray
    mem_total: np.ndarray
    host_need: np.ndarray
    # feasibility: a combination the frameworks offer, fits the GPU, fits the host RAM; all three
    valid: np.ndarray
    fits: np.ndarray
    host_ok: np.ndarray
    feasible: np.ndarray
    # ordering: simplicity rank (ties), and the sort key (step time, inf when infeasible)
    rank: np.ndarray
    rank_key: np.ndarray
    # layout (simulator.physics.parallel): degrees, sequence parallelism, and what the layout adds (s per step)
    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vp: np.ndarray
    sp: np.ndarray
    async_tp: np.ndarray  # tensor-parallel collectives overlapped with the GEMMs
    cp: np.ndarray  # context-parallel degree (ring attention)
    bubble: np.ndarray
    tp_comm: np.ndarray  # exposed
    tp_comm_hidden: np.ndarray  # hidden behind the GEMMs by asynchronous TP
    pp_comm: np.ndarray
    cp_comm: np.ndarray  # ring attention's exposed K/V exchange
    ep: np.ndarray  # expert-parallel degree (a mixture of experts)
    etp: np.ndarray  # expert tensor-parallel degree; 0: the tensor-parallel degree (Parallelism.etp None)
    ep_comm: np.ndarray  # expert-parallel all-to-all (exposed)

    def __len__(self) -> int:
        return int(self.step_time.size)

    def with_columns(self, **cols: np.ndarray) -> Table:
        """The same strategies with some columns replaced."""
        return replace(self, **cols)

    @classmethod
    def concat(cls, parts: list[Table], problem: Problem, packs: list, shardings: list[str],
               offloads: list[str]) -> Table:
        """One table of the rows of ``parts`` (whose pack, sharding and offload indices refer to
        ``packs``, ``shardings``, ``offloads``) for ``problem``."""
        return cls(problem=problem, packs=packs, shardings=shardings, offloads=offloads,
                   **{k: np.concatenate([getattr(p, k) for p in parts]) for k in _COLUMNS})

    @classmethod
    def of_grids(cls, grids: list[Grid], problem: Problem, packs: list, shardings: list[str],
                 offloads: list[str]) -> Table:
        """One table of the strategies of ``grids`` in order, each flattened in C order over its
        axes (indices referring to ``packs``, ``shardings``, ``offloads``), for ``problem``: each
        column is written once (as :meth:`concat` of the grids' flattened tables). A single
        grid's 0-d column stays a read-only view of its one value."""
        sizes = [math.prod(g.shape) for g in grids]
        ends = np.cumsum([0] + sizes)
        cols = {}
        for k in _COLUMNS:
            parts = [g.cols[k] for g in grids]
            if len(grids) == 1 and parts[0].ndim == 0:
                cols[k] = np.broadcast_to(parts[0], (int(ends[-1]),))
                continue
            dtype = np.result_type(*(x.dtype for x in parts))
            if all(x.size == 1 for x in parts):  # one value per grid (a layout's degrees)
                cols[k] = np.repeat(np.array([x.flat[0] for x in parts], dtype=dtype), sizes)
                continue
            if all(x.shape == g.shape for x, g in zip(parts, grids, strict=True)):  # every strategy its own value
                cols[k] = np.concatenate([x.reshape(-1) for x in parts], dtype=dtype)
                continue
            out = np.empty(int(ends[-1]), dtype=dtype)
            i = 0
            while i < len(grids):  # consecutive grids sharing the array (a layout's vp) in one write
                j = i + 1
                while j < len(grids) and parts[j] is parts[i] and grids[j].shape == grids[i].shape:
                    j += 1
                out[ends[i]:ends[j]].reshape((j - i, *grids[i].shape))[...] = parts[i]
                i = j
            cols[k] = out
        return cls(problem=problem, packs=packs, shardings=shardings, offloads=offloads, **cols)

    def parallelism(self, i: int) -> Parallelism:
        """The layout of strategy ``i``."""
        return Parallelism(int(self.dp[i]), int(self.tp[i]), int(self.pp[i]), int(self.vp[i]), bool(self.sp[i]),
                           bool(self.async_tp[i]), int(self.cp[i]), int(self.ep[i]), int(self.etp[i]) or None)

    def strategy(self, i: int) -> Strategy:
        """Strategy ``i`` with its knob values and layout."""
        p, att, c, ck = self.packs[int(self.pack[i])]
        return Strategy(precision=p, attention=att, compile=c, checkpointing=ck,
                        sharding=self.shardings[int(self.sharding[i])],
                        offload=self.offloads[int(self.offload[i])],
                        micro_batch=int(self.micro_batch[i]), grad_accum=int(self.grad_accum[i]),
                        parallelism=self.parallelism(i))


#: The per-strategy columns: every field of Table after the problem and the knob values.
_COLUMNS = tuple(f.name for f in fields(Table))[4:]


@dataclass(frozen=True)
class Grid:
    """The strategies of one evaluation before flattening into a :class:`Table`: laid out on the
    axes (packs K, micro-batches M, shardings Z, offloads NO), every column of :data:`_COLUMNS`
    an array broadcastable to ``shape`` that spans only the axes it varies along (0-d for a
    constant). Elementwise arithmetic on these gives each strategy the same numbers as on the
    flat rows, on far fewer elements. Units as in :class:`Table`."""

    problem: Problem
    packs: list[tuple[str, str, bool, str]]
    shardings: list[str]
    offloads: list[str]
    shape: tuple[int, int, int, int]
    cols: dict[str, np.ndarray]

    def table(self) -> Table:
        """The flat :class:`Table` of these strategies."""
        return Table.of_grids([self], self.problem, self.packs, self.shardings, self.offloads)


def _layer_params(model) -> float:
    emb = model.n_embedding_params() if hasattr(model, "n_embedding_params") else 0
    return max(1.0, (model.n_params() - emb) / model.n_layers)


@dataclass(frozen=True)
class MicroBatches:
    """Micro-batch candidates of one search (sizes in samples) and the sizes evaluated: every
    candidate and the last, possibly smaller, micro-batch of each step."""

    sizes: np.ndarray  # (M,) candidate micro-batch sizes
    grad_accum: np.ndarray  # (M,) micro-batches per optimizer step
    evaluated: np.ndarray  # (E,) sizes to evaluate, float
    mi: np.ndarray  # (M,) index of each candidate in ``evaluated``
    li: np.ndarray  # (M,) index of each candidate's last micro-batch in ``evaluated``


def micro_batch_candidates(pb: Problem, space: Space, packs: list[tuple], supported: np.ndarray) -> MicroBatches:
    """The pinned micro-batch sizes, or every size from 1 whose activations could fit at all next
    to the least model states any precision allows (ZeRO-3, everything offloaded): activation and
    logit memory are linear in the micro-batch, so one sample decides the bound. Units: samples.
    Kept per process, keyed by every input it reads."""
    pinned = None if space.micro_batches is None else np.asarray(space.micro_batches, dtype=int)
    key = (pb.model, pb.seq_len, pb.stack, pb.optimizer, pb.dp_ranks, pb.per_gpu_batch, pb.device.usable_memory,
           tuple(packs), supported.tobytes(), tuple(space.precisions), None if pinned is None else pinned.tobytes())
    return cached(_MICRO_BATCHES, key, lambda: _micro_batch_candidates(pb, space, packs, supported, pinned))


_MICRO_BATCHES = store()


def _micro_batch_candidates(pb: Problem, space: Space, packs: list[tuple], supported: np.ndarray,
                            pinned: np.ndarray | None) -> MicroBatches:
    model, dev, n = pb.model, pb.device, pb.dp_ranks
    if pinned is not None:
        mbs = pinned
    else:
        one = np.array([1.0])
        per_sample = min(float(sum(memory.peak_activations(model, pb.seq_len, one, p, att, ck, c, pb.stack)[::2])[0])
                         for (p, att, c, ck), ok in zip(packs, supported, strict=True) if ok) \
            if supported.any() else 1.0
        P, PL = float(model.n_params()), _layer_params(model)
        floor_states = min(sum(memory.model_states(P, PL, p, "zero3", "all", pb.optimizer, n)[k]
                               for k in ("weights", "gradients", "optimizer")) for p in space.precisions)
        room = dev.usable_memory - floor_states
        last_fit = int(room // (per_sample * (1 + pb.stack.fragmentation))) if room > 0 else 1
        mbs = np.arange(1, min(pb.per_gpu_batch, max(1, last_fit)) + 1)
    ga = np.ceil(pb.per_gpu_batch / mbs).astype(int)
    last = pb.per_gpu_batch - (ga - 1) * mbs  # size of the last (possibly smaller) micro-batch
    mb_eval = np.unique(np.concatenate([mbs, last])).astype(float)
    out = MicroBatches(mbs, ga, mb_eval, np.searchsorted(mb_eval, mbs), np.searchsorted(mb_eval, last))
    frozen(*(getattr(out, f.name) for f in fields(out)))
    return out


@dataclass(frozen=True)
class PackCompute:
    """Per pack (precision, attention, compile, checkpointing) and evaluated micro-batch size, (K, E):
    seconds of forward, backward and recompute, executed FLOPs, activation bytes (the rebuilt
    block's working set among them, ``rebuilt``), the logit bytes held at the peak
    (:func:`simulator.physics.memory.logits_at_peak`); and
    seconds of autocast's weight casts per micro-batch (K,), in forward and backward (``cast``) and
    again in recomputation (``rec_cast``: whole checkpointed layers re-cast their weights), and
    the parameters of those checkpointed layers (``rebuilt_params``, K,). Unsupported precisions: inf. ``sized`` stacks the (K, E) quantities the evaluation gathers at
    its micro-batch sizes, in the order of :data:`_SIZED`: forward, backward, recompute, FLOPs,
    their sum (a micro-batch's compute), the device's wait for the host in them
    (:attr:`simulator.physics.compute.MicroBatchTime.host_idle`), backward + recompute, activations, logits, the
    activations outside the blocks and the rebuilt block's working set."""

    fwd: np.ndarray
    bwd: np.ndarray
    rec: np.ndarray
    hw: np.ndarray
    act: np.ndarray
    logit: np.ndarray
    cast: np.ndarray
    rec_cast: np.ndarray
    act_outside: np.ndarray
    rebuilt: np.ndarray
    rebuilt_params: np.ndarray
    sized: np.ndarray  # (len(_SIZED), K, E)


#: The rows of :attr:`PackCompute.sized`.
_SIZED = ("fwd", "bwd", "rec", "hw", "total", "idle", "bwd_rec", "act", "logit", "act_outside", "rebuilt")


def compute_per_pack(pb: Problem, packs: list[tuple], supported: np.ndarray, sizes: np.ndarray) -> PackCompute:
    """Compute time and activation memory of one micro-batch of each of ``sizes`` samples, for
    every pack (:class:`PackCompute`); kept per process, keyed by the model (or view), sequence
    length, sizes, packs, stack and device."""
    key = (pb.model, pb.seq_len, sizes.tobytes(), tuple(packs), supported.tobytes(), pb.stack, pb.device.name)
    return cached(_PACK_COMPUTE, key, lambda: _compute_per_pack(pb, packs, supported, sizes), pb.device)


_PACK_COMPUTE = store()


def _compute_per_pack(pb: Problem, packs: list[tuple], supported: np.ndarray, sizes: np.ndarray) -> PackCompute:
    model, dev, seq = pb.model, pb.device, pb.seq_len
    P = float(model.n_params())
    K, E = len(packs), sizes.size
    fwd, bwd, rec, hw, act, logit, act_out, rebuilt = (np.full((K, E), np.inf) for _ in range(8))
    idle = np.zeros((K, E))
    cast, rec_cast = np.zeros(K), np.zeros(K)
    # parameters of the checkpointed layers, whose forward (weight casts included) runs again
    rerun = np.array([checkpointed_layers(ck, model.n_layers) for *_, ck in packs]) * _layer_params(model)
    rate = dev.mem_bw * dev.profile.bw_eff("cast")
    memo: dict = {}
    for i, (p, att, c, ck) in enumerate(packs):
        if not supported[i]:
            continue
        t = micro_batch_time(model, seq, sizes, p, att, c, ck, dev, memo, pb.stack)
        fwd[i], bwd[i], rec[i], hw[i], idle[i] = t.fwd, t.bwd, t.recompute, t.hw_flops, t.host_idle
        act[i], rebuilt[i], logit[i] = memory.peak_activations(model, seq, sizes, p, att, ck, c, pb.stack)
        act_out[i] = memory.outside_activations(model, seq, sizes, p, att, c, pb.stack)
        # autocast weight casts (and their gradients' casts back) once per micro-batch, only where
        # the weights stay fp32 (DDP)
        cast[i] = float(workload.autocast_cast_bytes(P, p, half_params=False).nbytes) / rate
        rec_cast[i] = 0.5 * float(workload.autocast_cast_bytes(rerun[i], p, half_params=False).nbytes) / rate
    sized = np.stack([fwd, bwd, rec, hw, fwd + bwd + rec, idle, bwd + rec, act, logit, act_out, rebuilt])
    frozen(fwd, bwd, rec, hw, act, logit, cast, rec_cast, act_out, rebuilt, rerun, sized)
    return PackCompute(fwd, bwd, rec, hw, act, logit, cast, rec_cast, act_out, rebuilt, rerun, sized)


@dataclass(frozen=True)
class PerSize:
    """:attr:`PackCompute.sized` at a search's micro-batch candidates (``at``, (K, M) each: one
    micro-batch of the candidate's size) and at each candidate's last micro-batch (``last``);
    ``per_step``: the first six (forward, backward, recompute, FLOPs, compute, host idle) summed over an
    optimizer step, (ga - 1) x at + last. Units as in :class:`PackCompute`."""

    at: dict[str, np.ndarray]
    last: dict[str, np.ndarray]
    per_step: dict[str, np.ndarray]


def per_size(pc: PackCompute, mb: MicroBatches) -> PerSize:
    """:class:`PerSize` of ``pc`` at the candidates of ``mb``."""
    at, last = pc.sized[:, :, mb.mi], pc.sized[:, :, mb.li]
    step = (mb.grad_accum - 1) * at[:6] + last[:6]
    return PerSize(dict(zip(_SIZED, at, strict=True)), dict(zip(_SIZED, last, strict=True)),
                   dict(zip(_SIZED[:6], step, strict=True)))


@dataclass(frozen=True)
class States:
    """Model states per pack, sharding and offload (K, Z, NO): bytes per GPU of weights, gradients
    and optimizer states, and bytes each GPU puts in host RAM. Per pack and sharding (K, Z): bytes
    per parameter of weights and gradients before sharding, of the gradients as the data-parallel
    collectives reduce them (:func:`memory.reduce_size_per_param`), whether autocast keeps fp32
    weights, and bytes of communication buffers."""

    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    host: np.ndarray
    weight_bpp: np.ndarray
    grad_bpp: np.ndarray
    reduce_bpp: np.ndarray
    fp32_params: np.ndarray
    buffers: np.ndarray


def model_states(pb: Problem, space: Space, packs: list[tuple]) -> States:
    """Weights, gradients, optimizer states and buffers of every pack, sharding and offload
    (:class:`States`). They depend on the precision only (not attention, compile or
    checkpointing): one row per distinct precision, gathered to packs. Kept per process, keyed by
    the model (or view), ranks, pipelining, stack, optimizer, shardings, offloads and precisions."""
    key = (pb.model, pb.dp_ranks, pb.pp, pb.stack, pb.optimizer, tuple(space.shardings), tuple(space.offloads),
           tuple(pk[0] for pk in packs))
    return cached(_STATES, key, lambda: _model_states(pb, space, packs))


_STATES = store()


def _model_states(pb: Problem, space: Space, packs: list[tuple]) -> States:
    model, n, stack = pb.model, pb.dp_ranks, pb.stack
    P, PL = float(model.n_params()), _layer_params(model)
    prec = [pk[0] for pk in packs]
    precs = list(dict.fromkeys(prec))
    pi = np.array([precs.index(p) for p in prec])
    D, Z, NO = len(precs), len(space.shardings), len(space.offloads)
    # weights kept fp32 and cast by autocast each micro-batch (DDP; PyTorch's ZeRO in some stacks)
    fp32p = np.array([[memory.autocast_fp32_params(p, s, stack) for s in space.shardings] for p in precs])
    w, g, o, host = (np.zeros((D, Z, NO)) for _ in range(4))
    gc, wc, rc = np.zeros((D, Z)), np.zeros((D, Z)), np.zeros((D, Z))
    for i, p in enumerate(precs):
        for j, s in enumerate(space.shardings):
            wb, gb, _ = memory.state_bytes_per_param(p, s, pb.optimizer, stack)
            gc[i, j], wc[i, j], rc[i, j] = gb, wb, memory.reduce_size_per_param(p, s, stack)
            for k, off in enumerate(space.offloads):
                st = memory.layout_states(model, PL, p, s, off, pb.optimizer, n, stack, pb.pp > 1)
                w[i, j, k], g[i, j, k], o[i, j, k], host[i, j, k] = (
                    st["weights"], st["gradients"], st["optimizer"], st["host"])
    buffers = np.array([[memory.comm_buffers(P, p, sh, n, stack) for sh in space.shardings] for p in precs])
    out = States(w[pi], g[pi], o[pi], host[pi], wc[pi], gc[pi], rc[pi], fp32p[pi], buffers[pi])
    frozen(*(getattr(out, f.name) for f in fields(out)))
    return out


@dataclass(frozen=True)
class Schedule:
    """The searched shardings' collectives arranged by column (seconds per optimizer step, each
    (K, 1, columns)): ``bwd`` the one behind the backward (DDP's all-reduce, ZeRO's
    reduce-scatter, FSDP's reduce-scatter and, under full sharding, its gathers again) and
    ``bwd_floor`` its piece that cannot overlap, for every sharding; on the ``every`` columns
    (ZeRO-2, FSDP, ZeRO-3) it runs every micro-batch, else once behind the last; ``fwd`` and
    ``fwd_floor``: the forward's unit-by-unit gathers of the ``fwd_cols`` (FSDP, ZeRO-3);
    ``pipe`` and ``pipe_floor``: the gathers of FSDP on a pipeline stage, on the ``pipe_cols``
    (whose shardings are ``pipe_shardings``), each behind a micro-batch's forward, as many as
    :func:`comm.pipelined_fsdp_gathers` counts;
    ``after``: ZeRO-1/2's gather of the updated weights after the step, on the ``after_cols``.
    Column sets are slices where contiguous (the searched order makes them so), None when empty
    (and then so are their arrays)."""

    bwd: np.ndarray
    bwd_floor: np.ndarray
    every: slice | np.ndarray | None
    fwd: np.ndarray | None
    fwd_floor: np.ndarray | None
    fwd_cols: slice | np.ndarray | None
    pipe: np.ndarray | None
    pipe_floor: np.ndarray | None
    pipe_cols: slice | np.ndarray | None
    pipe_shardings: tuple[str, ...]
    after: np.ndarray | None
    after_cols: slice | np.ndarray | None


@dataclass(frozen=True)
class GroupCosts:
    """What one data-parallel group's collectives and optimizer step cost per pack, sharding and
    offload, before the micro-batches are known (seconds): the searched shardings' collectives
    (:class:`Schedule`; None over a single rank); the optimizer step on the GPU (K, Z, NO; 0
    where it runs on the CPU); the offloaded CPU step and host-link transfers and offload
    'all''s host-link stream per micro-batch, (K, 1, Z, NO) each (0 where not offloaded)."""

    schedule: Schedule | None
    optimizer: np.ndarray
    off_step: np.ndarray
    stream: np.ndarray


def group_costs(pb: Problem, space: Space, packs: list[tuple], st: States, P: float, PL: float,
                opt_fresh: float) -> GroupCosts:
    """:class:`GroupCosts` of the data-parallel group of ``pb`` (``st``: :func:`model_states`;
    ``P``, ``PL``: the model's and one layer's parameters; ``opt_fresh``: the optimizer step's
    fresh pages, s). Kept per process, keyed by :func:`model_states`' key (which decides ``st``;
    its stack also picks the optimizer's AdamW implementation), the fabric and the device (which
    decide the rest)."""
    key = (pb.model, pb.dp_ranks, pb.pp, pb.stack, pb.optimizer, tuple(space.shardings), tuple(space.offloads),
           tuple(pk[0] for pk in packs), pb.fabric, pb.device.name)
    return cached(_GROUP_COSTS, key, lambda: _group_costs(pb, space, packs, st, P, PL, opt_fresh), pb.device)


_GROUP_COSTS = store()


def _group_costs(pb: Problem, space: Space, packs: list[tuple], st: States, P: float, PL: float,
                 opt_fresh: float) -> GroupCosts:
    sched = _schedule(pb, space.shardings, st, P, PL) if pb.dp_ranks > 1 else None
    out = GroupCosts(sched, *_optimizer_steps(pb, space, packs, st, opt_fresh, P))
    frozen(out.optimizer, out.off_step, out.stream)
    if sched is not None:
        frozen(sched.bwd, sched.bwd_floor, sched.fwd, sched.fwd_floor, sched.pipe, sched.pipe_floor, sched.after)
    return out


def _columns(idx: list[int]) -> slice | np.ndarray | None:
    """Column positions as a slice where they are contiguous, else an index array; None if none."""
    if not idx:
        return None
    return slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else np.array(idx, dtype=int)


def _schedule(pb: Problem, shardings: list[str], st: States, P: float, PL: float) -> Schedule:
    """The collectives of the searched shardings' schedules (:func:`sharding_schedule`), seconds
    per optimizer step, arranged as a :class:`Schedule`."""
    model, fab = pb.model, pb.fabric
    L = model.n_layers
    gc = st.reduce_bpp  # the gradients as reduced: their own bytes, or the stack's wider reduce dtype
    grad_bytes = (P * gc)[:, None, :]
    w_bytes = (P * st.weight_bpp)[:, None, :]
    # each family's collectives, where a sharding of it is searched; the last bucket to fill
    # cannot overlap: at worst a full bucket (monotone in model size)
    if "ddp" in shardings:
        buckets = np.maximum(1.0, np.ceil(grad_bytes / (25.0 * memory.MIB)))
        ar = comm.all_reduce(fab, grad_bytes, buckets)
        ar_bucket = comm.all_reduce(fab, np.minimum(grad_bytes, 25.0 * memory.MIB))
    if "zero1" in shardings or "zero2" in shardings:
        zbuckets = max(1.0, math.ceil(P / memory.ZERO_BUCKET_ELEMENTS))
        rs_z = comm.gather_or_scatter(fab, grad_bytes, zbuckets)
        ag_z = comm.gather_or_scatter(fab, w_bytes, zbuckets)
        rs_bucket = comm.gather_or_scatter(fab, np.minimum(grad_bytes, memory.ZERO_BUCKET_ELEMENTS * gc[:, None, :]))
    if any(s not in ("ddp", "zero1", "zero2") for s in shardings):
        rs_l = comm.gather_or_scatter(fab, grad_bytes, L + 1)
        ag_l = comm.gather_or_scatter(fab, w_bytes, L + 1)
        # ZeRO-3 / FSDP gather and reduce unit by unit: L layers and the root unit (embeddings,
        # head); the root is gathered first and reduced last, so its collective (or one layer's,
        # if larger) can never hide behind compute
        unit = max(P - L * PL, PL) / P
        ag_unit = comm.gather_or_scatter(fab, w_bytes * unit)
        rs_unit = comm.gather_or_scatter(fab, grad_bytes * unit)
    if pb.pp > 1 and any(s.startswith("fsdp") for s in shardings):
        # a pipeline stage's accumulated gradients, reduce-scattered in the reduce dtype after its
        # last backward with no compute left to hide behind (memory.pipelined_fsdp_states)
        rs_pp = comm.gather_or_scatter(fab, grad_bytes, L + 1)
    bwd, floor, fwd, fwd_floor, pipe, pipe_floor, after = [], [], [], [], [], [], []
    every, fwd_cols, pipe_cols, after_cols = [], [], [], []
    for j, s in enumerate(shardings):
        sl = (slice(None), slice(None), slice(j, j + 1))
        if pb.pp > 1 and s.startswith("fsdp"):  # gathers as comm.pipelined_fsdp_gathers counts them
            bwd.append(rs_pp[sl]), floor.append(rs_pp[sl])
            pipe.append(ag_l[sl]), pipe_floor.append(ag_unit[sl]), pipe_cols.append(j)
            continue
        if s == "ddp":  # all-reduce behind the last backward
            bwd.append(ar[sl]), floor.append(ar_bucket[sl])
        elif s in ("zero1", "zero2"):  # reduce-scatter (zero2: every micro-batch), gather after the step
            bwd.append(rs_z[sl]), floor.append(rs_bucket[sl]), after.append(ag_z[sl]), after_cols.append(j)
        else:  # fsdp-grad-op: gather in forward, reduce-scatter in backward; zero3 / fsdp-full: gather
            # in forward, gather + reduce-scatter in backward
            bwd.append(rs_l[sl] if s == "fsdp-grad-op" else ag_l[sl] + rs_l[sl]), floor.append(rs_unit[sl])
            fwd.append(ag_l[sl]), fwd_floor.append(ag_unit[sl]), fwd_cols.append(j)
        if s != "ddp" and s != "zero1":
            every.append(j)

    def cat(xs: list[np.ndarray]) -> np.ndarray | None:
        return np.concatenate(xs, axis=2) if xs else None

    return Schedule(cat(bwd), cat(floor), _columns(every), cat(fwd), cat(fwd_floor), _columns(fwd_cols),
                    cat(pipe), cat(pipe_floor), _columns(pipe_cols), tuple(shardings[j] for j in pipe_cols),
                    cat(after), _columns(after_cols))


#: Shardings whose gradient reduction a stack may run after backward (Stack.grad_reduce_overlap false).
_AFTER_BACKWARD = frozenset({"ddp", "zero1", "zero2"})


def sharding_schedule(pb: Problem, shardings: list[str], gc: GroupCosts, ps: PerSize, mb: MicroBatches) -> np.ndarray:
    """Seconds per optimizer step of data-parallel communication not hidden behind compute, (K, M, Z).

    DDP all-reduces the gradients once per step behind the last backward; ZeRO-1 reduce-scatters
    them there and all-gathers the updated weights after the step; ZeRO-2 reduce-scatters every
    micro-batch; FSDP shard-grad-op and ZeRO-3 / FSDP full shard gather weights unit by unit in
    forward (and again in backward under full sharding) and reduce-scatter gradients in
    backward. Collectives are issued in pieces, each paying the latency and each a unit of
    overlap: DDP buckets of 25 MiB (bucket_cap_mb default), DeepSpeed ZeRO buckets of 5e8
    elements, ZeRO-3 / FSDP one gather / reduce-scatter per unit (L layers + the root):
    :class:`Schedule`, in ``gc``. Every micro-batch's collective is exposed beyond its window
    of compute (the last one's behind the last, possibly smaller, micro-batch). On a pipeline
    stage (``pb.pp`` > 1) FSDP gathers per :func:`comm.pipelined_fsdp_gathers` and reduce-scatters
    the accumulated gradients once, exposed whole."""
    K, M, Z = gc.optimizer.shape[0], mb.sizes.size, len(shardings)
    sc = gc.schedule
    if sc is None:
        return np.zeros((K, M, Z))
    overlap = pb.fabric.overlap
    more = mb.grad_accum[None, :, None] - 1
    # DDP's all-reduce and ZeRO's reduce-scatters after backward where the stack does not overlap them
    # (Stack.grad_reduce_overlap: Megatron-LM's default); FSDP's reduce-scatters always run in backward
    after = np.array([not pb.stack.grad_reduce_overlap and s in _AFTER_BACKWARD for s in shardings])
    bwd_overlap = np.where(after, 0.0, overlap)[None, None, :]
    out = comm.exposed(sc.bwd, ps.last["bwd_rec"][:, :, None], sc.bwd_floor, bwd_overlap)  # behind the last
    ev = sc.every
    if ev is not None:  # and behind each earlier micro-batch
        out[:, :, ev] = more * comm.exposed(sc.bwd[:, :, ev], ps.at["bwd_rec"][:, :, None], sc.bwd_floor[:, :, ev],
                                            bwd_overlap[:, :, ev]) + out[:, :, ev]
    if sc.fwd_cols is not None:  # gathers in every forward
        f_mb, f_last = ps.at["fwd"][:, :, None], ps.last["fwd"][:, :, None]
        fwd = more * comm.exposed(sc.fwd, f_mb, sc.fwd_floor, overlap) + comm.exposed(sc.fwd, f_last, sc.fwd_floor, overlap)
        out[:, :, sc.fwd_cols] = fwd + out[:, :, sc.fwd_cols]
    if sc.pipe_cols is not None:  # a pipeline stage's gathers, each behind a micro-batch's forward
        gathers = np.stack([comm.pipelined_fsdp_gathers(s, mb.grad_accum) for s in sc.pipe_shardings], axis=-1)
        out[:, :, sc.pipe_cols] = gathers[None] * comm.exposed(sc.pipe, ps.at["fwd"][:, :, None], sc.pipe_floor,
                                                               overlap) + out[:, :, sc.pipe_cols]
    if sc.after_cols is not None:
        out[:, :, sc.after_cols] = out[:, :, sc.after_cols] + sc.after
    return out


#: Whether each precision is a mixed one (half-precision compute beside fp32 masters).
MIXED = {p: p in MIXED_PRECISIONS for p in PRECISIONS}


def _optimizer_steps(pb: Problem, space: Space, packs: list[tuple], st: States, opt_fresh: float,
                     P: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:class:`GroupCosts`' optimizer step on the GPU, offloaded step and offload stream
    (:mod:`simulator.physics.optimizer_time`): each rank updates its shard under ZeRO-1 and above."""
    model, dev, fab, n = pb.model, pb.device, pb.fabric, pb.dp_ranks
    prof = dev.profile
    L = model.n_layers
    K, Z, NO = len(packs), len(space.shardings), len(space.offloads)
    stage = np.array([SHARD_STAGE[s] for s in space.shardings])
    local = np.where(stage >= 1, memory.sharded_params(model, n), P)[None, :, None]  # params each rank updates
    share = local / P  # (1, Z, 1) fraction of the parameters each rank updates
    # a half copy of the updated weights, where ZeRO/FSDP keep fp32 masters (DDP's casts happen
    # per micro-batch, see assemble)
    half = np.array([MIXED[pk[0]] for pk in packs])[:, None] & ~st.fp32_params
    fp16 = np.array([pk[0] == "fp16" for pk in packs])[:, None]  # dynamic loss scaling unscales the gradients
    step_bytes = optimizer_time.bytes_per_param(pb.optimizer, st.grad_bpp, np.where(half, 2.0, 0.0), fp16)[:, :, None]
    opt_eff = prof.optimizer_bw_eff.get(pb.stack.optimizer,  # the stack's AdamW implementation, where profiled
                                        prof.optimizer_bw_eff.get("foreach", min(prof.optimizer_bw_eff.values())))
    loop = fresh_memory.optimizer_loop_time(model, prof)  # per-tensor host loop, where calibrated
    gpu_opt = optimizer_time.gpu_step_time(local, share, step_bytes, dev.mem_bw, opt_eff, opt_fresh, loop, L,
                                           prof.launch_overhead_us)
    offl = np.array(space.offloads)[None, None, :]
    cpu_rate = prof.cpu_adam_gparams_per_s * 1e9 / fab.gpus_per_node  # node's CPU shared by its GPUs
    off_step = np.where(offl != "none", optimizer_time.offload_step_time(
        local, st.grad_bpp[:, :, None], st.weight_bpp[:, :, None], cpu_rate, dev.host_bw), 0.0)
    optimizer_t = np.broadcast_to(np.where(offl == "none", gpu_opt, 0.0), (K, Z, NO))
    stream = optimizer_time.offload_stream_time(P, st.weight_bpp, st.grad_bpp, n, dev.host_bw)[:, :, None]
    stream4 = np.where(offl == "all", stream, 0.0)[:, None, :, :]
    return optimizer_t, off_step[:, None, :, :], stream4


def offload_seconds(gc: GroupCosts, ps: PerSize, mb: MicroBatches, n_layers: int) -> np.ndarray:
    """Seconds per optimizer step that offload adds (K, M, Z, NO): the offloaded step and the
    stream not hidden behind each micro-batch's compute (:func:`optimizer_time.offload_time`)."""
    return optimizer_time.offload_time(gc.off_step, gc.stream, ps.at["total"][:, :, None, None],
                                       ps.last["total"][:, :, None, None], mb.grad_accum[None, :, None, None],
                                       n_layers)


def spread(x: np.ndarray, n: int) -> np.ndarray:
    """``x`` (last axis of length 1) repeated ``n`` times along its last axis, written out: the
    same elements as broadcasting it, but elementwise operations with arrays spanning that axis
    then run over whole contiguous rows instead of ``n`` elements at a time."""
    if n == 1:
        return x
    out = np.empty(x.shape[:-1] + (n,), dtype=x.dtype)
    for i in range(n):
        out[..., i] = x[..., 0]
    return out


def _offload_allowed(shardings: tuple[str, ...], offloads: tuple[str, ...]) -> np.ndarray:
    """(Z, NO): which sharding and offload combinations the frameworks offer
    (:func:`offload_allowed`); kept per process (read-only)."""
    def make() -> np.ndarray:
        out = np.array([[offload_allowed(s, off) for off in offloads] for s in shardings])
        frozen(out)
        return out
    return cached(_OFFLOAD_ALLOWED, (shardings, offloads), make)


_OFFLOAD_ALLOWED = store()


def simplicity_rank(packs: list[tuple], shardings: list[str], n_offloads: int, micro_batch: np.ndarray,
                    largest_micro_batch: int) -> np.ndarray:
    """Simplicity rank of a grid's strategies, (K, M, Z, NO): ties are broken towards no offload,
    no checkpointing, plain DDP, a larger micro-batch (float; ``micro_batch``: (1, M, 1, 1))."""
    base = _simplicity_base(tuple(pk[3] for pk in packs), tuple(shardings), n_offloads)
    return base - micro_batch / (largest_micro_batch + 1.0)


def _simplicity_base(checkpointings: tuple[str, ...], shardings: tuple[str, ...], n_offloads: int) -> np.ndarray:
    """The micro-batch-independent part of :func:`simplicity_rank`, (K, 1, Z, NO): offload x 100 +
    the checkpointing's order x 10 + the sharding's stage + 1; kept per process (read-only)."""
    def make() -> np.ndarray:
        pack, sharding, offload = grid_indices(len(checkpointings), len(shardings), n_offloads)
        ck_rank = np.array([checkpointing_rank(c) for c in checkpointings])
        stage = np.array([SHARD_STAGE[s] for s in shardings])
        out = offload * 100 + ck_rank[pack] * 10 + stage[sharding] + 1.0
        frozen(out)
        return out
    return cached(_SIMPLICITY, (checkpointings, shardings, n_offloads), make)


_SIMPLICITY = store()


def grid_indices(K: int, Z: int, NO: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pack, sharding and offload index of a grid's strategies, shaped (K, 1, 1, 1),
    (1, 1, Z, 1) and (1, 1, 1, NO); kept per process (read-only)."""
    def make() -> tuple[np.ndarray, ...]:
        out = tuple(np.arange(n).reshape([n if a == i else 1 for a in range(4)]) for i, n in ((0, K), (2, Z), (3, NO)))
        frozen(*out)
        return out
    return cached(_INDICES, (K, Z, NO), make)


_INDICES = store()
#: Read-only 0-d columns of a plain data-parallel grid (one value for every strategy; ``_NO_ETP``:
#: the etp column's 0, expert tensor parallelism as the tensor-parallel degree).
_ZERO, _ONE, _FALSE, _NO_ETP = np.asarray(0.0), np.asarray(1), np.asarray(False), np.asarray(0)
frozen(_ZERO, _ONE, _FALSE, _NO_ETP)


def ranked(cols: dict[str, np.ndarray], usable_memory: float, simpler: float = 0.0) -> dict[str, np.ndarray]:
    """``cols`` (of a :class:`Grid`) with feasibility and the sort key added: ``fits`` (the total
    within ``usable_memory`` bytes), ``feasible`` (valid, fits and host_ok) and ``rank_key``, the
    step time (s) nudged by the simplicity rank plus 1000 x ``simpler`` (a layout's complexity),
    inf when infeasible."""
    fits = cols["mem_total"] <= usable_memory
    feasible = cols["valid"] & fits & cols["host_ok"]
    rank = cols["rank"] + 1000 * simpler if simpler else cols["rank"]  # + 0.0 would change no rank (> 0)
    return {**cols, "fits": fits, "feasible": feasible,
            "rank_key": np.where(feasible, cols["step_time"] * (1 + 1e-9 * rank), np.inf)}


def evaluate(pb: Problem, space: Space) -> Table:
    """Evaluate every strategy of ``space`` on ``pb``: micro-batch candidates, compute per pack,
    model states, the group's collectives and optimizer step, the sharding schedule's exposed
    communication and offload, then assembly, feasibility and ranking. Returns a :class:`Table`,
    plain data parallelism over all GPUs."""
    grid = evaluate_grid(pb, space)
    return replace(grid, cols=ranked(grid.cols, pb.device.usable_memory)).table()


def evaluate_grid(pb: Problem, space: Space) -> Grid:
    """:func:`evaluate`'s strategies as a :class:`Grid` (not yet flattened) without the columns
    :func:`ranked` adds (a layout changes what they derive from)."""
    dev = pb.device
    packs = list(product(space.precisions, space.attentions, space.compiles, space.checkpointings))
    ok = {p: dev.gemm_peak(p) is not None for p in space.precisions}
    supported = np.array([ok[pk[0]] for pk in packs])
    mb = micro_batch_candidates(pb, space, packs, supported)
    pc = compute_per_pack(pb, packs, supported, mb.evaluated)
    ps = per_size(pc, mb)
    st = model_states(pb, space, packs)
    P, PL = float(pb.model.n_params()), _layer_params(pb.model)
    grad_fresh, opt_fresh = fresh_memory.step_fresh(pb.model, dev.profile)  # fresh pages (CPU), per step
    gc = group_costs(pb, space, packs, st, P, PL, opt_fresh)
    exposed_comm = sharding_schedule(pb, space.shardings, gc, ps, mb)
    offload_t = offload_seconds(gc, ps, mb, pb.model.n_layers)
    return assemble(pb, space, packs, supported, mb, pc, ps, st, grad_fresh, exposed_comm, gc.optimizer, offload_t)


def assemble(pb: Problem, space: Space, packs: list[tuple], supported: np.ndarray, mb: MicroBatches,
             pc: PackCompute, ps: PerSize, st: States, grad_fresh: float, exposed_comm: np.ndarray,
             optimizer_t: np.ndarray, offload_t: np.ndarray) -> Grid:
    """The step (s) = compute (micro-batches, gradient first touches, autocast casts) + exposed
    communication + optimizer + offload; memory per GPU (bytes) = states + activations + logits +
    buffers and fragmentation; whether valid and the host RAM holds the offloaded states; the
    simplicity rank; all on the (K, M, Z, NO) axes of a :class:`Grid` (not yet :func:`ranked`)."""
    K, M, Z, NO = len(packs), mb.sizes.size, len(space.shardings), len(space.offloads)
    shape = (K, M, Z, NO)
    ga = mb.grad_accum
    step_of = ps.per_step
    compute = step_of["total"] + grad_fresh  # gradients are allocated once per step
    fp32 = st.fp32_params[:, None, :].astype(float)  # (K,1,Z): 1 where autocast casts fp32 weights
    fb_cast = (pc.cast[:, None] * ga[None, :])[:, :, None] * fp32  # (K,M,Z)
    rec_cast = (pc.rec_cast[:, None] * ga[None, :])[:, :, None] * fp32
    comp4 = (compute[:, :, None] + fb_cast + rec_cast)[..., None]
    step = spread(comp4 + exposed_comm[..., None], NO) + optimizer_t[:, None] + offload_t
    act4 = ps.at["act"][:, :, None, None]
    log4 = ps.at["logit"][:, :, None, None]
    mem_w = st.weights[:, None]
    # gradients of a single-micro-batch DDP step are written during backward as activations go
    # (not into a stack's contiguous gradient buffer, allocated once and kept)
    ddp = np.array([s == "ddp" and not pb.stack.contiguous_grads for s in space.shardings])
    fresh = spread((ga == 1)[None, :, None, None] & ddp[None, None, :, None], NO)
    mem_g = memory.gradients_at_peak(st.gradients[:, None], act4, ps.at["act_outside"][:, :, None, None], log4,
                                     ps.at["rebuilt"][:, :, None, None], fresh)
    mem_o = st.optimizer[:, None]
    copies = memory.autocast_weight_copies(float(pb.model.n_params()), st.fp32_params, pc.rebuilt_params[:, None],
                                           _layer_params(pb.model))
    other = spread((st.buffers + copies)[:, None, :, None] + memory.allocator_reserve(act4, log4, pb.stack), NO)
    total = np.broadcast_to(mem_w + mem_g + mem_o + act4 + log4 + other, shape)
    valid4 = _offload_allowed(tuple(space.shardings), tuple(space.offloads))[None, None] & supported[:, None, None, None]
    host_need = st.host[:, None] * pb.fabric.gpus_per_node  # per node
    host_ok = host_need <= pb.host_memory

    pack, sharding, offload = grid_indices(K, Z, NO)
    micro_batch = mb.sizes[None, :, None, None]
    rank = simplicity_rank(packs, space.shardings, NO, micro_batch, mb.sizes.max())
    zero = _ZERO
    half_cast = 0.5 * fb_cast[..., None]
    cols = dict(
        pack=pack, sharding=sharding, offload=offload, micro_batch=micro_batch,
        grad_accum=ga[None, :, None, None],
        step_time=step, compute=comp4,
        forward=step_of["fwd"][:, :, None, None] + half_cast,
        backward=(step_of["bwd"] + grad_fresh)[:, :, None, None] + half_cast,
        recompute=step_of["rec"][:, :, None, None] + rec_cast[..., None], exposed_comm=exposed_comm[..., None],
        optimizer=optimizer_t[:, None], offload_time=offload_t, hw_flops=step_of["hw"][:, :, None, None],
        host_idle=step_of["idle"][:, :, None, None],
        mem_weights=mem_w, mem_gradients=mem_g, mem_optimizer=mem_o, mem_activations=act4,
        mem_logits=log4, mem_other=other, mem_total=total, host_need=host_need,
        valid=valid4, host_ok=host_ok, rank=rank,
        dp=np.asarray(pb.dp_ranks), tp=_ONE, pp=_ONE, vp=_ONE, sp=_FALSE, async_tp=_FALSE, cp=_ONE,
        bubble=zero, tp_comm=zero, tp_comm_hidden=zero, pp_comm=zero, cp_comm=zero, ep=_ONE, etp=_NO_ETP,
        ep_comm=zero,
    )
    return Grid(pb, packs, list(space.shardings), list(space.offloads), shape, cols)
