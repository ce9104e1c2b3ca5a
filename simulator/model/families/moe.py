"""Mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) as operations.

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
  a sigmoid gate (``hidden x 1`` linear).

The stack decides how the experts run (:attr:`simulator.strategy.stacks.Stack.moe_experts`): ``grouped``
(Megatron-LM's ``--moe-grouped-gemm`` with the all-to-all dispatcher, torchtitan's grouped_mm:
one kernel per GEMM for all local experts) or ``loop`` (Hugging Face's eager block: a Python loop
over the experts hit, each a ``torch.where`` that syncs with the host, an index, three small GEMMs,
the activation, the weighting and an ``index_add_``: kernels per expert, slow). Expert
parallelism (``ep``, :class:`simulator.strategy.layout.Parallelism`) divides the experts; its all-to-all
is communication (:func:`simulator.physics.parallel.ep_comm_time`), not an operation here.

Parameters count exactly as ``*ForCausalLM`` (tests pin Mixtral-8x7B, OLMoE-1B-7B, Qwen3-30B-A3B);
the active parameters are those a token uses (``top_k`` of the experts). MFU counts the active
parameters' FLOPs: the graph's FLOPs of one sample without expert parallelism (no imbalance).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

import numpy as np
from pydantic import Field, model_validator

from .. import workload
from ..hf_fields import MOE_ROPE, ConfigProblem
from ..spec import ModelSpec
from .base import Block, Family, Graph, Knobs, Op
from .transformer import graph as dense_graph

MoEFamily = Literal["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
MOE_FAMILIES: tuple[str, ...] = get_args(MoEFamily)
_DISPLAY = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2-MoE", "qwen3_moe": "Qwen3-MoE", "olmoe": "OLMoE"}

#: Tokens the busiest expert-parallel rank's experts process over the mean, under dropless routing
#: with the load-balancing loss (applied to the expert work of the busiest rank when ep > 1; with
#: all experts on every GPU the total is the same on each). ASSUMPTION, not fitted: the project's
#: design notes (DESIGN.md, "Mixture-of-experts and FP8") record published gaps of 8-20% between
#: force-balanced and dropless routing of Qwen3-235B-A22B; 1.1 is near the low end. A run with a
#: capacity factor (tokens dropped or padded to the mean) has none: its prediction is then slow.
LOAD_IMBALANCE = 1.1
#: Router softmax and top-k: fp32 passes over the tokens x experts scores (read the half logits,
#: write fp32 probabilities, read them for top-k, write the k weights and indices), kernels.
ROUTER_PASSES, ROUTER_KERNELS = 3, 4
#: Kernels Hugging Face's eager loop launches per expert outside its GEMMs, each pass: forward
#: ``torch.where`` (a host sync), the index gather, the SiLU, the gate x up product, the routing
#: weight product and ``index_add_``; backward about twice that.
LOOP_KERNELS_PER_EXPERT = 6


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

    @model_validator(mode="after")
    def _check_moe(self) -> MoESpec:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if not self.gated_mlp:
            raise ValueError("the experts of the modelled MoE families are gated MLPs (gated_mlp true)")
        return self

    @property
    def family_display(self) -> str:
        return _DISPLAY[self.family]

    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return super().mlp_params_per_layer()

    def shared_params_per_layer(self) -> int:
        """Shared expert (three projections) and its gate, one layer."""
        fs, h = self.shared_ffn_hidden, self.hidden
        return 3 * h * fs + (h if self.shared_expert_gate else 0)

    def router_params_per_layer(self) -> int:
        return self.hidden * self.n_experts

    def mlp_params_per_layer(self) -> int:
        """The sparse block of one layer: router, every expert, the shared expert and its gate."""
        return (self.router_params_per_layer() + self.n_experts * self.expert_params()
                + self.shared_params_per_layer())

    def n_expert_params(self) -> int:
        """Routed experts' parameters, all layers (what expert parallelism divides)."""
        return self.n_layers * self.n_experts * self.expert_params()

    def n_active_params(self) -> int:
        """Parameters one token uses: all but the ``n_experts - top_k`` experts it is not routed to."""
        return self.n_params() - self.n_layers * (self.n_experts - self.top_k) * self.expert_params()

    def describe(self) -> str:
        n, a = self.n_params(), self.n_active_params()
        return (f"{self.display_name} · {n / 1e9:.2f} B parameters ({a / 1e9:.2f} B active) · {self.n_layers} layers × "
                f"{self.hidden} hidden × {self.n_heads} heads · {self.family_display} decoder, "
                f"{self.n_experts} experts, top-{self.top_k}"
                + (f" + shared expert {self.shared_ffn_hidden}" if self.shared_ffn_hidden else ""))


def _mlp_elementwise(f: float, gated: bool, compiled: bool) -> float:
    """Elements the MLP's elementwise work moves per token beside an eager activation kernel (the
    part of :func:`simulator.model.workload.mlp_elementwise_elements` not timed as the activation op)."""
    el = workload.mlp_elementwise_elements(f, gated, compiled)
    return el if compiled else el - 2.0 * f


def graph(model, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` samples (array): the transformer's graph with its MLP replaced by
    the sparse block (module docstring). ``model`` may be a ``parallel.ShardView`` (its ``tp``
    shard of each expert's width, its ``ep`` share of the experts)."""
    base = dense_graph(model, mb, seq_len, knobs)
    layer = base.blocks[0]
    e = workload.act_bytes(knobs.precision)
    T = np.asarray(mb, float) * seq_len
    h, f, E, k = model.hidden, model.ffn_hidden, model.n_experts, model.top_k
    tp, ep = getattr(model, "tp", 1), getattr(model, "ep", 1)
    local = E // ep
    fs = math.ceil(model.shared_ffn_hidden / tp)
    Tk = T * k * (LOAD_IMBALANCE if ep > 1 else 1.0)  # token copies this GPU's experts process
    up, up_s = 2 * f, 2 * fs
    loop = knobs.stack.moe_experts == "loop"
    per_expert = float(local) if loop else 1.0  # GEMM kernels per pass for all local experts
    ops: list[Op] = []
    for op in layer.ops:
        if op.name in ("mlp_up", "mlp_down"):
            continue
        if op.name == "activation":  # eager SiLU of every expert copy and of the shared expert
            af = (Tk * f + T * fs) * 2.0 * e
            kern = per_expert + (1.0 if fs else 0.0)
            op = dataclasses.replace(op, bytes_fwd=af, bytes_bwd=workload.ACTIVATION_BWD_BYTES * af,
                                     kernels_fwd=kern, kernels_bwd=kern)
        elif op.name == "norms_residual_activation":
            x = _mlp_elementwise(f, True, knobs.compiled)
            delta = ((Tk - T) * x + T * _mlp_elementwise(fs, True, knobs.compiled)) * e
            sparse = model.mlp_params_per_layer() - model.expert_params()
            op = dataclasses.replace(op, bytes_fwd=op.bytes_fwd + delta,
                                     bytes_bwd=op.bytes_bwd + workload.ELEMENTWISE_BWD_FACTOR * delta,
                                     saved=op.saved + ((Tk - T) * up + T * up_s) * e, params=op.params - sparse)
        ops.append(op)
    loop_k = LOOP_KERNELS_PER_EXPERT * local if loop else 0.0
    ops += [
        # the router reads the post-attention norm's output (kept for backward, as the dense
        # MLP-up kept it) and writes the expert scores; it stays in bf16 under fp8 (a narrow GEMM whose
        # scores decide the routing: FP8 recipes leave it out), as does the shared expert's gate
        Op("router", "gemm", m=T, n=E, k=h, kernels_fwd=1, kernels_bwd=2, saved=T * e * h,
           kept={"op": T * e * E}, params=model.router_params_per_layer()),
        Op("router_topk", "elementwise", bytes_fwd=T * E * (e + 4 * ROUTER_PASSES), bytes_bwd=T * E * 4 * 3,
           kernels_fwd=ROUTER_KERNELS, kernels_bwd=ROUTER_KERNELS, saved=T * E * 4,
           recompute=frozenset({"op"}), bandwidth="elementwise"),
        # dispatch: read the tokens, write top_k copies grouped by expert; backward sums the copies'
        # gradients back
        Op("dispatch", "elementwise", bytes_fwd=(T + Tk) * h * e, bytes_bwd=(T + Tk) * h * e,
           kernels_fwd=2 + loop_k / 2, kernels_bwd=2 + loop_k, recompute=frozenset({"op"}), bandwidth="elementwise"),
        Op("expert_up", "gemm", m=Tk / local, n=up, k=h, batch=float(local), kernels_fwd=per_expert,
           kernels_bwd=2 * per_expert, saved=Tk * e * h, kept={"op": Tk * e * up},
           params=local * h * up, fp8_linear=True),
        Op("expert_down", "gemm", m=Tk / local, n=h, k=f, batch=float(local), kernels_fwd=per_expert,
           kernels_bwd=2 * per_expert, saved=Tk * e * f, kept={"op": Tk * e * h},
           params=local * f * h, fp8_linear=True),
        # combine: weight each copy by its routing probability (the copies are kept for that
        # probability's gradient) and add them back in token order
        Op("combine", "elementwise", bytes_fwd=(2 * Tk + T) * h * e, bytes_bwd=2 * (2 * Tk + T) * h * e,
           kernels_fwd=2 + loop_k / 2, kernels_bwd=2 + loop_k, saved=Tk * e * h, recompute=frozenset({"op"}),
           bandwidth="elementwise"),
    ]
    if fs:
        ops += [Op("shared_up", "gemm", m=T, n=up_s, k=h, kernels_fwd=1, kernels_bwd=2, kept={"op": T * e * up_s},
                   params=h * up_s, fp8_linear=True),
                Op("shared_down", "gemm", m=T, n=h, k=fs, kernels_fwd=1, kernels_bwd=2, saved=T * e * fs,
                   kept={"op": T * e * h}, params=fs * h, fp8_linear=True)]
        if model.shared_expert_gate:
            ops.append(Op("shared_gate", "gemm", m=T, n=1, k=h, kernels_fwd=1, kernels_bwd=2, saved=T * e,
                          params=h))
    moe_layer = Block(layer.name, tuple(ops), layer.repeat, layer.input_bytes)
    return Graph((moe_layer, *base.blocks[1:]), base.outside, base.logits_bytes)


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


_BUILDERS = {
    "mixtral": _from_hf("mixtral", "num_local_experts", "intermediate_size"),
    "qwen2_moe": _from_hf("qwen2_moe", "num_experts", "moe_intermediate_size", shared=True),
    "qwen3_moe": _from_hf("qwen3_moe", "num_experts", "moe_intermediate_size"),
    "olmoe": _from_hf("olmoe", "num_experts", "intermediate_size"),
}


def from_hf_config(c, name: str) -> dict:
    """Spec fields from a Hugging Face MoE ``config.json`` (``model_type`` one of :data:`MOE_FAMILIES`)."""
    return _BUILDERS[c.data["model_type"]](c, name)


def notes(spec: MoESpec) -> list[str]:
    return [f"{spec.display_name}: {spec.n_active_params() / 1e9:.2f} B of its {spec.n_params() / 1e9:.2f} B parameters "
            f"are active per token (top-{spec.top_k} of {spec.n_experts} experts); MFU counts the active ones; the "
            f"busiest expert-parallel rank processes {LOAD_IMBALANCE:g}x the mean tokens (dropless routing)"]


MOE = Family(name="moe", spec_cls=MoESpec, families=MOE_FAMILIES, graph=graph, hf_model_types=MOE_FAMILIES,
             from_hf_config=from_hf_config, notes=notes)
