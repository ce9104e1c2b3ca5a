"""Peak allocated memory of real ``torch.compile``-d Hugging Face training steps, run on the CPU.

``calibration/hf_compiled_saved.py`` traces what Inductor's partitioner saves for backward; this
runs the whole step as a GPU would, with Inductor's generated code: the model (transformers 5.17
from the published config of ``calibration/hf_memory_trace.py``) compiled with
``torch.compile(fullgraph=True)``, CUDA's autocast policy and CUDA's dropout kernels
(:func:`~calibration.hf_memory_trace.install_cuda_autocast_policy` and the dropout helpers beside
it), forward with labels, backward, ``clip_grad_norm_(1.0)``, fused AdamW,
``zero_grad(set_to_none=True)``. The second step runs under ``torch.profiler`` with
``profile_memory=True``; its peak is the highest running sum of the allocator's ``[memory]``
events (bytes allocated less bytes freed, in time order) above the bytes live when it starts (the
parameters and AdamW's states): the step's gradients, activations, loss buffers and Inductor's
temporaries. In an eager cross-check this sum matches ``MemTracker``'s to the byte.

What it found that the saved-set trace cannot see: the compiled backward takes a gradient for
every output that requires one, and the model returns its logits beside the loss; the logits get
no gradient from ``loss.backward()``, so autograd hands the compiled backward a zero-filled tensor
of their size (``Function``'s materialised gradients), live beside the saved logits and their
gradient (``Stack.returns_outputs``).

Writes ``calibration/results/hf_compiled_peak.csv``; ``tests/test_hf_memory.py`` holds the
simulator's compiled hf-trainer plans to it. Real arithmetic on real tensors: each case takes a
minute or two on two cores and a few GiB of host memory. Needs ``transformers``: run it as
``calibration/hf_memory_trace.py`` says (``python -m calibration.hf_compiled_peak [model ...]``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from calibration.hf_memory_trace import (
    MODELS,
    install_cuda_autocast_policy,
    install_cuda_dropout,
    install_cuda_sdpa_dropout,
    start,
    write_rows,
)

OUT = Path(__file__).parent / "results" / "hf_compiled_peak.csv"

#: (model, tokens per sample, micro-batch, precision, attention): no checkpointing, compiled,
#: sized to run in host memory on a small machine (full depth: the peak is reached at the loss
#: and at the end of backward, where every layer's gradient is live).
CASES: tuple[tuple[str, int, int, str, str], ...] = (
    ("pythia-160m", 1024, 2, "bf16", "sdpa"),
    ("pythia-410m", 1024, 1, "fp32", "sdpa"),
    ("llama-8x1024", 1024, 2, "bf16", "sdpa"),
    ("qwen2.5-0.5b", 1024, 1, "bf16", "sdpa"),
)


def peak_above_states(config: dict[str, Any], side: int, batch: int, precision: str, attention: str) -> dict[str, int]:
    """The second compiled step's peak of allocated bytes above those live when it starts, and
    the bytes live then (parameters and optimizer states), for ``config`` at ``batch`` x ``side``
    tokens in ``precision`` (bf16/fp16: CUDA's autocast over fp32 weights; tf32/fp32: none)."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    install_cuda_autocast_policy()
    install_cuda_sdpa_dropout()
    install_cuda_dropout()
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**config)
    cfg._attn_implementation = attention
    model = transformers.AutoModelForCausalLM.from_config(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    ids = torch.randint(0, config["vocab_size"], (batch, side))
    compiled = torch.compile(model, fullgraph=True)

    def step() -> None:
        with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=half is not None):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        del loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # compiles, and creates AdamW's states
    states = sum(p.numel() * p.element_size() for p in model.parameters())
    states += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                  if isinstance(t, torch.Tensor))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = top = 0
    for _, nbytes in events:
        live += nbytes
        top = max(top, live)
    return {"peak_above_states": top, "states": states}


def main(argv: list[str] | None = None) -> int:
    from simulator.core.errors import run_cli

    return run_cli("hf_compiled_peak", lambda: _run_all(argv))


def _run_all(argv: list[str] | None) -> int:
    only = start("hf_compiled_peak", argv, [c[0] for c in CASES])
    import torch
    import transformers

    rows: list[dict[str, Any]] = []
    for model, side, batch, precision, attention in CASES:
        if only and model not in only:
            continue
        got = peak_above_states(MODELS[model], side, batch, precision, attention)
        rows.append({"model": model, "side": side, "micro_batch": batch, "precision": precision,
                     "attention": attention, "peak_above_states_bytes": got["peak_above_states"],
                     "states_bytes": got["states"], "config": json.dumps(MODELS[model], sort_keys=True),
                     "torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{model:16s} {side:5d} x {batch:2d} {precision:5s} {attention:6s} "
              f"{got['peak_above_states'] / 2**30:7.3f} GiB above {got['states'] / 2**30:6.2f} GiB of states",
              flush=True)
    write_rows(OUT, rows, only, [c[0] for c in CASES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
