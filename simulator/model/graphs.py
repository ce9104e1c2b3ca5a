"""The operations of one micro-batch (``simulator/model/families``), cached, and the FLOPs a model
counts per token.

The one entry from the simulator to the families: ``compute`` (time), ``memory`` (saved
activations, logits) and the MFU conventions read a model only through :func:`graph`, never a
family's fields. Pure and vectorized over the micro-batch size. FLOPs, bytes.
docs/architecture.md, physics 1-4.
"""

from __future__ import annotations

import numpy as np

from ..core.vocab import FP8
from ..strategy.stacks import Stack, get_stack
from .families import Knobs, family_of
from .families.base import Graph
from .fp8 import with_fp8_casts


def graph(model, seq_len: int, mb, precision: str, attention: str, compiled: bool,
          stack: Stack | str | None = None) -> Graph:
    """The family's operations of one micro-batch of ``mb`` samples (array) under ``stack``
    (default hf-trainer), with FP8's scaling casts under fp8 (:mod:`simulator.model.fp8`); the last few graphs are kept, since a search asks for the same one per
    knob combination."""
    mb = np.asarray(mb, dtype=float)
    stack = get_stack(stack)
    key = (model, seq_len, mb.tobytes(), precision, attention, compiled, stack)
    g = _GRAPHS.get(key)
    if g is None:
        g = family_of(model).graph(model, mb, seq_len, Knobs(precision, attention, compiled, stack))
        if precision == FP8:
            g = with_fp8_casts(g)
        if len(_GRAPHS) >= 256:
            _GRAPHS.pop(next(iter(_GRAPHS)))
        _GRAPHS[key] = g
    return g


_GRAPHS: dict = {}


def _one_sample(model, seq_len: int) -> Graph:
    """One sample's graph with the family's fastest attention (fused where it has one)."""
    return graph(model, seq_len, np.array([1.0]), "bf16", family_of(model).attentions[-1], False)


def model_flops_per_token(model, seq_len: int) -> float:
    """The algorithm's minimum training FLOPs per token: 3 x every op's forward FLOPs of one
    sample (GEMMs of the trunk and the heads, fused attention with causal masking exploited,
    scans, convolutions; no FLOPs for embedding lookups); ConvNeXt: per image (its seq_len is 1).
    Basis of MFU and of the floor at 100% of peak (a true lower bound: recomputation and
    FlashAttention's backward recompute only add to it)."""
    fwd = sum(float(reps * op.fwd_flops().ravel()[0]) for op, reps in _one_sample(model, seq_len).all_ops())
    return 3.0 * fwd / seq_len


def mfu(tokens_per_s: float, model, seq_len: int, n_gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``tokens_per_s`` of the whole job times
    :func:`model_flops_per_token`, over ``n_gpus`` x ``peak_flops`` (FLOP/s, the dense peak of the
    precision). Never above 1 for a real run."""
    return tokens_per_s * model_flops_per_token(model, seq_len) / (n_gpus * peak_flops)


def palm_flops_per_token(model, seq_len: int) -> float:
    """6 N + 12 L h s per token (PaLM / llm-foundry MFU convention: N = all parameters, attention
    counted dense and non-causal, h = heads x head_dim of each attention op; a mixture of experts:
    N = its active parameters, 6 N_active per token). Reported as
    ``mfu_6nd`` for comparison with published MFUs. Families without attention: 6 N (Mamba);
    convolutional networks reuse weights across pixels, so 6 N means nothing there and their
    model FLOPs are used (ConvNeXt, ``Family.six_n`` False)."""
    if not family_of(model).six_n:
        return model_flops_per_token(model, seq_len)
    attn = sum(reps * 12.0 * op.heads * op.head_dim * op.seq
               for op, reps in _one_sample(model, seq_len).all_ops() if op.kind == "attention")
    active = getattr(model, "n_active_params", model.n_params)  # a mixture of experts: the parameters a token uses
    return 6.0 * active() + attn
