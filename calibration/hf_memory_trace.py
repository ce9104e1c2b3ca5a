"""Peak allocated memory of real Hugging Face training steps, traced without a GPU.

Each case builds a ``transformers`` model from its config, runs two training steps (forward with
labels, backward, ``clip_grad_norm_(1.0)``, fused AdamW, ``zero_grad(set_to_none=True)``) the way
the H200 profiles of ``../shared/data/h200/prof_*.txt`` ran them, and records the second step's
peak of live tensor bytes with PyTorch's own ``torch.distributed._tools.mem_tracker.MemTracker``
(which counts every storage an op allocates and frees, by category) under ``FakeTensorMode``: no
memory is allocated and no arithmetic is done, so GPT-2 XL at 8 x 1024 tokens traces in seconds on
a laptop. Mixed precision follows CUDA's ``torch.autocast`` policy, not the CPU's: the op lists of
``ATen/autocast_mode.h`` (lower precision, fp32, fp32 with an output dtype, promote) are registered
as Python kernels on the ``AutocastCPU`` dispatch key (:func:`install_cuda_autocast_policy`), so
``pow``, ``softmax``, ``layer_norm``, ``rsqrt`` and the loss run in fp32 exactly where a GPU runs
them. What the trace leaves out, and a GPU's ``torch.cuda.max_memory_allocated`` counts: the cuBLAS
and cuDNN workspaces (tens of MiB), the caching allocator's rounding of each block to 512 bytes,
and kernels whose CUDA implementation saves other tensors than the CPU one (SDPA: the CPU flash
kernel saves the output and fp32 log-sum-exp per row, as cuDNN's and FlashAttention's do).

Writes ``calibration/results/hf_memory_trace.csv`` (one row a case: the config, the settings, the
peak and its categories in bytes); ``tests/test_hf_memory.py`` holds the simulator's hf-trainer
memory to it. Needs ``transformers`` (not a dependency of the package): run it in a scratch
environment, ``pip install transformers==5.17.0 torch==2.13.0`` (5.17 is the release the H200 steps
ran), then ``python -m calibration.hf_memory_trace``.
"""

from __future__ import annotations

import csv
import functools
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from calibration.allocator_replay import smallest_device
from simulator.core.errors import UsageError

OUT = Path(__file__).parent / "results" / "hf_memory_trace.csv"

#: CUDA's autocast op lists (PyTorch ``aten/src/ATen/autocast_mode.h``, 2.11-2.13):
#: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE.
CUDA_LOWER = ("_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
              "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
              "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
              "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "scaled_dot_product_attention")
CUDA_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
             "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
             "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
             "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
             "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
             "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
             "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
             "cdist", "renorm", "logsumexp", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
             "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d")
CUDA_FP32_OUT = ("prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
                 "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
                 "sum.dim_IntList")
CUDA_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
                "tensordot", "scatter_add")

_LIBS: list[Any] = []


def install_cuda_autocast_policy() -> None:
    """Register CUDA's autocast policy as the AutocastCPU kernels of every op in CUDA's lists
    (idempotent): lower precision casts floating inputs to the autocast dtype, fp32 casts them up,
    fp32-out passes ``dtype=torch.float32`` to a half input (no copy), promote casts to the widest."""
    import torch
    from torch._C import DispatchKey, DispatchKeySet

    if _LIBS:
        return
    exclude = DispatchKeySet(DispatchKey.AutocastCPU)

    def cast(x, dtype):
        if isinstance(x, torch.Tensor):
            ok = x.is_floating_point() and x.dtype not in (torch.float64, dtype)
            return x.to(dtype) if ok else x
        if isinstance(x, (list, tuple)):
            return type(x)(cast(y, dtype) for y in x)
        return x

    def flat(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                yield from flat(y)
        else:
            yield x

    def kernel(op, mode):
        def run(*args, **kw):
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                if mode == "lower":
                    dt = torch.get_autocast_dtype("cpu")
                    args, kw = cast(args, dt), {n: cast(v, dt) for n, v in kw.items()}
                elif mode == "fp32":
                    args, kw = cast(args, torch.float32), {n: cast(v, torch.float32) for n, v in kw.items()}
                elif mode == "fp32_out":
                    first = args[0]
                    half = isinstance(first, torch.Tensor) and first.dtype in (torch.float16, torch.bfloat16)
                    if half and kw.get("dtype") is None:
                        kw = dict(kw, dtype=torch.float32)
                else:
                    floats = [a.dtype for a in flat(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
                    if floats:
                        args = cast(args, functools.reduce(torch.promote_types, floats))
                return op(*args, **kw)
        return run

    lib = torch.library.Library("aten", "IMPL")
    _LIBS.append(lib)
    for names, mode in ((CUDA_LOWER, "lower"), (CUDA_FP32, "fp32"), (CUDA_FP32_OUT, "fp32_out"),
                        (CUDA_PROMOTE, "promote")):
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(torch.ops.aten, base, None)
            op = getattr(packet, overload or "default", None) if packet is not None else None
            if op is not None:
                lib.impl(name, kernel(op, mode), "AutocastCPU")


def install_cuda_sdpa_dropout() -> None:
    """Trace ``scaled_dot_product_attention`` with dropout as CUDA runs it (idempotent): the fused
    kernels (FlashAttention, cuDNN, memory-efficient) draw the dropout mask inside the kernel from a
    Philox seed and save no mask or probabilities, so their memory is the dropout-free kernel's;
    the CPU has no fused kernel with dropout and would fall back to the math path, which keeps the
    [b, h, s, s] probabilities. The traced call passes ``dropout_p = 0``: the same saved tensors as
    CUDA's fused kernels with dropout."""
    import torch.nn.functional as F

    if getattr(F.scaled_dot_product_attention, "_cuda_dropout", False):
        return
    sdpa = F.scaled_dot_product_attention

    def fused(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kw):
        return sdpa(query, key, value, attn_mask, 0.0, *args, **kw)

    fused._cuda_dropout = True
    F.scaled_dot_product_attention = fused


def install_cuda_dropout() -> None:
    """Trace ``F.dropout`` as CUDA runs it (idempotent): on a CUDA tensor ATen's ``dropout`` takes
    the fused ``native_dropout`` kernel, which saves a 1-byte boolean mask for backward
    (``aten/src/ATen/native/Dropout.cpp`` ``is_fused_kernel_acceptable``); on a CPU tensor it
    multiplies by a noise tensor of the input's dtype and saves that (2 or 4 bytes an element).
    The traced call runs ``native_dropout``, whose CPU kernel saves the same boolean mask."""
    import torch
    import torch.nn.functional as F

    if getattr(F.dropout, "_cuda_dropout", False):
        return
    dropout = F.dropout

    def fused(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and not inplace:
            return torch.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    fused._cuda_dropout = True
    F.dropout = fused


#: Hugging Face configs of the traced models (their published config.json values, trimmed to
#: the fields that set shapes). Pythia: EleutherAI/pythia-*; Llama-3.2-1B: meta-llama; Qwen2.5:
#: Qwen/Qwen2.5-0.5B; GPT-2 XL: openai-community/gpt2-xl; ViT-L/16: google/vit-large-patch16-224;
#: ConvNeXt-XL: facebook/convnext-xlarge-224-22k (21,841 classes).
def _pythia(h: int, layers: int, heads: int) -> dict[str, Any]:
    return {"model_type": "gpt_neox", "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "intermediate_size": 4 * h, "vocab_size": 50304, "rotary_pct": 0.25, "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "use_parallel_residual": True, "hidden_act": "gelu"}


MODELS: dict[str, dict[str, Any]] = {
    "pythia-160m": _pythia(768, 12, 12),
    "pythia-410m": _pythia(1024, 24, 16),
    "pythia-1b": _pythia(2048, 16, 8),
    "pythia-2.8b": _pythia(2560, 32, 32),
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
                     "tie_word_embeddings": True, "rope_theta": 500000.0, "max_position_embeddings": 131072,
                     "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5},
    "llama-8x1024": {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
                     "num_key_value_heads": 4, "intermediate_size": 4096, "vocab_size": 32000,
                     "tie_word_embeddings": False, "max_position_embeddings": 4096, "hidden_act": "silu"},
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768, "hidden_act": "silu",
                     "rope_theta": 1000000.0},
    "gpt2-xl": {"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "vocab_size": 50257,
                "n_positions": 1024, "activation_function": "gelu_new"},
    "vit-large-patch16-224": {"model_type": "vit", "hidden_size": 1024, "num_hidden_layers": 24,
                              "num_attention_heads": 16, "intermediate_size": 4096, "image_size": 224,
                              "patch_size": 16, "num_labels": 1000},
    "convnext-xlarge-224-22k": {"model_type": "convnext", "depths": [3, 3, 27, 3],
                            "hidden_sizes": [256, 512, 1024, 2048], "image_size": 224, "num_labels": 21841},
}

#: (model, tokens per sequence or image side, micro-batch, precision, attention, checkpointing)
CASES: tuple[tuple[str, int, int, str, str, str], ...] = (
    ("pythia-160m", 2048, 8, "bf16", "sdpa", "none"),
    ("pythia-160m", 2048, 8, "bf16", "eager", "none"),
    ("pythia-160m", 2048, 8, "fp32", "sdpa", "none"),
    ("pythia-410m", 2048, 8, "bf16", "sdpa", "none"),
    ("pythia-410m", 2048, 8, "fp16", "eager", "none"),
    ("pythia-410m", 2048, 8, "bf16", "eager", "full"),
    ("pythia-1b", 2048, 8, "bf16", "sdpa", "none"),
    ("pythia-1b", 2048, 4, "tf32", "sdpa", "none"),
    ("pythia-2.8b", 2048, 4, "bf16", "sdpa", "full"),
    ("pythia-2.8b", 2048, 4, "bf16", "sdpa", "none"),
    ("llama-8x1024", 2048, 8, "bf16", "sdpa", "none"),
    ("llama-3.2-1b", 2048, 8, "bf16", "sdpa", "none"),
    ("llama-3.2-1b", 8192, 2, "bf16", "sdpa", "none"),
    ("llama-3.2-1b", 2048, 4, "fp32", "sdpa", "none"),
    ("llama-3.2-1b", 2048, 8, "bf16", "sdpa", "full"),
    ("qwen2.5-0.5b", 2048, 8, "bf16", "sdpa", "none"),
    ("qwen2.5-0.5b", 2048, 4, "bf16", "eager", "none"),
    ("gpt2-xl", 1024, 8, "bf16", "sdpa", "none"),
    ("gpt2-xl", 1024, 8, "fp16", "eager", "none"),
    ("gpt2-xl", 1024, 4, "tf32", "sdpa", "none"),
    ("vit-large-patch16-224", 224, 64, "bf16", "sdpa", "none"),
    ("vit-large-patch16-224", 224, 64, "fp32", "eager", "none"),
    ("convnext-xlarge-224-22k", 224, 64, "bf16", "sdpa", "none"),
    ("convnext-xlarge-224-22k", 224, 32, "fp32", "sdpa", "none"),
)


def allocation_log() -> Any:
    """A ``TorchDispatchMode`` that records every storage an op creates and its release, in
    order: ``events`` of ``("a", id, bytes)`` and ``("f", id)`` (the release fires when the
    storage dies), the input of :func:`calibration.allocator_replay.replay`. ``track(t)`` adds
    tensors that exist before it starts (parameters, inputs)."""
    import itertools
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.weak import WeakIdKeyDictionary

    class AllocationLog(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple] = []
            self._ids = WeakIdKeyDictionary()
            self._next = itertools.count()

        def track(self, t: Any) -> None:
            if not isinstance(t, torch.Tensor):
                return
            s = t.untyped_storage()
            if s in self._ids:
                return
            sid = next(self._next)
            self._ids[s] = sid
            self.events.append(("a", sid, s.nbytes()))
            weakref.finalize(s, self.events.append, ("f", sid))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                self.track(t)
            return out

    return AllocationLog()


def trace(config: dict[str, Any], side: int, batch: int, precision: str, attention: str,
          checkpointing: str) -> dict[str, int]:
    """Peak live bytes over two training steps (the second's: the optimizer's states exist), and their categories (MemTracker's
    PARAM, GRAD, ACT, TEMP, OPT, ...), of the model ``config`` at ``batch`` x ``side`` tokens
    (images ``side`` pixels square) in ``precision`` (bf16/fp16: CUDA's autocast over fp32
    weights; tf32/fp32: none) with ``attention`` (sdpa, eager) and ``checkpointing`` (none, full:
    ``gradient_checkpointing_enable``, non-reentrant)."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    install_cuda_autocast_policy()
    install_cuda_sdpa_dropout()
    install_cuda_dropout()
    cfg = transformers.AutoConfig.for_model(**config)
    if config["model_type"] != "convnext":  # ConvNeXt has no attention
        cfg._attn_implementation = attention
    vision = config["model_type"] in ("vit", "convnext")
    auto = transformers.AutoModelForImageClassification if vision else transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(cfg)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    n_params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    with FakeTensorMode(allow_non_fake_inputs=True):
        # to_empty gives each module its own new Parameter, which unties tied embeddings: tie again
        model = model.to_empty(device="cpu")
        model.tie_weights()
        if sum(p.numel() for p in model.parameters()) != n_params:
            raise RuntimeError(f"{config['model_type']}: parameters changed moving off the meta device")
        if checkpointing == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        if vision:
            inputs = {"pixel_values": torch.zeros((batch, 3, side, side)),
                      "labels": torch.zeros((batch,), dtype=torch.long)}
        else:
            ids = torch.zeros((batch, side), dtype=torch.long)
            inputs = {"input_ids": ids, "labels": ids}
        log = allocation_log()
        for t in [*model.parameters(), *model.buffers(), *inputs.values()]:
            log.track(t)
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker, log:
            for _ in range(2):  # the peak of both: the second's, where the optimizer's states exist
                tracker.reset_mod_stats()  # per-module stats only; the device peak spans both steps
                with torch.autocast("cpu", dtype=half or torch.bfloat16, enabled=half is not None):
                    loss = model(**inputs).loss
                loss.backward()
                del loss
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            snap = tracker.get_tracker_snapshot("peak")
    per_device = next(iter(v for k, v in snap.items() if str(k) != "meta"))
    free_run, device = smallest_device(log.events)
    return {**{str(k).split(".")[-1].lower(): int(v) for k, v in per_device.items()},
            "allocator_allocated": free_run.allocated, "allocator_reserved": free_run.reserved,
            "allocator_device": device}


def main(argv: list[str] | None = None) -> int:
    from simulator.core.errors import run_cli

    return run_cli("hf_memory_trace", lambda: _trace_all(argv))


def start(prog: str, argv: list[str] | None, models: list[str]) -> set[str]:
    """The model names to re-trace (``argv``; none: all), checked against ``models``, with
    transformers loaded and quiet; UsageError in one line for an unknown name or a missing
    transformers (an extra of this package, not a dependency)."""
    only = set(argv if argv is not None else sys.argv[1:])
    if bad := sorted(only - set(models)):
        raise UsageError(f"unknown model(s) {', '.join(bad)}; valid: {', '.join(dict.fromkeys(models))}")
    try:
        import transformers
    except ImportError:
        raise UsageError(f"{prog} needs transformers 5.17: in a scratch environment, "
                         'pip install -e ".[trace]" torch==2.13.0 (README, "Measured on a real GPU")') from None
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    return only


def _trace_all(argv: list[str] | None) -> int:
    only = start("hf_memory_trace", argv, [c[0] for c in CASES])  # model names to re-trace; the other rows are kept
    import torch
    import transformers

    rows: list[dict[str, Any]] = []
    for model, side, batch, precision, attention, ckpt in CASES:
        if only and model not in only:
            continue
        peak = trace(MODELS[model], side, batch, precision, attention, ckpt)
        rows.append({"model": model, "side": side, "micro_batch": batch, "precision": precision,
                     "attention": attention, "checkpointing": ckpt, "peak_bytes": peak["total"],
                     **{f"{k}_bytes": v for k, v in peak.items() if k != "total"},
                     "config": json.dumps(MODELS[model], sort_keys=True),
                     "torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{model:24s} {side:5d} x {batch:3d} {precision:5s} {attention:6s} {ckpt:5s} "
              f"{peak['total'] / 2**30:8.2f} GiB allocated, runs in {peak['allocator_device'] / 2**30:8.2f} GiB",
              flush=True)
    write_rows(OUT, rows, only, [c[0] for c in CASES])
    return 0


def write_rows(path: Path, rows: list[dict[str, Any]], only: set[str], models: list[str]) -> None:
    """Writes ``rows`` to the CSV ``path`` atomically (:func:`simulator.core.atomic.write_text_atomic`),
    with the rows already there of the models not in ``only`` (all replaced where ``only`` is
    empty), in the order of ``models``."""
    import io

    from simulator.core.atomic import write_text_atomic

    if only and path.exists():
        with path.open() as fh:
            rows = [r for r in csv.DictReader(fh) if r["model"] not in only] + rows
    order = {m: i for i, m in reversed(list(enumerate(models)))}
    rows = sorted(rows, key=lambda r: order.get(r["model"], len(models)))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(path, out.getvalue())
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
