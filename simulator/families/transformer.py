"""The transformer family (GPT-NeoX, GPT-2, Llama, Mistral, MPT, BERT, RoBERTa, ViT) as operations.

Wraps today's ``workload`` and ``memory`` functions one layer at a time, so the operations carry
exactly the FLOPs, bytes, kernel launches and saved activations the existing transformer path
computes (``tests/test_families.py`` proves the equality). The spec is
:class:`simulator.models.ModelSpec`.
"""

from __future__ import annotations

import numpy as np

from .. import workload
from ..models import ModelSpec
from . import register
from .base import Block, Family, Graph, Knobs, Op

TRANSFORMER_FAMILIES = ("gpt_neox", "gpt2", "llama", "mistral", "mpt", "bert", "roberta", "vit")


def graph(model: ModelSpec, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` samples (array) of ``seq_len`` tokens under ``knobs``."""
    from .. import memory
    from ..compute import FLASH_BWD_FLOPS

    mb = np.asarray(mb, dtype=float)
    e = workload.act_bytes(knobs.precision)
    L = model.n_layers
    h, f, kv = model.hidden, model.ffn_hidden, workload.kv_dim(model)
    up = 2 * f if model.gated_mlp else f
    tokens = mb * seq_len
    # each GEMM saves its input; the QKV GEMM also its output (Q, K, V: the attention core's input)
    saved_in = {"qkv": e * (2 * h + 2 * kv), "attn_out": e * h, "mlp_up": e * h, "mlp_down": e * f}
    params = {"qkv": h * (h + 2 * kv) + ((h + 2 * kv) if model.linear_bias else 0),
              "attn_out": h * h + (h if model.linear_bias else 0),
              "mlp_up": h * up + (up if model.linear_bias else 0),
              "mlp_down": f * h + (h if model.linear_bias else 0)}
    ops = [Op(g.name, "gemm", count=g.count / L, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1,
              kernels_bwd=2, saved=tokens * saved_in[g.name], params=params[g.name])
           for g in workload.layer_gemms(model, tokens)]
    # attention core: selective checkpointing re-runs it (Korthikanti et al. 2022)
    if knobs.attention == "sdpa":
        fl = workload.attention_flops_fwd(model, mb, seq_len, fused=True) / L
        ops.append(Op("attention", "attention", flops_fwd=fl, flops_bwd=FLASH_BWD_FLOPS * fl, kernels_fwd=1,
                      kernels_bwd=1, recompute=frozenset({"selective"})))
        # FlashAttention's fp32 log-sum-exp (4 bytes per head and token) stays with its output
        ops[1] = _with_saved(ops[1], ops[1].saved + tokens * 4.0 * model.n_heads)
    else:
        core = tokens * memory.eager_scores_bytes_per_token(model, seq_len, e)
        sf, sb = workload.eager_softmax_bytes(model, mb, seq_len, e)
        for g in workload.eager_attention_gemms(model, mb, seq_len):
            ops.append(Op(g.name, "gemm", count=g.count / L, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1,
                          kernels_bwd=2, recompute=frozenset({"selective"})))
        ops.append(Op("softmax", "elementwise", bytes_fwd=sf.nbytes / L, bytes_bwd=sb.nbytes / L,
                      kernels_fwd=float(sf.kernels) / L, kernels_bwd=float(sb.kernels) / L,
                      saved=core, recompute=frozenset({"selective"})))
    lf, lb = workload.layer_elementwise(model, mb, seq_len, e, knobs.compiled)
    norms = model.norm_params_per_layer()
    ops.append(Op("norms_residual_activation", "elementwise", bytes_fwd=lf.nbytes / L, bytes_bwd=lb.nbytes / L,
                  kernels_fwd=float(lf.kernels) / L, kernels_bwd=float(lb.kernels) / L,
                  saved=tokens * e * (2 * h + up), params=norms))
    layer = Block("layer", tuple(ops), L, tokens * h * e)

    outside = [Op(g.name, "gemm", count=g.count, m=g.m, n=g.n, k=g.k, batch=g.batch, kernels_fwd=1, kernels_bwd=2)
               for g in workload.head_gemms(model, mb, seq_len)]
    lsf, lsb = workload.loss_bytes(model, mb, seq_len, e, knobs.compiled)
    emf, emb = workload.embedding_bytes(model, mb, seq_len, e)
    outside.append(Op("loss", "elementwise", bytes_fwd=lsf.nbytes, bytes_bwd=lsb.nbytes,
                      kernels_fwd=float(lsf.kernels), kernels_bwd=float(lsb.kernels)))
    # embedding output and the final norm's input stay for backward
    outside.append(Op("embedding", "elementwise", bytes_fwd=emf.nbytes, bytes_bwd=emb.nbytes,
                      kernels_fwd=float(emf.kernels), kernels_bwd=float(emb.kernels), saved=tokens * h * e * 2))
    logits = memory.logits_bytes(model, seq_len, mb, knobs.precision, knobs.compiled)
    return Graph((layer,), tuple(outside), logits)


def _with_saved(op: Op, saved) -> Op:
    from dataclasses import replace

    return replace(op, saved=saved)


TRANSFORMER = register(Family(name="transformer", spec_cls=ModelSpec, families=TRANSFORMER_FAMILIES, graph=graph))
