"""Tensor, sequence and pipeline parallelism (Megatron-LM): pure physics of one layout.

A :class:`Parallelism` splits the cluster's GPUs into ``dp x tp x pp x cp`` (Megatron's rank order:
tensor-parallel ranks innermost, inside a node; then context-parallel; then data-parallel;
pipeline stages outermost).

* Tensor parallelism (Shoeybi et al. 2019): QKV and MLP-up GEMMs are column-parallel (n / tp),
  the output projection and MLP-down row-parallel (k / tp); attention heads split (KV heads
  replicated when tp exceeds them); the embedding and the loss are vocabulary-parallel. Two
  all-reduces of the layer's activations per layer forward and two backward; with sequence
  parallelism (Korthikanti et al. 2022) each becomes a reduce-scatter + all-gather pair (the same
  bytes) and the norms' and dropouts' activations are divided by tp as well.
* Pipeline parallelism (Narayanan et al. 2021): layers split over pp stages (embedding on the
  first, head and loss on the last); 1F1B with a bubble of (pp-1)/m of the ideal time for m
  micro-batches, (pp-1)/(v*m) interleaved with v virtual stages per GPU; the first stage holds
  min(pp, m) micro-batches of activations (x (1 + (pp-1)/(pp*v)) interleaved); each micro-batch
  sends its activations forward and its gradient backward across every stage boundary.
* Context parallelism (ring attention; Megatron-LM's context_parallel_size, torchtitan's
  context_parallel): each sequence split over cp ranks in 2 cp chunks, rank i holding chunks i and
  2cp-1-i so every rank has the same share of the causal attention; GEMMs, norms, activations and
  logits see seq/cp tokens per rank; attention computes the rank's queries against every key
  (1/cp of the causal attention FLOPs, cp blocks of the view's size); K/V blocks travel the ring
  in cp-1 point-to-point steps, each behind one block of attention (backward: K/V and their
  gradients); weights are replicated, so gradients are reduced (and ZeRO/FSDP states sharded)
  over dp x cp ranks.

Units: bytes, seconds, elements. The per-GPU work goes through the ordinary workload, compute and
memory functions on a :class:`ShardView` of the model (the GPU's shard of the busiest stage).
"""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

from ..core.memo import cached, store
from ..model.spec import ModelSpec
from ..strategy.layout import Parallelism, stage_layers
from . import communication as comm


def bubble_time(pp: int, micro_batch_seconds, vp: int = 1, micro_batches=None) -> np.ndarray:
    """Seconds of the 1F1B pipeline bubble of m = ``micro_batches`` micro-batches (None: as many as
    the schedule needs, m >= pp): (pp-1)/vp micro-batch times, a fraction (pp-1)/(vp*m) of the ideal
    (bubble-free) time (Narayanan et al. 2021, eq. 1 and sec. 2.2.2). With fewer micro-batches than
    stages the interleaved schedule cannot fill its rounds: a micro-batch's next chunk reaches the
    first stage after a whole round of pp chunk times, so each of the vp rounds lasts max(m, pp) chunk
    times and the step (pp + (m-1)/vp) micro-batch times; the bubble (pp-m) + (m-1)/vp of them
    (plain 1F1B, vp 1: pp-1 for any m; one micro-batch: the stages one after another, pp times).
    ``micro_batch_seconds``: one micro-batch's forward and backward on a stage, with what it waits
    for. 0 without pipelining."""
    t = np.asarray(micro_batch_seconds, dtype=float)
    if micro_batches is None:
        return (pp - 1) / vp * t
    m = np.asarray(micro_batches, dtype=float)
    return (np.maximum(0.0, pp - m) + (np.minimum(m, pp) - 1.0) / vp) * t


def in_flight(pp: int, micro_batches, vp: int = 1) -> np.ndarray:
    """Micro-batches of activations the first stage holds at the peak of 1F1B: min(pp, m);
    interleaved, x (1 + (pp-1)/(pp*vp)) (Korthikanti et al. 2022, sec. 4.2.3)."""
    m = np.asarray(micro_batches, dtype=float)
    base = np.minimum(float(pp), m)
    return base * (1.0 + (pp - 1) / (pp * vp)) if vp > 1 else base


def tp_comm_bytes_per_layer(tokens, hidden: int, e: int, tp: int) -> np.ndarray:
    """Bytes each GPU sends per layer per pass (forward, or backward) for tensor parallelism:
    two all-reduces of the layer's (tokens x hidden) activations, each 2(tp-1)/tp of the buffer
    (ring); with sequence parallelism two all-gathers and two reduce-scatters, (tp-1)/tp each:
    the same bytes (Korthikanti et al. 2022, sec. 4.2.2)."""
    s = np.asarray(tokens, dtype=float) * hidden * e
    return 2 * 2 * (tp - 1) / tp * s


def tp_comm_time(tokens, hidden: int, e: int, tp: int, sp: bool, passes, bw: float, alpha: float) -> np.ndarray:
    """Seconds of tensor-parallel collectives per layer: ``passes`` forward-sized passes
    (2 = forward + backward; 3 with full recomputation), each with 2 collectives (4 with
    sequence parallelism) paying the latency ``alpha`` (s) and the bytes at ``bw`` (bytes/s)."""
    if tp <= 1:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    per_pass = (4 if sp else 2) * alpha + tp_comm_bytes_per_layer(tokens, hidden, e, tp) / bw
    return np.asarray(passes, dtype=float) * per_pass


def tp_comm_layers(view, par: Parallelism) -> float:
    """Layers' worth of :func:`tp_comm_time` one GPU of ``par`` pays: every layer of its view,
    less half of each sparse layer whose experts run folded (``etp`` 1: the MoE block takes the
    sequence shard as it is and sends it by all-to-all, so only the attention's all-gather and
    reduce-scatter remain; a shared expert, tensor-parallel, keeps its own)."""
    layers = float(view.n_layers)
    if par.folded and not getattr(view, "shared_ffn_hidden", 0):
        layers -= 0.5 * (view.n_layers - getattr(view, "first_dense_layers", 0))
    return layers


def tp_link(fab: comm.Fabric, tp: int) -> tuple[float, float]:
    """(bus bandwidth in bytes/s, latency in s) the tensor-parallel collectives of ``tp`` ranks
    see, in the bytes of :func:`tp_comm_bytes_per_layer`. Inside a node: its link. Across
    m = tp/g nodes (a layout people ran, e.g. TP 16 on nodes of 8, always slow): the hierarchical
    all-reduce of :func:`simulator.physics.communication.all_reduce` over the group, a reduce-scatter and
    an all-gather inside each node around an all-reduce over the nodes' networks, each node's
    network carrying its g ranks' shares; expressed as the bandwidth that moves the ring's
    2 (tp-1)/tp of the buffer in that time, and that collective's latency."""
    g = fab.gpus_per_node
    if tp <= g or fab.nodes == 1:
        return fab.intra_busbw, fab.intra_alpha
    m = tp / g
    seconds_per_byte = 2 * (g - 1) / g / fab.intra_busbw + 2 * (m - 1) / m / fab.inter_busbw
    alpha = 2 * fab.intra_alpha + fab.inter_alpha + 2 * (m - 1) * fab.hop_alpha
    return 2 * (tp - 1) / tp / seconds_per_byte, alpha


def async_tp_time(comm_pass, gemms: tuple, split: tuple, fwd_passes, tp: int, overlap: float) -> np.ndarray:
    """Seconds asynchronous tensor parallelism adds per micro-batch (PyTorch's async TP in
    torchtitan, Megatron-LM's --tp-comm-overlap): each sequence-parallel all-gather is split into
    tp pieces, each piece's GEMM running while the next piece arrives (and each reduce-scatter
    likewise behind the GEMM that produces it). Of a pass's collectives ``comm_pass`` (s; they
    still move every byte over the link) at most the fraction ``overlap`` is hidden (the transfers
    contend with the GEMMs for memory bandwidth and SMs), and never more than the pass's split
    GEMM time less its last piece, (tp-1)/tp of it, which has nothing left to hide; the rest stays
    exposed. The split GEMMs run less efficiently (fewer rows each): their extra time is added.
    ``gemms``/``split``: (forward, backward) GEMM seconds whole and split into tp pieces
    (:func:`simulator.physics.compute.layer_gemm_times`); ``fwd_passes``: forward passes per micro-batch (1 + the share of
    layers recomputed)."""
    (gf, gb), (sf, sb) = gemms, split
    win = (tp - 1) / tp
    exposed_f = comm_pass - np.minimum(overlap * comm_pass, win * sf)
    exposed_b = comm_pass - np.minimum(overlap * comm_pass, win * sb)
    return fwd_passes * (exposed_f + (sf - gf)) + exposed_b + (sb - gb)


def p2p_bytes(tokens, hidden: int, e: int, tp: int, sp: bool) -> np.ndarray:
    """Bytes of one activation (or gradient) send between stages: tokens x hidden x e, split
    over the tensor-parallel ranks with sequence parallelism."""
    return np.asarray(tokens, dtype=float) * hidden * e / (tp if sp else 1)


def p2p_time(tokens, hidden: int, e: int, par: Parallelism, fab: comm.Fabric) -> np.ndarray:
    """Seconds of point-to-point sends per micro-batch on a stage: one activation forward and
    one gradient backward per virtual stage. Stages cross nodes when the cluster has more than
    one node (the slowest boundary paces the pipeline): the node's network shared by its GPUs;
    else the intra-node link; at the profile's sustained fraction of bus bandwidth."""
    if par.pp <= 1:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    if fab.nodes > 1:
        bw, alpha = fab.inter_busbw / fab.gpus_per_node, fab.inter_alpha
    else:
        bw, alpha = fab.intra_busbw, fab.intra_alpha
    return 2.0 * par.vp * (alpha + p2p_bytes(tokens, hidden, e, par.tp, par.sp) / bw)


def cp_block_bytes(tokens, kv_dim: int, e: int) -> np.ndarray:
    """Bytes of one K/V block ring attention passes per step and layer: K and V of the rank's
    ``tokens`` (its seq/cp tokens x micro-batch), ``kv_dim`` wide each (the GPU's KV heads)."""
    return 2.0 * np.asarray(tokens, dtype=float) * kv_dim * e


def cp_ring_time(block_bytes, attn_fwd, attn_bwd, attn_fwd_passes, layers: int, par: Parallelism,
                 fab: comm.Fabric) -> np.ndarray:
    """Exposed seconds per micro-batch of ring attention's K/V exchange, all ``layers`` of the
    view. Per layer and forward pass cp-1 steps each send one K/V block (``block_bytes``) while
    one of the cp attention blocks computes; backward, each step sends K/V and their gradients
    (twice the bytes) behind one block of the attention backward. A step's transfer beyond its
    block's compute is exposed. ``attn_fwd``/``attn_bwd``: the rank's attention seconds per
    micro-batch, all layers; ``attn_fwd_passes``: forward passes of attention (recomputation
    repeats the ring). The ring's neighbours are tp apart: inside the node while tp x cp GPUs fit
    in one, else across it (the node's network shared by its GPUs, which all send at once)."""
    if par.cp <= 1:
        return np.zeros_like(np.asarray(block_bytes, dtype=float))
    if par.tp * par.cp > fab.gpus_per_node and fab.nodes > 1:
        bw, alpha = fab.inter_busbw / fab.gpus_per_node, fab.inter_alpha
    else:
        bw, alpha = fab.intra_busbw, fab.intra_alpha
    steps = par.cp - 1
    per_block_f = np.asarray(attn_fwd, dtype=float) / (layers * par.cp)
    per_block_b = np.asarray(attn_bwd, dtype=float) / (layers * par.cp)
    fwd = steps * np.maximum(0.0, alpha + block_bytes / bw - per_block_f)
    bwd = steps * np.maximum(0.0, alpha + 2.0 * block_bytes / bw - per_block_b)
    return layers * (attn_fwd_passes * fwd + bwd)


def ep_comm_bytes(tokens, hidden: int, top_k: int, e: int, ep: int) -> np.ndarray:
    """Bytes each GPU sends to the other expert-parallel ranks per all-to-all (one dispatch, or
    one combine) of one MoE layer: its ``tokens`` x ``top_k`` copies of a ``hidden``-wide
    activation (``e`` bytes each), of which (ep-1)/ep go to experts on other ranks under uniform
    routing (Megatron-Core MoE README, all-to-all token dispatcher; DESIGN.md)."""
    return np.asarray(tokens, dtype=float) * top_k * hidden * e * (ep - 1) / ep


def ep_link(fab: comm.Fabric, par: Parallelism) -> tuple[float, float, float]:
    """(seconds per byte sent, latency in s, share of the bytes leaving the node) of the
    expert-parallel all-to-all. The ep ranks are the expert tensor-parallel degree apart (tp, taken
    from the data-parallel ranks; 1 when folded, Megatron-Core's consecutive expert ranks):
    inside one node while ep x etp GPUs fit in it, over its link; beyond, each GPU's peers on its
    own node (g/etp of the ep ranks) still take their share over the node's link and the rest
    crosses the node's network, which all g GPUs of the node use at once (each sends its own
    tokens)."""
    g, stride = fab.gpus_per_node, par.expert_tp
    if par.ep * stride <= g or fab.nodes == 1:
        return 1.0 / fab.intra_busbw, fab.intra_alpha, 0.0
    peers = max(1, g // stride)  # ep ranks on each node
    out = (par.ep - peers) / (par.ep - 1)  # of the bytes sent to other ranks
    per_byte = (1.0 - out) / fab.intra_busbw + out * g / fab.inter_busbw
    return per_byte, fab.intra_alpha + fab.inter_alpha, out


def groups_hit(n_experts: int, top_k: int, groups: int, routing: str = "uniform") -> float:
    """Expected distinct groups a token's ``top_k`` experts fall in, the ``n_experts`` split into
    ``groups`` equal groups (GPUs, nodes) of consecutive experts. ``uniform`` routing (any k
    distinct experts alike): ``groups x (1 - C(E - E/groups, k) / C(E, k))``; ``contiguous``
    (:attr:`simulator.model.families.moe.MoESpec.routing`: experts ``i k ... i k + k - 1`` mod E):
    the groups each such run of k touches, averaged over the runs."""
    if routing == "contiguous":
        size = n_experts // groups
        runs = n_experts // math.gcd(n_experts, top_k)
        hit = [len({(i * top_k + j) % n_experts // size for j in range(top_k)}) for i in range(runs)]
        return sum(hit) / runs
    miss = math.comb(n_experts - n_experts // groups, top_k) / math.comb(n_experts, top_k)
    return groups * (1.0 - miss)


def deepep_time(tokens, hidden: int, n_experts: int, top_k: int, e, par: Parallelism, fab: comm.Fabric,
                routing: str = "uniform") -> np.ndarray:
    """Seconds of one DeepEP dispatch (or combine) of a GPU's ``tokens``: DeepEP (deepseek-ai/DeepEP
    README; Megatron-Core ``--moe-token-dispatcher-type flex --moe-enable-deepep``) sends a token
    once to each other GPU that holds any of its experts (:func:`groups_hit` of the ep GPUs, less
    its own), over NVLink, and across nodes once to each other node holding any (RDMA, then
    forwarded over NVLink), its RDMA and NVLink transfers overlapped: the slower of the two, plus
    the latency. Expert-parallel ranks consecutive or tp apart as :func:`ep_link` places them;
    ``routing`` as :func:`groups_hit` counts it."""
    g = fab.gpus_per_node
    peers = par.ep if par.ep * par.expert_tp <= g or fab.nodes == 1 else max(1, g // par.expert_tp)
    nodes = par.ep // peers
    row = np.asarray(tokens, dtype=float) * hidden * e
    p_gpu = groups_hit(n_experts, top_k, par.ep, routing) * (par.ep - 1) / par.ep  # other GPUs hit
    nvlink = row * p_gpu / fab.intra_busbw
    if nodes <= 1:
        return fab.intra_alpha + nvlink
    p_node = groups_hit(n_experts, top_k, nodes, routing) * (nodes - 1) / nodes  # other nodes hit
    rdma = row * p_node * g / fab.inter_busbw
    return fab.intra_alpha + fab.inter_alpha + np.maximum(nvlink, rdma)


#: Share of a GPU's compute the all-to-all's kernels take while they run beside it: the 20 SMs of
#: Megatron-Core's and DeepEP's communication kernels (``--moe-deepep-num-sms`` 20; DeepEP's
#: ``Buffer.num_sms`` 20) of an H100's 132. ASSUMPTION for other GPUs and for NCCL's all-to-all.
A2A_OVERLAP_SM_SHARE = 20 / 132


def ep_overlap_exposed(ep_mb, compute_mb) -> np.ndarray:
    """Seconds the all-to-all adds per micro-batch when the stack runs it beside another
    micro-batch's compute (Megatron-Core ``--overlap-moe-expert-parallel-comm``: 1F1B's forward
    of one micro-batch merged with the backward of another, the dispatches and combines of each
    during the other's compute): the part the ``compute_mb`` seconds cannot hide, plus the
    slowdown of the compute they hide behind (:data:`A2A_OVERLAP_SM_SHARE`)."""
    ep = np.asarray(ep_mb, dtype=float)
    hidden = np.minimum(ep, np.asarray(compute_mb, dtype=float))
    return ep - hidden + A2A_OVERLAP_SM_SHARE * hidden


def ep_comm_time(tokens, hidden: int, top_k: int, e, par: Parallelism, fab: comm.Fabric, passes,
                 n_experts: int = 0, dispatcher: str = "alltoall", routing: str = "uniform") -> np.ndarray:
    """Seconds of expert-parallel all-to-all per MoE layer and micro-batch: a dispatch and a
    combine in each of ``passes`` forward-sized passes (2 = forward + backward, whose gradients
    travel the same all-to-alls in reverse; more with recomputation), each
    :func:`ep_comm_bytes` at :func:`ep_link` (NCCL's all-to-all, ``dispatcher`` alltoall), or
    :func:`deepep_time` (``deepep``, with the ``n_experts`` and ``routing``). Not overlapped with compute
    (Megatron-Core's default; its batch-level overlap is opt-in). ``tokens``: the GPU's tokens
    per micro-batch (its sequence shard under sequence parallelism)."""
    if par.ep <= 1:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    if dispatcher == "deepep":
        one = deepep_time(tokens, hidden, n_experts, top_k, e, par, fab, routing)
    else:
        per_byte, alpha, _ = ep_link(fab, par)
        one = alpha + ep_comm_bytes(tokens, hidden, top_k, e, par.ep) * per_byte
    return np.asarray(passes, dtype=float) * 2.0 * one


def dp_fabric(fab: comm.Fabric, par: Parallelism) -> comm.Fabric:
    """The links one gradient-reduction group sees: the dp x cp ranks holding the same weights.
    Its ranks are tp apart: k = min(dp cp, g/tp) of them share a node, and the node's network
    carries g/k such groups at once (bandwidth per group k/g of the node's). One per fabric, dp x
    cp and tp, per process."""
    return cached(_GROUP_FABRICS, (fab, par.dp * par.cp, par.tp), lambda: _dp_fabric(fab, par.dp * par.cp, par.tp))


_GROUP_FABRICS = store()


def _dp_fabric(fab: comm.Fabric, ranks: int, tp: int) -> comm.Fabric:
    g = fab.gpus_per_node
    k = max(1, min(ranks, g // tp))
    nodes = math.ceil(ranks / k)
    return dataclasses.replace(fab, nodes=nodes, gpus_per_node=k, inter_bw=fab.inter_bw * k / g if nodes > 1 else 0.0,
                               inter_alpha=fab.inter_alpha if nodes > 1 else 0.0)


def stage_window_layers(spec, stage: int) -> int:
    """Sliding-window layers on the busiest pipeline stage of ``stage`` layers: the stage holds
    its share of the model's full-attention layers rounded up, ``ceil(stage x full / L)`` (at most
    ``stage``), the rest windowed. Exact for the interleaved patterns ``transformers`` uses (Gemma
    2 every other layer, Gemma 3 five of six, Mistral and Phi-3 all); Qwen's rarely enabled
    ``use_sliding_window`` windows the last layers instead, whose first stages hold more full
    layers than this share."""
    n_win = getattr(spec, "n_window_layers", 0)
    if not n_win:
        return 0
    full = spec.n_layers - n_win
    return stage - min(stage, math.ceil(stage * full / spec.n_layers))


class ShardView:
    """What one GPU of the busiest pipeline stage holds of a model: its stage's layers, its
    tensor-parallel share of heads (KV heads replicated when tp exceeds them), MLP width and
    vocabulary. Everything else reads through to the model spec. ``n_params`` counts the GPU's
    parameters (the stage's layers and the embedding or head, divided by tp; norms replicated)."""

    def __init__(self, spec, par: Parallelism):
        self._spec = spec
        tp = par.tp
        self.tp = tp
        self.seq_shards = tp if par.sp else 1
        self.n_layers = stage_layers(spec.n_layers, par.pp)[0]
        self.n_window_layers = stage_window_layers(spec, self.n_layers)
        self.n_heads = spec.n_heads // tp
        self.n_kv_heads = max(1, spec.kv_heads // tp)
        self.head_dim = spec.head_dim
        self.ffn_hidden = math.ceil(spec.ffn_hidden / tp)
        self.vocab_size = math.ceil(spec.vocab_size / tp)
        self.ep = par.ep
        # folded experts (expert TP below tp): whole experts (the expert tp's share of each), each
        # rank's sequence shard dispatched on its own
        self.etp = par.expert_tp
        self.expert_token_shards = tp // par.expert_tp if par.folded else 1
        b = spec.param_breakdown()
        kv_rows = 2 * self.n_kv_heads * self.head_dim * spec.hidden  # replicated KV heads count fully
        q_out = 2 * self.n_heads * self.head_dim * spec.hidden
        up = (2 if spec.gated_mlp else 1) + 1
        mlp = up * spec.hidden * self.ffn_hidden
        self._experts = 0
        # a mixture of experts' dense layers (DeepSeek's first_k_dense_replace) on the busiest stage:
        # none while its layers fit among the sparse ones (those have more parameters), else the rest
        self.first_dense_layers = max(0, self.n_layers - getattr(spec, "n_moe_layers", self.n_layers))
        attn = spec.attention_shard_params(self.n_heads) if getattr(spec, "mla", False) else q_out + kv_rows
        dense = 0
        if hasattr(spec, "n_experts"):  # a mixture of experts: its ep share of the experts, etp of each
            self.ffn_hidden = math.ceil(spec.ffn_hidden / self.etp)
            expert = spec.expert_shard_params(self.ffn_hidden)
            self._experts = (self.n_layers - self.first_dense_layers) * spec.n_experts // par.ep * expert
            mlp = (spec.n_experts // par.ep * expert + spec.router_params_per_layer()
                   + math.ceil(spec.shared_params_per_layer() / tp))
            dense = self.first_dense_layers * (3 * spec.hidden * math.ceil(spec.dense_ffn_hidden / tp) - mlp)
        layer = attn + mlp + b["norms_per_layer"]
        emb = spec.n_embedding_params()
        if par.pp > 1:  # first stage: embedding; last: head (tied weights keep a copy there)
            emb = max(b["embedding"] + b["position_embedding"], b["head"] or b["embedding"])
        self._emb = math.ceil(emb / tp)
        self._params = self.n_layers * layer + dense + self._emb + b["final_norm"]

    @property
    def __class__(self):
        """The spec's class: isinstance(view, ModelSpec) holds, so a view answers like the spec
        it shards (the transformer family builds its operations)."""
        return type(self._spec)

    def with_layers(self, n_layers: int) -> ShardView:
        """The same GPU's view with ``n_layers`` layers on its stage, of which the model's average
        share is windowed (``n_layers x n_window_layers / L``, fractional): affine in the layers,
        so the per-layer extrapolations of the layout search stay exact, and never more windowed
        layers (less attention) than a stage of that size holds (:func:`stage_window_layers`)."""
        out = object.__new__(ShardView)
        out.__dict__.update(self.__dict__)
        out.n_layers = n_layers
        out.n_window_layers = n_layers * self._spec.n_window_layers / self._spec.n_layers
        out.first_dense_layers = min(self.first_dense_layers, n_layers)  # the same dense layers, while they fit
        return out

    #: What one GPU's shard is made of (the spec's other attributes, read through, are the spec's).
    _SHARD = ("tp", "seq_shards", "n_layers", "n_window_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden", "vocab_size",
              "ep", "etp", "expert_token_shards", "first_dense_layers", "_emb", "_params", "_experts")

    _shard = operator.itemgetter(*_SHARD)

    def _key(self) -> tuple:
        return (self._spec, *ShardView._shard(self.__dict__))

    def __eq__(self, other) -> bool:
        """Views of the same spec holding the same shard are equal (caches keyed on the model
        then serve every view a search builds of one layout)."""
        return type(other) is ShardView and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __getattr__(self, name):
        if name in ("_spec", "_emb", "_params", "_experts"):  # not set yet (copying): never recurse into the spec
            raise AttributeError(name)
        value = getattr(self._spec, name)
        self.__dict__[name] = value  # the spec is frozen: read through once
        return value

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads

    #: This GPU's query and K/V widths: the spec's own formulas over the shard's heads.
    q_dim = property(ModelSpec.q_dim.fget)
    kv_dim = property(ModelSpec.kv_dim.fget)

    def n_params(self) -> int:
        return self._params

    def n_embedding_params(self) -> int:
        return self._emb

    def n_expert_params(self) -> int:
        """The routed experts' parameters this GPU holds (0 for a dense model)."""
        return self._experts


def view(spec, par: Parallelism):
    """The model as one GPU of ``par`` sees it (the spec itself without tp, pp or ep); one
    :class:`ShardView` per spec and (tp, sp, pp, ep, etp), the fields it reads of ``par``, per process."""
    if par.tp == 1 and par.pp == 1 and par.ep == 1:
        return spec
    return cached(_VIEWS, (spec, par.tp, par.sp, par.pp, par.ep, par.etp), lambda: ShardView(spec, par))


_VIEWS = store()


