"""Collective communication time (seconds) for data-parallel training, docs/architecture.md, physics 5.

alpha-beta ring collectives, hierarchical across nodes: within a node over the intra-node
link, between nodes over the node's network (each node's GPUs share its bandwidth).
Ring all-reduce moves 2(n-1)/n of the buffer per GPU; reduce-scatter and all-gather (n-1)/n.
A ring across N nodes takes N-1 steps (all-reduce 2(N-1)), each paying a hop latency on top of the
collective's fixed alpha: at 256-512 GPUs the latency of per-layer FSDP collectives grows with the
node count. The profile's collective efficiency scales the links' bus bandwidth and its overlap
says how much of the concurrent compute a collective can hide behind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fabric:
    """Links of a cluster as the physics needs them (bytes/s, seconds)."""

    nodes: int
    gpus_per_node: int
    intra_bw: float  # bus bandwidth per GPU inside a node, bytes/s
    intra_alpha: float  # s
    inter_bw: float  # per node, bytes/s (0 if single node)
    inter_alpha: float  # s
    busbw_eff: float = 1.0  # sustained fraction of the links' bus bandwidth in training (profile)
    hop_alpha: float = 0.0  # s per extra ring step across nodes (ring latency grows with nodes)
    overlap: float = 1.0  # fraction of concurrent compute a collective can hide behind (profile)

    @property
    def n(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def intra_busbw(self) -> float:
        """Bus bandwidth per GPU collectives sustain inside a node in training, bytes/s."""
        return self.intra_bw * self.busbw_eff

    @property
    def inter_busbw(self) -> float:
        """Bus bandwidth per node collectives sustain between nodes in training, bytes/s."""
        return self.inter_bw * self.busbw_eff


def all_reduce(f: Fabric, nbytes, pieces=1) -> np.ndarray:
    """Seconds to all-reduce ``nbytes`` across all GPUs (hierarchical), sent as ``pieces``
    collectives of equal size (buckets, layers): each pays the latency, together the bytes."""
    s = np.asarray(nbytes, dtype=float)
    k = np.asarray(pieces, dtype=float)
    g, N = f.gpus_per_node, f.nodes
    intra_bw, inter_bw = f.intra_busbw, f.inter_busbw
    t = np.zeros_like(s)
    if g > 1:
        if N == 1:
            t = t + k * f.intra_alpha + 2 * (g - 1) / g * s / intra_bw
        else:  # reduce-scatter + all-gather inside the node around the inter-node all-reduce
            t = t + 2 * (k * f.intra_alpha + (g - 1) / g * s / intra_bw)
    if N > 1:
        t = t + k * (f.inter_alpha + 2 * (N - 1) * f.hop_alpha) + 2 * (N - 1) / N * s / inter_bw
    return np.where(s > 0, t, 0.0)


def gather_or_scatter(f: Fabric, nbytes, pieces=1) -> np.ndarray:
    """Seconds for all-gathers or reduce-scatters of ``nbytes`` in total (unsharded size), sent
    as ``pieces`` collectives: each pays the latency, together the bytes."""
    s = np.asarray(nbytes, dtype=float)
    k = np.asarray(pieces, dtype=float)
    g, N = f.gpus_per_node, f.nodes
    t = np.zeros_like(s)
    if g > 1:
        t = t + k * f.intra_alpha + (g - 1) / g * s / f.intra_busbw
    if N > 1:
        t = t + k * (f.inter_alpha + (N - 1) * f.hop_alpha) + (N - 1) / N * s / f.inter_busbw
    return np.where(s > 0, t, 0.0)


def exposed(comm, window, floor, overlap: float | np.ndarray = 1.0) -> np.ndarray:
    """Part of ``comm`` seconds not hidden behind ``overlap`` x ``window`` seconds of compute; at
    least ``floor`` seconds, the piece that cannot overlap (the last bucket, the first unit gathered)."""
    comm = np.asarray(comm, dtype=float)
    return np.maximum(comm - overlap * np.asarray(window, dtype=float), np.minimum(comm, floor))


def pipelined_fsdp_gathers(sharding: str, micro_batches) -> np.ndarray:
    """All-gathers of a pipeline stage's parameters per optimizer step under FSDP2 and
    torch.distributed.pipelining, with ``micro_batches`` micro-batches (its reduce-scatters: one,
    after the stage's last backward; :func:`simulator.physics.memory.pipelined_fsdp_states`).

    Shard-grad-op (pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py apply_fsdp:
    fsdp_reshard_after_forward "default" sets reshard_after_forward = not pp_enabled, "to avoid
    per-microbatch all-gathers"; Automodel's apply_fsdp defaults to False): the first micro-batch's
    forward gathers every layer, which stays gathered until the step's reduce: one. Full sharding
    (reshard_after_forward True, torchtitan's "always"): each forward reshards a layer after using
    it, and the next backward of that layer gathers it again (the backward leaves it gathered,
    ``set_reshard_after_backward(False)`` in stage.py, so a forward right after a backward gathers
    nothing, nor a backward right after one): under 1F1B the warm-up forwards and the steady
    state's backwards, one per micro-batch."""
    m = np.asarray(micro_batches, dtype=float)
    return m if sharding == "fsdp-full" else np.ones_like(m)
