"""Training stacks (the user's software): what each keeps in fp32, fuses, and offers.

Presets live in ``simulator/data/stacks.yaml``, each field with the code of that stack it comes
from. A stack is not searched: it is chosen (``stack=`` / ``--stack NAME``), default
``hf-trainer`` (the $100K study's Hugging Face Trainer).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..core.errors import unknown
from ..core.vocab import MIXED_PRECISIONS
from .knobs import SHARDINGS

#: The fraction of the tensor-parallel collectives asynchronous TP hides at most (the transfers
#: contend with the GEMMs for memory bandwidth and SMs; simulator.physics.parallel.async_tp_time). Fitted to
#: the two bf16 rows of torchtitan's published async-TP benchmark, the only published pair of runs
#: with and without it that we found (tests/test_parallel.py checks both).
ASYNC_TP_OVERLAP = 0.42
ASYNC_TP_OVERLAP_SOURCE = (
    "fitted: pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, bf16 rows: Llama 3 70B "
    "on 256 H100 (FSDP 32, TP 8, compiled, full AC, local batch 16) 597.3 -> 652.4 tokens/s per GPU (1.09x; "
    "predicted 1.08x) and Llama 3 8B on 64 H100 (FSDP 8, TP 8, per-op SAC, local batch 12) 4378 -> 4809 "
    "(1.10x; predicted 1.11x)")

#: Why a compiled step's loss is fused by default (``Stack.compile_fuses_loss``).
_COMPILE_FUSES_LOSS_SOURCE = (
    "torch.compile: Inductor fuses the loss's upcast, log-softmax and nll into one reduction kernel each way "
    "(the half logits read and written about twice)")


class Stack(BaseModel):
    """One training stack; see the field notes in data/stacks.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display: str
    description: str
    loss: Literal["upcast", "upcast-inplace", "half", "fused", "fused-inplace"]
    loss_source: str
    compile_fuses_loss: bool = True
    compile_fuses_loss_source: str = _COMPILE_FUSES_LOSS_SOURCE
    fused_dispatch: Literal["inductor", "eager"] = "inductor"
    fused_dispatch_source: str = ("a compiled step is torch.compile's generated code (or a C program's launches, llm.c): "
                                  "the profile's compiled launch time per fused kernel")
    returns_outputs: bool = False
    returns_outputs_source: str = ("the model returns the loss, or the logits the loss is computed from outside it: "
                                   "no output of a compiled step goes without a gradient")
    norm: Literal["fp32", "half"]
    norm_source: str
    saves: Literal["hf-eager", "textbook"] = "textbook"
    saves_source: str = ("the stack's own fused modules: what Korthikanti et al. 2022 count per layer "
                         "(simulator.model.workload.layer_activation_bytes_per_token)")
    # how the eager modules of a ``saves: hf-eager`` stack are written (what their elementwise traffic is)
    rmsnorm: Literal["eager", "fused"] = "eager"
    rmsnorm_source: str = ("transformers' LlamaRMSNorm (and its copies in Qwen2/3, Mistral, Gemma): pow, mean, "
                           "rsqrt and two multiplies as eager ops on the fp32 stream (hf_eager.RMSNORM_EAGER)")
    projections: Literal["per-family", "fused"] = "per-family"
    projections_source: str = ("transformers' modules: one QKV projection where the family fuses it "
                               "(hf_eager.FUSED_QKV, FUSED_GATE_UP), else q/k/v and gate/up each read the norm "
                               "output, which autocast casts once per reader")
    rotary_tables: Literal["fp32", "half"] = "fp32"
    rotary_tables_source: str = ("transformers' rotary embeddings: cos/sin in the embeddings' dtype, fp32 under "
                                 "autocast over fp32 weights (LlamaRotaryEmbedding.forward), so Q and K's rotary "
                                 "ops past the first multiply write fp32 (hf_eager.ROTARY_TABLE)")
    fragmentation: float = Field(ge=0.0, le=1.0)
    fragmentation_source: str
    loss_fragmentation: float = Field(0.0, ge=0.0, le=1.0)
    loss_fragmentation_source: str = "not counted apart (fragmentation covers the activations only)"
    shardings: tuple[str, ...]
    shardings_source: str
    zero_params: Literal["half", "fp32"] = "half"
    zero_params_source: str = "DeepSpeed ZeRO (bf16/fp16 mode: half module weights, fp32 master copy in the optimizer)"
    parallelisms: tuple[Literal["tp", "pp", "cp", "ep"], ...] = ("tp", "pp", "cp", "ep")
    parallelisms_source: str = "not limited: the Megatron-style layouts are searched"
    pipeline_shardings: tuple[str, ...] = ("ddp", "zero1")
    pipeline_shardings_source: str = (
        "Megatron-style pipelining: the gradient all-reduce (DDP) or the distributed optimizer (ZeRO-1); "
        "DeepSpeed's PipelineEngine asserts zero_optimization_stage() < 2 ('ZeRO-2 and ZeRO-3 are "
        "incompatible with pipeline parallelism', deepspeed/runtime/pipe/engine.py)")
    async_tp: Literal["no", "compiled", "yes"] = "no"
    async_tp_source: str = "not offered"
    async_tp_overlap: float = Field(ASYNC_TP_OVERLAP, ge=0.0, le=1.0)
    async_tp_overlap_source: str = ASYNC_TP_OVERLAP_SOURCE
    states: Literal["mixed", "half", "master"] = "mixed"
    states_source: str = "torch.autocast over fp32 parameters (mixed precision): fp32 weights, gradients and moments"
    attention_kernel: Literal["flash", "cudnn"] = "flash"
    attention_kernel_source: str = ("FlashAttention-2: the flash-attn package, or torch SDPA's flash backend "
                                    "(the kernel of Shah et al. 2024's FA2 bars and of the end-to-end fits)")
    optimizer: Literal["fused", "foreach", "for_loop"] = "foreach"
    optimizer_source: str = ("torch.optim.AdamW's default on CUDA tensors (foreach=None picks the multi-tensor "
                             "foreach implementation; fused must be asked for)")
    moe_experts: Literal["grouped", "loop"] = "grouped"
    moe_experts_source: str = ("Megatron-LM --moe-grouped-gemm with the all-to-all dispatcher; torchtitan's "
                               "grouped_mm experts: one kernel per GEMM for all of a GPU's experts")
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    moe_dispatcher_source: str = ("NCCL all-to-all of every routed copy (Megatron-LM's default "
                                  "--moe-token-dispatcher-type alltoall; torchtitan's default expert parallelism)")
    grad_reduce_overlap: bool = True
    grad_reduce_overlap_source: str = ("PyTorch DDP's bucketed all-reduce hooks (and DeepSpeed ZeRO's, FSDP's reduce-scatters) "
                                       "run during backward, beside the layers still to differentiate")
    moe_a2a_overlap: bool = False
    moe_a2a_overlap_source: str = ("not overlapped (Megatron-LM's default; its --overlap-moe-expert-parallel-comm "
                                   "is opt-in; torchtitan has none)")
    fp32_grads: tuple[str, ...] = ()
    fp32_grads_source: str = ("gradients at the compute precision (autograd's .grad in the parameters' dtype; "
                              "fp32 where torch.autocast keeps fp32 parameters)")
    grad_buffer: Literal["autograd", "contiguous"] = "autograd"
    grad_buffer_source: str = ("autograd writes each .grad during backward (after zero_grad(set_to_none=True)); "
                               "sharded stacks keep their own flat gradient buffers")
    reduce_dtype: Literal["fp32"] | None = None
    reduce_dtype_source: str = "gradients reduced in their own dtype (the compute precision under mixed precision)"
    aliases: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _compile_fuses_loss_cited(self) -> Stack:
        if not self.compile_fuses_loss and self.compile_fuses_loss_source == _COMPILE_FUSES_LOSS_SOURCE:
            raise ValueError(f"stack {self.name}: compile_fuses_loss false needs its own compile_fuses_loss_source "
                             "(the code that keeps the loss out of the compiled step)")
        return self

    @field_validator("fp32_grads")
    @classmethod
    def _mixed_fp32_grads(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [p for p in v if p not in MIXED_PRECISIONS]
        if bad:
            raise ValueError(f"fp32_grads {bad} not among the mixed precisions {', '.join(MIXED_PRECISIONS)} "
                             "(fp32 and tf32 gradients are fp32 already)")
        return v

    @field_validator("shardings")
    @classmethod
    def _known_shardings(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in SHARDINGS]
        if bad or not v:
            raise ValueError(f"shardings {bad or '[]'} not among {', '.join(SHARDINGS)}")
        return v

    @field_validator("pipeline_shardings")
    @classmethod
    def _known_pipeline_shardings(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [s for s in v if s not in ("ddp", "zero1", "fsdp-grad-op", "fsdp-full")]
        if bad or not v:
            raise ValueError(f"pipeline_shardings {bad or '[]'} not among ddp, zero1, fsdp-grad-op, fsdp-full "
                             "(DeepSpeed's ZeRO-2/3 never pipeline)")
        return v

    def loss_bytes_per_logit(self, e: int, compiled: bool) -> float:
        """Bytes per logit element held at the loss's peak (logits, loss buffers, their gradient),
        with ``e`` bytes per activation element, by :meth:`loss_kind`. A fused kernel writing the
        gradient over the logits (``fused-inplace``): e. A fused loss (a fused loss kernel, or Inductor
        fusing the upcast and log-softmax of a compiled step): the half logits and their half gradient
        (2e). Eager upcast (``F.cross_entropy(logits.float())``): forward holds the logits, their fp32 copy
        and the saved fp32 log-probabilities (e + 4 + 4 under mixed precision; the fp32 logits are the
        copy in fp32); in backward ``nll_loss``'s fp32 gradient and ``log_softmax``'s fp32 input gradient
        live beside the saved log-probabilities (12): max(e + 8, 12). Megatron's in-place upcast
        (``upcast-inplace``): the half logits and their fp32 copy, which becomes the saved softmax in
        place, then the gradient in place and its half cast: e + 4 (4 in fp32, where ``.float()`` is the
        logits themselves). Eager loss on half logits (``half``): the logits and saved half
        log-probabilities, then ``nll_loss``'s half gradient and ``log_softmax``'s beside them: 3e.
        A compiled step whose model also returns its logits (``returns_outputs``): e more, the
        zero-filled gradient autograd hands the compiled backward for that output
        (calibration/hf_compiled_peak.py)."""
        tangent = float(e) if compiled and self.returns_outputs else 0.0
        held = {"fused-inplace": float(e), "fused": 2.0 * e, "upcast": max(e + 8.0, 12.0),
                "upcast-inplace": e + 4.0 if e < 4 else 4.0, "half": 3.0 * e}
        return held[self.loss_kind(compiled)] + tangent

    def loss_kind(self, compiled: bool) -> str:
        """How the loss runs: the stack's ``loss``, or ``fused`` (one kernel each way, reading and
        writing the logits about twice: 2e bytes per logit element each way) where a compiled step's
        compiler fuses an eager loss (``compile_fuses_loss``: torch.compile's Inductor does;
        Megatron-LM's hand-fused kernels, which "compiled" stands for on that stack, leave its fp32
        cross-entropy eager)."""
        if compiled and self.compile_fuses_loss and self.loss != "fused-inplace":
            return "fused"
        return self.loss

    def eager_dispatch(self, compiled: bool) -> bool:
        """Whether eager PyTorch issues a step's kernels, each paying the profile's eager launch and
        training-pass host time: an eager step, or a "compiled" one whose fused kernels eager modules
        call (``fused_dispatch: eager``, Megatron-LM); else torch.compile's generated code (or a C
        program, llm.c) at the compiled launch time per kernel."""
        return not compiled or self.fused_dispatch == "eager"

    @property
    def torch_zero(self) -> bool:
        """Whether the stack's ZeRO keeps fp32 module weights that torch.autocast casts
        (PyTorch's ZeroRedundancyOptimizer under DDP, apex's DistributedFusedAdam), not
        DeepSpeed's half weights with an fp32 master copy."""
        return self.zero_params == "fp32"

    @property
    def half_states(self) -> bool:
        """Whether the model itself is cast to the half precision (``model.to(torch.bfloat16)``):
        half weights and gradients, and an optimizer keeping its moments in the parameters'
        dtype (torch.optim.AdamW), no fp32 copy anywhere."""
        return self.states == "half"

    @property
    def half_model(self) -> bool:
        """Whether the model's weights are half (``states`` half or master), so torch.autocast
        casts nothing per micro-batch."""
        return self.states in ("half", "master")

    @property
    def hf_eager(self) -> bool:
        """Whether the stack runs Hugging Face transformers' modules, whose saved tensors
        :mod:`simulator.model.hf_eager` counts in eager mode and :mod:`simulator.model.hf_compiled`
        under torch.compile (``saves: hf-eager``)."""
        return self.saves == "hf-eager"

    def fp32_main_grads(self, precision: str) -> bool:
        """Whether the stack keeps fp32 gradients of half parameters under ``precision``
        (Megatron-LM's main_grad, ``fp32_grads``)."""
        return precision in self.fp32_grads

    @property
    def contiguous_grads(self) -> bool:
        """Whether the gradients live in one buffer allocated before the first step and kept
        (``grad_buffer: contiguous``): all their bytes are live at every peak, and the
        data-parallel collectives run in place on it (no bucket copies)."""
        return self.grad_buffer == "contiguous"

    def fp32_norm(self, e: int, compiled: bool) -> bool:
        """Whether eager norms write fp32 outputs under mixed precision (autocast layer_norm)."""
        return e == 2 and not compiled and self.norm == "fp32"


@functools.lru_cache(maxsize=1)
def _load() -> tuple[dict[str, Stack], str]:
    raw = yaml.safe_load(resources.files("simulator").joinpath("data/stacks.yaml").read_text(encoding="utf-8"))
    stacks = {name: Stack(name=name, **body) for name, body in raw["stacks"].items()}
    if raw["default"] not in stacks:
        raise ValueError(f"stacks.yaml: default {raw['default']!r} is not a stack")
    return stacks, raw["default"]


def list_stacks() -> list[str]:
    """Names of the stack presets."""
    return list(_load()[0])


def default_stack() -> Stack:
    """The default stack (hf-trainer)."""
    stacks, default = _load()
    return stacks[default]


def for_published(name: str) -> Stack:
    """The preset for a stack name found in published run tables (its name or an alias);
    UsageError if none claims it."""
    stacks, _ = _load()
    key = str(name).strip().lower()
    for s in stacks.values():
        if key == s.name or key in s.aliases:
            return s
    raise unknown("stack", str(name), [a for s in stacks.values() for a in (s.name, *s.aliases)])


def get_stack(name: str | Stack | None) -> Stack:
    """A stack by name (None: the default); UsageError naming the valid choices otherwise."""
    if isinstance(name, Stack):
        return name
    if name is None:
        return default_stack()
    stacks, _ = _load()
    key = str(name).strip().lower()
    if key not in stacks:
        raise unknown("stack", str(name), list(stacks))
    return stacks[key]
