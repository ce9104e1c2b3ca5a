"""The transformer's work in one training micro-batch: GEMM shapes, attention FLOPs,
bandwidth-bound bytes and saved activations (``families/transformer.py`` turns them into
operations), and what every family shares (bytes per activation, the cross-entropy loss,
autocast's weight casts).

Pure functions of the model (a ``models.ModelSpec`` or its tensor-parallel ``parallel.ShardView``),
sequence length, micro-batch size (numpy array, vectorized) and the execution knobs. Units:
elements for shapes, FLOPs, bytes. No timing here (see compute), and nothing else reads a
transformer's fields: compute and memory read operations.

Conventions (docs/architecture.md, physics 1): a GEMM (m x k) @ (k x n) costs 2*m*n*k FLOPs; its
backward is two GEMMs of the same cost (input gradient and weight gradient). Attention scores
and values cost 2*b*s^2*h each forward; fused causal kernels skip about half; FlashAttention's
backward executes 2.5x its forward (it recomputes the scores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.vocab import MIXED_PRECISIONS


@dataclass(frozen=True)
class Gemm:
    """A forward GEMM repeated ``count`` times per micro-batch; ``batch`` for batched GEMMs."""

    name: str
    m: np.ndarray
    n: float
    k: float
    count: int
    batch: np.ndarray | float = 1.0


@dataclass(frozen=True)
class MemOps:
    """Bandwidth-bound work of one pass: total bytes (array over micro-batch) and kernel count."""

    nbytes: np.ndarray
    kernels: np.ndarray | float


def act_bytes(precision: str) -> int:
    """Bytes per activation element: 2 under bf16/fp16/fp8 mixed precision, else 4 (fp8 keeps its
    activations in bf16; only the linear layers' GEMM inputs are cast to FP8)."""
    return 2 if precision in MIXED_PRECISIONS else 4


def is_causal(model) -> bool:
    return model.kind == "decoder"


def seq_shards(model) -> int:
    """Shards of the hidden-sized activations (norms, residuals): the tensor-parallel degree
    under Megatron sequence parallelism (a ``parallel.ShardView``), else 1."""
    return getattr(model, "seq_shards", 1)


def layer_gemms(model, tokens: np.ndarray) -> list[Gemm]:
    """Forward GEMMs of the transformer layers (all layers), m = tokens in the micro-batch.
    Under tensor parallelism (a ``parallel.ShardView``) QKV and MLP-up are column-parallel (n
    divided), the output projection and MLP-down row-parallel (k divided)."""
    h, f, L = model.hidden, model.ffn_hidden, model.n_layers
    up = 2 * f if model.gated_mlp else f
    q = model.q_dim
    return [
        Gemm("qkv", tokens, q + 2 * model.kv_dim, h, L),
        Gemm("attn_out", tokens, h, q, L),
        Gemm("mlp_up", tokens, up, h, L),
        Gemm("mlp_down", tokens, h, f, L),
    ]


def head_gemms(model, mb: np.ndarray, seq_len: int) -> list[Gemm]:
    """Forward GEMMs outside the layers: patch embedding, LM/MLM head, classifier."""
    h = model.hidden
    tokens = mb * seq_len
    out: list[Gemm] = []
    if model.family == "vit":
        patch_in = (model.num_channels or 3) * model.patch_size**2
        out.append(Gemm("patch_embed", mb * (seq_len - 1), h, patch_in, 1))
    if model.head == "lm":
        out.append(Gemm("logits", tokens, model.vocab_size, h, 1))
    elif model.head == "mlm":
        out.append(Gemm("mlm_dense", tokens, h, h, 1))
        out.append(Gemm("logits", tokens, model.vocab_size, h, 1))
    elif model.head == "classifier":
        out.append(Gemm("classifier", mb.astype(float), model.num_classes or 1, h, 1))
    return out


def logits_elements(model, mb: np.ndarray, seq_len: int) -> np.ndarray:
    """Number of logit elements per micro-batch (what the loss reads)."""
    if model.head in ("lm", "mlm"):
        return mb * seq_len * float(model.vocab_size)
    return mb * float(model.num_classes or 1)


def attention_span_fraction(seq_len: int, window: int | None) -> float:
    """Fraction of the s x s score matrix a causal kernel that skips masked blocks computes:
    1/2 for full causal attention; with a sliding window of w < s keys per query,
    (w*s - w^2/2) / s^2 (continuous count of the band; 1/2 again when w >= s)."""
    if window is None or window >= seq_len:
        return 0.5
    return (window * seq_len - 0.5 * window**2) / float(seq_len) ** 2


def attention_layer_weight(model, seq_len: int, fused: bool) -> float:
    """Layers' worth of full s x s attention executed: causal fused kernels skip the masked half
    and, in sliding-window layers, everything outside the window (FlashAttention-2
    ``window_size``, FlexAttention block masks); materialised (eager) attention computes the
    whole matrix and masks it afterwards, windows or not; encoders attend to everything."""
    L = model.n_layers
    if not (fused and is_causal(model)):
        return float(L)
    n_win = getattr(model, "n_window_layers", 0)
    window = getattr(model, "sliding_window", None)
    return (L - n_win) * 0.5 + n_win * attention_span_fraction(seq_len, window)


def attention_flops_fwd(model, mb: np.ndarray, seq_len: int, fused: bool) -> np.ndarray:
    """Executed forward FLOPs of attention scores + values, all layers: 2*s^2*(heads*head_dim)
    each per sample and layer, times :func:`attention_layer_weight` (fused causal skips half,
    and sliding-window layers skip what lies outside the window)."""
    return 4.0 * mb * seq_len**2 * model.q_dim * attention_layer_weight(model, seq_len, fused)


def eager_attention_gemms(model, mb: np.ndarray, seq_len: int) -> list[Gemm]:
    """Materialised attention (math backend): batched scores (s x d)@(d x s) and values."""
    d = model.head_dim
    batch = mb * float(model.n_heads)
    s = np.full_like(mb, seq_len, dtype=float)
    return [Gemm("scores", s, seq_len, d, model.n_layers, batch),
            Gemm("values", s, d, seq_len, model.n_layers, batch)]


#: Eager softmax under torch.autocast (softmax is on its fp32 list), Hugging Face's eager attention with fp32
#: weights: the scale runs in half (read and write e), then the attention mask, built in the weights' fp32, is
#: added to the half scores, which promotes them to fp32 (:func:`eager_mask_add_bytes`, a kernel of its own
#: class), the softmax runs in fp32 (read 4, write 4) and the probabilities are cast back for the values GEMM
#: (read 4, write e): 3e + 12 bytes per score and 3 kernels here (+ the mask add's e + 8 and 1 kernel: 4e + 20
#: in all). Backward: the gradient cast up (e + 4), the fp32 softmax gradient (read gradient and probabilities,
#: write one: 12), cast back (4 + e), mask and scale (2e + 2e): 6e + 20 bytes, 5 kernels. An H200 timed the
#: upcast softmax at 20 bytes per score in 1.66 ms (3.2 TB/s) against 0.41 ms for a bf16 one
#: (calibration/results/h200/microbench_shapes.csv)
AUTOCAST_SOFTMAX = ((3.0, 12.0, 3.0), (6.0, 20.0, 5.0))  # (passes of e bytes, fp32 bytes, kernels) fwd, bwd
#: fp32 softmax rows longer than the warp-persistent kernel takes (PyTorch's CUDA host_softmax_backward:
#: dim_size <= 1024 and dim_size x 4 bytes <= 4096): _softmax_backward_data first multiplies the gradient by
#: the probabilities in a kernel of its own (read 4 + 4, write 4), then reduces in cunn_SoftMaxBackwardSmem.
#: torch.profiler on an H200 (Pythia-160M eager under autocast, rows of 2048): 1.104 ms for that mul beside
#: 1.105 ms for the reduction per layer (calibration/results/h200/prof_p160m_eager_s2048_mb8.txt)
SOFTMAX_BWD_SPLIT_ROW, SOFTMAX_BWD_SPLIT_BYTES = 1024, 12.0
#: The mask add under autocast: read the half score (e) and the fp32 mask (4; [b, 1, s, s] broadcast over the
#: heads and re-read for each, larger than L2 at training sizes), write the fp32 sum (4); one kernel.
#: torch.profiler on an H200: 2.383 ms per layer for Pythia-160M's 8 x 12 x 2048^2 scores, 10 bytes each
#: (calibration/results/h200/prof_p160m_eager_s2048_mb8.txt, ``aten::add`` in ``elementwise_kernel<128, 4>``)
MASK_ADD_FP32_BYTES = 8.0


def eager_mask_add_bytes(model, mb: np.ndarray, seq_len: int, e: int) -> MemOps:
    """Forward bytes and kernels of eager attention's mask add under torch.autocast, all layers: half
    scores plus an fp32 mask broadcast over the heads, promoted to fp32 (:data:`MASK_ADD_FP32_BYTES`);
    its backward passes the gradient through (the cast back is in :data:`AUTOCAST_SOFTMAX`)."""
    elems = mb * float(model.n_heads) * seq_len**2 * model.n_layers
    return MemOps((e + MASK_ADD_FP32_BYTES) * elems, float(model.n_layers))


def eager_softmax_bytes(model, mb: np.ndarray, seq_len: int, e: int,
                        compiled: bool = False, upcast: bool = False) -> tuple[MemOps, MemOps]:
    """Forward and backward bytes and kernels over the s^2 scores, all layers. Eager: scale, mask
    and softmax each read and write the scores (6 passes, 3 kernels); backward, the softmax's
    gradient reads the gradient and the probabilities and writes one (3 passes), the mask's and
    the scale's each read and write one (2 + 2): 7 passes, 3 kernels. Soft-capped scores (Gemma 2:
    divide, tanh, multiply) add 6 passes and 3 kernels each way. Compiled (Inductor, or Megatron's
    fused scale-mask-softmax): 4 passes and 3 kernels forward, 3 and 2 backward, the counts the
    default GPU profiles were fitted with (Korthikanti et al.'s runs are the only compiled eager
    ones); a fused kernel reads and writes 2 and 3, which moves that fit's collective parameters to
    their bounds and is left for a refit with more tensor-parallel runs. ``upcast`` (eager under
    torch.autocast): :data:`AUTOCAST_SOFTMAX`, without the mask add (:func:`eager_mask_add_bytes`), with the
    backward's separate product over rows longer than :data:`SOFTMAX_BWD_SPLIT_ROW`."""
    elems = mb * float(model.n_heads) * seq_len**2 * model.n_layers
    L = model.n_layers
    cap = 6.0 if getattr(model, "attn_softcap", None) else 0.0
    kcap = 3.0 if cap else 0.0
    if upcast and not compiled:
        (pf, xf, kf), (pb, xb, kb) = AUTOCAST_SOFTMAX
        if seq_len > SOFTMAX_BWD_SPLIT_ROW:
            xb, kb = xb + SOFTMAX_BWD_SPLIT_BYTES, kb + 1.0
        return (MemOps(((pf + cap) * e + xf) * elems, (kf + kcap) * L),
                MemOps(((pb + cap) * e + xb) * elems, (kb + kcap) * L))
    (pf, kf), (pb, kb) = ((4.0, 3.0), (3.0, 2.0)) if compiled else ((6.0, 3.0), (7.0, 3.0))  # passes, kernels
    return (MemOps((pf + cap) * elems * e, (kf + kcap) * L),
            MemOps((pb + cap) * elems * e, (kb + kcap) * L))


def layer_activation_bytes_per_token(model, seq_len: int, e: int, attention: str) -> float:
    """Bytes one layer saves for backward per token (no dropout), after Korthikanti et al. 2022:
    attention block LN input, QKV input, Q/K/V, attention output; MLP block LN input, FC1
    input, FC1 output, activation output; eager attention adds the s x s softmax per head
    (a*s*e per token), fused SDPA only its fp32 log-sum-exp (4a). Q and the attention output
    are heads x head_dim wide (q), K and V kv wide. Each norm beyond two (Gemma 2/3) saves its
    input (h); one norm shared by attention and MLP (parallel attention) saves its input and
    output once, not twice (-2h); QK-norm saves Q and K before the norm too (q + kv). A sliding
    window saves nothing: fused kernels keep O(s) statistics either way, and materialised
    attention builds the full s x s matrix before masking it. Under tensor parallelism (a
    ``parallel.ShardView``) heads and f are the GPU's shard; the hidden-sized inputs of the norms
    and of QKV / FC1 are divided only with sequence parallelism (Korthikanti eq. 2-4)."""
    h, f = model.hidden / seq_shards(model), model.ffn_hidden
    kv, q = model.kv_dim, model.q_dim
    up = 2 * f if model.gated_mlp else f
    norms = getattr(model, "norms_per_layer", 2)
    attn = e * (h + h + (q + 2 * kv) + q)
    mlp = e * (h + h + up + f)
    extra = e * ((norms - 2) * h if norms >= 2 else -2 * h)
    if getattr(model, "qk_norm", "none") != "none":
        extra += e * (q + kv)
    core = eager_scores_bytes_per_token(model, seq_len, e) if attention == "eager" else 4.0 * model.n_heads
    return attn + mlp + extra + core


def eager_scores_bytes_per_token(model, seq_len: int, e: int) -> float:
    """Saved softmax probabilities of materialised attention per token: a*s elements at 4 bytes
    (fp32 softmax) plus the half copy under autocast (6 bytes), or e bytes in fp32 training;
    soft-capped scores (Gemma 2) also keep the tanh output (e bytes)."""
    cap = e if getattr(model, "attn_softcap", None) else 0
    return model.n_heads * seq_len * ((e + 4 if e == 2 else e) + cap)


def op_kept_bytes_per_token(model, e: int, attention: str) -> float:
    """Bytes one layer keeps per token under op-level selective checkpointing (torchtitan's
    'op' policy: outputs of matmuls and of the fused attention kernel are saved, everything
    else recomputed): the layer input, the Q/K/V, attention-output-projection, MLP up and down
    projection outputs, the attention output and SDPA's fp32 log-sum-exp. Eager attention's
    s x s scores and probabilities are recomputed. Q and the attention output are heads x
    head_dim wide (q); the hidden-sized tensors are the GPU's sequence shard under sequence
    parallelism."""
    h = model.hidden / seq_shards(model)
    kv, q = model.kv_dim, model.q_dim
    up = 2 * model.ffn_hidden if model.gated_mlp else model.ffn_hidden
    lse = 4.0 * model.n_heads if attention == "sdpa" else 0.0
    return e * (h + (q + 2 * kv) + h + q + up + h) + lse


#: torch.autocast runs layer_norm in fp32 under eager mixed precision: a norm writes 4-byte
#: outputs (+2 bytes) that the next linear casts back to half (read 4 + write 2): +8 bytes per
#: normalized element, and one cast kernel per norm.
FP32_NORM_EXTRA_BYTES = 8.0


#: Bytes and kernels of an elementwise op's backward over its forward's, where no op is counted
#: apart (:func:`layer_elementwise`): ASSUMPTION, each backward reads the output gradient and what
#: the forward saved and writes the input gradients, about two passes of the forward's tensors.
ELEMENTWISE_BWD_FACTOR = 2.0
#: Bytes of an eager MLP activation's backward over its forward's: one kernel (autograd's
#: ``gelu_backward``/``silu_backward``) reads the output gradient and the saved input and writes the
#: input gradient, 3 tensors where the forward moved 2.
ACTIVATION_BWD_BYTES = 1.5


def rotary_elements(rot: float, compiled: bool) -> tuple[float, int]:
    """(elements moved per element of Q or K, kernels per tensor) of rotary embeddings with a
    fraction ``rot`` of each head's dims rotated. Eager, as GPT-NeoX and Llama apply it (x*cos +
    rotate_half(x)*sin, rotate_half = cat(-x2, x1)) over the rotated dims R: neg (R/2 read + R/2
    written), cat (2R), two muls (2R each), add (3R): 10R, 5 kernels; a partial rotation (Pythia's
    25%) concatenates the rotated and the passed-through dims into a new tensor (read and write
    the whole head: 2 more per element, 1 kernel). On a 2-core CPU this eager rotary of Q and K
    took 1.5-7.6x the 4R that was counted before (Zen 5 EPYC, 2026-12-02). Compiled: the fused
    LN1+rotary kernel reads and writes the rotated dims (2R) and adds no kernel of its own."""
    if compiled:
        return 2.0 * rot, 0
    partial = rot < 1.0
    return 10.0 * rot + (2.0 if partial else 0.0), 5 + int(partial)


def mlp_elementwise_elements(f: float, gated: bool, compiled: bool) -> float:
    """Elements the MLP's activation (and, gated, the gate x up product) moves per token in
    :func:`layer_elementwise`, for an MLP ``f`` wide: eager SiLU/GELU reads and writes f (2f) and
    the product reads 2f and writes f (3f); compiled, one fused kernel reads 2f and writes f (3f),
    or reads and writes f (2f) without a gate."""
    if compiled:
        return 3.0 * f if gated else 2.0 * f
    return 5.0 * f if gated else 2.0 * f


def layer_elementwise(model, mb: np.ndarray, seq_len: int, e: int, compiled: bool,
                      fp32_norm: bool | None = None) -> tuple[MemOps, MemOps]:
    """Norms, residual adds, activation, rotary and layout copies of all layers (fwd, bwd).

    Eager: every op reads its inputs and writes its output (LN 2h, add 3h, GELU 2f or SwiGLU 5f,
    rotary :func:`rotary_elements` x (q+kv), output transpose copy 2q elements per token; q = heads x
    head_dim). Compiled (Inductor fusion): LN1+rotary, residual+LN2, activation and residual become
    4 kernels reading inputs once (2h + 2(q+kv) x rotated fraction, 4h, 2f or 3f, 3h). Backward
    moves :data:`ELEMENTWISE_BWD_FACTOR` times the forward's bytes in as many times its kernels.
    Eager: each norm beyond two (Gemma 2/3 post-norms) adds an LN pass and a kernel, one shared
    norm (parallel attention) removes one; QK-norm (Qwen3, Gemma 3, OLMo 2) normalizes Q and K:
    2(q+kv) and 2 kernels. Compiled, both fuse into the residual and rotary kernels, which read
    and write the same tensors anyway. Under tensor parallelism heads and f are the GPU's shard;
    norms and residuals (h) are divided only with sequence parallelism.
    ``fp32_norm``: eager norms write fp32 outputs (torch.autocast's layer_norm; default: under
    eager mixed precision); False for stacks whose norms run in half (simulator.strategy.stacks).
    """
    if fp32_norm is None:
        fp32_norm = e == 2 and not compiled
    h, f, kv, q = model.hidden / seq_shards(model), model.ffn_hidden, model.kv_dim, model.q_dim
    rotary = model.pos_embedding == "rotary"
    rot = getattr(model, "rotary_pct", 1.0)  # fraction of each head's dims rotated (Pythia 0.25)
    extra_norms = getattr(model, "norms_per_layer", 2) - 2
    qk_norm = getattr(model, "qk_norm", "none") != "none"
    tokens = mb * float(seq_len)
    rope_el, rope_k = rotary_elements(rot, compiled) if rotary else (0.0, 0)
    mlp = mlp_elementwise_elements(f, model.gated_mlp, compiled)
    if compiled:
        per_tok = 2 * h + (q + kv) * rope_el + 4 * h + mlp + 3 * h
        kernels = 4
    else:
        per_tok = 2 * h + 2 * h + 6 * h + mlp + (q + kv) * rope_el + 2 * q
        per_tok += 2 * h * extra_norms + (2 * (q + kv) if qk_norm else 0)
        kernels = 2 + 2 + (2 if model.gated_mlp else 1) + 2 * rope_k + 1 + extra_norms + (2 if qk_norm else 0)
    L = model.n_layers
    nbytes = tokens * per_tok * e * L
    if fp32_norm:
        nbytes = nbytes + tokens * 2 * h * FP32_NORM_EXTRA_BYTES * L
        kernels += 2
    bwd_bytes, bwd_kernels = ELEMENTWISE_BWD_FACTOR * nbytes, ELEMENTWISE_BWD_FACTOR * kernels * L
    if model.linear_bias:
        # each linear's bias gradient is a reduction over all tokens of its output gradient
        up = 2 * f if model.gated_mlp else f
        bwd_bytes = bwd_bytes + tokens * (q + 2 * kv + h + up + h) * e * L
        bwd_kernels += 4 * L
    fwd = MemOps(nbytes, float(kernels * L))
    bwd = MemOps(bwd_bytes, bwd_kernels)
    return fwd, bwd


def rotary_layout_bytes(model, mb: np.ndarray, seq_len: int, e: int) -> tuple[MemOps, MemOps]:
    """The eager rotary embedding and attention-output transpose copy of all layers, the share of
    :func:`layer_elementwise`'s eager count (forward, backward) whose kernels read broadcast or strided
    operands: rotary's ``x * cos`` and ``rotate_half(x) * sin`` broadcast a [seq, dims] table over the
    batch and heads and ``cat`` writes strided halves (:func:`rotary_elements`), and the output
    transpose copies a permuted view (2q elements a token). PyTorch's TensorIterator runs such operands
    in its non-vectorized ``elementwise_kernel`` / ``unrolled_elementwise_kernel`` rather than the
    vectorized one (an H200 ran them at under half a contiguous copy's bandwidth; the profile's
    ``broadcast`` class). Backward :data:`ELEMENTWISE_BWD_FACTOR` times, as counted."""
    q, kv = model.q_dim, model.kv_dim
    rope_el, rope_k = rotary_elements(getattr(model, "rotary_pct", 1.0), False) \
        if model.pos_embedding == "rotary" else (0.0, 0)
    tokens, L = mb * float(seq_len), model.n_layers
    nbytes = tokens * ((q + kv) * rope_el + 2 * q) * e * L
    kernels = float((2 * rope_k + 1) * L)
    return MemOps(nbytes, kernels), MemOps(ELEMENTWISE_BWD_FACTOR * nbytes, ELEMENTWISE_BWD_FACTOR * kernels)


def activation_bytes(model, mb: np.ndarray, seq_len: int, e: int) -> MemOps:
    """The eager MLP activation's share of :func:`layer_elementwise`'s forward, all layers: it
    reads and writes ``ffn_hidden`` elements per token (of the gate, in a gated MLP), one kernel
    per layer. :func:`layer_elementwise` counts its backward, like the rest, as
    :data:`ELEMENTWISE_BWD_FACTOR` times that; it is one kernel moving :data:`ACTIVATION_BWD_BYTES` times that (families time it
    apart, in its own bandwidth class)."""
    tokens = mb * float(seq_len)
    return MemOps(tokens * 2.0 * model.ffn_hidden * e * model.n_layers, float(model.n_layers))


def loss_bytes(model, mb: np.ndarray, seq_len: int, e: int, kind: str,
               tangent: bool = False) -> tuple[MemOps, MemOps]:
    """Cross-entropy over the logits (fwd, bwd; bytes moved and kernels): :func:`cross_entropy_bytes`
    of the stack's ``kind`` (:meth:`simulator.strategy.stacks.Stack.loss_kind`: one fused kernel each
    way, e.g. flash-attn's cross-entropy or Inductor fusing a compiled step's loss, or an eager loss).
    Eager final-logit soft-capping (Gemma 2: divide, tanh, multiply) adds 6e bytes per logit and 3
    kernels each way; fused, it fuses into the loss. ``tangent``: a compiled model that returns its
    logits (:attr:`simulator.strategy.stacks.Stack.returns_outputs`) gets a zero-filled gradient for
    them in backward, a memset of e bytes per logit that the loss's backward kernel reads (2e, one
    kernel more)."""
    n = logits_elements(model, mb, seq_len)
    cap = 6.0 * e if getattr(model, "logit_softcap", None) and kind not in FUSED_LOSSES else 0.0
    fwd, bwd = cross_entropy_bytes(n, e, kind, cap, 3.0 if cap else 0.0)
    if tangent:
        bwd = MemOps(bwd.nbytes + 2.0 * e * n, float(bwd.kernels) + 1.0)
    return fwd, bwd


#: Passes over an fp32 row of logits of the eager log-softmax, forward and backward: PyTorch's CUDA
#: ``cunn_SoftMaxForward`` keeps a row on chip only while it fits a block's 48 KiB of shared memory
#: (12k fp32 logits; vocabularies are 32k-152k), so it reads the row for the maximum, again for the
#: sum of exponentials and again to write the output (3 reads + 1 write); ``cunn_SoftMaxBackward``
#: reads the output gradient for its sum, then the gradient and the saved output, and writes one.
#: ``nll_loss``'s backward writes the fp32 gradient over all logits (zeros, then one per row).
#: An H200 ran the forward at 16 bytes per logit in 3.09 ms and the backward in 3.35 ms over
#: 16384 x 50304 logits (calibration/results/h200/prof_p160m_sdpa_s2048_mb8.txt).
LOG_SOFTMAX_PASSES = (4.0, 4.0)  # (fp32 passes forward, backward: 3 reads + 1 write each)
#: Loss kinds that run as one kernel each way (:meth:`simulator.strategy.stacks.Stack.loss_kind`).
FUSED_LOSSES = ("fused", "fused-inplace")
#: Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py
#: _VocabParallelCrossEntropy) on fp32 rows, bytes per logit beyond the upcast: forward the maximum
#: (read 4), subtract it in place (8), exponentiate in place (8), sum (4) and normalise in place (8),
#: 5 kernels; backward the gradient in place (``grad_input = softmax``, one-hot subtract, scale:
#: 8), 1 kernel.
INPLACE_UPCAST_BYTES = ((32.0, 5.0), (8.0, 1.0))


def cross_entropy_bytes(n_logits, e: int, kind: str, extra: float = 0.0,
                        extra_kernels: float = 0.0) -> tuple[MemOps, MemOps]:
    """Cross-entropy over ``n_logits`` logit elements (fwd, bwd), any family, by the stack's loss
    ``kind`` (:meth:`simulator.strategy.stacks.Stack.loss_kind`). Fused (or compiled): one kernel
    reads and writes the logits about twice each way (2e). Eager upcast
    (``F.cross_entropy(logits.float())``): the log-softmax's :data:`LOG_SOFTMAX_PASSES` over fp32 rows
    (16 bytes per logit each way) and, backward, ``nll_loss``'s fp32 gradient (4); with half logits
    (e < 4) ``.float()`` copies them up (read e, write 4) and backward casts the gradient back (read 4,
    write e): 16 + (e + 4) forward and 20 + (e + 4) backward under mixed precision, 16 and 20 in
    fp32, in 3 and 4 kernels. Megatron's in-place upcast: the same casts around
    :data:`INPLACE_UPCAST_BYTES`. Eager on half logits (``half``): the log-softmax's passes over half
    rows (4e forward, 4e + e for ``nll_loss``'s half gradient backward), 2 and 3 kernels. Plus
    ``extra`` bytes per logit and ``extra_kernels`` each way (soft-capping)."""
    if kind in FUSED_LOSSES:
        return MemOps(n_logits * 2 * e, 1.0), MemOps(n_logits * 2 * e, 1.0)
    if kind == "half":
        fwd, bwd = (e * p for p in LOG_SOFTMAX_PASSES)
        return (MemOps(n_logits * (fwd + extra), 2.0 + extra_kernels),
                MemOps(n_logits * (bwd + e + extra), 3.0 + extra_kernels))
    cast, cast_k = (e + 4.0, 1.0) if e < 4 else (0.0, 0.0)
    if kind == "upcast-inplace":
        (f, kf), (b, kb) = INPLACE_UPCAST_BYTES
        return (MemOps(n_logits * (f + cast + extra), kf + cast_k + extra_kernels),
                MemOps(n_logits * (b + cast + extra), kb + cast_k + extra_kernels))
    if kind != "upcast":
        raise ValueError(f"unknown loss kind {kind!r}")
    fwd, bwd = (4.0 * p for p in LOG_SOFTMAX_PASSES)
    return (MemOps(n_logits * (fwd + cast + extra), 3.0 + extra_kernels),
            MemOps(n_logits * (bwd + 4.0 + cast + extra), 4.0 + extra_kernels))


def tied_head(model) -> bool:
    """Whether the LM head reuses the token embedding's weight, whose two gradients autograd sums."""
    return bool(getattr(model, "tied_embeddings", False)) and getattr(model, "head", None) in ("lm", "mlm") \
        and getattr(model, "family", None) != "vit"


def embedding_bytes(model, mb: np.ndarray, seq_len: int, e: int) -> tuple[MemOps, MemOps]:
    """Token/position embedding gather (fwd) and the dense embedding gradient (bwd). A head tied
    to the embedding adds autograd's sum of the weight's two fp32 gradients (read both, write the
    sum: 12 bytes per weight element, one kernel): on a CPU, 4.9 ms of a 216 ms backward of a
    4-layer 256-wide GPT-2 with 50257 tokens (opcompare, Zen 5 EPYC, 2026-12-02)."""
    tokens = mb * float(seq_len)
    h = model.hidden
    emb_rows = model.vocab_size if model.family != "vit" else 0
    tied = 12.0 * model.vocab_size * h if tied_head(model) else 0.0
    fwd = MemOps(tokens * h * 2 * e, 2.0)
    bwd = MemOps(tokens * h * 2 * e + emb_rows * h * 4.0 + tied, 2.0 + float(tied > 0))
    return fwd, bwd


def autocast_cast_bytes(n_params: float, precision: str, half_params: bool) -> MemOps:
    """torch.autocast casts fp32 weights to half once per micro-batch (read 4 + write 2 bytes per
    parameter), and backward casts each weight's half gradient back to fp32 (read 2 + write 4):
    12 bytes per parameter, half of them in each pass. Not needed when the weights are already
    kept in half (ZeRO/FSDP mixed precision, a model cast to half)."""
    if precision not in MIXED_PRECISIONS or half_params:
        return MemOps(np.asarray(0.0), 0.0)
    return MemOps(np.asarray(12.0 * n_params), 0.0)


#: FlashAttention's backward executes 5 matmuls of the forward's size against the forward's 2
#: (it recomputes the scores): 2.5x the forward FLOPs (Dao 2023, FlashAttention-2, sec. 3.1.2).
FLASH_BWD_FLOPS = 2.5
