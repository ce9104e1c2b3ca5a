"""Tensor, sequence and pipeline parallelism (Megatron-LM): pure physics of one layout.

A :class:`Parallelism` splits the cluster's GPUs into ``dp x tp x pp`` (Megatron's rank order:
tensor-parallel ranks innermost, inside a node; then data-parallel; pipeline stages outermost).

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

Units: bytes, seconds, elements. The per-GPU work goes through the ordinary workload, compute and
memory functions on a :class:`ShardView` of the model (the GPU's shard of the busiest stage).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from . import communication as comm


@dataclass(frozen=True)
class Parallelism:
    """How the GPUs are split: data-parallel replicas x tensor-parallel x pipeline stages.

    ``vp``: virtual pipeline stages per GPU (interleaved 1F1B; 1 = plain 1F1B). ``sp``: Megatron
    sequence parallelism (only with tp > 1).
    """

    dp: int
    tp: int = 1
    pp: int = 1
    vp: int = 1
    sp: bool = False

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def describe(self) -> str:
        """E.g. 'TP 8 + sequence parallel · PP 4 (interleaved × 2) · DP 2'; '' for plain DP."""
        if self.tp == 1 and self.pp == 1:
            return ""
        parts = []
        if self.tp > 1:
            parts.append(f"TP {self.tp}" + (" + sequence parallel" if self.sp else ""))
        if self.pp > 1:
            parts.append(f"PP {self.pp}" + (f" (interleaved × {self.vp})" if self.vp > 1 else " (1F1B)"))
        parts.append(f"DP {self.dp}")
        return " · ".join(parts)


def stage_layers(n_layers: int, pp: int) -> tuple[int, ...]:
    """Layers on each pipeline stage, first to last: as even as possible, the extra layers on
    the first stages (the last stage also runs the head and the loss)."""
    if not 1 <= pp <= n_layers:
        raise ValueError(f"pp={pp} must be between 1 and the {n_layers} layers")
    q, r = divmod(n_layers, pp)
    return tuple(q + 1 if i < r else q for i in range(pp))


def bubble_fraction(pp: int, micro_batches, vp: int = 1) -> np.ndarray:
    """Pipeline bubble as a fraction of the ideal (bubble-free) time: (pp-1)/(vp*m)
    (Narayanan et al. 2021, eq. 1 and sec. 2.2.2). 0 without pipelining."""
    m = np.asarray(micro_batches, dtype=float)
    return (pp - 1) / (vp * m)


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


def dp_fabric(fab: comm.Fabric, par: Parallelism) -> comm.Fabric:
    """The links one data-parallel group sees. Its ranks are tp apart: k = min(dp, g/tp) of them
    share a node, and the node's network carries g/k such groups at once (bandwidth per group
    k/g of the node's)."""
    g = fab.gpus_per_node
    k = max(1, min(par.dp, g // par.tp))
    nodes = math.ceil(par.dp / k)
    return dataclasses.replace(fab, nodes=nodes, gpus_per_node=k, inter_bw=fab.inter_bw * k / g if nodes > 1 else 0.0,
                               inter_alpha=fab.inter_alpha if nodes > 1 else 0.0)


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
        self.n_heads = spec.n_heads // tp
        self.n_kv_heads = max(1, spec.kv_heads // tp)
        self.head_dim = spec.head_dim
        self.ffn_hidden = math.ceil(spec.ffn_hidden / tp)
        self.vocab_size = math.ceil(spec.vocab_size / tp)
        b = spec.param_breakdown()
        kv_rows = 2 * self.n_kv_heads * self.head_dim * spec.hidden  # replicated KV heads count fully
        q_out = 2 * self.n_heads * self.head_dim * spec.hidden
        up = (2 if spec.gated_mlp else 1) + 1
        layer = q_out + kv_rows + up * spec.hidden * self.ffn_hidden + b["norms_per_layer"]
        emb = spec.n_embedding_params()
        if par.pp > 1:  # first stage: embedding; last: head (tied weights keep a copy there)
            emb = max(b["embedding"] + b["position_embedding"], b["head"] or b["embedding"])
        self._emb = math.ceil(emb / tp)
        self._params = self.n_layers * layer + self._emb + b["final_norm"]

    @property
    def __class__(self):
        """The spec's class: isinstance(view, ModelSpec) holds, so a view answers like the spec
        it shards (the transformer family builds its operations)."""
        return type(self._spec)

    def with_layers(self, n_layers: int) -> ShardView:
        """The same GPU's view with ``n_layers`` layers on its stage."""
        out = object.__new__(ShardView)
        out.__dict__.update(self.__dict__)
        out.n_layers = n_layers
        return out

    def _key(self) -> tuple:
        return (self._spec, *sorted((k, v) for k, v in self.__dict__.items() if k != "_spec"))

    def __eq__(self, other) -> bool:
        """Views of the same spec holding the same shard are equal (caches keyed on the model
        then serve every view a search builds of one layout)."""
        return type(other) is ShardView and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __getattr__(self, name):
        if name in ("_spec", "_emb", "_params"):  # not set yet (copying): never recurse into the spec
            raise AttributeError(name)
        return getattr(self._spec, name)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads

    @property
    def q_dim(self) -> int:
        """Width of this GPU's query projection and attention output (its heads x head_dim)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of this GPU's K (or V) projection (its KV heads x head_dim)."""
        return self.n_kv_heads * self.head_dim

    def n_params(self) -> int:
        return self._params

    def n_embedding_params(self) -> int:
        return self._emb


def view(spec, par: Parallelism):
    """The model as one GPU of ``par`` sees it (the spec itself without tp or pp)."""
    return spec if par.tp == 1 and par.pp == 1 else ShardView(spec, par)


def layouts(n_gpus: int, gpus_per_node: int, n_heads: int, n_layers: int, *, tp=None, pp=None,
            vp=None, sp=None) -> list[Parallelism]:
    """Every ``dp x tp x pp = n_gpus`` layout: tp divides the node's GPUs and the heads; pp at
    most the layers (uneven stages allowed); vp in {1, 2} where every stage has 2+ layers per
    virtual stage (or as pinned); sequence parallelism with every tp > 1 unless pinned off.
    ``tp``, ``pp``, ``vp``, ``sp`` pin a knob (None = search)."""
    out = []
    tps = [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0 and n_heads % t == 0
           and n_gpus % t == 0]
    for t in tps if tp is None else [tp]:
        rest = n_gpus // t
        for p in [q for q in range(1, rest + 1) if rest % q == 0 and q <= n_layers] if pp is None else [pp]:
            d = rest // p
            min_layers = stage_layers(n_layers, p)[-1]
            vps = [1] + ([2] if p > 1 and min_layers >= 4 else []) if vp is None else [vp]
            sps = [t > 1] if sp is None else [bool(sp) and t > 1]
            for v in vps:
                for s in sps:
                    out.append(Parallelism(d, t, p, v, s))
    return out

