"""Predicting a validation configuration's step with the simulator: the step time per pass and the
peak memory per device, from a calibration profile; and the refusal of configurations whose model
states exceed the device's memory. Times in seconds, memory in GiB."""

from __future__ import annotations

from typing import Any

from simulator.core.errors import UsageError

from .measuring import GIB, VALIDATE_OPTIMIZER
from .suite import Config

#: How the default stack (hf-trainer) is changed to this loop's: its AdamW implementation
#: (:data:`VALIDATE_OPTIMIZER`); its model (calibration/torch_model.py) returns only the loss, no
#: logits or KV cache whose zero-filled gradients a compiled backward would take; and its modules are
#: written as that file writes them, not as transformers does: ``nn.RMSNorm`` (one fused kernel each
#: way), one QKV and one gate/up projection in every family, rotary tables cast to the activations'
#: half type (``cos.to(x.dtype)`` in ``_apply_rotary``).
VALIDATE_STACK = {
    "optimizer": VALIDATE_OPTIMIZER, "returns_outputs": False,
    "rmsnorm": "fused", "rmsnorm_source": "calibration/torch_model.py _norm: nn.RMSNorm",
    "projections": "fused", "projections_source": "calibration/torch_model.py Attention.qkv, MLP.up (gate and up)",
    "rotary_tables": "half", "rotary_tables_source": "calibration/torch_model.py _apply_rotary: cos.to(x.dtype)",
}


def check_fits_memory(configs: list[Config], memory_gib: float, where: str) -> None:
    """Refuse, before anything is built, a config whose model states alone (weights, gradients
    and AdamW's two moments as one DDP rank holds them, :func:`simulator.physics.memory.state_bytes_per_param`)
    exceed ``memory_gib`` (GiB): building it would end in an out-of-memory kill, not a row."""
    from simulator.physics.memory import state_bytes_per_param

    for cfg in configs:
        per_param = sum(state_bytes_per_param(cfg.precision, "ddp", "adamw"))
        need = cfg.spec.n_params() * per_param / 2**30
        if need > memory_gib:
            raise UsageError(f"suite config {cfg.id!r}: {cfg.model}'s {cfg.spec.n_params() / 1e9:.2f} B parameters need "
                             f"at least {need:,.1f} GiB ({per_param} bytes each: weights, gradients, AdamW moments), "
                             f"{where} has {memory_gib:,.1f} GiB; leave it out (--only) or use a smaller model")


def predict(cfg: Config, profile, world: int = 1) -> dict[str, Any]:
    """The simulator's step time (s) and breakdown for ``cfg`` on ``world`` local devices.

    Returns keys ``step``, ``fwd``, ``bwd``, ``rec`` (recomputation), ``opt``, the peak memory per
    device ``mem`` (allocated) and ``reserved`` (GiB, :func:`predicted_peaks`), and ``note`` (why
    there is no prediction, else empty).
    """
    from simulator.answer.api import simulate
    from simulator.strategy.stacks import get_stack

    if world > 1 and "local" not in profile.collectives:
        return {"step": None, "note": f"profile {profile.name!r} has no 'local' collectives fit "
                "(run `calibrate --collectives`); no prediction for multi-process runs"}
    try:
        plan = simulate(cfg.spec, f"{world}xlocal", profile=profile, seq_len=cfg.seq_len,
                        global_batch=cfg.micro_batch * cfg.grad_accum * world, steps=1,
                        optimizer="adamw", precision=cfg.precision, attention=cfg.attention,
                        compile=cfg.compile, checkpointing=cfg.checkpointing, sharding="ddp",
                        offload="none", micro_batch=cfg.micro_batch,
                        stack=get_stack(None).model_copy(update=VALIDATE_STACK))
    except UsageError as exc:
        return {"step": None, "note": f"simulate: {exc}"}
    b = plan.breakdown_s
    if plan.strategy.get("grad_accum") != cfg.grad_accum:
        return {"step": None, "note": f"simulate chose grad_accum {plan.strategy.get('grad_accum')}"}
    mem, reserved = predicted_peaks(plan, cfg.spec.n_params(), cfg.precision)
    return {"step": plan.step_time_s, "fwd": b["forward"], "bwd": b["backward"], "rec": b["recompute"],
            "opt": b["optimizer"], "mem": mem, "reserved": reserved, "note": "" if plan.feasible
            else "predicted infeasible: " + "; ".join(plan.reasons)}


def predicted_peaks(plan, n_params: float, precision: str) -> tuple[float, float]:
    """(allocated, reserved) peak GiB per device of a validation step: the plan's (``allocated``;
    ``total`` adds the caching allocator's reserve), or the optimizer step of this loop's foreach
    AdamW where that is larger: the states, buffers, every gradient and ``torch._foreach_sqrt``'s
    fp32 copy of the second moments (4 bytes per parameter). The simulator's stacks step with
    fused or per-tensor optimizers, which allocate no such copy."""
    from simulator.physics.memory import state_bytes_per_param

    m = plan.memory_gib
    reserve = m["total"] - m["allocated"]
    grads = state_bytes_per_param(precision, "ddp", "adamw")[1] * n_params
    step = m["weights"] + m["optimizer"] + m["other"] - reserve + (grads + 4.0 * n_params) / GIB
    return max(m["allocated"], step), max(m["total"], step)

