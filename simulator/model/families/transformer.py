"""The transformer family (every ``models.ModelSpec``: GPT-NeoX, GPT-2, Llama, Mistral, Qwen,
Gemma, ..., BERT, RoBERTa, ViT) as operations.

One layer's operations from the shapes, bytes and saved activations of ``workload`` (Korthikanti
et al. 2022 for what a layer saves); the same code serves a tensor-parallel ``parallel.ShardView``
of the spec (heads, MLP width and vocabulary divided; hidden-sized activations divided only under
sequence parallelism). The spec is :class:`simulator.model.spec.ModelSpec`.
"""

from __future__ import annotations

import numpy as np

from ...core.vocab import base_precision
from ...hardware.profile import activation_class
from .. import hf_compiled, hf_eager, workload
from ..spec import FAMILIES, ModelSpec
from .base import Block, Graph, Knobs, Op
from .base import Family as FamilyDef

#: Every ``family`` value a transformer ModelSpec takes (models.FAMILIES).
TRANSFORMER_FAMILIES: tuple[str, ...] = FAMILIES


def graph(model: ModelSpec, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` samples (array) of ``seq_len`` tokens under ``knobs``."""
    mb = np.asarray(mb, dtype=float)
    e = workload.act_bytes(knobs.precision)
    stack = knobs.stack
    L = model.n_layers
    L1 = max(L, 1)  # workload gives totals over the layers; a pipeline stage's view may hold none
    tokens = mb * seq_len
    h_act = model.hidden / workload.seq_shards(model)  # hidden-sized activations on this GPU
    # each GEMM saves its input and owns its weight (+ bias); under op-level checkpointing it
    # keeps its output instead. What a layer saves, keeps and owns beyond that (Q/K/V, norm and
    # activation inputs; norms) goes with the norms/residual/activation op, so the totals are
    # Korthikanti's per-layer bytes and the parameter count exactly
    ops = [Op(g.name, "gemm", count=g.count / L1, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1,
              kernels_bwd=2, saved=tokens * e * g.k, kept={"op": tokens * e * g.n},
              params=int(g.k * g.n + (g.n if model.linear_bias else 0)), fp8_linear=True)
           for g in workload.layer_gemms(model, tokens)]
    # what a layer saves: Hugging Face's modules where the stack runs them, eager
    # (simulator/model/hf_eager.py) or as Inductor's partitioner keeps them under torch.compile
    # (simulator/model/hf_compiled.py), else the textbook count
    hf_modules = stack.hf_eager
    hf = hf_modules and not knobs.compiled
    hf_saves = (hf_compiled if knobs.compiled else hf_eager) if hf_modules else None
    per_layer = workload.layer_activation_bytes_per_token(model, seq_len, e, knobs.attention)
    if hf_saves:  # never below the textbook count (OPT's ReLU MLP saves one f-wide tensor where it counts two)
        hf_layer, hf_core = hf_saves.layer_saved_bytes_per_token(model, seq_len, knobs.precision, knobs.attention)
        per_layer = max(per_layer, hf_layer)
    if knobs.compiled and stack.returns_outputs:  # the returned KV cache's zero-filled gradients
        per_layer += hf_compiled.cache_tangent_bytes_per_token(model, knobs.precision)
    op_kept = workload.op_kept_bytes_per_token(model, e, knobs.attention)
    # attention core: selective checkpointing re-runs it (Korthikanti et al. 2022); op-level
    # re-runs eager attention's scores and softmax, not the fused kernel
    core = 0.0
    if knobs.attention == "sdpa":
        fl = workload.attention_flops_fwd(model, mb, seq_len, fused=True) / L1
        ops.append(Op("attention", "attention", flops_fwd=fl, flops_bwd=workload.FLASH_BWD_FLOPS * fl, kernels_fwd=1,
                      kernels_bwd=1, recompute=frozenset({"selective"}), head_dim=model.head_dim, seq=seq_len,
                      causal=workload.is_causal(model), heads=model.n_heads, attention_kernel=stack.attention_kernel))
    else:
        core = hf_core if hf_saves else workload.eager_scores_bytes_per_token(model, seq_len, e)
        # autocast's fp32 list holds softmax as it holds layer_norm: the stacks whose norms run in fp32 upcast it
        upcast = stack.fp32_norm(e, knobs.compiled)
        sf, sb = workload.eager_softmax_bytes(model, mb, seq_len, e, knobs.compiled, upcast)
        for g in workload.eager_attention_gemms(model, mb, seq_len):
            ops.append(Op(g.name, "gemm", count=g.count / L1, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1,
                          kernels_bwd=2, recompute=frozenset({"selective", "op"})))
        ops.append(Op("softmax", "elementwise", bytes_fwd=sf.nbytes / L1, bytes_bwd=sb.nbytes / L1,
                      kernels_fwd=float(sf.kernels) / L1, kernels_bwd=float(sb.kernels) / L1,
                      saved=tokens * core, recompute=frozenset({"selective", "op"}), bandwidth="softmax"))
        if upcast and not knobs.compiled and workload.is_causal(model):  # encoders (ViT) add no mask
            ma = workload.eager_mask_add_bytes(model, mb, seq_len, e)
            ops.append(Op("mask_add", "elementwise", bytes_fwd=ma.nbytes / L1, kernels_fwd=float(ma.kernels) / L1,
                          recompute=frozenset({"selective", "op"}), bandwidth="broadcast"))
    lf, lb = workload.layer_elementwise(model, mb, seq_len, e, knobs.compiled, stack.fp32_norm(e, knobs.compiled))
    autocast = hf and stack.fp32_norm(e, knobs.compiled)  # Hugging Face's eager modules under torch.autocast
    if autocast:
        xf, xb, kf, kb = hf_eager.autocast_elementwise(model, e, fused_projections=stack.projections == "fused",
                                                       fused_rmsnorm=stack.rmsnorm == "fused")
        lf = workload.MemOps(lf.nbytes + tokens * xf * L, float(lf.kernels) + kf * L)
        lb = workload.MemOps(lb.nbytes + tokens * xb * L, float(lb.kernels) + kb * L)
    if hf:  # Hugging Face's eager rotary and transposes: broadcast and strided operands, a class of their own
        rf, rb = workload.rotary_layout_bytes(model, mb, seq_len, e)
        lf = workload.MemOps(lf.nbytes - rf.nbytes, float(lf.kernels) - float(rf.kernels))
        lb = workload.MemOps(lb.nbytes - rb.nbytes, float(lb.kernels) - float(rb.kernels))
        table = float(e) if stack.rotary_tables == "half" else hf_eager.ROTARY_TABLE
        xf, xb, kf, kb = hf_eager.rotary_autocast_extra(model, e, table) if autocast else (0.0, 0.0, 0.0, 0.0)
        ops.append(Op("rotary_layout", "elementwise", bytes_fwd=(rf.nbytes + tokens * xf * L) / L1,
                      bytes_bwd=(rb.nbytes + tokens * xb * L) / L1, kernels_fwd=(float(rf.kernels) + kf * L) / L1,
                      kernels_bwd=(float(rb.kernels) + kb * L) / L1, recompute=frozenset({"op"}),
                      bandwidth="broadcast"))
    projections = [op for op in ops if op.kind == "gemm" and not op.recompute]
    rest_saved = per_layer - core - sum(e * op.k for op in projections)
    rest_kept = op_kept - sum(e * op.n for op in projections)
    rest_params = model.param_breakdown()["layer_per_layer"] - sum(op.params for op in ops)
    if not knobs.compiled:  # eager: the activation is a kernel of its own, at its class's speed
        af = workload.activation_bytes(model, mb, seq_len, e)
        lf = workload.MemOps(lf.nbytes - af.nbytes, float(lf.kernels) - float(af.kernels))
        share = workload.ELEMENTWISE_BWD_FACTOR  # the activation's backward as layer_elementwise counted it
        lb = workload.MemOps(lb.nbytes - share * af.nbytes, float(lb.kernels) - share * float(af.kernels))
        if hf and model.mlp_activation == "gelu_tanh" and model.family in hf_eager.GELU_NEW:
            # transformers' NewGELUActivation: ten eager elementwise ops in fp32 where one kernel was counted
            xf, xb, kf, kb = hf_eager.gelu_new_ops(knobs.precision, e)
            width = tokens * model.ffn_hidden
            ops.append(Op("activation", "elementwise", bytes_fwd=width * xf, bytes_bwd=width * xb,
                          kernels_fwd=kf, kernels_bwd=kb, recompute=frozenset({"op"}), bandwidth="elementwise"))
        else:
            ops.append(Op("activation", "elementwise", bytes_fwd=af.nbytes / L1,
                          bytes_bwd=workload.ACTIVATION_BWD_BYTES * af.nbytes / L1,
                          kernels_fwd=float(af.kernels) / L1, kernels_bwd=float(af.kernels) / L1,
                          recompute=frozenset({"op"}),
                          bandwidth=activation_class(model.mlp_activation, base_precision(knobs.precision)),
                          bandwidth_bwd=activation_class(model.mlp_activation, base_precision(knobs.precision),
                                                         backward=True)))
    ops.append(Op("norms_residual_activation", "elementwise", bytes_fwd=lf.nbytes / L1, bytes_bwd=lb.nbytes / L1,
                  kernels_fwd=float(lf.kernels) / L1, kernels_bwd=float(lb.kernels) / L1,
                  saved=tokens * rest_saved, recompute=frozenset({"op"}), kept={"op": tokens * rest_kept},
                  bandwidth="elementwise", params=rest_params))
    layer_input = hf_eager.layer_input_bytes_per_token(model) if hf_modules else h_act * e
    layer = Block("layer", tuple(ops), L, tokens * layer_input)

    outside = [Op(g.name, "gemm", count=g.count, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1, kernels_bwd=2)
               for g in workload.head_gemms(model, mb, seq_len)]
    lsf, lsb = workload.loss_bytes(model, mb, seq_len, e, stack.loss_kind(knobs.compiled),
                                   tangent=knobs.compiled and stack.returns_outputs)
    emf, emb = workload.embedding_bytes(model, mb, seq_len, e)
    outside.append(Op("loss", "elementwise", bytes_fwd=lsf.nbytes, bytes_bwd=lsb.nbytes,
                      kernels_fwd=float(lsf.kernels), kernels_bwd=float(lsb.kernels), bandwidth="loss"))
    # embedding output and the final norm's input stay for backward (Hugging Face: the final
    # norm's fp32 input and statistics, the head's input, masks; simulator/model/hf_eager.py)
    around = hf_saves.outside_saved_bytes_per_token(model, seq_len, knobs.precision, knobs.attention) if hf_saves \
        else h_act * e * 2
    outside.append(Op("embedding", "elementwise", bytes_fwd=emf.nbytes, bytes_bwd=emb.nbytes,
                      kernels_fwd=float(emf.kernels), kernels_bwd=float(emb.kernels), saved=tokens * around,
                      bandwidth="embedding"))
    # logits and loss buffers: the stack's bytes per logit (e + 8 for an eager fp32-upcast loss,
    # 2e for a fused one: Stack.loss_bytes_per_logit), plus eager final-logit soft-capping's tanh output (Gemma 2)
    cap = e if (getattr(model, "logit_softcap", None) and not knobs.compiled) else 0
    logits = workload.logits_elements(model, mb, seq_len) * (stack.loss_bytes_per_logit(e, knobs.compiled) + cap)
    return Graph((layer,), tuple(outside), logits)


TRANSFORMER = FamilyDef(name="transformer", spec_cls=ModelSpec, families=TRANSFORMER_FAMILIES, graph=graph)
