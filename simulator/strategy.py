"""Training strategy: every knob the simulator models, its valid values, and pinning rules."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from .errors import UsageError, unknown

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
ATTENTIONS = ("eager", "sdpa")
COMPILES = (False, True)
CHECKPOINTINGS = ("none", "selective", "full")
SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "fsdp-grad-op", "fsdp-full")
OFFLOADS = ("none", "optimizer", "all")
OPTIMIZERS = ("adamw", "adam", "lion", "sgd")

#: ZeRO stage equivalent of each sharding mode (what is partitioned across data-parallel ranks).
SHARD_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp-grad-op": 2, "zero3": 3, "fsdp-full": 3}


class Strategy(BaseModel):
    """One fully specified way to run a training step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Literal["fp32", "tf32", "bf16", "fp16"]
    attention: Literal["eager", "sdpa", "n/a"]  # n/a: the model has no attention (Mamba, ConvNeXt)
    compile: bool
    checkpointing: Literal["none", "selective", "full"]
    sharding: Literal["ddp", "zero1", "zero2", "zero3", "fsdp-grad-op", "fsdp-full"]
    offload: Literal["none", "optimizer", "all"]
    micro_batch: int
    grad_accum: int

    def describe(self) -> str:
        """One line, e.g. 'bf16 · SDPA · compiled · ZeRO-1 · no checkpointing · micro-batch 4 × 32'."""
        parts = [
            self.precision,
            {"sdpa": "SDPA", "eager": "eager attention", "n/a": "no attention"}[self.attention],
            "compiled" if self.compile else "not compiled",
            {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
             "fsdp-grad-op": "FSDP shard-grad-op", "fsdp-full": "FSDP full-shard"}[self.sharding],
            {"none": "no checkpointing", "selective": "selective checkpointing",
             "full": "full checkpointing"}[self.checkpointing],
        ]
        if self.offload != "none":
            parts.append({"optimizer": "optimizer offloaded to CPU", "all": "params + optimizer offloaded to CPU"}[self.offload])
        parts.append(f"micro-batch {self.micro_batch} × {self.grad_accum} accumulation")
        return " · ".join(parts)


def offload_allowed(sharding: str, offload: str) -> bool:
    """What the frameworks offer: DeepSpeed ZeRO-Offload moves optimizer states for ZeRO-1/2/3 and
    ZeRO-Infinity also parameters for ZeRO-3; PyTorch FSDP's CPUOffload(offload_params=True) moves
    parameters, gradients and the optimizer step together, modelled for full sharding only."""
    if offload == "none":
        return True
    if offload == "optimizer":
        return sharding in ("zero1", "zero2", "zero3")
    return sharding in ("zero3", "fsdp-full")


def check_choice(flag: str, value, choices) -> None:
    """Raise UsageError if a pinned knob is not one of its valid choices."""
    if value not in choices:
        raise unknown(f"value for {flag}", str(value), [str(c) for c in choices])


def check_pins(pins: dict) -> None:
    """Validate pinned knobs (None = free) and their combination."""
    spaces = {"precision": PRECISIONS, "attention": ATTENTIONS, "checkpointing": CHECKPOINTINGS,
              "sharding": SHARDINGS, "offload": OFFLOADS}
    for key, choices in spaces.items():
        if pins.get(key) is not None:
            check_choice("--" + key, pins[key], choices)
    mb = pins.get("micro_batch")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0):
        raise UsageError(f"--micro-batch must be a positive integer, got {mb!r}")
    s, o = pins.get("sharding"), pins.get("offload")
    if s is not None and o is not None and not offload_allowed(s, o):
        need = "zero3 or fsdp-full" if o == "all" else "zero1, zero2 or zero3"
        raise UsageError(f"--offload {o} does not work with --sharding {s}; it needs --sharding {need}")
