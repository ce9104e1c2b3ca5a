"""FP8 training's extra work on a micro-batch's operations: the scaling casts of the FP8 linear layers.

Under precision fp8 (bf16 mixed precision with FP8 GEMMs, as torchao's float8 training and NVIDIA
Transformer Engine run it) each GEMM of an ``Op.fp8_linear`` op takes FP8 operands, each with
its own scale. Tensor-wise dynamic scaling (torchao's default ``tensorwise`` recipe, the one
torchtitan's published FP8 runs use) computes each operand's absolute maximum, then casts it:
two passes over the bf16 tensor. Each operand feeds two of the linear's three GEMMs in
different layouts (``torch._scaled_mm`` needs the first operand row-major and the second
column-major), so the cast writes it twice in FP8. Forward casts the input x (m x k) and the
weight W (k x n); backward the output gradient g (m x n). Bytes, per repetition of the op.
Activations, weights, gradients and what backward keeps stay as under bf16 (torchao's
Float8Linear saves its bf16 input; torchao's published Llama 3 8B table: 47.65 GB peak in bf16,
47.77 GB with float8), so memory is unchanged; the weights are cast once per micro-batch (no
FP8 weight cache across micro-batches, no FP8 all-gather under FSDP: both would save a little).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .families.base import Block, Graph, Op

#: Bytes moved per element of an FP8 GEMM operand by tensor-wise dynamic scaling: the amax pass
#: reads it in bf16 (2), the cast pass reads it again (2) and writes FP8 in both layouts (1 + 1).
CAST_BYTES_PER_ELEMENT = 6.0
#: Kernels per cast operand (the amax reduction, then the cast).
CAST_KERNELS = 2.0


def cast_op(ops: tuple[Op, ...]) -> Op | None:
    """The scaling casts of a block's FP8 linear ops as one bandwidth-bound op (None if it has none):
    forward x and W of every GEMM, backward g; re-run with the forward wherever the block is
    recomputed, and under op-level checkpointing (a cast is not a matmul)."""
    lin = [op for op in ops if op.kind == "gemm" and op.fp8_linear]
    if not lin:
        return None
    fwd = sum(op.count * np.asarray(op.batch, float) * (np.asarray(op.m, float) * op.k + op.k * op.n) for op in lin)
    bwd = sum(op.count * np.asarray(op.batch, float) * np.asarray(op.m, float) * op.n for op in lin)
    n = sum(op.count for op in lin)
    return Op("fp8_casts", "elementwise", bytes_fwd=CAST_BYTES_PER_ELEMENT * fwd, bytes_bwd=CAST_BYTES_PER_ELEMENT * bwd,
              kernels_fwd=2 * CAST_KERNELS * n, kernels_bwd=CAST_KERNELS * n, recompute=frozenset({"op"}),
              bandwidth="elementwise")


def with_fp8_casts(g: Graph) -> Graph:
    """``g`` with each block's scaling casts added (:func:`cast_op`)."""
    blocks = []
    for b in g.blocks:
        c = cast_op(b.ops)
        blocks.append(b if c is None else Block(b.name, (*b.ops, c), b.repeat, b.input_bytes))
    return dataclasses.replace(g, blocks=tuple(blocks))
