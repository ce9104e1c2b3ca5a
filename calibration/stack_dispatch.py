"""Host time per kernel of Megatron-Core's transformer layer, beside the project's own decoder's, on one device.

The simulator's host time per kernel of an eager training pass (``Profile.train_fwd_kernel_us`` /
``train_bwd_kernel_us``) is measured on the project's lean decoder (:mod:`calibration.benches.dispatch`);
Megatron's layers wrap their kernels in more Python (autograd Functions around fused kernels, the
tensor-parallel region functions, the RNG tracker around dropout), and on vTrain's measured small-GPT
runs the host floor reads about twice the simulator's (docs/small_model_runs.md). This tool times
both layers at shapes whose kernels take a few microseconds (hidden 32, 2 heads, 8 tokens, so each
pass is its host's dispatch), 1 and 5 layers apart, interleaved, the 10th percentile of many steps:
the host seconds one layer adds to a forward and to a backward pass, and divided by the kernels the
simulator counts for each layer (megatron-lm's fused graph, and the validate loop's eager one),
the host time per counted kernel of each. Nothing in the package reads the result yet: it is the
measurement a megatron-lm host figure would cite.

Needs ``megatron-core`` (not a dependency): ``pip install -e ".[megatron]"`` in a scratch
environment, or its wheel in ``.whl/`` on a device machine (calibration/device_check.sh runs this
when it imports). On a CPU, megatron-core's CUDA RNG calls are stubbed and the figures are the CPU's
own dispatch, not a GPU host's (a CPU run is not a proxy for a GPU's host time:
docs/small_model_runs.md). ``python -m calibration.stack_dispatch [--out F.csv] [--steps N]``;
exit status 0 success, 2 usage error, 3 runtime failure.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from simulator.core.errors import UsageError, UsageParser, run_cli

HIDDEN, HEADS, TOKENS, VOCAB = 32, 2, 8, 64
LAYERS = (1, 5)


def counted_kernels() -> dict[str, tuple[float, float]]:
    """(forward, backward) kernels the simulator counts for one layer of each timed model."""
    from calibration.benches.dispatch import tiny_spec
    from calibration.validate.predicting import VALIDATE_STACK
    from simulator.answer.runs import megatron_gpt
    from simulator.model.graphs import graph
    from simulator.strategy.stacks import get_stack

    def per_layer(spec, stack, compiled: bool, precision: str) -> tuple[float, float]:
        block = graph(spec, TOKENS, np.array([1.0]), precision, "eager", compiled, stack).blocks[0]
        return (sum(float(np.sum(op.kernels_fwd)) * op.count for op in block.ops),
                sum(float(np.sum(op.kernels_bwd)) * op.count for op in block.ops))

    return {"megatron-core": per_layer(megatron_gpt("tiny", 1, HIDDEN, HEADS, VOCAB, TOKENS), get_stack("megatron-lm"),
                                       True, "fp32"),
            "torch_model": per_layer(tiny_spec("gpt2", 1), get_stack(None).model_copy(update=VALIDATE_STACK), False,
                                     "fp32")}


def _megatron_step(layers: int, device) -> Callable[[], tuple[float, float]]:
    """One timed training pass pair of a megatron-core local-spec GPT decoder (dropout 0.1, Megatron-LM's
    default; the bias-GELU and bias-dropout-add fusions off: megatron-core compiles them with
    torch.compile, whose first call takes longer than the whole measurement, and the same ops run eagerly)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
        if device.type == "cuda":
            mrandom.model_parallel_cuda_manual_seed(1234)
        else:
            mrandom.get_cuda_rng_tracker().add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, 1234)
    cfg = TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=HEADS,
                            use_cpu_initialization=True, hidden_dropout=0.1, attention_dropout=0.1,
                            add_bias_linear=True)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=VOCAB, max_sequence_length=64,
                     position_embedding_type="learned_absolute").to(device).train()
    ids = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    pos = torch.arange(TOKENS, device=device)[None]
    mask = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool, device=device).triu(1)
    return _timer(lambda: model(ids, pos, mask, labels=ids).sum(), model, device)


def _torch_model_step(layers: int, device) -> Callable[[], tuple[float, float]]:
    """The same for the project's own decoder (calibration/torch_model.py), GPT-2 block, eager attention."""
    from calibration.benches.dispatch import tiny_spec
    from calibration.torch_model import build_model

    model = build_model(tiny_spec("gpt2", layers), "eager", device=device).train()
    x = torch.randint(0, VOCAB, (1, TOKENS), device=device)
    return _timer(lambda: model(x, x), model, device)


def _timer(forward: Callable, model, device) -> Callable[[], tuple[float, float]]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        loss = forward()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1

    return step


def _stub_cuda_rng() -> None:
    """On a CPU: megatron-core's RNG tracker and global buffers call CUDA; give them CPU stand-ins."""
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: "cpu"
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.zeros(16, dtype=torch.uint8)


def measure(steps: int = 300, warmup: int = 20) -> dict[str, tuple[float, float]]:
    """Host seconds one layer adds to a forward and a backward pass, per model: the 10th percentile
    of ``steps`` timed passes at 5 layers less that at 1, over 4, the models interleaved step by step."""
    import logging

    import torch.distributed as dist

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        _stub_cuda_rng()
    logging.getLogger("megatron.core.tensor_parallel.random").setLevel(logging.ERROR)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    builders = {"megatron-core": _megatron_step, "torch_model": _torch_model_step}
    runs = {(name, n): build(n, device) for name, build in builders.items() for n in LAYERS}
    times: dict[tuple[str, int], list[tuple[float, float]]] = {k: [] for k in runs}
    for i in range(warmup + steps):
        for key, step in runs.items():
            t = step()
            if i >= warmup:
                times[key].append(t)

    def low(key, which: int) -> float:
        return float(np.quantile([t[which] for t in times[key]], 0.1))

    return {name: tuple((low((name, LAYERS[1]), w) - low((name, LAYERS[0]), w)) / (LAYERS[1] - LAYERS[0])
                        for w in (0, 1)) for name in builders}


def main(argv: list[str] | None = None) -> int:
    ap = UsageParser(prog="python -m calibration.stack_dispatch", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="append one row a model to this CSV")
    ap.add_argument("--steps", type=int, default=300, help="timed steps per model and depth (default 300)")
    a = ap.parse_args(argv)
    if a.steps < 10:
        raise UsageError(f"--steps must be at least 10, got {a.steps}")
    try:
        import megatron.core as mcore
    except ImportError:
        raise UsageError("megatron-core is not installed: pip install -e \".[megatron]\" in a scratch environment, "
                         "or put its wheel in .whl/ on a device machine") from None
    per_layer = measure(a.steps)
    kernels = counted_kernels()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    rows = []
    for name, (f, b) in per_layer.items():
        kf, kb = kernels[name]
        rows.append({"date": dt.date.today().isoformat(), "device": device, "torch": torch.__version__,
                     "megatron_core": getattr(mcore, "__version__", "?"), "model": name,
                     "layer_fwd_us": round(1e6 * f, 2), "layer_bwd_us": round(1e6 * b, 2),
                     "kernels_fwd": kf, "kernels_bwd": kb,
                     "per_kernel_fwd_us": round(1e6 * f / kf, 2), "per_kernel_bwd_us": round(1e6 * b / kb, 2)})
        print(f"{name}: {1e6 * f:.0f} / {1e6 * b:.0f} us a layer forward / backward, {kf:.0f} / {kb:.0f} kernels counted: "
              f"{1e6 * f / kf:.1f} / {1e6 * b / kb:.1f} us a counted kernel")
    if a.out:
        new = not a.out.exists()
        with a.out.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli("python -m calibration.stack_dispatch", main))
