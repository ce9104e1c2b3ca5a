"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3, gpt-oss) as operations.

Each layer is the transformer's attention block (``families/transformer.py``, unchanged) and, in
place of its MLP, a sparse MoE block (``transformers``' ``MixtralSparseMoeBlock``,
``Qwen2MoeSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``, ``OlmoeSparseMoeBlock``):

* the router, a bias-free ``hidden x n_experts`` linear, then softmax and top-k over the experts
  (:data:`ROUTER_PASSES`); its auxiliary load-balancing loss is a few reductions over
  ``tokens x n_experts`` probabilities, negligible beside the expert GEMMs and not counted;
* dispatch: each token copied to its ``top_k`` experts (a bandwidth-bound permutation);
* the experts, gated MLPs of width ``ffn_hidden`` each, as grouped GEMMs: each of the
  ``n_experts / ep`` experts on a GPU multiplies its tokens, ``m = tokens x top_k / experts per
  GPU`` rows under uniform routing, so their efficiency is the GEMM model's at that m (thin GEMMs
  for fine-grained experts); the busiest expert-parallel rank gets :data:`LOAD_IMBALANCE` times
  the mean (dropless routing);
* combine: the ``top_k`` expert outputs weighted by their routing probabilities and summed back
  into token order;
* Qwen2-MoE: a shared expert (a dense gated MLP of ``shared_ffn_hidden``) on every token, scaled by
  a sigmoid gate (``hidden x 1`` linear); DeepSeek: ``n_shared_experts`` of them, one MLP that much
  wider, ungated;
* DeepSeek: multi-head latent attention in place of the Q/K/V projection (:func:`_mla_ops`), and
  the ``first_dense_layers`` as a second block with a dense gated MLP (:func:`_dense_block`).
  Group-limited routing and V3's sigmoid scores with their correction bias cost the router a few
  more passes over ``tokens x n_experts`` scores, not counted beyond :data:`ROUTER_PASSES`;
* gpt-oss (``transformers``' ``GptOssForCausalLM``, :func:`_gpt_oss`): biases on the Q/K/V/O
  projections, on every expert's projections (``gate_up_proj_bias``, ``down_proj_bias``: their
  gradients reduce over the expert copies) and on the router (``router_bias``); a learned
  attention sink per head (``attention_sinks``); a 128-token sliding window on every other layer
  (the transformer's ``sliding_window`` / ``n_window_layers``: fused attention computes the band
  only). Its router takes the top-k of the logits, then a softmax over those k: the same passes.

The stack decides how the experts run (:attr:`simulator.strategy.stacks.Stack.moe_experts`): ``grouped``
(Megatron-LM's ``--moe-grouped-gemm`` with the all-to-all dispatcher, torchtitan's grouped_mm:
one kernel per GEMM for all local experts) or ``loop`` (Hugging Face's eager block: a Python loop
over the experts hit, each a ``torch.where`` that syncs with the host, gathers, three small GEMMs
at the expert's own m, the activation, the weighting and an ``index_add_``: :data:`LOOP_KERNELS`
per expert, each paying the eager host time even under torch.compile, which breaks its graph at
the loop; the forward's syncs keep the loop from overlapping the rest of the step
(``Op.graph_break``), so it is slow wherever the host's time per expert exceeds the device's). Expert
parallelism (``ep``, :class:`simulator.strategy.layout.Parallelism`) divides the experts; its all-to-all
is communication (:func:`simulator.physics.parallel.ep_comm_time`), not an operation here.

Parameters count exactly as ``*ForCausalLM`` (tests pin Mixtral-8x7B, OLMoE-1B-7B, Qwen3-30B-A3B,
DeepSeek-V2-Lite, DeepSeek-V3);
the active parameters are those a token uses (``top_k`` of the experts). MFU counts the active
parameters' FLOPs: the graph's FLOPs of one sample without expert parallelism (no imbalance).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import numpy as np
from pydantic import Field, model_validator

from ...core.vocab import Routing
from .. import workload
from ..hf_fields import MOE_ROPE, ConfigProblem
from ..spec import ModelSpec
from .base import Block, Family, Graph, Knobs, Op
from .transformer import graph as dense_graph

MoEFamily = Literal["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss"]
MOE_FAMILIES: tuple[str, ...] = get_args(MoEFamily)
_DISPLAY = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE",
            "deepseek_v2": "DeepSeek-V2", "deepseek_v3": "DeepSeek-V3", "gpt_oss": "gpt-oss"}

#: Tokens the busiest expert-parallel rank's experts process over the mean, under dropless routing
#: with the load-balancing loss (applied to the expert work of the busiest rank when ep > 1; with
#: all experts on every GPU the total is the same on each). ASSUMPTION, not fitted: the project's
#: design notes (DESIGN.md, "Mixture-of-experts and FP8") record published gaps of 8-20% between
#: force-balanced and dropless routing of Qwen3-235B-A22B; 1.1 is near the low end. A run with a
#: capacity factor (``MoESpec.capacity_factor``) has none: its experts run at their capacity.
LOAD_IMBALANCE = 1.1
#: Router softmax and top-k: fp32 passes over the tokens x experts scores (read the half logits,
#: write fp32 probabilities, read them for top-k, write the k weights and indices), kernels.
ROUTER_PASSES, ROUTER_KERNELS = 3, 4
#: Forward kernels of one expert's iteration of Hugging Face's eager loop (transformers <= 4.57
#: ``OlmoeSparseMoeBlock``, ``MixtralSparseMoeBlock``, ``Qwen2MoeSparseMoeBlock``,
#: ``Qwen3MoeSparseMoeBlock``, ``DeepseekV2MoE``; transformers 5's ``experts_implementation="eager"``),
#: by op: dispatch ``torch.where(expert_mask[i])`` (a nonzero: count and select, then a copy of the
#: count to the host, which waits) and the gathers of the tokens and of their routing weights;
#: ``expert_up`` the ``gate_proj`` and ``up_proj`` linears (one fused ``gate_up_proj`` in
#: transformers 5: counted as two); the SiLU and the gate x up product; ``expert_down``; combine
#: the routing-weight product and ``index_add_``. Backward launches
#: :data:`simulator.model.workload.ELEMENTWISE_BWD_FACTOR` times the elementwise ones (the
#: gathers' backward is an accumulating ``index_put_``) and two GEMMs per GEMM.
LOOP_KERNELS = {"dispatch": 4.0, "expert_up": 2.0, "expert_act": 2.0, "expert_down": 1.0, "combine": 2.0}


class MoESpec(ModelSpec):
    """A mixture-of-experts decoder: the transformer's fields, ``ffn_hidden`` the width of one
    expert, and the routing. Sizes in elements."""

    family: MoEFamily  # type: ignore[assignment]
    n_experts: int = Field(gt=1)
    """Routed experts per layer (``num_local_experts``, ``num_experts``)."""
    top_k: int = Field(gt=0)
    """Experts each token is sent to (``num_experts_per_tok``)."""
    shared_ffn_hidden: int = Field(default=0, ge=0)
    """Width of the shared expert, a dense gated MLP every token passes (Qwen2-MoE); 0: none."""
    shared_expert_gate: bool = False
    """A sigmoid gate (``hidden x 1`` linear) scaling the shared expert's output (Qwen2-MoE)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """Multi-head latent attention (DeepSeek, MLA): width of the compressed key-value latent
    (``kv_a_proj_with_mqa`` writes it and the one rotary key all heads share; ``kv_b_proj``
    expands it into every head's key and value). None: the ordinary Q/K/V projections."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """MLA: rank of the query's down-projection (``q_a_proj``, an RMSNorm, ``q_b_proj``); None: one
    ``q_proj`` (DeepSeek-V2-Lite)."""
    qk_rope_head_dim: int = Field(default=0, ge=0)
    """MLA: the dims of each query and key head that get rotary embeddings; the other
    ``attn_head_dim - qk_rope_head_dim`` (``qk_nope_head_dim``) come from the latent."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """MLA: width of each value head (and of each head of the attention output)."""
    first_dense_layers: int = Field(default=0, ge=0)
    """Leading layers whose MLP is a dense gated MLP of ``dense_ffn_hidden`` (DeepSeek's
    ``first_k_dense_replace``); the other layers are sparse."""
    dense_ffn_hidden: int = Field(default=0, ge=0)
    """Width of the dense layers' MLP (``intermediate_size``); 0 without dense layers."""
    router_bias: bool = False
    """The router is a linear with a bias (gpt-oss ``GptOssTopKRouter``: ``n_experts`` more
    parameters a layer)."""
    attention_sinks: bool = False
    """A learned sink logit per head joins each query's softmax (gpt-oss ``sinks``: ``n_heads``
    parameters a layer). Its work is negligible and not counted: a fused kernel (cuDNN's learnable
    softmax, FlashAttention-3 with sinks) adds one logit to each query's row of scores, of 2,048 on
    average in a causal 4,096-token layer and up to 128 in a windowed one (5 x 10^-4 and 8 x 10^-3
    of the softmax's exponentials, which are themselves about 1/(4 head_dim) of the score and value
    GEMMs' FLOPs: 4 x 10^-3 at head_dim 64), and its gradient one sum over ``tokens x n_heads``
    (the query's output gradient dotted with its output, which FlashAttention's backward computes anyway)."""
    capacity_factor: float | None = Field(default=None, gt=0)
    """How the training run routes (a setting of the run, ``--capacity-factor``): None, dropless
    (every expert takes all its tokens; the busiest expert-parallel rank :data:`LOAD_IMBALANCE`
    times the mean); c, each expert's buffer holds c times its mean share of the token copies,
    the tokens beyond it dropped and the buffer padded to it (Megatron-Core
    ``--moe-expert-capacity-factor c --moe-pad-expert-input-to-capacity``, NeMo's Mixtral recipes;
    GShard, Switch): every expert, and the all-to-all, carry exactly c times the mean, whatever
    the routing. At most ``n_experts / top_k`` (a buffer of all the tokens). Benchmarks that
    force balanced routing (Megatron-Core ``--moe-router-force-load-balancing``, NeMo Automodel's
    ``fake_balanced_gate``) run like capacity factor 1."""
    routing: Routing = "uniform"
    """Where a token's ``top_k`` experts lie (a setting of the run, ``--moe-routing``): uniform, any
    ``top_k`` distinct experts alike (a learned router; Megatron-Core's forced balancing draws
    random logits); contiguous, NeMo Automodel's ``FakeBalancedGate`` (nemo_automodel/components/
    moe/layers.py: token i takes experts ``(i k ... i k + k - 1) mod n_experts``), so its experts
    sit together on the fewest GPUs and nodes that hold them. It moves what DeepEP sends
    (:func:`simulator.physics.parallel.groups_hit`), not what the experts compute."""

    @model_validator(mode="after")
    def _check_moe(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if not self.gated_mlp:
            raise ValueError("the experts of the modelled MoE families are gated MLPs (gated_mlp true)")
        if self.first_dense_layers >= self.n_layers:
            raise ValueError(f"first_dense_layers ({self.first_dense_layers}) must be below n_layers ({self.n_layers})")
        if (self.first_dense_layers > 0) != (self.dense_ffn_hidden > 0):
            raise ValueError("first_dense_layers and dense_ffn_hidden go together")
        if self.capacity_factor is not None and self.capacity_factor > self.n_experts / self.top_k:
            raise ValueError(f"capacity_factor ({self.capacity_factor:g}) must be at most n_experts / top_k "
                             f"({self.n_experts / self.top_k:g}: a buffer of every token)")
        if self.mla and self.attention_sinks:
            raise ValueError("attention sinks with multi-head latent attention are not modelled")
        if self.mla:
            if self.v_head_dim is None or self.attn_head_dim is None or self.kv_heads != self.n_heads:
                raise ValueError("multi-head latent attention needs attn_head_dim, v_head_dim and one key head per head")
            if not 0 < self.qk_rope_head_dim < self.attn_head_dim:
                raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be in (0, attn_head_dim)")
        elif self.q_lora_rank is not None or self.v_head_dim is not None or self.qk_rope_head_dim:
            raise ValueError("q_lora_rank, v_head_dim and qk_rope_head_dim need kv_lora_rank (latent attention)")
        return self

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (DeepSeek)."""
        return self.kv_lora_rank is not None

    def expert_load(self, ep: int) -> float:
        """Token copies the busiest GPU's experts process over the mean share: the capacity
        factor where there is one, else :data:`LOAD_IMBALANCE` under expert parallelism (1 with
        all experts on every GPU)."""
        if self.capacity_factor is not None:
            return self.capacity_factor
        return LOAD_IMBALANCE if ep > 1 else 1.0

    def dispatched_load(self) -> float:
        """Token copies each all-to-all carries over the mean: padded buffers (the capacity
        factor) or the tokens themselves (dropless: 1)."""
        return 1.0 if self.capacity_factor is None else self.capacity_factor

    @property
    def n_moe_layers(self) -> int:
        """Layers with the sparse block (all but the ``first_dense_layers``)."""
        return self.n_layers - self.first_dense_layers

    def attention_shard_params(self, heads: int) -> int:
        """MLA parameters of one layer holding ``heads`` of its heads (Megatron-Core's tensor
        parallelism divides the heads of ``q_proj``/``q_b_proj``, ``kv_b_proj`` and ``o_proj`` and
        replicates the down-projections and the latent norms): queries ``h x heads d`` (or
        ``h x r_q``, a norm of ``r_q``, ``r_q x heads d``), ``h x (r_kv + d_rope)``, a norm of
        ``r_kv``, ``r_kv x heads (d_nope + d_v)`` and ``heads d_v x h``; no biases (DeepSeek's
        ``attention_bias`` false)."""
        h, d, r = self.hidden, self.head_dim, self.qk_rope_head_dim
        kv, v, ql = self.kv_lora_rank or 0, self.v_head_dim or 0, self.q_lora_rank
        q = h * heads * d if ql is None else h * ql + ql + ql * heads * d
        return q + h * (kv + r) + kv + kv * heads * (d - r + v) + heads * v * h

    def attention_params_per_layer(self) -> int:
        """MLA's (:meth:`attention_shard_params` of all heads), else the transformer's; and the
        heads' sinks."""
        attn = self.attention_shard_params(self.n_heads) if self.mla else super().attention_params_per_layer()
        return attn + (self.n_heads if self.attention_sinks else 0)

    def dense_mlp_params(self) -> int:
        """The dense gated MLP of one of the ``first_dense_layers`` (no biases)."""
        return 3 * self.hidden * self.dense_ffn_hidden

    def param_breakdown(self) -> dict[str, int]:
        """The transformer's breakdown with the dense layers' MLPs in ``mlp``; ``*_per_layer``
        keys are a sparse layer's."""
        out = super().param_breakdown()
        out["mlp"] += self.first_dense_layers * (self.dense_mlp_params() - self.mlp_params_per_layer())
        return out

    @property
    def family_display(self) -> str:
        return _DISPLAY[self.family]

    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return self.expert_shard_params(self.ffn_hidden)

    def expert_shard_params(self, width: int) -> int:
        """One routed expert ``width`` wide (its expert tensor-parallel shard): gate, up and down
        projections and, where biased (``linear_bias``: gpt-oss), the gate and up biases of that
        width and the down projection's ``hidden`` (replicated)."""
        h = self.hidden
        return 3 * h * width + ((2 * width + h) if self.linear_bias else 0)

    def shared_params_per_layer(self) -> int:
        """Shared expert (three projections) and its gate, one layer."""
        fs, h = self.shared_ffn_hidden, self.hidden
        return 3 * h * fs + (h if self.shared_expert_gate else 0)

    def router_params_per_layer(self) -> int:
        """The router's ``hidden x n_experts`` weight and its bias where it has one."""
        return (self.hidden + self.router_bias) * self.n_experts

    def mlp_params_per_layer(self) -> int:
        """The sparse block of one layer: router, every expert, the shared expert and its gate."""
        return (self.router_params_per_layer() + self.n_experts * self.expert_params()
                + self.shared_params_per_layer())

    def n_expert_params(self) -> int:
        """Routed experts' parameters, all sparse layers (what expert parallelism divides)."""
        return self.n_moe_layers * self.n_experts * self.expert_params()

    def n_active_params(self) -> int:
        """Parameters one token uses: all but the ``n_experts - top_k`` experts it is not routed to."""
        return self.n_params() - self.n_moe_layers * (self.n_experts - self.top_k) * self.expert_params()

    def describe(self) -> str:
        n, a = self.n_params(), self.n_active_params()
        return (f"{self.display_name} · {n / 1e9:.2f} B parameters ({a / 1e9:.2f} B active) · {self.n_layers} layers × "
                f"{self.hidden} hidden × {self.n_heads} heads · {self.family_display} decoder, "
                f"{self.n_experts} experts, top-{self.top_k}"
                + (f" + shared expert {self.shared_ffn_hidden}" if self.shared_ffn_hidden else "")
                + (f", latent attention (KV rank {self.kv_lora_rank})" if self.mla else "")
                + (f", {self.first_dense_layers} dense layer(s) first" if self.first_dense_layers else ""))


def _mlp_elementwise(f: float, gated: bool, compiled: bool) -> float:
    """Elements the MLP's elementwise work moves per token beside an eager activation kernel (the
    part of :func:`simulator.model.workload.mlp_elementwise_elements` not timed as the activation op)."""
    el = workload.mlp_elementwise_elements(f, gated, compiled)
    return el if compiled else el - 2.0 * f


def graph(model, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` samples (array): the transformer's graph with its MLP replaced by
    the sparse block (module docstring). ``model`` may be a ``parallel.ShardView`` (its expert
    tensor-parallel shard of each expert's width, its ``ep`` share of the experts; folded experts,
    ``expert_token_shards`` > 1, route only the rank's sequence shard of the tokens)."""
    base = dense_graph(model, mb, seq_len, knobs)
    layer = base.blocks[0]
    e = workload.act_bytes(knobs.precision)
    T = np.asarray(mb, float) * seq_len
    h, f, E, k = model.hidden, model.ffn_hidden, model.n_experts, model.top_k
    tp, ep = getattr(model, "tp", 1), getattr(model, "ep", 1)
    local = E // ep
    fs = math.ceil(model.shared_ffn_hidden / tp)
    Te = T / getattr(model, "expert_token_shards", 1)  # tokens this GPU routes
    Tk = Te * k * model.expert_load(ep)  # token copies this GPU's experts process
    up, up_s = 2 * f, 2 * fs
    loop = knobs.stack.moe_experts == "loop"
    # the loop's kernels for all local experts (every expert is hit: a micro-batch routes thousands
    # of token copies to at most a few hundred experts), each pass; grouped: one kernel per GEMM
    per = {name: n * local for name, n in LOOP_KERNELS.items()} if loop else dict.fromkeys(LOOP_KERNELS, 0.0)
    gemm_kernels = {name: per[name] if loop else 1.0 for name in ("expert_up", "expert_down")}
    copies = 0.0 if loop else Tk  # expert copies whose elementwise work the layer's ops hold (loop: expert_act)
    ops: list[Op] = []
    for op in layer.ops:
        if op.name in ("mlp_up", "mlp_down"):
            continue
        if op.name == "activation":  # eager SiLU of the expert copies (grouped) and of the shared expert
            af = (copies * f + T * fs) * 2.0 * e
            kern = (0.0 if loop else 1.0) + (1.0 if fs else 0.0)
            op = dataclasses.replace(op, bytes_fwd=af, bytes_bwd=workload.ACTIVATION_BWD_BYTES * af,
                                     kernels_fwd=kern, kernels_bwd=kern)
        elif op.name == "norms_residual_activation":
            x = _mlp_elementwise(f, True, knobs.compiled)
            delta = ((copies - T) * x + T * _mlp_elementwise(fs, True, knobs.compiled)) * e
            # biased experts (gpt-oss): the layer counted one MLP's bias gradients, reductions of
            # its up and down outputs' gradients over the tokens; the experts' run over their
            # copies (the router's bias gradient, over tokens x n_experts, is not counted)
            bias_grads = (Tk - T) * (up + h) * e if model.linear_bias else 0.0
            sparse = model.mlp_params_per_layer() - model.expert_params()
            op = dataclasses.replace(op, bytes_fwd=op.bytes_fwd + delta,
                                     bytes_bwd=op.bytes_bwd + workload.ELEMENTWISE_BWD_FACTOR * delta + bias_grads,
                                     saved=op.saved + ((Tk - T) * up + T * up_s) * e, params=op.params - sparse)
        ops.append(op)
    bwd = workload.ELEMENTWISE_BWD_FACTOR
    ops += [
        # the router reads the post-attention norm's output (kept for backward, as the dense
        # MLP-up kept it) and writes the expert scores; it stays in bf16 under fp8 (a narrow GEMM whose
        # scores decide the routing: FP8 recipes leave it out), as does the shared expert's gate
        Op("router", "gemm", m=Te, n=E, k=h, kernels_fwd=1, kernels_bwd=2, saved=Te * e * h,
           kept={"op": Te * e * E}, params=model.router_params_per_layer()),
        Op("router_topk", "elementwise", bytes_fwd=Te * E * (e + 4 * ROUTER_PASSES), bytes_bwd=Te * E * 4 * 3,
           kernels_fwd=ROUTER_KERNELS, kernels_bwd=ROUTER_KERNELS, saved=Te * E * 4,
           recompute=frozenset({"op"}), bandwidth="elementwise"),
        # dispatch: read the tokens, write top_k copies grouped by expert; backward sums the copies'
        # gradients back
        Op("dispatch", "elementwise", bytes_fwd=(Te + Tk) * h * e, bytes_bwd=(Te + Tk) * h * e,
           kernels_fwd=2 + per["dispatch"], kernels_bwd=2 + bwd * per["dispatch"], recompute=frozenset({"op"}),
           bandwidth="elementwise", graph_break=loop),
        Op("expert_up", "gemm", m=Tk / local, n=up, k=h, batch=float(local), kernels_fwd=gemm_kernels["expert_up"],
           kernels_bwd=2 * gemm_kernels["expert_up"], saved=Tk * e * h, kept={"op": Tk * e * up},
           params=local * (h * up + (up if model.linear_bias else 0)), fp8_linear=True, graph_break=loop,
           grouped=not loop),
    ]
    if loop:  # each expert's SiLU and gate x up product, eager kernels even under torch.compile
        xe = Tk * workload.mlp_elementwise_elements(f, True, False) * e
        ops.append(Op("expert_act", "elementwise", bytes_fwd=xe, bytes_bwd=bwd * xe, kernels_fwd=per["expert_act"],
                      kernels_bwd=bwd * per["expert_act"], recompute=frozenset({"op"}), bandwidth="elementwise",
                      graph_break=True))
    ops += [
        Op("expert_down", "gemm", m=Tk / local, n=h, k=f, batch=float(local), kernels_fwd=gemm_kernels["expert_down"],
           kernels_bwd=2 * gemm_kernels["expert_down"], saved=Tk * e * f, kept={"op": Tk * e * h},
           params=local * (f * h + (h if model.linear_bias else 0)), fp8_linear=True, graph_break=loop,
           grouped=not loop),
        # combine: weight each copy by its routing probability (the copies are kept for that
        # probability's gradient) and add them back in token order
        Op("combine", "elementwise", bytes_fwd=(2 * Tk + Te) * h * e, bytes_bwd=2 * (2 * Tk + Te) * h * e,
           kernels_fwd=2 + per["combine"], kernels_bwd=2 + bwd * per["combine"], saved=Tk * e * h,
           recompute=frozenset({"op"}), bandwidth="elementwise", graph_break=loop),
    ]
    if fs:
        ops += [Op("shared_up", "gemm", m=T, n=up_s, k=h, kernels_fwd=1, kernels_bwd=2, kept={"op": T * e * up_s},
                   params=h * up_s, fp8_linear=True),
                Op("shared_down", "gemm", m=T, n=h, k=fs, kernels_fwd=1, kernels_bwd=2, saved=T * e * fs,
                   kept={"op": T * e * h}, params=fs * h, fp8_linear=True)]
        if model.shared_expert_gate:
            ops.append(Op("shared_gate", "gemm", m=T, n=1, k=h, kernels_fwd=1, kernels_bwd=2, saved=T * e,
                          params=h))
    k_dense = getattr(model, "first_dense_layers", 0)
    if getattr(model, "mla", False):
        ops = _own_rest(_mla_ops(ops, model, T, e, knobs.compiled), model.param_breakdown()["layer_per_layer"])
    moe_layer = Block(layer.name, tuple(ops), layer.repeat - k_dense, layer.input_bytes)
    dense = (_dense_block(model, mb, seq_len, knobs, k_dense),) if k_dense else ()
    return Graph((moe_layer, *dense, *base.blocks[1:]), base.outside, base.logits_bytes)


#: Elements an eager step moves per element of Q and K to assemble them from their parts
#: (``torch.cat`` of the query's latent and rotary halves, the key copied into a new tensor): read
#: and write each once.
MLA_CONCAT_ELEMENTS = 2.0


def _mla_ops(ops: list[Op], model, T: np.ndarray, e: int, compiled: bool) -> list[Op]:
    """A layer's ops with multi-head latent attention (``transformers``' ``DeepseekV2Attention``,
    ``DeepseekV3Attention``) in place of the Q/K/V projection, ``d`` = ``attn_head_dim`` (nope +
    rope), ``v`` = ``v_head_dim``, ``a`` heads (the GPU's, a view's):

    * GEMMs ``q_proj`` (h -> a d), or ``q_a_proj`` (h -> r_q) and ``q_b_proj`` (r_q -> a d);
      ``kv_a_proj`` (h -> r_kv + d_rope: the latent and the shared rotary key, reading the same
      normed input as the query, saved once); ``kv_b_proj`` (r_kv -> a (d_nope + v)); ``o_proj``
      (a v -> h);
    * attention: scores at width d, values at width v: forward FLOPs ``2 s^2 a (d + v)`` per
      sample (the dense count's ``4 s^2 a d`` scaled by ``(d + v) / 2d``), the kernel's efficiency
      read at width d; a kernel that needs one width for Q/K and V pads V to d (FlashAttention-2;
      ``transformers`` did so for it) and executes up to ``(d - v) / (d + v)`` more, not counted;
    * the latent norms (r_kv, and r_q) read and write their latent and save its input; eager
      steps also assemble Q and K from their parts (:data:`MLA_CONCAT_ELEMENTS`); rotary
      embeddings as the transformer counts them over the rotated share of Q and K (the key's
      rotary part is one head, counted as ``a``: conservative).

    Saved activations: the transformer's Q, K, V and attention output at width d
    (``workload.layer_activation_bytes_per_token``: V and the output are v wide, so this over
    counts by ``2 a (d - v)`` per token: conservative), plus the latent projections' inputs.
    """
    h, a, d, r = model.hidden, model.n_heads, model.head_dim, model.qk_rope_head_dim
    kv, v, ql = model.kv_lora_rank, model.v_head_dim, model.q_lora_rank

    def gemm(name: str, n: float, k: float, saved: float) -> Op:
        return Op(name, "gemm", m=T, n=n, k=k, kernels_fwd=1, kernels_bwd=2, saved=T * e * saved,
                  kept={"op": T * e * n}, params=int(n * k))

    out: list[Op] = []
    for op in ops:
        if op.name == "qkv":
            out += [gemm("q_proj", a * d, h, h)] if ql is None else \
                [gemm("q_a_proj", ql, h, h), gemm("q_b_proj", a * d, ql, ql)]
            out += [gemm("kv_a_proj", kv + r, h, 0.0), gemm("kv_b_proj", a * (d - r + v), kv, kv)]
            continue
        if op.name == "attn_out":
            op = dataclasses.replace(op, k=a * v, saved=T * e * a * v, params=a * v * h)
        elif op.kind == "attention":
            share = (d + v) / (2.0 * d)
            op = dataclasses.replace(op, flops_fwd=op.flops_fwd * share, flops_bwd=op.flops_bwd * share,
                                     heads=op.heads * share)
        elif op.name == "values":  # eager attention: probabilities x V, v wide
            op = dataclasses.replace(op, n=v)
        elif op.name == "norms_residual_activation":
            latent = kv + (ql or 0)
            x = T * e * (2.0 * latent + (0.0 if compiled else MLA_CONCAT_ELEMENTS * 2 * a * d))
            kern = 0.0 if compiled else 1.0 + (ql is not None) + 2.0
            op = dataclasses.replace(op, bytes_fwd=op.bytes_fwd + x,
                                     bytes_bwd=op.bytes_bwd + workload.ELEMENTWISE_BWD_FACTOR * x,
                                     kernels_fwd=op.kernels_fwd + kern,
                                     kernels_bwd=op.kernels_bwd + workload.ELEMENTWISE_BWD_FACTOR * kern,
                                     saved=op.saved + T * e * (kv + r + (ql or 0)))
        out.append(op)
    return out


def _own_rest(ops: list[Op], total: int) -> list[Op]:
    """``ops`` with the norms/residual op owning what the others do not of ``total`` parameters
    (its norms, the latent norms)."""
    rest = total - sum(op.params for op in ops if op.name != "norms_residual_activation")
    return [dataclasses.replace(op, params=rest) if op.name == "norms_residual_activation" else op for op in ops]


def _dense_block(model, mb: np.ndarray, seq_len: int, knobs: Knobs, repeat: int) -> Block:
    """The ``first_dense_layers``: the transformer's layer with a dense gated MLP of
    ``dense_ffn_hidden`` (its ``tp`` shard in a view), latent attention where the model has it."""
    width = math.ceil(model.dense_ffn_hidden / getattr(model, "tp", 1))
    if type(model) is model.__class__:  # a spec: a copy with the dense width (not validated: same model)
        dense = model.model_copy(update={"ffn_hidden": width})
    else:  # a parallel.ShardView: the same view, its MLP the dense one's shard
        dense = object.__new__(type(model))
        dense.__dict__.update(model.__dict__)
        dense.ffn_hidden = width
    layer = dense_graph(dense, mb, seq_len, knobs).blocks[0]
    ops = list(layer.ops)
    if getattr(model, "mla", False):
        e = workload.act_bytes(knobs.precision)
        ops = _mla_ops(ops, model, np.asarray(mb, float) * seq_len, e, knobs.compiled)
    total = model.attention_params_per_layer() + model.dense_mlp_params() + model.norm_params_per_layer()
    return Block("dense_layer", tuple(_own_rest(ops, total)), repeat, layer.input_bytes)


def _from_hf(family: str, experts_key: str, ffn_key: str, shared: bool = False):
    """Builder of spec fields from a ``config.json`` of ``family``: the rotary decoder's fields
    (:func:`simulator.model.hf_fields._rope_decoder`) and the routing."""
    def build(c, name: str) -> dict:
        fields = MOE_ROPE[family](c, name)
        sparse_step = c.int("decoder_sparse_step", 1)
        dense_layers = c.data.get("mlp_only_layers") or []
        if sparse_step != 1 or dense_layers:
            raise ConfigProblem("dense MLP layers between the sparse ones (decoder_sparse_step, mlp_only_layers) "
                                 "are not modelled")
        fields.update(family=family, n_experts=c.int(experts_key), top_k=c.int("num_experts_per_tok"),
                      ffn_hidden=c.int(ffn_key))
        if shared:
            fields.update(shared_ffn_hidden=c.int("shared_expert_intermediate_size"), shared_expert_gate=True)
        return fields

    return build


def _deepseek(c, name: str) -> dict:
    """Spec fields of a DeepSeek-V2/V3 ``config.json`` (``transformers``' ``DeepseekV2ForCausalLM``,
    ``DeepseekV3ForCausalLM``): multi-head latent attention, ``n_shared_experts`` shared experts of
    ``moe_intermediate_size`` (one gated MLP ``n_shared_experts`` times as wide, no gate), the
    ``first_k_dense_replace`` dense layers of ``intermediate_size``. Read and ignored, since they
    add no parameters and no work beyond the router's few passes (:data:`ROUTER_PASSES`): group-
    limited routing (``n_group``, ``topk_group``, ``topk_method``), V3's sigmoid scores and
    ``e_score_correction_bias`` (a buffer in ``transformers``, updated by a rule, not the
    optimizer), ``routed_scaling_factor``, ``norm_topk_prob``, ``rope_scaling`` (YaRN). V3's
    ``num_nextn_predict_layers`` (multi-token prediction) are not built by ``transformers`` and
    not counted. The training length: :func:`_pretrained_length` (DeepSeek pre-trained at 4K)."""
    fields = MOE_ROPE[c.data["model_type"]](c, name)
    if c.bool("attention_bias", False) or c.bool("mlp_bias", False):
        raise ConfigProblem("biases in DeepSeek's attention or MLPs (attention_bias, mlp_bias) are not modelled")
    if c.int("moe_layer_freq", 1) != 1:
        raise ConfigProblem("sparse layers other than every layer after the dense ones (moe_layer_freq) are not modelled")
    nope, rope, ql = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim"), c.data.get("q_lora_rank")
    f, k = c.int("moe_intermediate_size"), c.int("first_k_dense_replace", 0)
    fields.update(default_seq_len=_pretrained_length(c, fields["default_seq_len"]),family=c.data["model_type"], n_kv_heads=None, attn_head_dim=nope + rope, rotary_pct=rope / (nope + rope),
                  kv_lora_rank=c.int("kv_lora_rank"), q_lora_rank=None if ql is None else c.int("q_lora_rank"),
                  qk_rope_head_dim=rope, v_head_dim=c.int("v_head_dim"), n_experts=c.int("n_routed_experts"),
                  top_k=c.int("num_experts_per_tok"), ffn_hidden=f, shared_ffn_hidden=c.int("n_shared_experts", 0) * f,
                  first_dense_layers=k, dense_ffn_hidden=c.int("intermediate_size") if k else 0)
    return fields


def _pretrained_length(c, default: int) -> int:
    """The training length of a config that extends its context with YaRN: the context before the
    extension (``rope_scaling.original_max_position_embeddings``; ``rope_parameters`` in
    ``transformers`` 5), capped at ``default``; ``default`` where none is given."""
    scaling = c.data.get("rope_scaling") or c.data.get("rope_parameters")
    if isinstance(scaling, dict) and scaling.get("original_max_position_embeddings"):
        return min(default, c.int("original_max_position_embeddings", data=scaling))
    return default


def _gpt_oss(c, name: str) -> dict:
    """Spec fields of a gpt-oss ``config.json`` (``transformers``' ``GptOssForCausalLM``): the rotary
    decoder of :data:`MOE_ROPE` (biased attention, 64-wide heads, ``layer_types`` alternating a
    128-token window with full attention), ``num_local_experts`` biased experts of
    ``intermediate_size``, a biased router, one attention sink per head; the training length
    :func:`_pretrained_length` (4,096 tokens before YaRN, ``initial_context_length``). Read and
    ignored: ``swiglu_limit`` and ``swiglu_alpha`` (the experts' clamped SwiGLU,
    ``gate * sigmoid(1.702 gate) * (up + 1)``, moves what SwiGLU moves when fused, as Megatron-Core
    and compiled steps run it; Hugging Face's eager ``_apply_gate`` launches about seven
    elementwise kernels where SwiGLU's two are counted; its eager attention, what ``transformers`` runs
    without flex attention or a FlashAttention-3 kernel with sinks, since it has no SDPA path, also
    concatenates the sinks to the materialised scores and subtracts each row's maximum, two more
    passes over them, not counted either), ``router_aux_loss_coef``,
    ``quantization_config`` (the published checkpoints' MXFP4 experts: precision is a recipe knob),
    rope scaling."""
    fields = MOE_ROPE["gpt_oss"](c, name)
    fields.update(family="gpt_oss", n_experts=c.int("num_local_experts"), top_k=c.int("num_experts_per_tok"),
                  router_bias=True, attention_sinks=True,
                  default_seq_len=_pretrained_length(c, fields["default_seq_len"]))
    return fields


_BUILDERS = {
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "mixtral": _from_hf("mixtral", "num_local_experts", "intermediate_size"),
    "qwen2_moe": _from_hf("qwen2_moe", "num_experts", "moe_intermediate_size", shared=True),
    "qwen3_moe": _from_hf("qwen3_moe", "num_experts", "moe_intermediate_size"),
    "olmoe": _from_hf("olmoe", "num_experts", "intermediate_size"),
    "gpt_oss": _gpt_oss,
}


def from_hf_config(c, name: str) -> dict:
    """Spec fields from a Hugging Face MoE ``config.json`` (``model_type`` one of :data:`MOE_FAMILIES`)."""
    return _BUILDERS[c.data["model_type"]](c, name)


def notes(spec: MoESpec, stack) -> list[str]:
    """Active vs total parameters; under a stack that loops over the experts, that it is slow."""
    routing = (f"the busiest expert-parallel rank processes {LOAD_IMBALANCE:g}x the mean tokens (dropless routing)"
               if spec.capacity_factor is None else
               f"capacity factor {spec.capacity_factor:g}: every expert's buffer is {spec.capacity_factor:g}x its mean "
               "tokens, the rest dropped, the buffer padded")
    out = [f"{spec.display_name}: {spec.n_active_params() / 1e9:.2f} B of its {spec.n_params() / 1e9:.2f} B parameters "
           f"are active per token (top-{spec.top_k} of {spec.n_experts} experts); MFU counts the active ones; {routing}"]
    if stack.moe_dispatcher != "alltoall" or stack.moe_a2a_overlap:
        out.append(f"expert all-to-all: {stack.moe_dispatcher_source}; {stack.moe_a2a_overlap_source}")
    if spec.routing == "contiguous":
        out.append("contiguous routing (NeMo Automodel's fake_balanced_gate): each token's experts are consecutive, "
                   "so DeepEP sends it to the fewest GPUs and nodes; a learned router spreads them (--moe-routing uniform)")
    if stack.moe_experts == "loop":
        out.append(f"{stack.display} runs Hugging Face's eager expert loop, which is slow: a Python loop over the "
                   f"{spec.n_experts} experts of each layer, each a host sync (torch.where), gathers, three small "
                   f"GEMMs and index_add_ ({sum(LOOP_KERNELS.values()):g} kernels per expert forward, twice that "
                   f"backward), eager even under torch.compile; megatron-lm and torchtitan run the experts as "
                   f"grouped GEMMs (--stack megatron-lm or torchtitan; transformers 5's experts_implementation "
                   f"grouped_mm does too, not modelled here)")
    return out


MOE = Family(name="moe", spec_cls=MoESpec, families=MOE_FAMILIES, graph=graph, hf_model_types=MOE_FAMILIES,
             from_hf_config=from_hf_config, notes=notes)
