"""Memory per GPU (bytes): model states by precision/optimizer/sharding, activations, logits.

Pure functions; arrays broadcast. DESIGN.md "Physics" 4.
"""

from __future__ import annotations

import numpy as np

from . import workload
from .models import ModelSpec
from .strategy import SHARD_STAGE

MIB = 1024**2
#: DeepSpeed ZeRO's default reduce_bucket_size and allgather_bucket_size (5e8 elements each,
#: DeepSpeed configuration docs, "ZeRO optimizations"): buffers at the communication dtype.
ZERO_BUCKET_ELEMENTS = 5e8
#: Caching-allocator fragmentation, as a fraction of activation memory. Assumption: PyTorch's
#: caching allocator typically reserves 5-15% above allocated tensors during training
#: (memory_reserved vs memory_allocated); replaced by measurement where validation shows otherwise.
FRAGMENTATION = 0.10

OPTIMIZER_MOMENTS = {"adam": 2, "adamw": 2, "lion": 1, "sgd": 1}


def state_bytes_per_param(precision: str, sharding: str, optimizer: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter before sharding.

    fp32/tf32: 4 + 4 + 4*moments. Mixed precision under DDP (torch.autocast keeps fp32 weights
    and gradients): 4 + 4 + 4*moments. Mixed precision under ZeRO/FSDP (half weights and
    gradients, fp32 master copy in the optimizer): 2 + 2 + (4 + 4*moments). Adam: 16 B/param.
    """
    k = 4 * OPTIMIZER_MOMENTS[optimizer]
    if precision in ("bf16", "fp16") and sharding != "ddp":
        return 2, 2, 4 + k
    return 4, 4, k


def grad_comm_bytes_per_param(precision: str, sharding: str) -> int:
    """Bytes per parameter that gradient collectives move (DDP + autocast reduces fp32 grads)."""
    return state_bytes_per_param(precision, sharding, "sgd")[1]


def model_states(n_params: float, layer_params: float, precision: str, sharding: str,
                 offload: str, optimizer: str, n_gpus: int) -> dict[str, float]:
    """Per-GPU bytes of weights, gradients and optimizer states; and bytes put in host RAM.

    Sharding over n data-parallel ranks (ZeRO-1 optimizer states; ZeRO-2/shard-grad-op also
    gradients; ZeRO-3/full-shard also weights, plus the gathered working set of ~2 layers of
    weights (current + prefetched) and 1 layer of unsharded gradients). Offload moves optimizer
    states (and, with 'all', the weight shards) to host memory.
    """
    w, g, o = state_bytes_per_param(precision, sharding, optimizer)
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


def autocast_weight_copies(n_params: float, precision: str, sharding: str) -> float:
    """Bytes of half-precision weight copies torch.autocast caches from forward to backward
    (cache_enabled=True, the default) where the weights themselves stay fp32 (DDP)."""
    return 2.0 * n_params if precision in ("bf16", "fp16") and sharding == "ddp" else 0.0


def comm_buffers(n_params: float, precision: str, sharding: str, n_gpus: int) -> float:
    """Communication buffers per GPU (bytes). PyTorch DDP (gradient_as_bucket_view=False, the
    default) copies every gradient into flat buckets: one more gradient-sized buffer. DeepSpeed
    ZeRO keeps a reduce and an all-gather bucket of up to 5e8 elements each; FSDP communicates
    from its flat per-unit parameters (counted in the gathered working set)."""
    if n_gpus <= 1:
        return 0.0
    w, g, _ = state_bytes_per_param(precision, sharding, "sgd")
    if sharding == "ddp":
        return n_params * g
    if sharding.startswith("zero"):
        return min(n_params, ZERO_BUCKET_ELEMENTS) * (g + w)
    return 0.0


def layer_activation_bytes_per_token(model, seq_len: int, e: int, attention: str) -> float:
    """Bytes one layer saves for backward per token (no dropout), after Korthikanti et al. 2022:
    attention block LN input, QKV input, Q/K/V, attention output; MLP block LN input, FC1
    input, FC1 output, activation output; eager attention adds the s x s softmax per head
    (a*s*e per token), fused SDPA only its fp32 log-sum-exp (4a)."""
    h, f = model.hidden, model.ffn_hidden
    kv = workload.kv_dim(model)
    up = 2 * f if model.gated_mlp else f
    attn = e * (h + h + (h + 2 * kv) + h)
    mlp = e * (h + h + up + f)
    core = eager_scores_bytes_per_token(model, seq_len, e) if attention == "eager" else 4.0 * model.n_heads
    return attn + mlp + core


def eager_scores_bytes_per_token(model, seq_len: int, e: int) -> float:
    """Saved softmax probabilities of materialised attention per token: a*s elements at 4 bytes
    (fp32 softmax) plus the half copy under autocast (6 bytes), or e bytes in fp32 training."""
    return model.n_heads * seq_len * (e + 4 if e == 2 else e)


def activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                checkpointing: str) -> np.ndarray:
    """Activation bytes of one micro-batch at the start of backward (all layers)."""
    if not isinstance(model, ModelSpec):  # other families: through their operations
        from . import opcost

        return opcost.activations(model, seq_len, mb, precision, attention, checkpointing)
    e = workload.act_bytes(precision)
    tokens = np.asarray(mb, dtype=float) * seq_len
    per_layer = layer_activation_bytes_per_token(model, seq_len, e, attention)
    L = model.n_layers
    if checkpointing == "full":
        trunk = tokens * (L * model.hidden * e + per_layer)
    elif checkpointing == "selective" and attention == "eager":
        core = eager_scores_bytes_per_token(model, seq_len, e)
        trunk = tokens * (L * (per_layer - core) + core)
    else:
        trunk = tokens * L * per_layer
    return trunk + tokens * model.hidden * e * 2  # embedding output + final norm


def logits_bytes(model, seq_len: int, mb: np.ndarray, precision: str, compiled: bool) -> np.ndarray:
    """Logits and loss buffers: eager keeps logits (e) plus fp32 log-probabilities and their
    fp32 gradient (e + 8 bytes per logit); a compiled fused loss about 2e."""
    if not isinstance(model, ModelSpec):  # other families: through their operations
        from . import opcost

        return opcost.logits_bytes(model, seq_len, mb, precision, compiled)
    e = workload.act_bytes(precision)
    n = workload.logits_elements(model, np.asarray(mb, dtype=float), seq_len)
    return n * (2 * e if compiled else e + 8)
