"""The parallel layout of a cluster (dp x tp x pp x cp, ep): the object and the layouts searched.

The communication and memory physics of a layout is :mod:`simulator.physics.parallel`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import UsageError
from ..core.memo import cached, store


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
    data-parallel ranks), the GPU count is still dp x tp x pp x cp. ``etp``: expert tensor
    parallelism, None = tp (Megatron-Core's default ``--expert-tensor-parallel-size``: each expert
    split over the tensor-parallel ranks, which all process the micro-batch's tokens) or 1 with
    tp > 1 (Megatron-Core's MoE parallel folding, pinned: whole experts, each tensor-parallel
    rank's sequence shard dispatched on its own, the expert-parallel group drawn from the
    consecutive tp x dp ranks, so ep divides tp x dp).
    """

    dp: int  # data-parallel replicas (the context-parallel ranks of a replica share its samples)
    tp: int = 1
    pp: int = 1
    vp: int = 1
    sp: bool = False
    async_tp: bool = False
    cp: int = 1
    ep: int = 1
    etp: int | None = None

    @property
    def n_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel ranks each expert is split over (``etp``, else tp)."""
        return self.tp if self.etp is None else self.etp

    @property
    def folded(self) -> bool:
        """Whether the experts run folded (``etp`` 1 under tp > 1): whole experts, each rank's
        sequence shard dispatched on its own."""
        return self.expert_tp < self.tp

    def with_vp(self, vp: int) -> Parallelism:
        """The same layout with ``vp`` virtual pipeline stages per GPU: ``dataclasses.replace(self,
        vp=vp)`` without its introspection (a search makes several per layout)."""
        out = object.__new__(Parallelism)
        out.__dict__.update(self.__dict__)
        object.__setattr__(out, "vp", vp)
        return out

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
            parts.append(f"EP {self.ep}" + (f" (expert TP {self.expert_tp})" if self.folded else ""))
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


def expert_degrees(n_experts: int, dp: int, tp: int, gpus_per_node: int, ep=None, etp=None) -> list[int]:
    """Expert-parallel degrees of a layout with ``dp`` data-parallel ranks: ep divides the
    experts and dp. Megatron-Core (megatron/core/parallel_state.py, initialize_model_parallel)
    builds the expert grid from the same GPUs: expert_tensor_parallel_size defaults to the tensor-
    parallel size, the world size must be divisible by etp x ep x pp and the rest is the expert
    data-parallel size; with etp = tp that is ep dividing dp x cp, of which ep dividing dp (no
    context parallelism among the expert ranks) is modelled; torchtitan likewise borrows its EP
    ranks from data parallelism. Searched inside a node (ep x tp GPUs at most the node's), where
    the all-to-all runs over NVLink; ``ep`` pins one (across nodes allowed). With ``etp`` 1 under
    tp > 1 (MoE parallel folding, pinned) the expert grid is etp x ep x edp over the same tp x dp
    GPUs of a stage: ep divides tp x dp. No experts: [1]."""
    if n_experts <= 1:
        return [1]
    ranks = dp * tp if etp is not None and etp < tp else dp
    if ep is not None:
        return [ep] if n_experts % ep == 0 and ranks % ep == 0 else []
    return [d for d in range(1, dp + 1) if dp % d == 0 and n_experts % d == 0 and d * tp <= gpus_per_node]


def layouts(n_gpus: int, gpus_per_node: int, n_heads: int, n_layers: int, *, tp=None, pp=None,
            vp=None, sp=None, cp=None, seq_len: int = 0, n_experts: int = 0, ep=None, etp=None) -> list[Parallelism]:
    """Every ``dp x tp x pp x cp = n_gpus`` layout: tp divides the node's GPUs and the heads (or,
    pinned, a multiple of the node's GPUs dividing the heads: TP across nodes, :func:`tp_link`); pp at
    most the layers (uneven stages allowed); vp in {1, 2} where every stage has 2+ layers per
    virtual stage (or as pinned); with every tp > 1 that divides the rank's ``seq_len / cp`` tokens
    (Megatron-LM asserts it) sequence parallelism on and off (less activation memory against two
    collectives where one all-reduce was: either can be faster), else off; pinned on: only such
    layouts; cp in
    :data:`CP_SEARCHED` dividing the sequence into 2 cp chunks, searched from :data:`CP_MIN_SEQ`
    tokens on (else 1); with ``n_experts`` (a mixture of experts) every ep of
    :func:`expert_degrees`. ``tp``, ``pp``, ``vp``, ``sp``, ``cp``, ``ep``, ``etp`` pin a knob (None =
    search; ``etp`` None = tp, 1 applies to tp > 1 with sequence parallelism). Kept per process (a
    new list each call), keyed by every argument and its type."""
    args = (n_gpus, gpus_per_node, n_heads, n_layers, tp, pp, vp, sp, cp, seq_len, n_experts, ep, etp)
    key = tuple((x, type(x)) for x in args)
    return list(cached(_LAYOUTS, key, lambda: _layouts(*args)))


_LAYOUTS = store()


def _layouts(n_gpus: int, gpus_per_node: int, n_heads: int, n_layers: int, tp, pp, vp, sp, cp, seq_len: int,
             n_experts: int, ep, etp) -> tuple[Parallelism, ...]:
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
                if sp is None:  # searched: on and off where it splits the tokens, else off
                    sps = [True, False] if splits else [False]
                else:  # pinned on needs the split
                    sps = [bool(sp)] if splits or not sp else []
                folded = etp is not None and etp < t
                for v in vps:
                    for s in sps:
                        if folded and not s:  # the folded experts dispatch each rank's sequence shard
                            continue
                        for x in expert_degrees(n_experts, d, t, gpus_per_node, ep, etp if folded else None):
                            out.append(Parallelism(d, t, p, v, s, cp=c, ep=x, etp=etp if folded else None))
    return tuple(out)


def pipelines(stack, sharding: str, offload: str = "none") -> bool:
    """Whether ``sharding`` (with ``offload``) combines with pipeline parallelism on ``stack``: the
    stack's ``pipeline_shardings`` (Megatron-LM: DDP and its distributed optimizer, ZeRO-1;
    DeepSpeed's pipeline engine refuses ZeRO-2/3; torchtitan and NeMo Automodel also FSDP2 under
    torch.distributed.pipelining), among the shardings it offers. FSDP's CPU offload under
    pipelining is not modelled (the stage's unsharded parameters and gradients stay on the GPU for
    the whole step, :func:`simulator.physics.memory.pipelined_fsdp_states`), so refused."""
    if sharding not in stack.shardings or sharding not in stack.pipeline_shardings:
        return False
    return offload == "none" or not sharding.startswith("fsdp")


def allowed_layouts(n: int, g: int, model, seq: int, stack, lay: dict, attentions, shardings,
                    compiles) -> list[Parallelism]:
    """Every rule about which layouts are allowed, in one place: the dp x tp x pp x cp (vp, sp,
    async TP, ep) layouts of ``n`` GPUs, ``g`` per node, for ``model`` (its ``n_heads``,
    ``n_layers``, ``n_experts``; a model without heads or layers gets data parallelism only) at
    ``seq`` tokens per sequence on ``stack`` (the parallelisms it has, how it overlaps TP), with the
    pins of ``lay`` (tp, pp, vp, cp, ep, sequence_parallel, async_tp; None = searched) checked
    against the searched attentions, shardings and compile settings. Raises UsageError naming the
    bad pin and its valid values."""
    heads, layers = getattr(model, "n_heads", None), getattr(model, "n_layers", None)
    experts = getattr(model, "n_experts", 0)
    ep, etp = lay.get("ep"), lay.get("etp")
    if etp is not None and (not isinstance(etp, int) or isinstance(etp, bool) or etp <= 0):
        raise UsageError(f"--etp must be a positive integer, got {etp!r}")
    if etp is not None and not experts:
        raise UsageError(f"--etp {etp}: {model.display_name} is not a mixture of experts")
    if etp is not None and etp != 1 and etp != lay.get("tp"):
        raise UsageError(f"--etp {etp}: expert tensor parallelism is modelled as 1 (Megatron-Core's MoE parallel "
                         f"folding) or the tensor-parallel degree (its default); valid choices: 1"
                         + (f", {lay['tp']}" if lay.get("tp") else ""))
    if etp is not None and etp < (lay.get("tp") or 1) and "ep" not in stack.parallelisms:
        raise UsageError(f"--etp {etp}: the {stack.display} stack has no expert parallelism")
    if ep is not None and (not isinstance(ep, int) or isinstance(ep, bool) or ep <= 0):
        raise UsageError(f"--ep must be a positive integer, got {ep!r}")
    if ep is not None and ep > 1 and not experts:
        raise UsageError(f"--ep {ep}: {model.display_name} is not a mixture of experts; valid choice: 1")
    if ep is not None and experts and experts % ep:
        ok = [d for d in range(1, min(experts, n) + 1) if experts % d == 0 and n % d == 0]
        raise UsageError(f"--ep {ep}: expert parallelism splits the {experts} experts of each layer over ep GPUs; "
                         f"valid choices: {', '.join(map(str, ok))}")
    if heads is None or layers is None:  # not a transformer: data parallelism only
        for k in ("tp", "pp", "vp", "cp"):
            if lay.get(k, 1) != 1:
                raise UsageError(f"--{k} {lay[k]}: {model.display_name} is not a transformer; valid choice: 1")
        return [Parallelism(n)]
    for field_name, v in (("n_layers", layers), ("n_heads", heads)):
        if v < 1:  # a spec built without validation (ModelSpec.model_copy): name the field, not the layout
            raise UsageError(f"{model.display_name} has {field_name} {v}; a transformer needs at least 1")
    for k in ("tp", "pp", "vp", "cp"):
        v = lay.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise UsageError(f"--{k} must be a positive integer, got {v!r}")
    lacking = [k for k in ("tp", "pp", "cp", "ep") if k not in stack.parallelisms]
    for k in lacking:
        if lay.get(k, 1) != 1:
            raise UsageError(f"--{k} {lay[k]}: the {stack.display} stack has no "
                             f"{dict(tp='tensor', pp='pipeline', cp='context', ep='expert')[k]} parallelism "
                             f"({stack.parallelisms_source}); valid choice: 1")
        lay = {**lay, k: 1}
    cp, ep = lay.get("cp"), lay.get("ep")
    if cp is not None and cp > 1:
        ok = [c for c in range(2, n + 1) if n % c == 0 and seq % (2 * c) == 0]
        if cp not in ok:
            raise UsageError(f"--cp {cp}: context parallelism splits each {seq}-token sequence into 2 × cp chunks "
                             f"over cp of the {n} GPUs; valid choices: {', '.join(str(c) for c in [1, *ok])}")
        if not any(x in CP_ATTENTIONS for x in attentions):
            raise UsageError(f"--cp {cp}: ring attention runs on fused attention kernels; it needs --attention "
                             f"{' or '.join(CP_ATTENTIONS)}")
    tp, pp, vp = lay.get("tp"), lay.get("pp"), lay.get("vp")
    free = layouts(n, g, heads, layers, tp=tp, cp=cp or 1) if tp is not None else layouts(n, g, heads, layers,
                                                                                            cp=cp or 1)
    if tp is not None and not free:
        ok = sorted({p.tp for p in layouts(n, g, heads, layers, cp=cp or 1)})
        across = [t for t in range(2 * g, n + 1, g) if n % t == 0 and heads % t == 0] if n > g else []
        raise UsageError(f"--tp {tp}: tp must divide the {g} GPUs per node and the {heads} attention heads, or span "
                         f"whole nodes; valid choices: {', '.join(str(v) for v in ok + across)}")
    if pp is not None:
        ok = sorted({p.pp for p in free if tp is None or p.tp == tp})
        if pp not in ok:
            raise UsageError(f"--pp {pp}: dp x tp x pp must make the {n} GPUs and pp be at most the {layers} "
                             f"layers; valid choices: {', '.join(str(v) for v in ok)}")
        if pp > 1 and not any(pipelines(stack, sh) for sh in shardings):
            ok = [sh for sh in stack.shardings if pipelines(stack, sh)]
            raise UsageError(f"--pp {pp} needs --sharding {' or '.join(ok) or '(none)'} on the {stack.display} stack, "
                             f"not {', '.join(shardings)} ({stack.pipeline_shardings_source})")
    if vp is not None and vp > 1:  # pinned: up to a layer per virtual stage of the busiest stage (searched: 2)
        p_eff = pp or max({p.pp for p in free if tp is None or p.tp == tp})
        max_layers = stage_layers(layers, p_eff)[0] if p_eff > 1 else 0
        if p_eff == 1 or vp > max_layers:
            raise UsageError(f"--vp {vp}: interleaving needs --pp above 1 and at most {max_layers or 1} "
                             "virtual stages (the layers of the busiest stage: Megatron-LM's uneven layouts give "
                             f"the others fewer, or none); valid here: 1..{max(1, max_layers)}")
    sp = lay.get("sequence_parallel")
    if etp is not None and etp < (tp or 1) and sp is False:
        raise UsageError(f"--etp {etp}: the folded experts dispatch each tensor-parallel rank's sequence shard; "
                         "it needs sequence parallelism (drop --no-sequence-parallel)")
    out = layouts(n, g, heads, layers, tp=tp, pp=pp, vp=vp, sp=sp, cp=cp, seq_len=seq, n_experts=experts, ep=ep,
                  etp=etp)
    base = layouts(n, g, heads, layers, tp=tp, pp=pp, vp=vp, sp=sp, cp=cp, seq_len=seq) if ep and not out else []
    if base:
        folded = etp is not None and etp < (tp or 1)
        ok = sorted({d for p in base for r in [p.dp * p.tp if folded else p.dp] for d in range(1, r + 1)
                     if r % d == 0 and experts % d == 0})
        where = ("ranks of a pipeline stage (GPUs / (pp × cp)) under --etp 1" if folded
                 else "data-parallel degree (GPUs / (tp × pp × cp)); --etp 1 (Megatron-Core's MoE parallel "
                      "folding) draws them from tp × dp")
        raise UsageError(f"--ep {ep}: the expert-parallel ranks are data-parallel ranks, so ep must divide the "
                         f"{where} and the {experts} experts; valid choices here: {', '.join(map(str, ok))}")
    if sp and not out:
        ok = sorted({p.tp for p in free if p.tp > 1 and (seq // (cp or 1)) % p.tp == 0 and "tp" not in lacking})
        raise UsageError(f"--sequence-parallel splits the tensor-parallel ranks' {seq // (cp or 1)} tokens over tp: "
                         f"it needs --tp above 1 dividing them (valid here: {', '.join(map(str, ok)) or 'none'})")
    if not out:
        raise UsageError(f"--tp {tp or 1} × --pp {pp or 1} × --cp {cp or 1} do not divide the {n} GPUs; pin fewer of them")
    if lay.get("async_tp") is not None and not isinstance(lay["async_tp"], bool):
        raise UsageError(f"async_tp must be True, False or None (searched), got {lay['async_tp']!r}")
    if lay.get("async_tp") and stack.async_tp == "compiled" and True not in compiles:
        raise UsageError(f"--async-tp: the {stack.display} stack overlaps tensor parallelism only under "
                         "torch.compile; drop --no-compile or --async-tp")
    if lay.get("async_tp"):
        out = [p for p in out if p.tp > 1 and p.sp]
        if not out:
            raise UsageError("--async-tp overlaps the sequence-parallel collectives of tensor parallelism: it needs "
                             f"--tp above 1 (valid here: {', '.join(str(v) for v in sorted({p.tp for p in free} - {1}))})"
                             " and sequence parallelism")
    if vp is not None and vp > 1 and pp is None:
        out = [p for p in out if p.pp > 1]
    return out
