"""Memory per GPU (bytes): model states by precision/optimizer/sharding, communication buffers,
and the activations and logits a micro-batch's operations save (any family).

Pure functions; arrays broadcast. docs/architecture.md, physics 4.
"""

from __future__ import annotations

import numpy as np

from ..core.vocab import MIXED_PRECISIONS
from ..model.families import family_of
from ..model.graphs import graph
from ..strategy.knobs import SHARD_STAGE, checkpointed_layers
from ..strategy.stacks import Stack

MIB = 1024**2
#: DeepSpeed ZeRO's default reduce_bucket_size and allgather_bucket_size (5e8 elements each,
#: DeepSpeed configuration docs, "ZeRO optimizations"): buffers at the communication dtype.
ZERO_BUCKET_ELEMENTS = 5e8

OPTIMIZER_MOMENTS = {"adam": 2, "adamw": 2, "lion": 1, "sgd": 1}
#: Bytes per element of an fp32 gradient (fp32 training's, Megatron-LM's main_grad, an fp32 reduce dtype).
FP32_BYTES = 4
#: Bytes per element of a half-precision (bf16/fp16) tensor; fp8 training keeps bf16 parameters and gradients.
HALF_BYTES = 2


def moment_bytes(optimizer: str) -> int:
    """Bytes of optimizer moments per parameter: fp32 (4 bytes) per moment."""
    return 4 * OPTIMIZER_MOMENTS[optimizer]


def autocast_fp32_params(precision: str, sharding: str, stack=None) -> bool:
    """Whether mixed precision keeps fp32 weights and gradients that torch.autocast casts to half
    (DDP; and ZeRO-1/2 where the stack's ZeRO is PyTorch's ZeroRedundancyOptimizer or apex's
    DistributedFusedAdam over autocast, ``stack.torch_zero``). Otherwise ZeRO/FSDP
    keep half weights and gradients with an fp32 master copy in the optimizer, as do stacks that
    cast the model itself (:attr:`simulator.strategy.stacks.Stack.half_model`)."""
    if precision not in MIXED_PRECISIONS or (stack is not None and stack.half_model):
        return False
    if sharding == "ddp":
        return True
    return stack is not None and stack.torch_zero and sharding in ("zero1", "zero2")


def reduce_bytes_per_param(precision: str, stack=None) -> int:
    """Bytes per element of the dtype a stack reduces its gradients in under ``precision``, before
    a wider gradient's own: fp32 (4) where the stack asks for it (``stack.reduce_dtype``: FSDP2's
    MixedPrecisionPolicy(reduce_dtype=torch.float32) in torchtitan and NeMo Automodel) or keeps
    fp32 gradients (``stack.fp32_grads``: Megatron-LM's main_grad under bf16/fp8), and in fp32 or
    tf32 training; otherwise the compute precision's half bytes (2). Gradients held wider than this
    (fp32 under autocast DDP) are reduced as held: the collectives and FSDP2's unsharded gradient
    buffers move max(gradient bytes, this) per parameter (:func:`reduce_size_per_param`)."""
    if precision not in MIXED_PRECISIONS:
        return FP32_BYTES
    if stack is not None and (stack.reduce_dtype == "fp32" or stack.fp32_main_grads(precision)):
        return FP32_BYTES
    return HALF_BYTES


def reduce_size_per_param(precision: str, sharding: str, stack=None) -> int:
    """Bytes per parameter the data-parallel gradient reduction moves and FSDP2 accumulates
    unsharded: the larger of the gradient's own (:func:`state_bytes_per_param`) and the reduce
    dtype's (:func:`reduce_bytes_per_param`)."""
    return max(state_bytes_per_param(precision, sharding, "sgd", stack)[1], reduce_bytes_per_param(precision, stack))


def state_bytes_per_param(precision: str, sharding: str, optimizer: str, stack=None) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter before sharding.

    fp32/tf32: 4 + 4 + 4*moments. Mixed precision with fp32 weights under autocast (DDP; see
    :func:`autocast_fp32_params`): 4 + 4 + 4*moments. Mixed precision under DeepSpeed ZeRO / FSDP
    (half weights and gradients, fp32 master copy in the optimizer), or a stack that keeps the
    model in half with fp32 main weights in its optimizer (Megatron-LM, ``states: master``):
    2 + 2 + (4 + 4*moments).
    Adam: 16 B/param either way. A stack that casts the model itself to half
    (:attr:`simulator.strategy.stacks.Stack.half_states`): 2 + 2 + 2*moments (the moments in the weights'
    dtype), 8 B/param with Adam. A stack keeping fp32 gradients of its half parameters under the
    precision (``stack.fp32_grads``: Megatron-LM's fp32 main_grad under bf16 and fp8) has 4 B of
    gradients: 2 + 4 + (4 + 4*moments), 18 B/param with Adam.
    """
    k = moment_bytes(optimizer)
    if precision in MIXED_PRECISIONS and stack is not None and stack.half_states:
        return HALF_BYTES, HALF_BYTES, k // 2
    if precision in MIXED_PRECISIONS and not autocast_fp32_params(precision, sharding, stack):
        g = FP32_BYTES if stack is not None and stack.fp32_main_grads(precision) else HALF_BYTES
        return HALF_BYTES, g, FP32_BYTES + k
    return FP32_BYTES, FP32_BYTES, k


def model_states(n_params: float, layer_params: float, precision: str, sharding: str,
                 offload: str, optimizer: str, n_gpus: int, stack=None, pipelined: bool = False) -> dict[str, float]:
    """Per-GPU bytes of weights, gradients and optimizer states; and bytes put in host RAM.

    Sharding over n data-parallel ranks (ZeRO-1 optimizer states; ZeRO-2/shard-grad-op also
    gradients; ZeRO-3/full-shard also weights, plus the gathered working set of ~2 layers of
    weights (current + prefetched) and 1 layer of unsharded gradients). Offload moves optimizer
    states (and, with 'all', the weight shards) to host memory. ``pipelined``: the parameters
    are one pipeline stage's, run by torch.distributed.pipelining (FSDP:
    :func:`pipelined_fsdp_states`).
    """
    w, g, o = state_bytes_per_param(precision, sharding, optimizer, stack)
    r = reduce_size_per_param(precision, sharding, stack)
    n = n_gpus
    stage = SHARD_STAGE[sharding]
    frac = (n - 1) / n
    if pipelined and sharding.startswith("fsdp"):
        return pipelined_fsdp_states(n_params, layer_params, w, g, r, n_params * o / n)
    if stage >= 3:
        weights = n_params * w / n + min(n_params, 2 * layer_params) * w * frac
    else:
        weights = n_params * w
    if stage >= 2:
        # one unit's unsharded gradients, and where the reduce dtype is wider the copy FSDP casts
        # them into before its reduce-scatter (FSDP2 foreach_reduce's reduce_scatter_input of
        # reduce_dtype; FSDP1 unsharded_grad.to(reduce_dtype)), both live at the copy
        grads = n_params * g / n + min(n_params, layer_params) * (g + (r if r > g else 0)) * frac
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


def pipelined_fsdp_states(n_params: float, layer_params: float, w: int, g: int, r: int,
                          optimizer: float) -> dict[str, float]:
    """Per-GPU bytes of a pipeline stage's ``n_params`` parameters under FSDP2 and
    torch.distributed.pipelining (``w``, ``g``: bytes per parameter of the half weights and their
    gradient; ``r``: of the gradient as reduced, :func:`reduce_size_per_param`; ``optimizer``: the
    rank's sharded optimizer bytes, fp32 master included).

    pytorch/pytorch torch/distributed/pipelining/stage.py ``_PipelineStageBase.backward_maybe_with_nosync``
    runs every micro-batch's backward with ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)``; only after the stage's last backward (``_post_backward`` /
    ``perform_reduce_grad``, the schedule's REDUCE_GRAD, schedules.py) does it switch both on and call
    each group's ``post_backward``, which reduce-scatters and reshards. So from the first micro-batch's
    all-gather to the step's reduce the stage's parameters stay gathered: all ``n_params x w`` bytes
    (FSDP2's all-gather output is a full-size buffer; the shard is the fp32 master in ``optimizer``),
    under full sharding too (reshard_after_forward frees a layer after its forward, but each backward
    leaves every layer gathered again for the next). The gradients stay unsharded across the
    micro-batches: torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``to_accumulated_grad_if_needed``
    upcasts each to the reduce dtype (``r``; fp32 in the stacks that pipeline it, ``stack.reduce_dtype``)
    into ``unsharded_accumulated_grad``
    and ``accumulate_unsharded_grad_if_needed`` adds the next micro-batch's in: ``n_params`` x that,
    plus one layer's fresh half gradient before it is added. No offload (refused,
    :func:`simulator.strategy.layout.pipelines`)."""
    grads = n_params * r + min(n_params, layer_params) * g
    return {"weights": n_params * w, "gradients": grads, "optimizer": optimizer, "host": 0.0}


def autocast_weight_copies(n_params: float, fp32_weights: np.ndarray, rebuilt_params: np.ndarray,
                           block_params: float) -> np.ndarray:
    """Bytes of half-precision weight copies torch.autocast makes in forward (cache_enabled=True,
    the default) and the linear layers save for backward, where the weights themselves stay fp32
    (``fp32_weights``, :func:`autocast_fp32_params`). ``rebuilt_params`` of the ``n_params`` sit
    in checkpointed blocks: ``torch.utils.checkpoint`` keeps nothing their forward saved and casts
    their weights again when it rebuilds them, one block (``block_params``) at a time."""
    rebuilt = np.asarray(rebuilt_params, float)
    return 2.0 * np.asarray(fp32_weights, float) * (n_params - rebuilt + np.where(rebuilt > 0, block_params, 0.0))


def comm_buffers(n_params: float, precision: str, sharding: str, n_gpus: int, stack=None) -> float:
    """Communication buffers per GPU (bytes). PyTorch DDP (gradient_as_bucket_view=False, the
    default) copies every gradient into flat buckets: one more gradient-sized buffer. DeepSpeed
    ZeRO keeps a reduce and an all-gather bucket of up to 5e8 elements each; FSDP communicates
    from its flat per-unit parameters (counted in the gathered working set). PyTorch's
    ZeroRedundancyOptimizer runs under DDP (``stack.torch_zero``): DDP's buckets. A stack whose
    gradients live in one contiguous buffer (``stack.contiguous_grads``: Megatron-LM's
    DistributedDataParallel, whose buckets are views of its grad buffer, all-reduced or
    reduce-scattered in place, and whose distributed optimizer all-gathers into the model's own
    parameter buffer) keeps none."""
    if n_gpus <= 1 or (stack is not None and stack.contiguous_grads):
        return 0.0
    w, g, _ = state_bytes_per_param(precision, sharding, "sgd", stack)
    if sharding == "ddp" or (sharding.startswith("zero") and stack is not None and stack.torch_zero):
        return n_params * g
    if sharding.startswith("zero"):
        return min(n_params, ZERO_BUCKET_ELEMENTS) * (g + w)
    return 0.0


def activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, checkpointing: str,
                compiled: bool = False, stack: Stack | str | None = None) -> np.ndarray:
    """Bytes of one micro-batch's activations at the start of backward (all blocks and the ops
    outside them), plus the working set of the one block repetition being rebuilt during
    backward: the sum of :func:`activation_terms`."""
    held, rebuilt = activation_terms(model, seq_len, mb, precision, attention, checkpointing, compiled, stack)
    return held + rebuilt


def activation_terms(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, checkpointing: str,
                     compiled: bool = False, stack: Stack | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(held, rebuilt) bytes of one micro-batch: what its blocks and the ops outside them keep at
    the start of backward, and the working set of the one block repetition being rebuilt during
    backward (zero without checkpointing), from the family's operations
    (:func:`simulator.model.graphs.graph`).

    Per block of R repetitions that each save S bytes: none keeps R x S. full / every:K: the c
    checkpointed repetitions (R, floor(R/K)) keep only their input, the others S. selective /
    op: every repetition keeps what the policy keeps of each op (:meth:`Op.kept_under`; the
    transformer under selective drops eager attention's s x s tensors, Korthikanti et al. 2022;
    under op keeps its matmul and fused-attention outputs). Where a policy drops something, one
    repetition at a time is rebuilt around what it kept (S less that), the largest such block's.
    With one repetition every policy holds what none holds. ``compiled`` and ``stack`` pick the
    graph: a stack running Hugging Face's modules saves what :mod:`simulator.model.hf_eager` counts
    (eager) or :mod:`simulator.model.hf_compiled` (compiled), fused stacks the textbook count.
    """
    g = graph(model, seq_len, mb, precision, attention, compiled, stack)
    z = np.zeros_like(np.asarray(mb, dtype=float))
    trunk, live = z, [z]
    for b in g.blocks:
        full = b.kept_under("none") + z
        c = checkpointed_layers(checkpointing, b.repeat)
        if c:
            kept = np.asarray(b.input_bytes, float) + z
        elif checkpointing != "none":
            c, kept = b.repeat, b.kept_under(checkpointing) + z
        else:
            kept = full
        trunk = trunk + (b.repeat - c) * full + c * kept
        if c:
            live.append(full - kept)
    outside = sum((op.count * np.asarray(op.kept_under("none"), float) for op in g.outside), z)
    return trunk + outside, np.max(live, axis=0)


def outside_activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str,
                        compiled: bool = False, stack: Stack | str | None = None) -> np.ndarray:
    """Bytes of one micro-batch's activations saved outside the repeated blocks (embedding output,
    final norm, head input): the part of :func:`activations` still held when backward has left the
    last block."""
    g = graph(model, seq_len, mb, precision, attention, compiled, stack)
    z = np.zeros_like(np.asarray(mb, dtype=float))
    return sum((op.count * np.asarray(op.kept_under("none"), float) for op in g.outside), z)


def allocator_reserve(activations, logits, stack: Stack) -> np.ndarray:
    """Bytes the caching allocator holds above the allocated peak (reserved - allocated): the
    stack's ``fragmentation`` share of the ``activations`` and ``loss_fragmentation`` share of the
    ``logits`` held at the peak (bytes each; ``stacks.yaml``, fitted for hf-trainer by
    ``calibration/allocator_fit.py``). A plan's total is the allocated peak plus this."""
    return stack.fragmentation * np.asarray(activations, float) + stack.loss_fragmentation * np.asarray(logits, float)


def peak_activations(model, seq_len: int, mb: np.ndarray, precision: str, attention: str, checkpointing: str,
                     compiled: bool, stack: Stack | str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(activations, rebuilt, logits) bytes of one micro-batch at a step's peak: the held
    activations with the rebuilt block's working set (:func:`activation_terms`), that working set,
    and the logit and loss buffers beside it (:func:`logits_at_peak`)."""
    held, rebuilt = activation_terms(model, seq_len, mb, precision, attention, checkpointing, compiled, stack)
    logits = logits_at_peak(logits_bytes(model, seq_len, mb, precision, compiled, stack), rebuilt)
    return held + rebuilt, rebuilt, logits


def logits_at_peak(logits: np.ndarray, rebuilt: np.ndarray) -> np.ndarray:
    """Bytes of the logits and loss buffers held at a step's peak beyond the rebuilt block's
    working set (:func:`activation_terms`): the loss's buffers are freed when backward leaves the
    head, before it rebuilds the first checkpointed block, so the two never coexist and the peak
    holds the larger; without checkpointing (nothing rebuilt) all of them."""
    return np.maximum(0.0, logits - rebuilt)


def gradients_at_peak(grads: np.ndarray, act: np.ndarray, act_outside: np.ndarray, logits: np.ndarray,
                      rebuilt: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Gradient bytes live at a step's memory peak, on top of ``act`` (activations with the
    rebuilt block's working set ``rebuilt``) and ``logits`` (:func:`logits_at_peak`). Where a
    step's one micro-batch starts with no gradients (``fresh``: no accumulation, and PyTorch
    autograd writes each ``.grad`` during backward after ``zero_grad(set_to_none=True)``, as DDP
    and a single GPU do), backward frees each block's saved activations as it writes that block's
    gradients, so the live bytes move from (activations + logits) at its start to (gradients +
    activations outside the blocks + the first block's rebuilt working set) at its end, and the
    peak holds max(0, gradients + outside + rebuilt - activations - logits) gradient bytes
    (autocast's weight copies, freed too, are left in: conservative). Otherwise (accumulation,
    sharded gradient buffers, a stack's contiguous gradient buffer: ``Stack.contiguous_grads``)
    all of them."""
    return np.where(fresh, np.maximum(0.0, grads + act_outside + rebuilt - act - logits), grads)


def logits_bytes(model, seq_len: int, mb: np.ndarray, precision: str, compiled: bool,
                 stack: Stack | str | None = None) -> np.ndarray:
    """Logits and loss buffers of one micro-batch (bytes), from the family's graph (the stack's
    bytes per logit, :meth:`simulator.strategy.stacks.Stack.loss_bytes_per_logit`)."""
    g = graph(model, seq_len, mb, precision, family_of(model).attentions[-1], compiled, stack)
    return np.asarray(g.logits_bytes, float) + np.zeros_like(np.asarray(mb, dtype=float))


def layout_states(model, layer_params: float, precision: str, sharding: str, offload: str, optimizer: str,
                  n_gpus: int, stack=None, pipelined: bool = False) -> dict[str, float]:
    """:func:`model_states` of a GPU's view of the model (``parallel.ShardView``) over ``n_gpus``
    data-parallel ranks (``pipelined``: one stage of a pipeline, as there). Under expert
    parallelism (a mixture of experts, ``ep`` > 1) the GPU's
    experts (``n_expert_params``) are replicated only over the ranks holding the same experts
    (Megatron-Core's expert data-parallel group, :func:`expert_dp`), so their sharded states are
    divided by that, the rest of the model's by n; otherwise exactly :func:`model_states`."""
    P, ep = float(model.n_params()), getattr(model, "ep", 1)
    if ep <= 1:
        return model_states(P, layer_params, precision, sharding, offload, optimizer, n_gpus, stack, pipelined)
    X = float(model.n_expert_params())
    dense = model_states(P - X, layer_params, precision, sharding, offload, optimizer, n_gpus, stack, pipelined)
    experts = model_states(X, X / max(model.n_layers, 1), precision, sharding, offload, optimizer,
                           expert_dp(model, n_gpus), stack, pipelined)
    return {k: dense[k] + experts[k] for k in dense}


def expert_dp(model, n_gpus: int) -> int:
    """Ranks holding the same experts among ``n_gpus`` data-parallel ranks of a view with
    ``ep`` > 1: n/ep, or n x (tp/etp)/ep when the experts are folded (the expert grid spans the
    stage's tp x dp GPUs)."""
    return max(1, n_gpus * getattr(model, "expert_token_shards", 1) // model.ep)


def sharded_params(model, n_gpus: int) -> float:
    """Parameters whose optimizer states one of ``n_gpus`` data-parallel ranks holds when they
    are sharded (ZeRO-1 and above): P / n, and a GPU's experts over the n/ep ranks that share them
    under expert parallelism (:func:`layout_states`)."""
    P, ep = float(model.n_params()), getattr(model, "ep", 1)
    if ep <= 1:
        return P / n_gpus
    X = float(model.n_expert_params())
    return (P - X) / n_gpus + X / expert_dp(model, n_gpus)
