"""Mamba (Gu & Dao 2023; Hugging Face ``MambaForCausalLM``) as operations.

Each of the ``n_layers`` blocks: RMSNorm (fp32, eager PyTorch in Hugging Face's ``MambaBlock``)
and an fp32 residual; the mixer: ``in_proj`` (hidden -> 2 x inner: x and the gate z), a depthwise
causal conv1d (kernel ``conv_kernel``) + SiLU, ``x_proj`` (inner -> dt_rank + 2 x state: dt, B,
C), ``dt_proj`` (dt_rank -> inner) + softplus, the selective scan over the sequence (state
``state_size`` per inner channel), the skip ``D``, gating by SiLU(z), ``out_proj`` (inner ->
hidden). Then the final RMSNorm and the LM head (tied to the embeddings).

Two kernel paths, as the study ran them (``kernel``):

* ``fused`` (default): mamba-ssm's ``mamba_inner_fn`` with causal-conv1d's kernel. The scan keeps
  its state in on-chip memory and saves only per-chunk states (fp32, every 2,048 steps,
  mamba-ssm ``selective_scan``); with ``checkpoint_lvl=1`` (mamba-ssm's default) the conv output
  and delta are not saved but recomputed in backward (``recompute={"always"}``). What
  ``MambaInnerFn.forward`` saves (mamba_ssm/ops/selective_scan_interface.py): xz, x_dbl, B and C
  made contiguous, the scan output before gating and the chunk states; out_proj runs inside the
  Function, so its input is not kept (the backward kernel rebuilds the gated output).
* ``slow``: Hugging Face's ``slow_forward`` (no mamba-ssm): discretized A = exp(dt A) and
  B = dt B, and dt B x, materialized in fp32 as [batch, inner, sequence, state], then a Python
  loop over the sequence (a handful of small kernels per step, launched once per step whatever
  the batch), each step's fp32 state kept for backward.

The study ran Mamba without ``torch.compile``, and it has no attention: neither knob is searched.
Checkpointing is layer-granular (``full``; ``every:K``, which any block wrapper offers):
Hugging Face's ``gradient_checkpointing`` wraps each ``MambaBlock``. ``selective`` has no
attention core to drop, and ``op`` (torchtitan's per-op policy) cannot see into
``mamba_inner_fn``, one autograd function from in_proj to out_proj: neither is searched. The
RMSNorms upcast to fp32 in Hugging Face's code (the stacks whose norm is ``fp32``); a stack whose
norm is ``half`` (fla: ``fla.modules.RMSNorm``, one Triton kernel) keeps only its half input. The
stack decides the loss.
Parameters count exactly as ``MambaForCausalLM`` (checked against transformers in the tests).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field

from .. import workload
from ..spec import NamedSpec
from .base import Block, Family, Graph, Knobs, Op

#: mamba-ssm's selective-scan forward saves the running state once per chunk of this many steps
#: (csrc/selective_scan/selective_scan.cpp: n_chunks = ceil(seqlen / 2048)), fp32, [inner, 2 x state].
SCAN_CHUNK = 2048
#: FLOPs per (token, inner channel, state) of the selective scan's forward: exp(dt A), dt B x,
#: the state update (multiply-add) and the C readout (multiply-add) ~ 9 (Gu & Dao 2023, sec. 3.3.2
#: count O(B L D N)); its backward recomputes the states and forms the gradients: 2x that.
SCAN_FLOPS_PER_STATE = 9.0
#: fp32 atomicAdds per (token, inner channel, state) of mamba-ssm's selective-scan backward with
#: input-dependent B and C: one block per (sequence, inner channel) adds its dB and dC contribution
#: of every (state, token) into the shared [batch, group, state, seq] fp32 gradients
#: (csrc/selective_scan/selective_scan_bwd_kernel.cuh: gpuAtomicAdd(dB_cur ...), gpuAtomicAdd(dC_cur
#: ...) inside the per-state loop, after the block's forward and reverse scans of that state).
SCAN_BWD_ATOMICS = 2
#: fp32 vectors (hidden wide) Hugging Face's MambaRMSNorm keeps per token for backward: its input and
#: the normalized vector (``hidden_states * rsqrt(variance)``), both fp32 on the fp32 residual stream.
NORM_SAVED_FP32 = 2
#: Eager fp32 RMSNorm (to fp32, pow, mean, rsqrt, mul, weight mul) and the fp32 residual add:
#: passes over a hidden-wide fp32 vector per token (read + write each) and kernels.
NORM_RESIDUAL_PASSES, NORM_RESIDUAL_KERNELS = 9, 7
#: A stack whose norm runs in half precision as one fused kernel (fla's RMSNorm): hidden-wide half
#: vectors moved per token, (forward, backward): norm read + write and the residual add's two
#: reads and one write; backward reads input and gradient and writes the gradient (3), and the
#: residual gradient add (3).
HALF_NORM_PASSES = (5, 6)
#: Slow path, per sequence step: kernels of the loop body (state multiply, add, cast, readout
#: matmul) forward, and of its backward.
SLOW_STEP_KERNELS_FWD, SLOW_STEP_KERNELS_BWD = 4, 6


class MambaSpec(NamedSpec):
    """A Mamba language model (``MambaForCausalLM``). Sizes in elements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: Literal["mamba"]
    n_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    state_size: int = Field(default=16, gt=0)
    conv_kernel: int = Field(default=4, gt=0)
    expand: int = Field(default=2, gt=0)
    dt_rank: int | None = Field(default=None, gt=0)
    """Rank of the dt projection; None = ceil(hidden / 16) (Hugging Face's "auto")."""
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool = True
    use_bias: bool = False
    use_conv_bias: bool = True
    default_seq_len: int = Field(default=2048, gt=0)
    kernel: Literal["fused", "slow"] = "fused"
    """``fused``: mamba-ssm + causal-conv1d CUDA kernels; ``slow``: Hugging Face's PyTorch path."""
    display: str | None = None
    hf_id: str | None = None
    source: str = ""

    kind: Literal["decoder"] = "decoder"

    @property
    def inner(self) -> int:
        """Inner (expanded) width: ``expand * hidden``."""
        return self.expand * self.hidden

    @property
    def rank(self) -> int:
        """dt projection rank (``dt_rank`` or ceil(hidden / 16))."""
        return self.dt_rank or math.ceil(self.hidden / 16)

    @property
    def seq_len_default(self) -> int:
        return self.default_seq_len

    @property
    def family_display(self) -> str:
        return "Mamba"

    def layer_params(self) -> dict[str, int]:
        """Parameters of one block by module (``MambaBlock``: norm + ``MambaMixer``)."""
        d, e, n, r, k = self.hidden, self.inner, self.state_size, self.rank, self.conv_kernel
        b = 1 if self.use_bias else 0
        return {"norm": d, "in_proj": d * 2 * e + b * 2 * e, "conv1d": e * k + (e if self.use_conv_bias else 0),
                "x_proj": e * (r + 2 * n), "dt_proj": r * e + e, "A_log": e * n, "D": e,
                "out_proj": e * d + b * d}

    def n_params(self) -> int:
        """Exact parameter count of ``MambaForCausalLM`` (tied head counted once)."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.hidden
        return (self.vocab_size * self.hidden + self.n_layers * sum(self.layer_params().values())
                + self.hidden + head)

    def n_embedding_params(self) -> int:
        """Token embedding (and an untied head)."""
        return self.vocab_size * self.hidden * (1 if self.tied_embeddings else 2)

    def describe(self) -> str:
        n = self.n_params()
        return (f"{self.display_name} · {n / 1e9:.2f} B parameters · {self.n_layers} layers × {self.hidden} "
                f"hidden (state {self.state_size}, inner {self.inner}) · Mamba ({self.kernel} kernels)")


def graph(spec: MambaSpec, mb: np.ndarray, seq_len: int, knobs: Knobs) -> Graph:
    """One micro-batch of ``mb`` sequences of ``seq_len`` tokens."""
    e = workload.act_bytes(knobs.precision)
    d, E, N, R, K = spec.hidden, spec.inner, spec.state_size, spec.rank, spec.conv_kernel
    T = np.asarray(mb, float) * seq_len  # tokens
    p = spec.layer_params()
    if e == 2 and knobs.stack.norm == "half":
        # one fused RMSNorm kernel on the half residual stream (fla.modules.RMSNorm: keeps its half
        # input and fp32 1/rms per token) and the residual add: reads and writes of hidden-wide
        # half vectors, forward and backward
        norm = Op("norm_residual", "elementwise", bytes_fwd=T * HALF_NORM_PASSES[0] * e * d,
                  bytes_bwd=T * HALF_NORM_PASSES[1] * e * d, kernels_fwd=2, kernels_bwd=2, saved=T * (e * d + 4),
                  params=p["norm"])
    else:
        # MambaRMSNorm on the fp32 residual stream: pow and the rsqrt product keep the fp32 input,
        # the weight product keeps the fp32 normalized vector (its output is cast by in_proj, which
        # keeps the cast): NORM_SAVED_FP32 fp32 vectors
        norm = Op("norm_residual", "elementwise", bytes_fwd=T * NORM_RESIDUAL_PASSES * 2 * 4 * d,
                  bytes_bwd=T * 2 * NORM_RESIDUAL_PASSES * 2 * 4 * d, kernels_fwd=NORM_RESIDUAL_KERNELS,
                  kernels_bwd=2 * NORM_RESIDUAL_KERNELS, saved=T * NORM_SAVED_FP32 * 4 * d, params=p["norm"])
    ops = [norm]
    if spec.kernel == "fused":
        n_chunks = math.ceil(seq_len / SCAN_CHUNK)
        ops += [
            # in_proj (nn.Linear, outside mamba_inner_fn) keeps its input; MambaInnerFn keeps xz,
            # the contiguous copy of in_proj's transposed output
            Op("in_proj", "gemm", m=T, n=2 * E, k=d, kernels_fwd=1, kernels_bwd=2, saved=T * e * (d + 2 * E),
               params=p["in_proj"]),
            # causal_conv1d_fwd (conv + SiLU, one kernel); recomputed in backward (checkpoint_lvl=1)
            Op("conv1d", "conv", flops_fwd=T * 2 * K * E, flops_bwd=T * 4 * K * E, bytes_fwd=T * 2 * E * e,
               bytes_bwd=T * 4 * E * e, kernels_fwd=1, kernels_bwd=1, recompute=frozenset({"always"}),
               params=p["conv1d"]),
            # x_dbl = x_proj(conv1d_out) is kept, and so are B and C, copied out of it contiguous
            # ([batch, 1, state, seq]) for the scan kernel
            Op("x_proj", "gemm", m=T, n=R + 2 * N, k=E, kernels_fwd=1, kernels_bwd=2,
               saved=T * e * (R + 2 * N + 2 * N), params=p["x_proj"]),
            # delta = dt_proj.weight @ dt (bias and softplus inside the scan kernel); recomputed
            Op("dt_proj", "gemm", m=T, n=E, k=R, kernels_fwd=1, kernels_bwd=2, recompute=frozenset({"always"}),
               params=p["dt_proj"]),
            # selective_scan_fwd: reads u, delta, z (inner each), B, C; writes the output before
            # and after gating (out, kept for backward, and out_z); saves the fp32 state once per
            # chunk. Backward reads u, delta, z, out, dout, B, C, writes du, ddelta, dz and out_z
            # again (recomputed for out_proj's weight gradient) and dB, dC (fp32), recomputing the
            # states inside the kernel.
            Op("selective_scan", "scan", flops_fwd=T * SCAN_FLOPS_PER_STATE * E * N,
               flops_bwd=T * 2 * SCAN_FLOPS_PER_STATE * E * N, bytes_fwd=T * (e * (5 * E + 2 * N)),
               bytes_bwd=T * (e * (5 * E + 2 * N) + e * 4 * E + 4 * 2 * N),
               kernels_fwd=1, kernels_bwd=1,
               saved=T * e * E + np.asarray(mb, float) * n_chunks * 4 * 2 * N * E,
               atomics_bwd=T * SCAN_BWD_ATOMICS * E * N, params=p["A_log"] + p["D"]),
            # F.linear inside MambaInnerFn.forward: autograd keeps nothing for it (out_z is rebuilt)
            Op("out_proj", "gemm", m=T, n=d, k=E, kernels_fwd=1, kernels_bwd=2, params=p["out_proj"]),
        ]
    else:
        EN = E * N
        steps = float(seq_len)
        ops += [
            Op("in_proj", "gemm", m=T, n=2 * E, k=d, kernels_fwd=1, kernels_bwd=2, saved=T * e * (d + 2 * E),
               params=p["in_proj"]),
            # nn.Conv1d (depthwise, padded) then SiLU: conv output and SiLU output saved
            Op("conv1d_silu", "conv", flops_fwd=T * 2 * K * E, flops_bwd=T * 4 * K * E, bytes_fwd=T * 4 * E * e,
               bytes_bwd=T * 8 * E * e, kernels_fwd=2, kernels_bwd=4, saved=T * 2 * E * e, params=p["conv1d"]),
            Op("x_proj", "gemm", m=T, n=R + 2 * N, k=E, kernels_fwd=1, kernels_bwd=2, saved=T * e * (R + 2 * N),
               params=p["x_proj"]),
            Op("dt_proj", "gemm", m=T, n=E, k=R, kernels_fwd=1, kernels_bwd=2, params=p["dt_proj"]),
            # softplus (autocast runs it in fp32): input and fp32 output kept
            Op("softplus", "elementwise", bytes_fwd=T * E * (e + 4), bytes_bwd=T * E * 12, kernels_fwd=1,
               kernels_bwd=1, saved=T * E * (e + 4)),
            # discretization in fp32, [b, inner, s, state]: A*dt (write), exp (read + write; output
            # saved), dt*B (write; saved), dB*x (read + write): 24 bytes per state element
            Op("discretize", "elementwise", flops_fwd=T * 4 * EN, flops_bwd=T * 8 * EN, bytes_fwd=T * 24 * EN,
               bytes_bwd=T * 48 * EN, kernels_fwd=4, kernels_bwd=8, saved=T * (8 * EN + 4 * E),
               params=p["A_log"]),
            # the loop: per step state = dA * state + dBx (fp32), cast, readout matmul with C;
            # each step's fp32 state and its cast copy are kept for backward
            Op("scan_loop", "scan", flops_fwd=T * 4 * EN, flops_bwd=T * 8 * EN, bytes_fwd=T * (28 + 2 * e) * EN,
               bytes_bwd=T * 2 * (28 + 2 * e) * EN, kernels_fwd=SLOW_STEP_KERNELS_FWD * steps + 1,
               kernels_bwd=SLOW_STEP_KERNELS_BWD * steps + 1, saved=T * (4 + e) * EN),
            # stack, + x * D (fp32), * SiLU(z): gate, its activation and the fp32 sum kept
            Op("skip_gate", "elementwise", bytes_fwd=T * E * (2 * e + 8 + 4 + 2 * e + 4 + e),
               bytes_bwd=T * E * 2 * (3 * e + 16), kernels_fwd=4, kernels_bwd=8, saved=T * E * (2 * e + 4),
               params=p["D"]),
            Op("out_proj", "gemm", m=T, n=d, k=E, kernels_fwd=1, kernels_bwd=2, saved=T * e * E,
               params=p["out_proj"]),
        ]
    layer = Block("layer", tuple(ops), spec.n_layers, T * 4 * d)  # fp32 residual stream

    V = spec.vocab_size
    logits = T * float(V)
    loss_f, loss_b = workload.cross_entropy_bytes(logits, e, knobs.stack.loss_kind(knobs.compiled))
    outside = (
        Op("embedding", "elementwise", bytes_fwd=T * d * 2 * e, bytes_bwd=T * d * 2 * e + V * d * 4.0,
           kernels_fwd=1, kernels_bwd=2, saved=T * 4 * d * 2, params=V * d),
        Op("final_norm", "elementwise", bytes_fwd=T * 6 * 2 * 4 * d, bytes_bwd=T * 12 * 2 * 4 * d, kernels_fwd=5,
           kernels_bwd=10, params=d),
        Op("lm_head", "gemm", m=T, n=V, k=d, kernels_fwd=1, kernels_bwd=2, saved=T * e * d,
           params=0 if spec.tied_embeddings else V * d),
        Op("loss", "elementwise", bytes_fwd=loss_f.nbytes, bytes_bwd=loss_b.nbytes, kernels_fwd=loss_f.kernels,
           kernels_bwd=loss_b.kernels),
    )
    return Graph((layer,), outside, logits * knobs.stack.loss_bytes_per_logit(e, knobs.compiled))


def from_hf_config(c, name: str) -> dict:
    """Spec fields from a Hugging Face ``MambaConfig`` (``model_type`` mamba)."""
    rank = c.data.get("time_step_rank", "auto")
    return dict(
        family="mamba",
        n_layers=c.int("num_hidden_layers"),
        hidden=c.int("hidden_size"),
        state_size=c.int("state_size", 16),
        conv_kernel=c.int("conv_kernel", 4),
        expand=c.int("expand", 2),
        dt_rank=None if rank == "auto" else c.int("time_step_rank"),
        vocab_size=c.int("vocab_size"),
        tied_embeddings=c.bool("tie_word_embeddings", True),
        use_bias=c.bool("use_bias", False),
        use_conv_bias=c.bool("use_conv_bias", True),
    )


def notes(spec: MambaSpec, stack: object) -> list[str]:
    return [f"{spec.display_name} has no attention: the attention knob does not apply and is not searched; "
            f"{spec.kernel} Mamba kernels "
            + ("(mamba-ssm + causal-conv1d)" if spec.kernel == "fused" else "(Hugging Face slow path, no mamba-ssm)")
            + "; no torch.compile (as the study ran Mamba); checkpointing is per layer (none, every:K, full: "
            "selective and op do not apply)"]


MAMBA = Family(name="mamba", spec_cls=MambaSpec, families=("mamba",), graph=graph, attentions=("n/a",),
               compiles=(False,), checkpointings=("none", "every:2", "full"), hf_model_types=("mamba",),
               from_hf_config=from_hf_config, notes=notes)
