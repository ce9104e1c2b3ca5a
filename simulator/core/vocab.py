"""Vocabularies every layer shares: training precisions, datasheet precisions, MLP activations."""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["fp32", "tf32", "bf16", "fp16"]
#: Training precisions (fp32, fp32 with TF32 GEMMs, bf16 / fp16 mixed precision): the one list;
#: a recipe's precisions (simulator.model.recipes) and a datasheet's peaks (simulator.hardware.catalog) build on it.
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: Mixed precisions: half activations (and half weights and gradients under ZeRO / FSDP).
HALF_PRECISIONS = ("bf16", "fp16")


#: Precisions a datasheet peak (and a profile's efficiency) may be given for: the training
#: precisions and fp8 (listed in datasheets, not trained here).
PEAK_PRECISIONS = (*PRECISIONS, "fp8")


#: MLP activations a :class:`ModelSpec` names (of the gate, in a gated MLP): exact (erf) GELU,
#: GPT-2's tanh approximation (Hugging Face ``gelu_new`` / ``gelu_pytorch_tanh``), SiLU, ReLU.
Activation = Literal["gelu", "gelu_tanh", "silu", "relu"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)
