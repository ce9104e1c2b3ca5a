"""What a ``torch.compile``\\ d step of Hugging Face transformers' modules saves for backward: bytes
per token of one layer and of the ops around the layers, as Inductor's partitioner chooses them.

Under ``torch.compile`` AOTAutograd traces forward and backward into one joint graph, decomposes it
with Inductor's decomposition table (``layer_norm`` and ``log_softmax`` become their elementwise
ops and reductions) and Inductor's ``min_cut_rematerialization_partition`` decides what the forward
saves and what the backward recomputes: chains of cheap elementwise ops are recomputed from what
they read, matmul outputs, small reductions and random masks are saved. That is not the textbook count of fused stacks
(:func:`simulator.model.workload.layer_activation_bytes_per_token`, Korthikanti et al. 2022): the
modules still run an fp32 residual stream, an fp32 RMSNorm, ``repeat_kv`` and a KV cache, and the
partitioner keeps what they produce. The rules below are what ``calibration/hf_compiled_saved.py``
traces (transformers 5.17, PyTorch 2.13, CUDA's autocast policy; the saved set of a real
Inductor-compiled step to the byte) for GPT-NeoX (Pythia), Llama, Qwen2 and GPT-2, in bf16 under
autocast and in fp32, with SDPA and (Llama) eager attention; the saved set of 1- and 2-layer
models gives the per-layer and the outside terms exactly.
``e`` is the bytes of an activation element: 2 under autocast over fp32 weights, 4 in fp32/tf32.

Per layer:

* The residual stream the norms read, fp32 (:data:`simulator.model.hf_eager.STREAM`): each
  pre-norm's input (two; one where both norms read the same tensor, GPT-NeoX's parallel residual).
* Each norm's rstd, 4 bytes a row (LayerNorm's mean is recomputed from its input; norms reading
  one tensor, GPT-NeoX's parallel residual, share it), and its output as the projections read it
  (e bytes: autocast's casts of it are one tensor once compiled, CSE).
* The attention's inputs. Rotary (or QK-norm) models give SDPA new Q, K and V tensors, K and V
  repeated to the query heads by ``repeat_kv`` under GQA: 3 e q. Without rotation (GPT-2) SDPA's
  Q is a view of the projection output, which stays whole, e (q + 2 kv), and K and V are the
  copies the KV cache's update makes (``DynamicLayer.update``'s ``torch.cat``): 2 e kv (decoders).
  Eager attention's matmuls save Q, K and V as they read them (3 e q) and the s x s softmax
  probabilities as :func:`simulator.model.hf_eager.attention_saved` counts them.
* SDPA's output and fp32 log-sum-exp (e q + 4 bytes per head) and the attention output as the
  output projection reads it (e q). The two are one storage where the kernel writes [b, s, heads,
  d] (Llama's Q, a transposed view of its projection, traced so); where it writes [b, heads, s, d]
  (GPT-NeoX's rotated Q, traced so) ``transpose(1, 2).contiguous()`` copies it. Counted apart, as
  :mod:`simulator.model.hf_eager` counts them: erring towards more memory.
* The MLP: SwiGLU's gate and up outputs and their product (3 e f); any other activation (GPT-2's
  eager ``gelu_new`` too: its fp32 ``tanh`` is recomputed) its input and its output (2 e f).
* Hidden dropout with p > 0: a 1-byte mask after each of the two output projections.

Not saved, but held as long (:func:`cache_tangent_bytes_per_token`, counted by the transformer
family where the stack's model returns its outputs, ``Stack.returns_outputs``): a Hugging Face
decoder returns its KV cache, each layer's K and V an output of the compiled forward that
``loss.backward()`` gives no gradient, so autograd hands the compiled backward a zero-filled one of
each (2 e kv), live from the start of backward until backward passes that layer
(``calibration/hf_compiled_peak.py``: a real Inductor-compiled Pythia-410M step allocates 48 of
them before its backward graph runs).

Outside the layers: the final norm's fp32 input and rstd, the LM head's input (e h), the
embedding dropout's mask, the rotary tables, and the causal mask a compiled decoder's SDPA reads:
the 4-D [b, 1, s, s] mask (``masking_utils`` builds it when the step is traced), e bytes per score
(eager attention adds it to the scores and saves none of it).

What is not traced keeps the eager count where it is larger (post-norms, QK-norm) and errs
towards more memory elsewhere (a GQA model without rotation repeats nothing).
Units: bytes per token (per layer unless named otherwise).
"""

from __future__ import annotations

from .hf_eager import (
    STREAM,
    attention_saved,
    dropout_of,
    embedding_saved_bytes_per_token,
    norm_saved,
)
from .workload import act_bytes

#: Bytes per row of one norm's saved statistics: its fp32 rstd (LayerNorm's mean is recomputed once
#: Inductor decomposes ``native_layer_norm``).
NORM_STATS = 4.0


def layer_saved_bytes_per_token(model, seq_len: int, precision: str, attention: str,
                                dropout: tuple[float, float] | None = None) -> tuple[float, float]:
    """(all, s x s part) bytes per token one compiled Hugging Face layer saves for backward under
    ``precision`` (bf16/fp16: torch.autocast over fp32 weights; fp32/tf32: none) and ``attention``
    (sdpa, eager); see the module notes for each term and its trace."""
    e = float(act_bytes(precision))
    h = model.hidden / getattr(model, "seq_shards", 1)
    q, kv, f = model.q_dim, model.kv_dim, model.ffn_hidden
    norms = getattr(model, "norms_per_layer", 2)
    pre_norms = min(norms, 2)
    streams = 1 if (model.parallel_residual or norms == 1) else 2
    total = streams * (STREAM * h + NORM_STATS) + pre_norms * e * h
    # post-norms (Gemma 2/3) on the half branch outputs: untraced compiled, the eager count
    total += max(norms - 2, 0) * norm_saved(model, h, half_input=True)
    new_qk = model.pos_embedding == "rotary" or getattr(model, "qk_norm", "none") != "none"
    core = 0.0
    if attention == "sdpa":
        if new_qk:
            total += 3 * e * q
        else:
            total += e * (q + 2 * kv) + (2 * e * kv if model.kind == "decoder" else 0.0)
        total += e * q + 4.0 * model.n_heads
    else:
        _, core = attention_saved(model, seq_len, precision, attention, dropout)
        total += 3 * e * q + core
    if getattr(model, "qk_norm", "none") != "none":  # untraced compiled: the eager QK-norm terms
        total += 2 * STREAM * (q + kv) + 4.0 * (model.n_heads + model.kv_heads)
    total += e * q  # attention output, as the output projection reads it
    total += (3 if model.gated_mlp else 2) * e * f
    if (dropout if dropout is not None else dropout_of(model))[0] > 0:
        total += 2.0 * h
    return total, core


def cache_tangent_bytes_per_token(model, precision: str) -> float:
    """Bytes per token per layer of the zero-filled gradients a compiled Hugging Face decoder's
    backward receives for the K and V its KV cache returns (2 e kv; encoders return no cache),
    held like a saved activation of that layer:
    AOTAutograd's backward takes a gradient for every output that requires one, and autograd
    materialises the ones ``loss.backward()`` leaves undefined. Measured in real Inductor-compiled
    steps on the CPU (``calibration/hf_compiled_peak.py``)."""
    e = float(act_bytes(precision))
    return 2 * e * model.kv_dim if model.kind == "decoder" else 0.0


def outside_saved_bytes_per_token(model, seq_len: int, precision: str, attention: str,
                                  dropout: tuple[float, float] | None = None) -> float:
    """Bytes per token a compiled Hugging Face step saves outside its layers (module notes): the
    final norm's fp32 input and rstd, the LM head's input, the embedding dropout's mask, the
    rotary tables and a compiled decoder's SDPA causal mask (e bytes x s per token)."""
    e = float(act_bytes(precision))
    h = model.hidden / getattr(model, "seq_shards", 1)
    out = STREAM * h + e * h
    if getattr(model, "final_norm", True):
        out += NORM_STATS
    out += embedding_saved_bytes_per_token(model, dropout)
    if attention == "sdpa" and model.kind == "decoder":
        out += e * seq_len
    return out
