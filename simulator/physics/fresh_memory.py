"""Host cost of fresh memory and of the per-tensor optimizer loop (CPU devices).

On a CPU, PyTorch tensors come from the C allocator: small blocks are reused from memory it
keeps, large ones are new pages it faults in (kernel zeroing + page-table work) on first touch
and hands back to the OS when freed. A training step that stores activations, logits and
gradients in large tensors therefore pays a first-touch cost per byte on top of the work done
with them; activation checkpointing, by storing less, avoids most of it. GPU caching allocators
reuse their blocks, so profiles without ``fresh_memory`` (all catalog profiles) pay nothing.

Pure functions; bytes, seconds. The allocator model is :class:`simulator.hardware.profile.FreshMemory`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..model import workload
from ..strategy.stacks import Stack, default_stack
from . import memory


@functools.lru_cache(maxsize=1)
def torch_model_stack() -> Stack:
    """The stack whose saved bytes the fresh-page model counts: the default stack with the
    textbook count of saved activations, the layout of ``calibration/torch_model.py``'s steps
    (fused QKV and up projections) on which the profiles' ``fresh_memory`` fits were made."""
    return default_stack().model_copy(update={"saves": "textbook"})


def fresh_bytes(parts, fm, heap_kept: bool = False) -> np.ndarray:
    """Bytes landing on fresh pages when one phase allocates ``parts``: (tensor size, total
    bytes) pairs, arrays broadcast. Tensors of at least ``fm.mmap_bytes`` are all fresh; of the
    T bytes in smaller tensors, T * T^2 / (T^2 + keep^2) are, none where ``heap_kept`` (the heap
    could not return their pages since the last time they were used)."""
    big = 0.0
    small = 0.0
    for size, total in parts:
        is_big = np.asarray(size, dtype=float) >= fm.mmap_bytes
        total = np.asarray(total, dtype=float)
        big = big + np.where(is_big, total, 0.0)
        small = small + np.where(is_big, 0.0, total)
    if heap_kept:
        return big + 0.0 * small
    keep2 = fm.keep_bytes**2
    frac = np.where(small > 0, small**2 / np.maximum(small**2 + keep2, 1e-300), 0.0)
    return big + small * frac


def fresh_time(parts, profile, heap_kept: bool = False):
    """Seconds of first touches of :func:`fresh_bytes` (0 without a ``fresh_memory`` fit)."""
    fm = profile.fresh_memory
    if fm is None:
        return 0.0 * sum(np.asarray(t, dtype=float) for _, t in parts)
    return fresh_bytes(parts, fm, heap_kept) / (fm.gbs * 1e9)


def param_tensor_sizes(model) -> np.ndarray:
    """Elements of each parameter tensor of a transformer (weights and biases as separate
    tensors, the gated MLP's gate and up in one matrix, tied weights once); whatever the list
    misses of ``n_params()`` is one more tensor. Models without transformer fields count one
    tensor per layer."""
    try:
        h, f, L, v = model.hidden, model.ffn_hidden, model.n_layers, model.vocab_size
        kv = model.kv_dim
    except AttributeError:
        L = max(1, int(getattr(model, "n_layers", 1)))
        return np.full(L, model.n_params() / L)
    up = 2 * f if model.gated_mlp else f
    layer = [(h + 2 * kv) * h, h * h, up * h, f * h]
    if model.linear_bias:
        layer += [h + 2 * kv, h, up, h]
    norm = [h, h] if (model.norm == "layernorm" and model.norm_bias) else [h]
    layer += norm * 2
    sizes = layer * L
    if model.family != "vit":
        sizes.append(v * h)
        if model.head in ("lm", "mlm") and not model.tied_embeddings:
            sizes.append(v * h)
    if getattr(model, "final_norm", False):
        sizes += norm
    rest = model.n_params() - sum(sizes)
    if rest > 0:
        sizes.append(rest)
    return np.asarray(sizes, dtype=float)


def micro_batch_fresh(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                      checkpointing: str, profile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, recomputation) seconds of first touches per micro-batch.

    Forward: the activations kept for backward (half in hidden-wide, half in MLP-wide tensors),
    eager attention's s x s temporaries (:func:`eager_temps`) in every layer and
    the logit buffers; backward: eager attention's s x s gradients, the logits' gradient
    (:func:`logits_fresh_bytes`) and, for a head tied to the embedding, the two partial gradients
    of the shared weight that autograd sums into a third (the sum is counted with the step's
    gradients, :func:`step_fresh`); recomputation: the s x s temporaries again in each layer whose
    attention is recomputed (full and selective checkpointing). Of these only the tensors of at
    least ``mmap_bytes`` are fresh in a training loop: the heap pages of the smaller ones stay
    mapped from the previous step, because the parameter gradients that backward allocates after
    them live until the optimizer step and keep the heap from trimming (``heap_kept``; measured
    with ``python -m calibration.opcompare --faults``: GPT-2 small's forward faults in its 103 MB
    of logits and nothing of its ~400 MB of smaller activations; a 6-layer eager model at s=1024
    faults in each of the four s x s tensors of every layer, forward and backward).
    """
    mb = np.asarray(mb, dtype=float)
    zero = 0.0 * mb
    if profile.fresh_memory is None or not hasattr(model, "ffn_hidden"):  # transformers only
        return zero, zero, zero
    e = workload.act_bytes(precision)
    tokens = mb * seq_len
    L = model.n_layers
    heads = float(getattr(model, "n_heads", 1))
    act = memory.activations(model, seq_len, mb, precision, attention, checkpointing, stack=torch_model_stack())
    scores: list[tuple[np.ndarray, np.ndarray]] = []  # (tensor bytes, total bytes) per pass
    if attention == "eager":
        if checkpointing == "none":  # the kept probabilities are among the temporaries
            act = np.maximum(act - L * tokens * workload.eager_scores_bytes_per_token(model, seq_len, e), 0.0)
        scores = [(mb * heads * seq_len**2 * b, L * n * mb * heads * seq_len**2 * b) for b, n in eager_temps(e)]
    rec = scores if checkpointing in ("full", "selective") else []
    f = float(getattr(model, "ffn_hidden", model.hidden))
    n_logits = workload.logits_elements(model, mb, seq_len)
    lf, lb = logits_fresh_bytes(n_logits, e)
    fwd = fresh_time([(tokens * model.hidden * e, 0.5 * act), (tokens * f * e, 0.5 * act),
                      *scores, (n_logits * 4.0, lf)], profile, heap_kept=True)
    vh = 4.0 * model.vocab_size * model.hidden if workload.tied_head(model) else 0.0
    bwd = fresh_time([*scores, (n_logits * 4.0, lb), (vh, 2.0 * vh + zero)], profile, heap_kept=True)
    return fwd, bwd, fresh_time([*rec, (0.0, zero)], profile, heap_kept=True)


def eager_temps(e: int) -> list[tuple[float, int]]:
    """(bytes per element, tensors) of the s x s tensors one layer of materialised attention
    allocates in one pass (:class:`calibration.torch_model.Attention`): forward the scores, their
    scaled and their masked copies (``e`` bytes each) and the probabilities (under autocast fp32,
    plus their half-precision copy); backward as many gradients of the same sizes."""
    return [(2.0, 4), (4.0, 1)] if e == 2 else [(float(e), 4)]


def logits_fresh_bytes(n_logits, e: int):
    """(forward, backward) bytes of new logit-sized buffers: the logits (e bytes each), their
    fp32 copy under mixed precision and the fp32 log-probabilities; backward the fp32 gradient
    and its cast back to half."""
    n = np.asarray(n_logits, dtype=float)
    half = 1.0 if e == 2 else 0.0
    return n * (e + 4.0 + 4.0 * half), n * (4.0 + e * half)


#: glibc's heap trim threshold is twice its mmap threshold once a freed mapping has raised that
#: (malloc.c, ``free``: ``mp_.trim_threshold = 2 * mp_.mmap_threshold``; mallopt(3)). When more
#: free memory than that lies at the top of the heap, ``free`` trims it (``systrim``) down to the
#: top pad (128 KiB): all of it goes back to the OS, not just the excess.
HEAP_TRIM_FACTOR = 2.0


def optimizer_temp_bytes(sizes, mmap_bytes: float) -> float:
    """Bytes of fresh pages per step of a foreach Adam(W) step's temporaries: one fp32 tensor per
    parameter tensor (``sizes``, bytes), all alive at once (``_foreach_sqrt`` of the second
    moments). Temporaries of at least ``mmap_bytes`` are mapped anew. The smaller ones are the
    last blocks allocated, at the top of the heap; freed together, they stay mapped while they
    total at most :data:`HEAP_TRIM_FACTOR` x ``mmap_bytes`` and are all trimmed and faulted in
    again beyond it (measured: a Llama with 126 MB of such temporaries and 128 tokens per step
    faults in 118 MB per step). Where backward has just freed more activations than that, the
    temporaries fill the holes instead and fault nothing (a 10-layer GPT-2 at 1,024 tokens per
    micro-batch, 197 MB of them): counted fresh all the same, an overestimate of at most their
    bytes at the fault rate, small beside the passes of a step that stores so much."""
    s = np.asarray(sizes, dtype=float)
    big = s >= mmap_bytes
    small = s[~big].sum()
    return float(s[big].sum() + (small if small > HEAP_TRIM_FACTOR * mmap_bytes else 0.0))


def step_fresh(model, profile, param_share: float = 1.0) -> tuple[float, float]:
    """(gradient, optimizer) seconds of first touches per optimizer step: the fp32 gradients a
    step allocates anew (``zero_grad(set_to_none=True)``) and the foreach Adam(W) temporaries
    (:func:`optimizer_temp_bytes`) of the ``param_share`` of parameters this rank updates."""
    fm = profile.fresh_memory
    if fm is None:
        return 0.0, 0.0
    sizes = param_tensor_sizes(model) * 4.0
    big = sizes >= fm.mmap_bytes
    t = float(fresh_time([(sizes.max(initial=0.0), sizes[big].sum()), (0.0, sizes[~big].sum())], profile))
    return t, optimizer_temp_bytes(sizes * param_share, fm.mmap_bytes) / (fm.gbs * 1e9)


def optimizer_loop_time(model, profile, param_share: float = 1.0) -> float | None:
    """Host seconds of a per-tensor optimizer loop (``optimizer_tensor_us`` per parameter
    tensor), or None when the profile has no such fit."""
    if profile.optimizer_tensor_us is None:
        return None
    return float(param_tensor_sizes(model).size) * param_share * profile.optimizer_tensor_us * 1e-6
