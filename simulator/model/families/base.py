"""What every model family produces: operations, the blocks they repeat in, and the family's hooks.

A family turns its own validated spec into a :class:`Graph` for one micro-batch: the repeated
blocks of the trunk (transformer layers, Mamba layers, the ConvNeXt blocks of each stage), each a
list of :class:`Op`, plus the operations outside the trunk (embedding or stem, head, loss). The
consumers (``simulator/model/graphs.py``: time, FLOPs, saved activations) read operations only, never a
family's fields. Units: elements for shapes, FLOPs, bytes; arrays run over micro-batch sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ...strategy.knobs import CHECKPOINTINGS

OpKind = Literal["gemm", "attention", "scan", "conv", "elementwise"]


@dataclass(frozen=True)
class Op:
    """One operation of a micro-batch, repeated ``count`` times per repetition of its block.

    ``gemm``: forward (m x k) @ (k x n), ``batch`` independent copies (batched GEMMs); its backward
    is the two GEMMs (m,k,n) and (k,n,m): 2*m*n*k FLOPs each. Other kinds carry their forward and
    backward FLOPs and bytes moved explicitly (``attention``: the fused kernel's FLOPs; ``scan``,
    ``conv``, ``elementwise``: bandwidth-bound unless their FLOPs say otherwise). ``kernels_*`` are
    kernel launches per repetition. ``saved`` is bytes kept for backward per repetition;
    ``recompute`` the op-granular checkpointing policies (``selective``, ``op``; layer-granular
    ``full`` and ``every:K`` re-run every op of the checkpointed block repetitions) under which
    the op is re-run in backward, and ``always`` for ops a kernel recomputes by design. ``kept``:
    bytes the op keeps under a policy named there (torchtitan's ``op`` keeps matmul outputs,
    not their inputs); a policy not named keeps ``saved``, or nothing if it re-runs the op.
    Attention ops carry their ``head_dim``, sequence length ``seq`` and ``causal`` mask (the
    kernel's efficiency depends on them) and the ``heads`` it computes (with ``head_dim``: the
    width of the dense, non-causal attention of the PaLM FLOP convention). ``bandwidth``: the
    profile's bandwidth class of a bandwidth-bound op (``profile.BW_OP_CLASSES``; '' = the
    profile's ``memory_bw_eff``); ``bandwidth_bwd`` the backward's where it has its own ('' = the
    same). ``params`` counts the parameters the op owns (per repetition).
    ``atomics_bwd``: fp32 atomic adds into global memory its backward kernel issues per repetition,
    timed at the profile's ``fp32_atomic_rate`` (:func:`simulator.hardware.rates.atomic_rate`) and
    added to the op's roofline time (mamba-ssm issues them after each state's scans, between the
    block's barriers, so they do not overlap the scan's own work).
    ``fp8_linear``: a GEMM of a linear layer that FP8 training converts (torchao's Float8Linear,
    Transformer Engine's Linear): under precision fp8 its three GEMMs run at the FP8 peak and
    the block pays their inputs' scaling casts (:func:`simulator.model.fp8.with_fp8_casts`).
    ``attention_kernel``: the fused-attention kernel the stack runs (``flash``, ``cudnn``:
    :attr:`simulator.strategy.stacks.Stack.attention_kernel`), timed at the profile's figures for it.
    ``graph_break``: the op runs in a Python loop whose forward reads data-dependent sizes back to
    the host (``torch.where`` / ``nonzero`` in Hugging Face's eager expert loop): the host waits
    for the device there, so the forward of such ops overlaps neither the dispatch nor the device
    work of the others, and torch.compile breaks its graph there, so their kernels pay the eager
    host time per kernel in both passes (:meth:`simulator.physics.compute._Timed.pass_time`).
    ``grouped``: the ``batch`` GEMMs run as one grouped GEMM (a mixture of experts' experts under
    ``torch._grouped_mm`` or Megatron-Core's grouped GEMM), timed against one GEMM of all their rows
    where the profile calibrates it (``grouped_gemm_m_half``), else as ``batch`` GEMMs of m rows.
    """

    name: str
    kind: OpKind
    count: float = 1.0
    m: np.ndarray | float = 0.0
    n: float = 0.0
    k: float = 0.0
    batch: np.ndarray | float = 1.0
    flops_fwd: np.ndarray | float = 0.0
    flops_bwd: np.ndarray | float = 0.0
    bytes_fwd: np.ndarray | float = 0.0
    bytes_bwd: np.ndarray | float = 0.0
    kernels_fwd: float = 0.0
    kernels_bwd: float = 0.0
    saved: np.ndarray | float = 0.0
    recompute: frozenset[str] = frozenset()
    kept: Mapping[str, np.ndarray | float] = field(default_factory=dict)
    head_dim: float = 0.0
    seq: float = 0.0
    causal: bool = True
    heads: float = 0.0
    bandwidth: str = ""
    bandwidth_bwd: str = ""
    atomics_bwd: np.ndarray | float = 0.0
    params: int = 0
    fp8_linear: bool = False
    graph_break: bool = False
    attention_kernel: str = "flash"
    grouped: bool = False

    def kept_under(self, policy: str) -> np.ndarray | float:
        """Bytes kept per repetition under an op-granular policy (``none``, ``selective``, ``op``)."""
        if policy in self.kept:
            return self.kept[policy]
        return 0.0 if policy in self.recompute else self.saved

    def gemm_flops_fwd(self) -> np.ndarray:
        """Forward FLOPs of one repetition of a GEMM op: 2*m*n*k*batch."""
        return 2.0 * np.asarray(self.m, float) * self.n * self.k * np.asarray(self.batch, float)

    def fwd_flops(self) -> np.ndarray:
        """Forward FLOPs of one repetition (any kind)."""
        if self.kind == "gemm":
            return self.gemm_flops_fwd()
        return np.asarray(self.flops_fwd, float)

    def bwd_flops(self) -> np.ndarray:
        """Backward FLOPs of one repetition (GEMMs: two GEMMs of the forward's size)."""
        if self.kind == "gemm":
            return 2.0 * self.gemm_flops_fwd()
        return np.asarray(self.flops_bwd, float)


@dataclass(frozen=True)
class Block:
    """A unit of the trunk repeated ``repeat`` times; ``input_bytes`` is what full checkpointing
    keeps per repetition (the block's input, per micro-batch)."""

    name: str
    ops: tuple[Op, ...]
    repeat: int
    input_bytes: np.ndarray | float
    _kept: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def kept_under(self, policy: str) -> np.ndarray | float:
        """Bytes one repetition keeps under an op-granular policy (``none``: everything its ops
        save); computed once per policy, since a search asks for every micro-batch size at once."""
        if policy not in self._kept:
            self._kept[policy] = sum(op.count * np.asarray(op.kept_under(policy), float) for op in self.ops)
        return self._kept[policy]


@dataclass(frozen=True)
class Graph:
    """The operations of one micro-batch: the trunk's blocks, the ops outside them (never
    recomputed), and the loss buffers (``logits_bytes``: logits, log-probabilities, gradient)."""

    blocks: tuple[Block, ...]
    outside: tuple[Op, ...]
    logits_bytes: np.ndarray | float

    def all_ops(self) -> list[tuple[Op, float]]:
        """Every op with its repetitions per micro-batch (block repeats x op count)."""
        out = [(op, float(b.repeat) * op.count) for b in self.blocks for op in b.ops]
        return out + [(op, op.count) for op in self.outside]


@dataclass(frozen=True)
class Knobs:
    """The execution knobs a family may read when building its graph; ``stack``: the training
    stack (:class:`simulator.strategy.stacks.Stack`: loss kernel, norm precision)."""

    precision: str
    attention: str
    compiled: bool
    stack: Any


@dataclass(frozen=True)
class Family:
    """A registered model family (torchtitan's ``ModelSpec`` registry is the model).

    ``spec_cls``: its pydantic spec (``family`` field discriminates); ``families``: the values of
    that field it owns; ``graph(spec, mb, seq_len, knobs)`` builds one micro-batch's operations;
    ``attentions`` / ``compiles`` / ``checkpointings``: the knob values that apply (``("n/a",)``:
    the family has no attention, so the knob is not searched); ``from_hf_config(cfg, name)``:
    spec fields from a Hugging Face ``config.json`` (``cfg`` offers ``int``/``bool`` accessors
    and ``data``), keyed by ``model_type`` in ``hf_model_types``; ``notes(spec, stack)``: lines the
    output shows (what does not apply and why, how the stack runs the family); ``six_n``: see the field.
    """

    name: str
    spec_cls: type
    families: tuple[str, ...]
    graph: Callable[..., Graph]
    attentions: tuple[str, ...] = ("eager", "sdpa")
    compiles: tuple[bool, ...] = (False, True)
    checkpointings: tuple[str, ...] = CHECKPOINTINGS
    hf_model_types: tuple[str, ...] = ()
    from_hf_config: Callable[[Any, str], dict[str, Any]] | None = None
    notes: Callable[[Any, Any], list[str]] = field(default=lambda spec, stack: [])
    six_n: bool = True
    """Whether 6 N per token approximates training FLOPs (False where weights are reused
    across positions, as in convolutions)."""

    def allows_checkpointing(self, policy: str) -> bool:
        """Whether ``policy`` (canonical, e.g. every:4) applies: one of ``checkpointings``, or any
        every:K where the family searches one (layer-granular checkpointing of its blocks)."""
        if policy in self.checkpointings:
            return True
        return policy.startswith("every:") and any(c.startswith("every:") for c in self.checkpointings)
