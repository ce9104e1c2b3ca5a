"""Host time of eager training passes: tiny decoders whose compute is negligible, so what is timed is
eager PyTorch's own cost of running a layer (module calls, views, splits, autograd recording in the
forward, one autograd-engine node per op in the backward).

``dispatch/<family>-<attention>/L<n>``: a :class:`calibration.torch_model.DecoderLM` of the
family's block (GPT-2, GPT-NeoX or Llama) with hidden size 32, ``n`` layers, 8 tokens, timed
forward (to the loss) and backward apart; ``.../L<n>/bf16`` the same under autocast to the
device's half type, whose passes cast every linear layer's inputs and dispatch each op through
autocast. Fitting (:mod:`calibration.build`) takes the measured minus the simulator's predicted
time (its GEMMs, bytes and kernels at the launch overhead) per kernel the simulator counts,
forward and backward apart: ``Profile.train_fwd_kernel_us`` and ``train_bwd_kernel_us`` (about
20 and 10 us on a 2-core CPU, where a tiny ``x + x`` costs 2-3 us), and under autocast
``train_fwd_kernel_us_amp`` and ``train_bwd_kernel_us_amp``. On a GPU they add to the host side
of each pass, which the device hides for all but small models.
"""

from __future__ import annotations

import statistics
import time

import torch

from simulator.core.vocab import HALF_PRECISIONS

from .base import Bench, RunContext, ok

LAYERS = (1, 3)
TOKENS = 8
FAMILIES = {  # base preset, its attention backends
    "gpt2": ("gpt2", ("sdpa", "eager")),
    "neox": ("pythia-14m", ("sdpa",)),
    "llama": ("tinyllama-1.1b", ("sdpa",)),
}


def tiny_spec(family: str, layers: int):
    """The tiny decoder of ``family`` with ``layers`` layers (hidden 32, 2 heads, vocab 64)."""
    from simulator.model.presets import get_model
    from simulator.model.spec import ModelSpec

    base = get_model(FAMILIES[family][0]).model_dump()
    base.update(name=f"dispatch-{family}-L{layers}", display=None, hf_id=None, source="calibration dispatch bench",
                n_layers=layers, hidden=32, n_heads=2, ffn_hidden=64, vocab_size=64, max_positions=64,
                default_seq_len=TOKENS)
    if base.get("n_kv_heads"):
        base["n_kv_heads"] = 1
    return ModelSpec(**base)


def _bench(family: str, attention: str, layers: int, precision: str = "fp32"):
    def run(ctx: RunContext) -> dict:
        from ..device import DTYPES
        from ..timing import synchronizer
        from ..torch_model import build_model

        sync = synchronizer(ctx.device)
        amp = DTYPES[precision] if precision in HALF_PRECISIONS else None
        model = build_model(tiny_spec(family, layers), attention, device=ctx.device)
        model.train()
        x = torch.randint(0, 64, (1, TOKENS), device=ctx.device)
        y = torch.randint(0, 64, (1, TOKENS), device=ctx.device)
        parts: list[tuple[float, float]] = []

        def step() -> None:
            sync()
            t0 = time.perf_counter()
            with torch.autocast(ctx.device.type, dtype=amp, enabled=amp is not None):
                loss = model(x, y)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            parts.append((t1 - t0, time.perf_counter() - t1))
            model.zero_grad(set_to_none=True)

        t = ctx.time(step, warmup=3)
        timed = parts[3:] or parts  # after the warm-up calls
        rec = ok(t, layers=layers)
        rec["precision"] = precision
        rec["fwd_s"] = statistics.median(p[0] for p in timed)
        rec["bwd_s"] = statistics.median(p[1] for p in timed)
        return rec

    return run


def plan(ctx: RunContext) -> list[Bench]:
    """One bench per family block, attention backend and layer count, in fp32 and under autocast
    to the device's first half type (its own cast kernels and dispatch: ``/<precision>`` keys)."""
    b = ctx.settings.budget_s
    out = []
    for prec in ["fp32", *ctx.half]:
        suffix = "" if prec == "fp32" else f"/{prec}"
        for fam, (_, backends) in FAMILIES.items():
            for att in backends:
                for n in LAYERS:
                    out.append(Bench(f"dispatch/{fam}-{att}/L{n}{suffix}", "dispatch",
                                     {"family": fam, "attention": att, "layers": n, "precision": prec},
                                     _bench(fam, att, n, prec), 1.5 * b + 0.1))
    return out
