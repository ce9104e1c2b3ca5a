"""Memory per GPU (bytes): model states by precision/optimizer/sharding, activations, logits.

Pure functions; arrays broadcast. docs/architecture.md, physics 4.
"""

from __future__ import annotations

import numpy as np

from . import workload
from .models import ModelSpec
from .strategy import HALF_PRECISIONS, SHARD_STAGE, checkpointed_layers

MIB = 1024**2
#: DeepSpeed ZeRO's default reduce_bucket_size and allgather_bucket_size (5e8 elements each,
#: DeepSpeed configuration docs, "ZeRO optimizations"): buffers at the communication dtype.
ZERO_BUCKET_ELEMENTS = 5e8

OPTIMIZER_MOMENTS = {"adam": 2, "adamw": 2, "lion": 1, "sgd": 1}


def moment_bytes(optimizer: str) -> int:
    """Bytes of optimizer moments per parameter: fp32 (4 bytes) per moment."""
    return 4 * OPTIMIZER_MOMENTS[optimizer]


def autocast_fp32_params(precision: str, sharding: str, stack=None) -> bool:
    """Whether mixed precision keeps fp32 weights and gradients that torch.autocast casts to half
    (DDP; and ZeRO-1/2 where the stack's ZeRO is PyTorch's ZeroRedundancyOptimizer or apex's
    DistributedFusedAdam over autocast, ``stack.torch_zero``). Otherwise ZeRO/FSDP
    keep half weights and gradients with an fp32 master copy in the optimizer."""
    if precision not in HALF_PRECISIONS:
        return False
    if sharding == "ddp":
        return True
    return stack is not None and stack.torch_zero and sharding in ("zero1", "zero2")


def state_bytes_per_param(precision: str, sharding: str, optimizer: str, stack=None) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter before sharding.

    fp32/tf32: 4 + 4 + 4*moments. Mixed precision with fp32 weights under autocast (DDP; see
    :func:`autocast_fp32_params`): 4 + 4 + 4*moments. Mixed precision under DeepSpeed ZeRO / FSDP
    (half weights and gradients, fp32 master copy in the optimizer): 2 + 2 + (4 + 4*moments).
    Adam: 16 B/param either way.
    """
    k = moment_bytes(optimizer)
    if precision in HALF_PRECISIONS and not autocast_fp32_params(precision, sharding, stack):
        return 2, 2, 4 + k
    return 4, 4, k


def model_states(n_params: float, layer_params: float, precision: str, sharding: str,
                 offload: str, optimizer: str, n_gpus: int, stack=None) -> dict[str, float]:
    """Per-GPU bytes of weights, gradients and optimizer states; and bytes put in host RAM.

    Sharding over n data-parallel ranks (ZeRO-1 optimizer states; ZeRO-2/shard-grad-op also
    gradients; ZeRO-3/full-shard also weights, plus the gathered working set of ~2 layers of
    weights (current + prefetched) and 1 layer of unsharded gradients). Offload moves optimizer
    states (and, with 'all', the weight shards) to host memory.
    """
    w, g, o = state_bytes_per_param(precision, sharding, optimizer, stack)
    n = n_gpus
    stage = SHARD_STAGE[sharding]
    frac = (n - 1) / n
    if stage >= 3:
        weights = n_params * w / n + min(n_params, 2 * layer_params) * w * frac
    else:
        weights = n_params * w
    if stage >= 2:
        grads = n_params * g / n + min(n_params, layer_params) * g * frac
    else:
        grads = n_params * g
    opt = n_params * o / (n if stage >= 1 else 1)
    host = 0.0
    if offload in ("optimizer", "all"):
        host += opt
        opt = 0.0
    if offload == "all":
        shard = n_params * w / n
        host += shard + n_params * g / n
        weights = max(weights - shard, min(n_params, 2 * layer_params) * w)
        grads = min(n_params, layer_params) * g
    return {"weights": weights, "gradients": grads, "optimizer": opt, "host": host}


def autocast_weight_copies(n_params: float, precision: str, sharding: str, stack=None) -> float:
    """Bytes of half-precision weight copies torch.autocast caches from forward to backward
    (cache_enabled=True, the default) where the weights themselves stay fp32 (DDP)."""
    return 2.0 * n_params if autocast_fp32_params(precision, sharding, stack) else 0.0


def comm_buffers(n_params: float, precision: str, sharding: str, n_gpus: int, stack=None) -> float:
    """Communication buffers per GPU (bytes). PyTorch DDP (gradient_as_bucket_view=False, the
    default) copies every gradient into flat buckets: one more gradient-sized buffer. DeepSpeed
    ZeRO keeps a reduce and an all-gather bucket of up to 5e8 elements each; FSDP communicates
    from its flat per-unit parameters (counted in the gathered working set). PyTorch's
    ZeroRedundancyOptimizer runs under DDP (``stack.torch_zero``): DDP's buckets."""
    if n_gpus <= 1:
        return 0.0
    w, g, _ = state_bytes_per_param(precision, sharding, "sgd", stack)
    if sharding == "ddp" or (sharding.startswith("zero") and stack is not None and stack.torch_zero):
        return n_params * g
    if sharding.startswith("zero"):
        return min(n_params, ZERO_BUCKET_ELEMENTS) * (g + w)
    return 0.0


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
    h, f = model.hidden / workload.seq_shards(model), model.ffn_hidden
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
    h = model.hidden / workload.seq_shards(model)
    kv, q = model.kv_dim, model.q_dim
    up = 2 * model.ffn_hidden if model.gated_mlp else model.ffn_hidden
    lse = 4.0 * model.n_heads if attention == "sdpa" else 0.0
    return e * (h + (q + 2 * kv) + h + q + up + h) + lse


def activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                checkpointing: str) -> np.ndarray:
    """Activation bytes of one micro-batch at the start of backward (all layers), plus the
    working set of the one layer being recomputed during backward.

    none: every layer's saved tensors. full / every:K: checkpointed layers keep only their input
    (h*e per token), the others everything; during backward one checkpointed layer at a time is
    rebuilt around its kept input (its saved tensors less that input). selective (Megatron):
    eager attention's s x s tensors are dropped and recomputed (fused attention saves none).
    op: each layer keeps its matmul and attention outputs (:func:`op_kept_bytes_per_token`), one
    layer at a time rebuilds the rest. With one layer every policy holds what 'none' holds.
    """
    if not isinstance(model, ModelSpec):  # other families: through their operations
        from . import opcost

        return opcost.activations(model, seq_len, mb, precision, attention, checkpointing)
    e = workload.act_bytes(precision)
    tokens = np.asarray(mb, dtype=float) * seq_len
    per_layer = layer_activation_bytes_per_token(model, seq_len, e, attention)
    L = model.n_layers
    h = model.hidden / workload.seq_shards(model)
    c = checkpointed_layers(checkpointing, L)
    if c:
        kept = h * e
        trunk = tokens * ((L - c) * per_layer + c * kept + (per_layer - kept))
    elif checkpointing == "op":
        kept = op_kept_bytes_per_token(model, e, attention)
        trunk = tokens * (L * kept + (per_layer - kept))
    elif checkpointing == "selective" and attention == "eager":
        core = eager_scores_bytes_per_token(model, seq_len, e)
        trunk = tokens * (L * (per_layer - core) + core)
    else:
        trunk = tokens * L * per_layer
    return trunk + tokens * h * e * 2  # embedding output + final norm


def logits_bytes(model, seq_len: int, mb: np.ndarray, precision: str, compiled: bool, stack) -> np.ndarray:
    """Logits and loss buffers (bytes): logit elements x the stack's bytes per logit
    (:meth:`simulator.stacks.Stack.loss_bytes_per_logit`: e + 8 for an eager fp32-upcast loss,
    2e for a fused or compiled one), plus, with eager final-logit soft-capping (Gemma 2), the
    tanh output (e)."""
    if not isinstance(model, ModelSpec):  # other families: through their operations
        from . import opcost

        return opcost.logits_bytes(model, seq_len, mb, precision, compiled, stack)
    e = workload.act_bytes(precision)
    n = workload.logits_elements(model, np.asarray(mb, dtype=float), seq_len)
    cap = e if (getattr(model, "logit_softcap", None) and not compiled) else 0
    return n * (stack.loss_bytes_per_logit(e, compiled) + cap)
