"""Training strategy: every knob the simulator models, its valid values, and pinning rules."""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ..core.errors import UsageError, unknown
from ..core.vocab import PRECISIONS, Precision
from .layout import Parallelism

ATTENTIONS = ("eager", "sdpa")
COMPILES = (False, True)
#: Activation checkpointing policies searched when the knob is free (``every:K`` pins any K):
#: none; selective (Megatron-LM: the attention core); op (torchtitan's op-level selective policy:
#: matmul and attention outputs kept, the rest recomputed); every:2 (every 2nd layer fully:
#: torchtitan's selective_ac_option = "2", floor(L/K) of the layers); full (every layer).
#: Megatron/DeepSpeed checkpoint_num_layers = K is a different shape (chunks of K layers, each
#: chunk's input kept and K layers rebuilt at once) and is not modelled.
CHECKPOINTINGS = ("none", "selective", "op", "every:2", "full")
CHECKPOINTING_POLICIES = ("none", "selective", "op", "full", "every:K")
_EVERY_RE = re.compile(r"^every:(\S*)$")
SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "fsdp-grad-op", "fsdp-full")
OFFLOADS = ("none", "optimizer", "all")
Optimizer = Literal["adamw", "adam", "lion", "sgd"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)

#: ZeRO stage equivalent of each sharding mode (what is partitioned across data-parallel ranks).
SHARD_STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "fsdp-grad-op": 2, "zero3": 3, "fsdp-full": 3}


#: The layout as flat keys (``Strategy`` input and output; JSON stays flat).
LAYOUT_KEYS = ("dp", "tp", "pp", "vp", "sequence_parallel", "async_tp", "cp", "ep", "etp")


class Strategy(BaseModel):
    """One fully specified way to run a training step.

    ``parallelism``: the layout (:class:`simulator.strategy.layout.Parallelism`); None means every GPU is
    a data-parallel rank (the degree is the cluster's GPU count). Input and output also take the
    layout as the flat keys of :data:`LAYOUT_KEYS` (``dp`` None, ``tp``, ``pp``, ``vp``,
    ``sequence_parallel``, ``async_tp``, ``cp``), the JSON form of a plan's strategy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision
    attention: Literal["eager", "sdpa", "n/a"]  # n/a: the model has no attention (Mamba, ConvNeXt)
    compile: bool
    checkpointing: str  # one of CHECKPOINTING_POLICIES, every:K with K >= 1
    sharding: Literal["ddp", "zero1", "zero2", "zero3", "fsdp-grad-op", "fsdp-full"]
    offload: Literal["none", "optimizer", "all"]
    micro_batch: int
    grad_accum: int
    parallelism: Parallelism | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat_layout(cls, data: Any) -> Any:
        """Accept the layout as flat keys (``dp``, ``tp``, ``pp``, ``vp``, ``sequence_parallel``)."""
        if not isinstance(data, dict) or not any(k in data for k in LAYOUT_KEYS):
            return data
        if data.get("parallelism") is not None:
            raise ValueError("give the layout as parallelism or as dp/tp/pp/vp/sequence_parallel, not both")
        flat = {k: data.get(k) for k in LAYOUT_KEYS}
        out = {k: v for k, v in data.items() if k not in LAYOUT_KEYS}
        tp, pp, vp, cp, ep = (int(flat[k]) if flat[k] is not None else 1 for k in ("tp", "pp", "vp", "cp", "ep"))
        sp, async_tp = bool(flat["sequence_parallel"]), bool(flat["async_tp"])
        etp = int(flat["etp"]) if flat["etp"] is not None else None
        if flat["dp"] is not None:
            out["parallelism"] = Parallelism(int(flat["dp"]), tp, pp, vp, sp, async_tp, cp, ep, etp)
        elif (tp, pp, vp, sp, async_tp, cp, ep) != (1, 1, 1, False, False, 1, 1):
            raise ValueError("a tensor- or pipeline-parallel layout needs its data-parallel degree dp")
        return out

    @model_serializer(mode="wrap")
    def _flat_dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dump the layout as the flat keys of :data:`LAYOUT_KEYS` (the plans' JSON form)."""
        out = handler(self)
        out.pop("parallelism", None)
        p = self.parallelism
        out.update(dp=p.dp if p else None, tp=self.tp, pp=self.pp, vp=self.vp, sequence_parallel=self.sequence_parallel,
                   async_tp=self.async_tp, cp=self.cp)
        if self.ep > 1:  # only mixtures of experts have it
            out["ep"] = self.ep
        if self.parallelism is not None and self.parallelism.etp is not None:  # pinned expert tensor parallelism
            out["etp"] = self.parallelism.etp
        return out

    @property
    def dp(self) -> int | None:
        """Data-parallel degree; None: every GPU of the cluster."""
        return self.parallelism.dp if self.parallelism else None

    @property
    def tp(self) -> int:
        return self.parallelism.tp if self.parallelism else 1

    @property
    def pp(self) -> int:
        return self.parallelism.pp if self.parallelism else 1

    @property
    def vp(self) -> int:
        return self.parallelism.vp if self.parallelism else 1

    @property
    def sequence_parallel(self) -> bool:
        return self.parallelism.sp if self.parallelism else False

    @property
    def async_tp(self) -> bool:
        """Tensor-parallel collectives overlapped with the GEMMs."""
        return self.parallelism.async_tp if self.parallelism else False

    @property
    def cp(self) -> int:
        """Context-parallel degree: each sequence split over cp ranks (ring attention)."""
        return self.parallelism.cp if self.parallelism else 1

    @property
    def ep(self) -> int:
        """Expert-parallel degree (a mixture of experts): its experts split over ep data-parallel ranks."""
        return self.parallelism.ep if self.parallelism else 1

    @field_validator("checkpointing")
    @classmethod
    def _policy(cls, v: str) -> str:
        return parse_checkpointing(v)

    def describe(self) -> str:
        """One line, e.g. 'bf16 · SDPA · compiled · ZeRO-1 · no checkpointing · micro-batch 4 × 32'."""
        parts = [
            self.precision,
            {"sdpa": "SDPA", "eager": "eager attention", "n/a": "no attention"}[self.attention],
            "compiled" if self.compile else "not compiled",
            {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
             "fsdp-grad-op": "FSDP shard-grad-op", "fsdp-full": "FSDP full-shard"}[self.sharding],
            describe_checkpointing(self.checkpointing),
        ]
        if self.offload != "none":
            parts.append({"optimizer": "optimizer offloaded to CPU", "all": "params + optimizer offloaded to CPU"}[self.offload])
        parts.append(f"micro-batch {self.micro_batch} × {self.grad_accum} "
                     + ("micro-batches" if self.pp > 1 else "accumulation"))
        if self.tp > 1 or self.pp > 1 or self.cp > 1 or self.ep > 1:
            parts.insert(0, self.parallelism.describe())
        return " · ".join(parts)


def parse_checkpointing(text: str) -> str:
    """The canonical policy name ('every:02' -> 'every:2'); UsageError naming the valid choices."""
    v = str(text).strip().lower()
    m = _EVERY_RE.match(v)
    if m:
        k = m.group(1)
        if not k.isdigit() or int(k) < 1:
            raise UsageError(f"--checkpointing {text}: K in every:K must be a positive integer (every:2 "
                             f"checkpoints every second layer); got {k!r}")
        return f"every:{int(k)}"
    if v not in CHECKPOINTING_POLICIES:
        raise unknown("value for --checkpointing", str(text), CHECKPOINTING_POLICIES)
    return v


def checkpoint_every(policy: str) -> int:
    """K of an 'every:K' policy, 1 for 'full' and 0 (never) otherwise."""
    if policy == "full":
        return 1
    return int(policy.split(":")[1]) if policy.startswith("every:") else 0


def checkpointed_layers(policy: str, n_layers: int) -> int:
    """Layers whose whole forward is recomputed: all under 'full', floor(L / K) under 'every:K'
    (torchtitan wraps each block whose running index is a multiple of K)."""
    k = checkpoint_every(policy)
    return n_layers // k if k else 0


def describe_checkpointing(policy: str) -> str:
    """E.g. 'checkpointing every 2nd layer', 'op-level selective checkpointing'."""
    k = checkpoint_every(policy)
    if policy.startswith("every:"):
        if k == 1:
            return "checkpointing every layer"
        suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
        return f"checkpointing every {k}{suffix} layer"
    return {"none": "no checkpointing", "selective": "selective checkpointing (attention core)",
            "op": "op-level selective checkpointing (matmul and attention outputs kept)",
            "full": "full checkpointing"}[policy]


def checkpointing_rank(policy: str) -> float:
    """Simplicity order for ties: none < selective < op < every:K (sparser first) < full."""
    fixed = {"none": 0.0, "selective": 1.0, "op": 2.0, "full": 4.0}
    return fixed[policy] if policy in fixed else 4.0 - 1.0 / checkpoint_every(policy)


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
    spaces = {"precision": PRECISIONS, "attention": ATTENTIONS, "sharding": SHARDINGS, "offload": OFFLOADS}
    for key, choices in spaces.items():
        if pins.get(key) is not None:
            check_choice("--" + key, pins[key], choices)
    if pins.get("checkpointing") is not None:
        parse_checkpointing(pins["checkpointing"])
    mb = pins.get("micro_batch")
    if mb is not None and (not isinstance(mb, int) or isinstance(mb, bool) or mb <= 0):
        raise UsageError(f"--micro-batch must be a positive integer, got {mb!r}")
    s, o = pins.get("sharding"), pins.get("offload")
    if s is not None and o is not None and not offload_allowed(s, o):
        need = "zero3 or fsdp-full" if o == "all" else "zero1, zero2 or zero3"
        raise UsageError(f"--offload {o} does not work with --sharding {s}; it needs --sharding {need}")
