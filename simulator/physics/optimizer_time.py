"""The optimizer step's time per GPU (seconds), docs/architecture.md, physics 6.

On the GPU the update is bound by memory bandwidth: every parameter a rank updates has its
master weight, gradient and moments read and written once per step, plus the gradient-norm
clipping pass, plus a fixed launch cost. Offloaded (DeepSpeed ZeRO-Offload / FSDP CPUOffload),
the update runs on the node's CPU and the gradients and updated weights cross the host link; with
offload 'all' the weight and gradient shards also stream over the host link every micro-batch.
Pure functions; arrays broadcast. Units: seconds, bytes, parameters.
"""

from __future__ import annotations

import numpy as np

from . import communication as comm
from .memory import moment_bytes

#: Launches of one optimizer step per layer: PyTorch's foreach Adam(W) issues about a dozen
#: multi-tensor kernels (moment updates, bias corrections, sqrt, division, parameter update,
#: weight decay) per group of tensors; one group per layer is assumed (the bandwidth term
#: dominates for any model worth simulating).
OPT_KERNELS_PER_LAYER = 12


#: Passes over the gradients that fp16 training's dynamic loss scaling adds to a step: the unscale
#: reads each gradient and writes it divided by the scale, checking for inf/NaN on the way
#: (torch.amp.GradScaler.unscale_: torch._amp_foreach_non_finite_check_and_unscale_; Megatron-LM's
#: and DeepSpeed's fp16 optimizers unscale their fp32 main gradients the same way)
LOSS_SCALE_GRAD_PASSES = 2


def bytes_per_param(optimizer: str, grad_bytes, half_copy, loss_scaled=False) -> np.ndarray:
    """Bytes an Adam-family step moves per parameter it updates: read the fp32 master weight (4),
    the gradient and the moments; write the moments and the weight (4); a half copy of the
    updated weight (``half_copy`` bytes: 2 where ZeRO/FSDP keep fp32 masters beside half
    weights, else 0); the gradient-norm clipping pass (read for the norm, read + write to
    scale: 3 x ``grad_bytes``); and under fp16's loss scaling (``loss_scaled``, bool or array)
    the unscale (:data:`LOSS_SCALE_GRAD_PASSES` x ``grad_bytes``)."""
    g = np.asarray(grad_bytes, dtype=float)
    scale = np.where(np.asarray(loss_scaled, dtype=bool), LOSS_SCALE_GRAD_PASSES * g, 0.0)
    return 4 + g + moment_bytes(optimizer) * 2 + 4 + half_copy + 3 * g + scale


def gpu_step_time(local_params, share, step_bytes, mem_bw: float, bw_eff: float, fresh_s: float,
                  loop_s: float | None, n_layers: int, launch_overhead_us: float) -> np.ndarray:
    """Seconds of the optimizer step on the GPU: ``local_params`` parameters x ``step_bytes``
    bytes each at ``bw_eff`` of ``mem_bw`` (bytes/s); the rank's ``share`` of the step's fresh
    pages (``fresh_s``, seconds for all parameters, CPU devices); and either the rank's share of a
    calibrated per-tensor host loop (``loop_s``, seconds for all parameters) or
    :data:`OPT_KERNELS_PER_LAYER` launches per layer at ``launch_overhead_us`` each."""
    launches = (OPT_KERNELS_PER_LAYER * n_layers * 1e-6 * launch_overhead_us if loop_s is None
                else share * loop_s)
    return local_params * step_bytes / (mem_bw * bw_eff) + share * fresh_s + launches


def offload_step_time(local_params, grad_bytes, weight_bytes, cpu_params_per_s: float,
                      host_bw: float) -> np.ndarray:
    """Seconds of an offloaded optimizer step: the CPU update of ``local_params`` parameters at
    ``cpu_params_per_s`` (the node's CPU Adam rate over its GPUs), plus the gradients down and the
    updated weights up over the host link (``grad_bytes`` + ``weight_bytes`` per parameter at
    ``host_bw`` bytes/s)."""
    return local_params / cpu_params_per_s + local_params * (grad_bytes + weight_bytes) / host_bw


def offload_stream_time(n_params: float, weight_bytes, grad_bytes, n_gpus: int, host_bw: float) -> np.ndarray:
    """Seconds per micro-batch that offload 'all' moves over the host link: the rank's weight
    shard up twice (forward and backward gathers) and its gradient shard down (``weight_bytes``,
    ``grad_bytes`` per parameter; ``host_bw`` bytes/s)."""
    return (2 * n_params * weight_bytes / n_gpus + n_params * grad_bytes / n_gpus) / host_bw


def offload_time(step_s, stream, window, window_last, grad_accum, n_layers: int) -> np.ndarray:
    """Seconds per optimizer step that offload adds: the offloaded step ``step_s``
    (:func:`offload_step_time`) plus the part of the offload stream not hidden behind compute:
    each of the ``grad_accum`` micro-batches streams ``stream`` seconds
    (:func:`offload_stream_time`) behind its ``window`` seconds of compute (``window_last`` for
    the last, possibly smaller, one); one layer's share cannot hide."""
    floor = stream / n_layers
    return step_s + (grad_accum - 1) * comm.exposed(stream, window, floor) + comm.exposed(stream, window_last, floor)
