"""The parallel layout of a cluster (dp x tp x pp x cp, ep): the object and the layouts searched.

The communication and memory physics of a layout is :mod:`simulator.physics.parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallelism:
    """How the GPUs are split: data-parallel replicas x tensor-parallel x pipeline stages.

    ``vp``: virtual pipeline stages per GPU (interleaved 1F1B; 1 = plain 1F1B). ``sp``: Megatron
    sequence parallelism (only with tp > 1). ``async_tp``: the tensor-parallel collectives
    overlapped with the GEMMs (:func:`async_tp_time`; needs sequence parallelism). ``cp``: context
    parallelism (ring attention): each sequence split over cp ranks (:func:`cp_ring_time`).
    ``ep``: expert parallelism (a mixture of experts): the experts of each MoE layer split over ep
    of the data-parallel ranks, which exchange tokens by all-to-all (:func:`ep_comm_time`); ep
    divides dp (Megatron-Core and torchtitan carve the expert-parallel group out of the
    data-parallel ranks), the GPU count is still dp x tp x pp x cp.
    """

    dp: int  # data-parallel replicas (the context-parallel ranks of a replica share its samples)
    tp: int = 1
    pp: int = 1
    vp: int = 1
    sp: bool = False
    async_tp: bool = False
    cp: int = 1
    ep: int = 1

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def describe(self) -> str:
        """E.g. 'TP 8 + sequence parallel · CP 2 · PP 4 (interleaved × 2) · EP 2 · DP 2'; '' for plain DP."""
        if self.tp == 1 and self.pp == 1 and self.cp == 1 and self.ep == 1:
            return ""
        parts = []
        if self.tp > 1:
            parts.append(f"TP {self.tp}" + (" + sequence parallel" if self.sp else "") + (" + async" if self.async_tp else ""))
        if self.cp > 1:
            parts.append(f"CP {self.cp} (ring attention)")
        if self.pp > 1:
            parts.append(f"PP {self.pp}" + (f" (interleaved × {self.vp})" if self.vp > 1 else " (1F1B)"))
        if self.ep > 1:
            parts.append(f"EP {self.ep}")
        parts.append(f"DP {self.dp}")
        return " · ".join(parts)


def stage_layers(n_layers: int, pp: int) -> tuple[int, ...]:
    """Layers on each pipeline stage, first to last: as even as possible, the extra layers on
    the first stages (the last stage also runs the head and the loss)."""
    if not 1 <= pp <= n_layers:
        raise ValueError(f"pp={pp} must be between 1 and the {n_layers} layers")
    q, r = divmod(n_layers, pp)
    return tuple(q + 1 if i < r else q for i in range(pp))


#: Context parallelism is searched only from this sequence length on (tokens): below it the
#: attention is too small a share of the step for ring attention to pay (Megatron-LM and torchtitan
#: recommend it for long-context training); a pinned --cp applies at any length.
CP_MIN_SEQ = 8192
#: Attention kernels ring attention runs on: fused blockwise kernels returning the log-sum-exp
#: that merges the blocks (Megatron-LM CP: TransformerEngine flash attention; torchtitan: SDPA).
CP_ATTENTIONS = ("sdpa",)
#: Context-parallel degrees searched (powers of two, as the ring's load-balanced 2 cp chunks need).
CP_SEARCHED = (1, 2, 4, 8)


def expert_degrees(n_experts: int, dp: int, tp: int, gpus_per_node: int, ep=None) -> list[int]:
    """Expert-parallel degrees of a layout with ``dp`` data-parallel ranks: ep divides the
    experts and dp. Megatron-Core (megatron/core/parallel_state.py, initialize_model_parallel)
    builds the expert grid from the same GPUs: expert_tensor_parallel_size defaults to the tensor-
    parallel size, the world size must be divisible by etp x ep x pp and the rest is the expert
    data-parallel size; with etp = tp that is ep dividing dp x cp, of which ep dividing dp (no
    context parallelism among the expert ranks) is modelled; torchtitan likewise borrows its EP
    ranks from data parallelism. Searched inside a node (ep x tp GPUs at most the node's), where
    the all-to-all runs over NVLink; ``ep`` pins one (across nodes allowed). No experts: [1]."""
    if n_experts <= 1:
        return [1]
    if ep is not None:
        return [ep] if n_experts % ep == 0 and dp % ep == 0 else []
    return [d for d in range(1, dp + 1) if dp % d == 0 and n_experts % d == 0 and d * tp <= gpus_per_node]


def layouts(n_gpus: int, gpus_per_node: int, n_heads: int, n_layers: int, *, tp=None, pp=None,
            vp=None, sp=None, cp=None, seq_len: int = 0, n_experts: int = 0, ep=None) -> list[Parallelism]:
    """Every ``dp x tp x pp x cp = n_gpus`` layout: tp divides the node's GPUs and the heads (or,
    pinned, a multiple of the node's GPUs dividing the heads: TP across nodes, :func:`tp_link`); pp at
    most the layers (uneven stages allowed); vp in {1, 2} where every stage has 2+ layers per
    virtual stage (or as pinned); sequence parallelism with every tp > 1 that divides the rank's
    ``seq_len / cp`` tokens (Megatron-LM asserts it), unless pinned off (pinned on: only such
    layouts); cp in
    :data:`CP_SEARCHED` dividing the sequence into 2 cp chunks, searched from :data:`CP_MIN_SEQ`
    tokens on (else 1); with ``n_experts`` (a mixture of experts) every ep of
    :func:`expert_degrees`. ``tp``, ``pp``, ``vp``, ``sp``, ``cp``, ``ep`` pin a knob (None = search)."""
    out = []
    tps = [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0 and n_heads % t == 0
           and n_gpus % t == 0]
    if tp is not None and tp > gpus_per_node and tp % gpus_per_node == 0 and n_heads % tp == 0 and n_gpus % tp == 0:
        tps.append(tp)  # across whole nodes: allowed when pinned (people ran it), never searched
    if cp is None:
        cps = [c for c in CP_SEARCHED if seq_len >= CP_MIN_SEQ and seq_len % (2 * c) == 0] or [1]
    else:
        cps = [cp]
    for t in tps if tp is None else [tp]:
        for c in cps:
            if n_gpus % (t * c):
                continue
            rest = n_gpus // (t * c)
            for p in [q for q in range(1, rest + 1) if rest % q == 0 and q <= n_layers] if pp is None else [pp]:
                if rest % p:
                    continue
                d = rest // p
                min_layers = stage_layers(n_layers, p)[-1]
                vps = [1] + ([2] if p > 1 and min_layers >= 4 else []) if vp is None else [vp]
                splits = t > 1 and (seq_len // c) % t == 0  # SP splits each rank's tokens over tp
                sps = [splits] if sp is None else [bool(sp)] if splits or not sp else []
                for v in vps:
                    for s in sps:
                        for x in expert_degrees(n_experts, d, t, gpus_per_node, ep):
                            out.append(Parallelism(d, t, p, v, s, cp=c, ep=x))
    return out
