"""What Hugging Face transformers' eager modules save for backward: bytes per token of one layer
and of the ops around the layers, derived from what PyTorch autograd keeps of each op they run;
and what they move under torch.autocast beyond the textbook count of a layer's elementwise work
(:func:`autocast_elementwise`: the casts, fp32 norms, residual adds and rotary as they run).

The stack decides which implementation runs (``simulator/data/stacks.yaml`` field ``saves``): the
Hugging Face Trainer (and a plain loop over ``AutoModelForCausalLM``) runs these eager modules;
fused stacks (llm-foundry, Megatron-LM, torchtitan, flash-attn, llm.c) keep the textbook count
of :func:`simulator.model.workload.layer_activation_bytes_per_token` (Korthikanti et al. 2022). Under
``torch.compile`` AOTAutograd's partitioner re-derives what to save (elementwise chains are
recomputed in backward): :mod:`simulator.model.hf_compiled` counts what it keeps of these modules.

The rules (huggingface/transformers ``src/transformers``; PyTorch ``torch.autocast`` CUDA op
lists; autograd derivatives in ``tools/autograd/derivatives.yaml``), for bf16/fp16 mixed precision
with fp32 weights under ``torch.autocast`` (``e`` = 2) and for fp32/tf32 (no autocast, ``e`` = 4):

* The residual stream is fp32 in both: the token embedding is no autocast op, and each residual
  add of a half branch output to the fp32 stream promotes to fp32 (``LlamaDecoderLayer.forward``
  ``hidden_states = residual + hidden_states``).
* LayerNorm (``nn.LayerNorm``): autocast runs ``layer_norm`` in fp32; it saves its fp32 input and
  the per-row mean and rstd (8 bytes per token) and writes an fp32 output.
* RMSNorm (``LlamaRMSNorm.forward``: ``hidden_states.to(torch.float32)``, ``pow(2).mean``,
  ``* torch.rsqrt(variance + eps)``, ``self.weight * hidden_states.to(input_dtype)``): ``pow`` and
  the ``mul`` save the fp32 input, ``rsqrt`` its 4-byte result per row, the weight ``mul`` the
  normalized fp32 tensor: 8 bytes per element + 4 per row; fp32 output. On a half input (QK-norm,
  Gemma's post-norms) the fp32 copy and the normalized fp32 tensor: 8 per element + 4 per row
  (Gemma's ``_norm(x.float()) * (1.0 + weight.float())``; Llama's keeps 4 + 2, the larger is used).
* Linear layers (``nn.Linear``; GPT-2's ``Conv1D`` = ``torch.addmm``) save their input. Autocast
  casts an fp32 input to half for each call and caches only casts of leaf weights, so each
  projection that reads an fp32 norm output keeps its own half copy (Llama's separate
  ``q_proj``/``k_proj``/``v_proj``: three; ``gate_proj``/``up_proj``: two). Without autocast the
  projections share the one fp32 tensor. The weights' half copies are
  :func:`simulator.physics.memory.autocast_weight_copies`, not activations.
* Rotary embeddings (``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``): cos/sin come
  out in the dtype of the fp32 embeddings (``LlamaRotaryEmbedding.forward``: ``cos.to(x.dtype)``), so
  the rotated Q and K are fp32; the ``mul`` saves cos and sin (shared by all layers), not Q. The
  attention then casts the rotated Q and K to half (autocast ``scaled_dot_product_attention`` /
  ``matmul``) and saves those copies; the projection outputs of Q and K are freed. A partial
  rotation (GPT-NeoX ``rotary_pct``) concatenates the rotated and passed-through dims into a new
  tensor, while V stays a view of the fused QKV output, which keeps that whole output alive.
* SDPA (``integrations/sdpa_attention.py``; fused kernels) saves Q, K, V, its output and the fp32
  log-sum-exp per head; GQA passes ``enable_gqa`` (K and V are not repeated). The output's
  ``transpose(1, 2).contiguous()`` feeds the output projection, which saves it: counted as its
  own tensor (it is a view of the kernel's output where the kernel writes [b, s, h, d]; counting
  it apart errs towards more memory).
* Eager attention (``eager_attention_forward``): ``matmul`` under autocast saves half copies of Q
  and of K (repeated to the query heads by ``repeat_kv``), the fp32 softmax output is saved by
  ``softmax`` and its half copy by the second ``matmul`` with V (repeated): 6 bytes per score.
  GPT-2 (``attn_weights.type(value.dtype)`` then ``attn_dropout``): the fp32 softmax output, the
  dropout's 1-byte mask and its half output: 7 bytes per score. The 4-D fp32 causal mask
  [b, 1, s, s] is built once per step (``masking_utils``) and shared by the layers.
* MLP activations: ``silu``/``gelu``/``relu`` save one tensor (input or output); SwiGLU
  (``down_proj(act_fn(gate_proj(x)) * up_proj(x))``) also keeps the activation's output and the up
  projection's for the product's ``mul``. GPT-2's ``gelu_new`` (``NewGELUActivation``:
  ``0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))``)
  is six eager ops: autocast runs ``pow`` in fp32 (saves an fp32 copy of the input), ``tanh``
  saves its fp32 output, the last ``mul`` saves ``0.5 * input`` (half) and ``1.0 + tanh`` (fp32),
  and its fp32 output is cast again for ``c_proj``: 4 + 4 + 2 + 4 = 14 bytes per element under
  autocast, 4 x 4 = 16 in fp32.
* Dropout with p > 0 (``nn.Dropout``, CUDA ``native_dropout``) saves a 1-byte mask; with p = 0 it
  returns its input and saves nothing. The configs' defaults: :data:`HF_DROPOUT`.
* The loss (``loss/loss_utils.py`` ``ForCausalLMLoss``: ``logits.float()``, then
  ``F.cross_entropy``) is the stack's ``loss: upcast`` (:meth:`simulator.strategy.stacks.Stack.loss_bytes_per_logit`).

Units: bytes per token (per sample for the mask), per layer unless named otherwise.
"""

from __future__ import annotations

from ..core.vocab import MIXED_PRECISIONS

#: (hidden/residual dropout, attention-probability dropout) probabilities of a Hugging Face model
#: built with ``from_config`` from its family's config defaults; families not listed have none.
#: GPT2Config resid_pdrop = embd_pdrop = attn_pdrop = 0.1 (configuration_gpt2.py, and every gpt2*
#: config.json); BertConfig / RobertaConfig hidden_dropout_prob = attention_probs_dropout_prob = 0.1;
#: OPTConfig dropout = 0.1, attention_dropout = 0.0. GPT-NeoX (Pythia), Llama, Mistral, Qwen2/3,
#: Gemma, Phi-3, OLMo, Falcon, BLOOM, StableLM, MPT, ViT: 0.0 in their configs.
HF_DROPOUT: dict[str, tuple[float, float]] = {
    "gpt2": (0.1, 0.1), "bert": (0.1, 0.1), "roberta": (0.1, 0.1), "opt": (0.1, 0.0),
}
#: Families whose attention input is one fused QKV projection (GPT2Attention ``c_attn``,
#: GPTNeoXAttention ``query_key_value``, FalconAttention / BloomAttention ``query_key_value``,
#: Phi3Attention ``qkv_proj``, MptAttention ``Wqkv``); the others have q_proj, k_proj, v_proj.
FUSED_QKV: frozenset[str] = frozenset({"gpt2", "gpt_neox", "falcon", "bloom", "phi3", "mpt"})
#: Families whose gated MLP reads its input once (Phi3MLP ``gate_up_proj``); the other gated MLPs
#: have gate_proj and up_proj.
FUSED_GATE_UP: frozenset[str] = frozenset({"phi3"})
#: Families whose ``gelu_tanh`` is transformers' eager ``NewGELUActivation`` (``gelu_new``: GPT2Config
#: activation_function); Gemma's ``gelu_pytorch_tanh`` is one ``F.gelu(approximate='tanh')`` and
#: BLOOM's ``BloomGelu`` a custom autograd function saving its input.
GELU_NEW: frozenset[str] = frozenset({"gpt2"})

#: Bytes per element of the residual stream and of norm arithmetic: fp32 both under autocast over
#: fp32 weights and in fp32 training.
STREAM = 4.0
#: ``NewGELUActivation`` (``gelu_new``) as the eager ops it is, per element of the MLP's width:
#: (forward bytes, backward bytes, forward kernels, backward kernels), with e the autocast half type's bytes.
#: Under torch.autocast, in Python's order: ``0.5 * input`` (half: 2e); ``torch.pow(input, 3.0)`` on
#: autocast's fp32 list (the input cast up, e + 4, then pow, 8); ``0.044715 *`` (8); ``input +`` (half plus
#: fp32 into fp32: e + 8); ``sqrt(2 / pi) *`` (8); ``tanh`` (8); ``1.0 +`` (8); the product of the half and
#: the fp32 factors (e + 8); ``c_proj``'s addmm casts the fp32 result back (4 + e): 6e + 64 bytes, 10
#: kernels. Backward, autograd's nodes in reverse: the cast (e + 4); the product's two gradients, the half
#: one cast down (12 + (4 + e) + (8 + e)); tanh_backward (12); the two scalar products (8 + 8); the mixed add's
#: half gradient cast down (4 + e); pow_backward (pow, times 3, times the gradient: 28, 3 kernels); the cast
#: up's (4 + e); ``0.5 *`` (2e); the input's three gradients summed (2 x 3e): 13e + 92 bytes, 15 kernels.
#: Without autocast (fp32/tf32, e = 4): no casts, 72 bytes and 8 kernels forward, 112 and 11 backward.
#: Source: transformers src/transformers/activations.py NewGELUActivation.forward; PyTorch's CUDA
#: autocast op lists (pow: fp32).
GELU_NEW_AUTOCAST = ((6.0, 64.0), (13.0, 92.0), 10.0, 15.0)  # ((x e, + bytes) fwd, (x e, + bytes) bwd, kernels)
GELU_NEW_FP32 = (72.0, 112.0, 8.0, 11.0)


def dropout_of(model) -> tuple[float, float]:
    """(hidden, attention) dropout probabilities of the model's Hugging Face config defaults."""
    return HF_DROPOUT.get(model.family, (0.0, 0.0))


def norm_saved(model, width: float, half_input: bool = False) -> float:
    """Bytes one eager norm over ``width`` elements saves per token (see the module notes):
    LayerNorm the fp32 input and 8 bytes of row statistics; RMSNorm the fp32 input (or an fp32
    copy of a half input), the normalized fp32 tensor and 4 bytes of rsqrt per row."""
    if model.norm == "layernorm" and not half_input:
        return STREAM * width + 8.0
    return 2 * STREAM * width + 4.0


def attention_saved(model, seq_len: int, precision: str, attention: str,
                    dropout: tuple[float, float] | None = None) -> tuple[float, float]:
    """(all, s x s part) bytes per token the attention of one layer saves between the norm's
    output and the output projection's input (both excluded): Q, K, V as the kernel keeps them,
    QK-norm, SDPA's output and log-sum-exp, or eager attention's Q/K/V copies and probabilities."""
    auto = precision in MIXED_PRECISIONS
    e = 2.0 if auto else 4.0
    q, kv = model.q_dim, model.kv_dim
    heads = model.n_heads
    fused = model.family in FUSED_QKV
    rotary = model.pos_embedding == "rotary"
    qk_norm = getattr(model, "qk_norm", "none") != "none"
    p_attn = (dropout if dropout is not None else dropout_of(model))[1]
    out = 0.0
    # QK-norm on the half projection outputs (autocast) or fp32 ones: fp32 copy + normalized fp32
    if qk_norm:
        out += 2 * STREAM * (q + kv) + 4.0 * (heads + model.kv_heads)
    # Q and K as the attention receives them: rotated or normalized (new fp32 tensors), else the
    # projection outputs themselves
    qk_new = rotary or qk_norm
    # what stays of the projection outputs: a fused QKV output whole while V (a view of it) is
    # saved; V alone where Q and K were replaced; all three otherwise
    proj_kept = e * (q + 2 * kv) if (fused or not qk_new) else e * kv
    if attention == "sdpa":
        # the kernel's Q and K: half copies of the new fp32 tensors under autocast, or those
        # tensors themselves in fp32; its output and fp32 log-sum-exp per head
        qk_kernel = e * (q + kv) if qk_new else 0.0
        return out + proj_kept + qk_kernel + e * q + 4.0 * heads, 0.0
    # eager: matmul(Q, K^T) saves Q and K repeated to the query heads (half copies under autocast
    # of the new fp32 tensors, the tensors in fp32; repeat_kv's copy under GQA), matmul(P, V) saves
    # P and V (repeat_kv's copy under GQA)
    rep = q != kv
    qk_copy = 2 * e * q if qk_new else (e * q if rep else 0.0)
    v_copy = e * q if rep else 0.0
    if p_attn > 0:  # fp32 softmax output, 1-byte dropout mask, half dropout output
        per_score = STREAM + 1.0 + e if auto else STREAM + 1.0 + STREAM
    else:  # fp32 softmax output and its half copy for the second matmul (fp32: the output alone)
        per_score = STREAM + e if auto else STREAM
    if getattr(model, "attn_softcap", None):
        per_score += e  # tanh output of soft-capping (Gemma 2)
    core = heads * seq_len * per_score
    return out + proj_kept + qk_copy + v_copy + core, core


def mlp_saved(model, precision: str) -> float:
    """Bytes per token one layer's MLP saves between its up projection's input and its down
    projection's input (both included): up/gate outputs, activation tensors, down input."""
    auto = precision in MIXED_PRECISIONS
    e = 2.0 if auto else 4.0
    f = model.ffn_hidden
    act = model.mlp_activation
    if model.gated_mlp:  # act(gate) saves gate out; act * up saves both; down saves the product
        return 4 * e * f
    if act == "gelu_tanh" and model.family in GELU_NEW:
        # pow's fp32 input copy, tanh out, 0.5*x, 1+tanh; down input (half copy of the fp32 output)
        return (14.0 + 2.0) * f if auto else (16.0 + 4.0) * f
    if act == "relu":  # relu saves its output, which is the down projection's input
        return e * f
    return 2 * e * f  # activation input (up output) and down input


def layer_saved_bytes_per_token(model, seq_len: int, precision: str, attention: str,
                                dropout: tuple[float, float] | None = None) -> tuple[float, float]:
    """(all, s x s part) bytes per token one Hugging Face eager layer saves for backward under
    ``precision`` (bf16/fp16: torch.autocast over fp32 weights; fp32/tf32: no autocast) and
    ``attention`` (sdpa, eager); see the module notes for each term and its source."""
    auto = precision in MIXED_PRECISIONS
    e = 2.0 if auto else 4.0
    h = model.hidden / getattr(model, "seq_shards", 1)
    q = model.q_dim
    p_hidden = (dropout if dropout is not None else dropout_of(model))[0]
    norms = getattr(model, "norms_per_layer", 2)
    shared_input = model.parallel_residual or norms == 1  # both norms read the same stream tensor
    fused = model.family in FUSED_QKV
    up_reads = 1 if (not model.gated_mlp or model.family in FUSED_GATE_UP) else 2
    qkv_reads = 1 if fused else 3
    # norms before attention and MLP: inputs (fp32 stream) and statistics, once if shared
    n1 = norm_saved(model, h)
    total = n1 if norms == 1 else (2 * n1 - (STREAM * h if shared_input else 0.0))
    # post-norms (Gemma 2/3) on the half branch outputs
    total += max(norms - 2, 0) * norm_saved(model, h, half_input=True)
    # projection inputs: a half copy per projection reading an fp32 norm output (autocast), or
    # the one fp32 norm output shared by all of them; RMSNorm's output is a tensor of its own
    reads = qkv_reads + up_reads
    if norms == 1 and not auto:
        total += STREAM * h
    elif auto:
        total += e * h * reads
    else:
        total += STREAM * h * 2
    attn, core = attention_saved(model, seq_len, precision, attention, dropout)
    total += attn + e * q  # output projection's input (the attention output, transposed copy)
    total += mlp_saved(model, precision)
    if p_hidden > 0:  # 1-byte masks after the attention and MLP output projections
        total += 2.0 * h
    return total, core


def outside_saved_bytes_per_token(model, seq_len: int, precision: str, attention: str,
                                  dropout: tuple[float, float] | None = None) -> float:
    """Bytes per token saved outside the layers: the final norm (fp32 input and statistics), the
    LM head's input (its half copy under autocast, the fp32 norm output otherwise), the embedding
    dropout's mask, cos/sin of rotary embeddings (fp32, shared by the layers) and, for eager
    attention in a decoder, the fp32 4-D causal mask (s x 4 bytes per token)."""
    auto = precision in MIXED_PRECISIONS
    h = model.hidden / getattr(model, "seq_shards", 1)
    out = 0.0
    if getattr(model, "final_norm", True):
        out += norm_saved(model, h) + (2.0 if auto else STREAM) * h
    else:
        out += STREAM * h
    out += embedding_saved_bytes_per_token(model, dropout)
    if attention == "eager" and model.kind == "decoder":
        out += STREAM * seq_len
    return out


def embedding_saved_bytes_per_token(model, dropout: tuple[float, float] | None = None) -> float:
    """Bytes per token saved around the embedding, eager or compiled: the embedding dropout's
    1-byte mask (p > 0) and the fp32 cos/sin tables of rotary embeddings (shared by the layers)."""
    h = model.hidden / getattr(model, "seq_shards", 1)
    out = 1.0 * h if (dropout if dropout is not None else dropout_of(model))[0] > 0 else 0.0
    if model.pos_embedding == "rotary":
        out += 2 * STREAM * model.head_dim
    return out


def layer_input_bytes_per_token(model) -> float:
    """Bytes per token a checkpointed layer keeps: its fp32 residual-stream input
    (``GradientCheckpointingLayer`` re-runs the layer from ``hidden_states``)."""
    return STREAM * model.hidden / getattr(model, "seq_shards", 1)


#: Bytes per element of the cos/sin tables Hugging Face's rotary embeddings multiply Q and K by:
#: fp32, the dtype of the fp32 embeddings (``LlamaRotaryEmbedding.forward``: ``cos.to(x.dtype)``), so
#: under torch.autocast every rotary op past the first multiply writes fp32.
ROTARY_TABLE = 4.0
#: Eager ops of ``LlamaRMSNorm.forward`` on the fp32 stream, (fp32 passes over the normalized
#: elements, kernels): ``pow(2)`` reads and writes, ``mean`` reads, ``x * rsqrt(...)`` reads and
#: writes, ``self.weight * x`` reads and writes (7 passes; ``.to(float32)`` and
#: ``.to(input_dtype)`` are no-ops on fp32), with ``+ eps`` and ``rsqrt`` over one value per row.
RMSNORM_EAGER = (7.0, 6.0)


def autocast_elementwise(model, e: int, fused_projections: bool = False,
                         fused_rmsnorm: bool = False) -> tuple[float, float, float, float]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) per token that one layer
    of Hugging Face's eager modules moves under torch.autocast (``e`` = 2) beyond
    :func:`simulator.model.workload.layer_elementwise`'s eager count with fp32 norms (two norms,
    each an fp32 output that one projection casts back; backward twice the forward):

    * Casts: autocast casts the fp32 norm output for each projection that reads it (its cast
      cache holds leaf weights only; see the module notes): read 4 + write e per element, one
      kernel, for each read beyond the two counted (Llama's q/k/v and gate/up: three more).
      Backward casts each gradient back (e + 4) and autograd sums the fp32 gradients of the norm
      output's readers (read 8, write 4): two kernels.
    * Norms: LayerNorm reads and writes the fp32 stream (8 bytes per element where the count has
      2e + 2); ``LlamaRMSNorm`` is :data:`RMSNORM_EAGER`'s ops; backward twice that, as counted.
    * Residual adds: each add of a half branch output to the fp32 stream reads e + 4 and writes 4
      bytes per element (counted as 3e); GPT-NeoX's parallel residual adds the two half branches
      first (3e) and that sum to the stream. Backward, the branch's gradient is cast to half (4 + e,
      where the count has its 2 x 3e).
    * Rotary: :func:`rotary_autocast_extra`, counted with the rotary op (broadcast operands).

    ``fused_projections``: modules with one QKV and one gate/up projection whatever the family
    (no casts beyond the two counted); ``fused_rmsnorm``: an RMSNorm of one fused kernel each way
    (``nn.RMSNorm``), moving what LayerNorm moves (:class:`simulator.strategy.stacks.Stack`
    ``projections`` and ``rmsnorm``).

    Units: bytes per token of one layer (the GPU's shard of heads under tensor parallelism)."""
    h = model.hidden / getattr(model, "seq_shards", 1)
    norms = min(getattr(model, "norms_per_layer", 2), 2)
    reads = (1 if model.family in FUSED_QKV or fused_projections else 3) + \
        (1 if (not model.gated_mlp or model.family in FUSED_GATE_UP or fused_projections) else 2)
    casts = max(reads - 2, 0)
    fwd, bwd = casts * (STREAM + e) * h, casts * (STREAM + e + 3 * STREAM) * h
    k_fwd, k_bwd = float(casts), 2.0 * casts
    counted_norm = 2 * e + 2.0  # layer_elementwise: 2h elements x e and the fp32 output's 2 bytes
    passes, k = RMSNORM_EAGER if model.norm == "rmsnorm" and not fused_rmsnorm else (2.0, 1.0)
    fwd += norms * (passes * STREAM - counted_norm) * h
    bwd += 2 * norms * (passes * STREAM - counted_norm) * h
    k_fwd, k_bwd = k_fwd + norms * (k - 1), k_bwd + 2 * norms * (k - 1)
    stream_adds = 1 if model.parallel_residual else 2
    fwd += stream_adds * (e + 2 * STREAM - 3 * e) * h
    bwd += stream_adds * (STREAM + e - 2 * 3 * e) * h
    return fwd, bwd, k_fwd, k_bwd


def rotary_autocast_extra(model, e: int, table: float = ROTARY_TABLE) -> tuple[float, float, float, float]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) per token that one layer's
    rotary embedding (``apply_rotary_pos_emb``) moves under torch.autocast beyond
    :func:`simulator.model.workload.rotary_elements`' eager count, over the rotated dims R of Q and K
    with :data:`ROTARY_TABLE` tables t: ``x * cos`` and ``rotate_half(x) * sin`` read e and write t,
    ``neg`` and ``cat`` of ``rotate_half`` move e (R/2 + R/2, R + R), the add reads 2t and writes t:
    (5e + 5t) R; a partial rotation's ``cat`` with the passed-through dims reads t R + e (d - R) and
    writes t d; then the attention casts the fp32 Q and K to half (read t, write e per element, one
    kernel each). The count has (10 R + 2 d partial) x e. Backward moves about as much again beyond
    twice the count (the multiplies' fp32 gradients cast to half, ``slice_backward``'s zeroed copies):
    once the forward's excess. Zero without rotary. ``table``: bytes per element of the tables; e where
    the stack casts them to the half type first (:class:`simulator.strategy.stacks.Stack` ``rotary_tables``:
    every op writes half, Q and K need no cast back, and the excess is the four casts of the
    sequence-long tables, nothing per token). Units: bytes per token of one layer."""
    if model.pos_embedding != "rotary":
        return 0.0, 0.0, 0.0, 0.0
    if table <= e:
        return 0.0, 0.0, 4.0, 0.0
    t = table
    rot = getattr(model, "rotary_pct", 1.0)
    partial = rot < 1.0
    per = rot * (5 * e + 5 * t) + ((t * rot + e * (1 - rot) + t) if partial else 0.0) + (t + e)
    counted = (10.0 * rot + (2.0 if partial else 0.0)) * e
    extra = (model.q_dim + model.kv_dim) * (per - counted)
    return extra, extra, 2.0, 2.0


def gelu_new_ops(precision: str, e: int) -> tuple[float, float, float, float]:
    """(forward bytes, backward bytes, forward kernels, backward kernels) per element of the MLP width
    of Hugging Face's eager ``gelu_new`` under ``precision`` with ``e`` bytes per half activation
    element (:data:`GELU_NEW_AUTOCAST`, :data:`GELU_NEW_FP32`)."""
    if precision in MIXED_PRECISIONS:
        (af, bf), (ab, bb), kf, kb = GELU_NEW_AUTOCAST
        return af * e + bf, ab * e + bb, kf, kb
    return GELU_NEW_FP32
