"""What ``torch.compile`` keeps for backward in real Hugging Face training steps, traced without a GPU.

Under ``torch.compile`` AOTAutograd decomposes a step's joint graph with Inductor's decomposition
table and splits it into a forward and a backward graph with Inductor's partitioner
(``min_cut_rematerialization_partition``, ``compiler="inductor"``), which decides what the forward
saves and what the backward recomputes; the saved set is what a compiled step holds at the start
of backward beside the states. This runs those decompositions and that partitioner on the models
of ``calibration/hf_memory_trace.py`` (transformers 5.17 from published configs, CUDA's autocast
policy, fake tensors: no memory, no arithmetic) with no-op compilers and records the bytes the
backward graph takes as saved inputs: every layer's saved activations, the loss's saved logits,
and the half weight copies autocast made in forward. Inductor's own code generation is not run
(its fused kernels' temporaries are not part of the saved set). Checked against a real step: a
4-layer GPT-2 XL at 2 x 1024 tokens compiled by Inductor and run on the CPU saves 1.1092 GiB
(its backward node's saved tensors), the trace 1.1092. Without the decompositions the partitioner
sees ``_log_softmax`` and ``native_layer_norm`` whole and saves more (the fp32 log-probabilities,
LayerNorm means, gelu_new's tanh: 1.496 GiB there).

Writes ``calibration/results/hf_compiled_saved.csv``; ``tests/test_hf_memory.py`` holds the
simulator's compiled activations, logits and autocast copies to it. Needs ``transformers``: run
it as ``calibration/hf_memory_trace.py`` says (``python -m calibration.hf_compiled_saved``).
"""

from __future__ import annotations

import functools
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

OUT = Path(__file__).parent / "results" / "hf_compiled_saved.csv"

#: (model, tokens per sample, micro-batch, precision, attention): no checkpointing, compiled. GPT-2 with
#: eager attention does not trace here: AOTAutograd deep-copies its backward graph, whose constant
#: tensor (the attention's scale) lives on the CPU beside fake tensors, and torch refuses the copy.
CASES: tuple[tuple[str, int, int, str, str], ...] = (
    ("pythia-160m", 2048, 8, "bf16", "sdpa"),
    ("pythia-1b", 2048, 8, "bf16", "sdpa"),
    ("llama-3.2-1b", 2048, 8, "bf16", "sdpa"),
    ("llama-3.2-1b", 2048, 2, "bf16", "eager"),
    ("qwen2.5-0.5b", 2048, 8, "bf16", "sdpa"),
    ("gpt2-xl", 1024, 8, "bf16", "sdpa"),
    ("pythia-410m", 2048, 8, "fp32", "sdpa"),
)


def _storage_bytes(values) -> int:
    """Bytes of the distinct storages behind ``values`` (tensors; anything else ignored): a saved
    view (the transpose a weight gradient reads) shares its base's memory."""
    import torch

    seen: dict[int, int] = {}
    for v in values:
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            seen[s._cdata] = s.nbytes()
    return sum(seen.values())


def saved_bytes(config: dict[str, Any], side: int, batch: int, precision: str, attention: str = "sdpa") -> int:
    """Bytes the compiled step's backward graph takes as saved inputs (not its tangents), less
    the forward graph's own inputs it saves as they are (parameters, the token ids): one
    forward and backward of ``config`` at ``batch`` x ``side`` tokens under ``torch.compile``
    with Inductor's decompositions and partitioner and no-op compilers, ``attention`` (sdpa, eager), ``precision`` (bf16/fp16: CUDA's
    autocast over fp32 weights; fp32/tf32: none). Raises where dynamo breaks the graph (the saved
    set would then be several graphs' and the count not comparable)."""
    import torch
    import transformers
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    install_cuda_autocast_policy()
    install_cuda_sdpa_dropout()
    install_cuda_dropout()
    graphs: list[int] = []

    def backward(gm, _inputs):
        graphs.append(_storage_bytes(n.meta.get("val") for n in gm.graph.nodes
                                     if n.op == "placeholder" and not n.name.startswith("tangents")))
        return make_boxed_func(gm)

    def forward(gm, _inputs):
        # saved values that are the graph's own inputs (parameters, fp32 weights used as they are)
        # allocate nothing: they are counted apart, as states
        out = next(n for n in gm.graph.nodes if n.op == "output")
        aliases.append(_storage_bytes(a.meta.get("val") for a in out.args[0]
                                      if isinstance(a, torch.fx.Node) and a.op == "placeholder"))
        return make_boxed_func(gm)

    aliases: list[int] = []
    backend = aot_autograd(fw_compiler=forward, bw_compiler=backward, decompositions=select_decomp_table(),
                           partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"))
    cfg = transformers.AutoConfig.for_model(**config)
    cfg._attn_implementation = attention
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cpu")
        model.tie_weights()
        model.train()
        # GPT-2's loss_type is unset: transformers warns once from inside forward, where dynamo breaks the graph
        model.loss_type = "ForCausalLM"
        ids = torch.zeros((batch, side), dtype=torch.long)
        with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=half is not None):
            loss = torch.compile(model, backend=backend, fullgraph=True)(input_ids=ids, labels=ids).loss
        loss.backward()
    if len(graphs) != 1 or len(aliases) != 1:
        raise RuntimeError(f"{config['model_type']}: {len(graphs)} backward graphs, expected one")
    return graphs[0] - aliases[0]


def main(argv: list[str] | None = None) -> int:
    from simulator.core.errors import run_cli

    return run_cli("hf_compiled_saved", lambda: _trace_all(argv))


def _trace_all(argv: list[str] | None) -> int:
    only = start("hf_compiled_saved", argv, [c[0] for c in CASES])  # model names to re-trace; the other rows are kept
    import torch
    import transformers

    rows = []
    for model, side, batch, precision, attention in CASES:
        if only and model not in only:
            continue
        n = saved_bytes(MODELS[model], side, batch, precision, attention)
        rows.append({"model": model, "side": side, "micro_batch": batch, "precision": precision, "attention": attention,
                     "saved_bytes": n, "config": json.dumps(MODELS[model], sort_keys=True),
                     "torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{model:16s} {side:5d} x {batch:3d} {precision:5s} {attention:5s} saved {n / 2**30:7.2f} GiB", flush=True)
    write_rows(OUT, rows, only, [c[0] for c in CASES])
    return 0


if __name__ == "__main__":
    sys.exit(main())
