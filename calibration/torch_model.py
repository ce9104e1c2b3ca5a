"""A real torch decoder built from a :class:`simulator.model.spec.ModelSpec`, for validation runs.

The structure follows the spec: LayerNorm or RMSNorm (with or without bias), rotary (partial,
``rotary_pct``), learned or ALiBi positions, gated or plain MLP with the spec's activation, grouped-query
attention via ``n_kv_heads``, parallel (GPT-NeoX) or sequential residual, tied or untied LM head.
Its parameter count equals ``spec.n_params()`` exactly.

The GEMMs are laid out as the simulator's workload counts them (:mod:`simulator.model.workload`): one
fused QKV projection, one output projection, one MLP up projection (``2 * ffn_hidden`` wide when
gated: gate and up in one matrix) and one down projection per layer, plus the logits GEMM.
Shapes: tokens are ``(batch, seq)`` int64; hidden states ``(batch, seq, hidden)``.

Checkpointing: 'full' re-runs every block in backward, 'selective' only the attention core
(softmax(q k^T) v, Korthikanti et al. 2022); :class:`RecomputeClock` times those re-runs.

Initialization follows the Hugging Face models of these families (GPT-2, GPT-NeoX, Llama
``initializer_range`` 0.02): linear and embedding weights N(0, 0.02), biases 0, norms 1. With
torch's default N(0, 1) embedding as a tied LM head, the logits of a fresh model are so peaked that
most probabilities, gradients and Adam moments underflow to subnormal floats, which x86 CPUs
process up to 100x slower: steps no real training run takes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from simulator.core.errors import UsageError
from simulator.model.hf_eager import GELU_NEW
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import CHECKPOINTINGS as CHECKPOINTING

ATTENTION_BACKENDS = ("eager", "sdpa")
INIT_STD = 0.02  # initializer_range of the Hugging Face GPT-2, GPT-NeoX and Llama configs
#: Hugging Face's gradient_checkpointing_enable() checkpoints with use_reentrant=True: backward re-runs
#: the whole block (the non-reentrant variant stops once it has what backward needs, skipping e.g.
#: the MLP's down projection)
REENTRANT = True


#: The torch function of each ModelSpec activation (simulator.core.vocab.ACTIVATIONS).
ACTIVATION_FNS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``), op for op as Hugging Face runs it: the
    tanh approximation as eager ops, which the hf-trainer stack costs as such
    (:func:`simulator.model.hf_eager.gelu_new_ops`)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def activation_fn(spec: ModelSpec) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MLP activation of ``spec`` as the Hugging Face model of its family computes it."""
    if spec.mlp_activation == "gelu_tanh" and spec.family in GELU_NEW:
        return new_gelu
    return ACTIVATION_FNS[spec.mlp_activation]


class RecomputeClock:
    """Seconds spent re-running checkpointed code during backward (validation's 'recompute').

    ``in_backward`` is set by the training loop around ``loss.backward()``; checkpointed
    functions wrapped by :meth:`timed` add their wall time to ``seconds`` only then (the device
    is synchronised around each re-run, so the time is what it executed)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.in_backward = False

    def timed(self, fn):
        def run(*args):
            if not self.in_backward:
                return fn(*args)
            dev = next(a for a in args if isinstance(a, torch.Tensor)).device
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            try:  # (a non-reentrant checkpoint stops a re-run early, by raising)
                return fn(*args)
            finally:
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                self.seconds += time.perf_counter() - t0

        return run


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden, eps=1e-5)
    return nn.LayerNorm(spec.hidden, eps=1e-5, bias=spec.norm_bias)


def _rotary_tables(seq_len: int, rot_dim: int, device, base: float = 10000.0):
    """cos/sin tables of shape (seq, rot_dim) in fp32 (GPT-NeoX / Llama half-split layout)."""
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, device=device, dtype=torch.float32) / rot_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int) -> torch.Tensor:
    """Rotate the first ``rot_dim`` dims of each head of ``x`` (batch, heads, seq, head_dim)."""
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    xr = xr * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return torch.cat((xr, xp), dim=-1) if xp.numel() else xr


def _alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes (Press et al. 2022), for any number of heads."""
    p = 2 ** math.floor(math.log2(n_heads))
    base = [2 ** (-8.0 * (i + 1) / p) for i in range(p)]
    extra = [2 ** (-4.0 * (2 * i + 1) / p) for i in range(n_heads - p)]
    return torch.tensor(base + extra, dtype=torch.float32)


class Attention(nn.Module):
    """Causal self-attention: fused QKV, GQA, rotary/ALiBi, eager or SDPA core."""

    def __init__(self, spec: ModelSpec, backend: str, clock: RecomputeClock | None = None):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = spec.n_heads, spec.kv_heads, spec.head_dim
        self.backend = backend
        self.clock = clock  # set: checkpoint the attention core (selective checkpointing)
        qkv_bias = spec.linear_bias if spec.qkv_bias is None else spec.qkv_bias  # Qwen2: on the QKV projection only
        self.qkv = nn.Linear(spec.hidden, spec.hidden + 2 * spec.kv_dim, bias=qkv_bias)
        self.out = nn.Linear(spec.hidden, spec.hidden, bias=spec.linear_bias)
        rot = int(spec.head_dim * spec.rotary_pct) if spec.pos_embedding == "rotary" else 0
        self.rot_dim = rot - rot % 2
        self.alibi = spec.pos_embedding == "alibi"
        if self.alibi:
            self.register_buffer("slopes", _alibi_slopes(spec.n_heads), persistent=False)

    def _alibi_bias(self, s: int, device, dtype) -> torch.Tensor:
        pos = torch.arange(s, device=device, dtype=torch.float32)
        rel = (pos[None, :] - pos[:, None])  # j - i (<= 0 below the diagonal)
        bias = self.slopes.to(device)[:, None, None] * rel[None]
        causal = torch.ones(s, s, device=device, dtype=torch.bool).triu(1)
        return bias.masked_fill(causal, float("-inf")).to(dtype)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(
            [self.n_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rot_dim and rope is not None:
            q = _apply_rotary(q, *rope, self.rot_dim)
            k = _apply_rotary(k, *rope, self.rot_dim)
        if self.kv_heads != self.n_heads:
            rep = self.n_heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        bias = self._alibi_bias(s, x.device, q.dtype) if self.alibi else None
        if self.clock is not None and self.training and torch.is_grad_enabled():
            y = checkpoint(self.clock.timed(self._core), q, k, v, bias, use_reentrant=REENTRANT)
        else:
            y = self._core(q, k, v, bias)
        return self.out(y.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T / sqrt(d) + mask) v, (batch, heads, seq, head_dim)."""
        s = q.shape[2]
        if self.backend == "sdpa":
            if bias is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:  # eager / "math": materialised s x s scores
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
            if bias is None:
                causal = torch.ones(s, s, device=q.device, dtype=torch.bool).triu(1)
                scores = scores.masked_fill(causal, float("-inf"))
            else:
                scores = scores + bias
            y = torch.softmax(scores, dim=-1).to(v.dtype) @ v
        return y


class MLP(nn.Module):
    """Plain or gated (gate and up fused in one matrix) MLP with the spec's activation."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.gated_mlp
        up = 2 * spec.ffn_hidden if self.gated else spec.ffn_hidden
        self.up = nn.Linear(spec.hidden, up, bias=spec.linear_bias)
        self.down = nn.Linear(spec.ffn_hidden, spec.hidden, bias=spec.linear_bias)
        self.act = activation_fn(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.gated:
            g, u = h.chunk(2, dim=-1)
            return self.down(self.act(g) * u)
        return self.down(self.act(h))


class Block(nn.Module):
    """One pre-norm transformer layer, sequential or parallel residual."""

    def __init__(self, spec: ModelSpec, backend: str, clock: RecomputeClock | None = None):
        super().__init__()
        self.ln1, self.ln2 = _norm(spec), _norm(spec)
        self.attn, self.mlp = Attention(spec, backend, clock), MLP(spec)
        self.parallel = spec.parallel_residual

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None) -> torch.Tensor:
        rope = (cos, sin) if cos is not None and sin is not None else None
        if self.parallel:
            return x + self.attn(self.ln1(x), rope) + self.mlp(self.ln2(x))
        x = x + self.attn(self.ln1(x), rope)
        return x + self.mlp(self.ln2(x))


def _init_weights(module: nn.Module) -> None:
    """Hugging Face initialization: N(0, INIT_STD) weights, zero biases (norms keep 1 and 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight.device.type != "meta":
        with torch.no_grad():
            module.weight.normal_(0.0, INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()


class DecoderLM(nn.Module):
    """Causal language model with the structure of ``spec``; ``forward`` returns the mean loss."""

    def __init__(self, spec: ModelSpec, attention: str = "sdpa", checkpointing: str = "none"):
        super().__init__()
        if spec.kind != "decoder" or spec.head != "lm":
            raise UsageError(f"validation builds decoder LMs only; {spec.name!r} is a {spec.family} {spec.kind}")
        if attention not in ATTENTION_BACKENDS:
            raise UsageError(f"attention must be one of {', '.join(ATTENTION_BACKENDS)}, got {attention!r}")
        if checkpointing not in CHECKPOINTING:
            raise UsageError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}, got {checkpointing!r}")
        self.spec, self.checkpointing = spec, checkpointing
        self.clock = RecomputeClock()
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden)
        self.pos = nn.Embedding(spec.max_positions, spec.hidden) if spec.pos_embedding == "learned" else None
        core_clock = self.clock if checkpointing == "selective" else None
        self.blocks = nn.ModuleList(Block(spec, attention, core_clock) for _ in range(spec.n_layers))
        self.final_norm = _norm(spec) if spec.final_norm else None
        self.lm_head = None if spec.tied_embeddings else nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        rot = int(spec.head_dim * spec.rotary_pct) if spec.pos_embedding == "rotary" else 0
        self.rot_dim = rot - rot % 2
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (fp32) of ``tokens`` (batch, seq) against ``targets``."""
        s = tokens.shape[1]
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=tokens.device))[None]
        cos = sin = None
        if self.rot_dim:
            cos, sin = _rotary_tables(s, self.rot_dim, tokens.device)
        for blk in self.blocks:
            if self.checkpointing == "full" and self.training and torch.is_grad_enabled():
                x = checkpoint(self.clock.timed(blk), x, cos, sin, use_reentrant=REENTRANT)
            else:
                x = blk(x, cos, sin)
        if self.final_norm is not None:
            x = self.final_norm(x)
        w = self.embed.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, w)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(spec: ModelSpec, attention: str = "sdpa", checkpointing: str = "none",
                device: str | torch.device = "cpu") -> DecoderLM:
    """A freshly initialised :class:`DecoderLM` on ``device`` (use ``'meta'`` to only count)."""
    with torch.device(device):
        return DecoderLM(spec, attention, checkpointing)


#: Adam's second moment given to rows a short run has never updated (fp32; normal, not subnormal).
#: Its square root, 1e-15, is far below AdamW's eps (1e-8), so no update changes.
SEEN_SECOND_MOMENT = 1e-30


def seed_long_run_state(opt: torch.optim.Optimizer) -> None:
    """Give every exact zero of AdamW's second moments ``SEEN_SECOND_MOMENT``, as in a long run.

    After a few steps of a few hundred tokens, the embedding rows of tokens not yet drawn still have
    a second moment of exactly zero (97% of a 50k vocabulary after three steps of 512 tokens); in a
    long run nearly every row has been updated. On some CPUs the square root of an exact zero runs
    ~5x slower than of a normal float (an AMD EPYC with AVX-512: 46 vs 9.6 ms over 16M floats), so
    an untied 50k embedding's optimizer step took 2.5x the long-run time. Call after the first
    ``opt.step()``; updates stay the same, as the seeded moment's root is below eps.
    """
    with torch.no_grad():
        for state in opt.state.values():
            v = state.get("exp_avg_sq")
            if v is not None:
                v.masked_fill_(v == 0, SEEN_SECOND_MOMENT)


def warm_up(step: Callable[[], object], opt: torch.optim.Optimizer, warmup: int) -> float:
    """Run a configuration's untimed steps and return the first one's seconds (with compiling).

    The first step creates AdamW's state (seeded then as in a long run, :func:`seed_long_run_state`);
    ``warmup`` more steps follow, so that timed steps see the steady heap of a long run. The second
    step is the first to allocate gradients while the optimizer's state is live, and on a CPU it grows
    the heap by up to the gradients' size in fresh pages: a 2 x 768 GPT-2 with a 50k vocabulary over
    128 tokens took 660 ms in its second backward (61k page faults) and 195-215 ms from the third on,
    none faulting (AMD EPYC Zen 4, glibc keeping freed memory, 2026-12-03). A timed step right after
    the first one measured that transient, which no long run has.
    """
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    seed_long_run_state(opt)
    for _ in range(warmup):
        step()
    return first
