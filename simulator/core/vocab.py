"""Vocabularies every layer shares: training precisions, datasheet precisions, MLP activations,
a mixture of experts' routings."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]
#: Training precisions (fp32, fp32 with TF32 GEMMs, bf16 / fp16 mixed precision, and fp8: bf16
#: mixed precision whose layers' linear GEMMs run in FP8, as torchao float8 and Transformer Engine
#: do): the one list; a recipe's precisions (simulator.model.recipes) and a datasheet's peaks
#: (simulator.hardware.catalog, and a profile's efficiencies) build on it.
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: Half floating-point dtypes (torch.bfloat16, torch.float16).
HALF_PRECISIONS = ("bf16", "fp16")
#: FP8 training: bf16 mixed precision with FP8 GEMMs in the linear layers (Op.fp8_linear).
FP8 = "fp8"
#: Mixed precisions: half activations (and half weights and gradients under ZeRO / FSDP).
MIXED_PRECISIONS = (*HALF_PRECISIONS, FP8)


def base_precision(precision: str) -> str:
    """The precision everything but FP8 linear layers runs in: bf16 under fp8, else ``precision``."""
    return "bf16" if precision == FP8 else precision


#: MLP activations a :class:`ModelSpec` names (of the gate, in a gated MLP): exact (erf) GELU,
#: GPT-2's tanh approximation (Hugging Face ``gelu_new`` / ``gelu_pytorch_tanh``), SiLU, ReLU.
Activation = Literal["gelu", "gelu_tanh", "silu", "relu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)


#: Where a token's top-k experts lie (simulator.model.families.moe.MoESpec.routing, ``--moe-routing``).
Routing = Literal["uniform", "contiguous"]
ROUTINGS: tuple[str, ...] = get_args(Routing)
