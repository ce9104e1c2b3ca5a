"""Benchmarks of the regimes that dominate real training steps outside the layer GEMMs.

* ``fresh/<size>x<count>``: allocate ``count`` tensors of ``size`` bytes, write them all, free
  them (what a forward does with the activations it stores), against writing one preallocated
  buffer of the same total. The difference is the cost of fresh pages
  (:class:`simulator.hardware.profile.FreshMemory`); on a GPU's caching allocator it is ~0.
* ``loss/t<T>v<V>``: fp32 cross-entropy over (T x V) logits and its gradient (log-softmax, NLL and
  their backward; exp-bound on a CPU, far below the copy bandwidth): the ``loss`` op class.
* ``embedding/t<T>v<V>h<h>``: ``F.embedding`` forward and its dense weight gradient.
* ``cast/<n>``: an fp32 weight cast to bf16/fp16 (what ``torch.autocast`` does per micro-batch).
* ``mask_add/<precision>/b<b>h<h>s<s>``: eager attention's mask add under torch.autocast, half scores
  [b, h, s, s] plus an fp32 mask [b, 1, s, s] broadcast over the heads, promoted to fp32 (read e + 4,
  write 4 bytes a score: ``simulator.model.workload.eager_mask_add_bytes``): the ``broadcast`` op class.
* ``rotary_mul/<precision>/b<b>h<h>s<s>d<d>``: Hugging Face's eager rotary multiply under torch.autocast,
  half Q [b, h, s, d] times an fp32 cos table [1, 1, s, d] broadcast over the batch and heads, promoted to
  fp32 (read e, write 4 bytes an element; the table is s x d, cached), and ``permute_copy/...``: the copy
  of a transposed [b, s, h, d] view into [b, h, s, d] (read and write e strided): the kernels the
  ``broadcast`` class prices for hf-trainer's eager rotary and transposes
  (:func:`simulator.model.workload.rotary_layout_bytes`), fitted with the mask add.
* ``optmix/<impl>/<mix>``: gradient-norm clipping and AdamW over a model's tensor-size mix: one
  huge embedding-like tensor, or many layer tensors (``foreach`` on a CPU loops over tensors;
  fresh temporaries per tensor); 28 + 12 bytes per parameter, as ``simulator.engine.estimate`` counts.
  On a CPU each call starts with cold caches, as after a training step's forward and backward
  (:func:`calibration.benches.optimizer.time_cold`), and records the bytes it faulted in.

Records carry the work the simulator counts for them (bytes, FLOPs, tensors) so that fitting
(:mod:`calibration.build`) never re-derives it. Times are seconds per call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from simulator.model.workload import MASK_ADD_FP32_BYTES

from ..device import DTYPES
from .base import Bench, RunContext, ok, unsupported
from .cold import cold_bytes, cold_inputs, fresh_outputs
from .gemm import model_tokens
from .optimizer import ADAM_BYTES_PER_PARAM, _adamw, counting_faults, layer_shapes, time_cold

MIB = 1 << 20
CLIP_BYTES_PER_PARAM = 12  # gradient-norm clipping: read for the norm, read + write to scale (fp32)
FRESH = {  # (tensor bytes, total bytes per call): small tensors over growing totals, and large ones
    "tiny": [(MIB, 8 * MIB), (MIB, 48 * MIB), (48 * MIB, 48 * MIB)],
    "quick": [(MIB, 16 * MIB), (MIB, 48 * MIB), (MIB, 128 * MIB), (8 * MIB, 128 * MIB), (64 * MIB, 64 * MIB)],
    "thorough": [(s, t * MIB) for s in (256 << 10, MIB, 4 * MIB) for t in (16, 32, 64, 128, 256)]
    + [(48 * MIB, 96 * MIB), (64 * MIB, 64 * MIB), (256 * MIB, 256 * MIB)],
}
LOSS = {  # (tokens, vocab): logits below and above the allocator's mmap threshold
    "tiny": [(128, 2048)],
    "quick": [(256, 2048), (512, 8192), (256, 32768), (512, 50304)],
    "thorough": [(256, 2048), (512, 8192), (256, 32768), (512, 50304), (2048, 32768), (1024, 131072)],
}
EMBED = {  # (tokens, vocab, hidden)
    "tiny": [(128, 2048, 64)],
    "quick": [(512, 2048, 256), (512, 50304, 128), (2048, 16384, 512)],
    "thorough": [(512, 2048, 256), (512, 50304, 128), (2048, 16384, 512), (4096, 50304, 768),
                 (1024, 131072, 256)],
}
CAST = {"tiny": [1 << 18], "quick": [1 << 20, 1 << 23], "thorough": [1 << 18, 1 << 20, 1 << 22, 1 << 24]}
# (batch, heads, sequence) of the mask_add benches: scores of 0.5M-128M elements; GPUs the larger (beyond L2)
MASK_ADD = {"tiny": [(1, 2, 256)], "quick": [(2, 4, 256), (2, 8, 512)],
            "thorough": [(2, 4, 256), (2, 8, 512), (4, 8, 1024)]}
CUDA_MASK_ADD = {"tiny": [(2, 4, 1024)], "quick": [(4, 8, 1024), (2, 16, 2048)],
                 "thorough": [(4, 8, 1024), (2, 16, 2048), (8, 12, 2048)]}
# (batch, heads, sequence, head dim) of the rotary_mul and permute_copy benches: Q of 0.5M-64M elements
ROTARY = {"tiny": [(1, 4, 256, 64)], "quick": [(2, 8, 256, 64), (2, 8, 512, 64)],
          "thorough": [(2, 8, 256, 64), (2, 8, 512, 64), (4, 8, 1024, 64)]}
CUDA_ROTARY = {"tiny": [(2, 8, 1024, 64)], "quick": [(8, 12, 2048, 64), (8, 16, 2048, 64)],
               "thorough": [(8, 12, 2048, 64), (8, 16, 2048, 64), (8, 32, 4096, 128)]}
# name -> list of tensor shapes. 'big': 24 MiB tensors (the per-byte cost of the large tensors that
# dominate a real model's step), each below glibc's mmap threshold, so their foreach temporaries are
# reused, not faulted in (those are counted anyway); at least 2, and on a CPU as many as make
# AdamW's state span twice the last-level cache (:func:`big_mix`). 'layers': many small layer
# tensors (the per-tensor cost of a small model's step).
OPT_MIX = {
    "tiny": {"embed": [(4096, 64)]},
    "quick": {"big": [(6144, 1024)] * 2, "layers": layer_shapes(128) * 8},
    "thorough": {"big": [(6144, 1024)] * 2, "embed": [(50304, 256)], "embed-s": [(8192, 256)],
                 "layers": layer_shapes(256) * 16, "layers-l": layer_shapes(1024) * 2},
}

# On a GPU the quick mixes above fit in L2 and one fused or multi-tensor kernel covers each: the step is its
# launches, and the fit read 0.59 of an H200's bandwidth for fused AdamW (0.67 over 0.4-1B parameters) and
# 14 us a tensor (2.9). GPUs time mixes of real models' sizes instead: 134M parameters in two 8192^2 tensors
# (weight, gradient and moments 2.1 GiB) and 24 layers of hidden 1024 (288 tensors, 302M parameters)
CUDA_OPT_MIX = {
    "tiny": {"big": [(4096, 4096)] * 2, "layers": layer_shapes(512) * 4},
    "quick": {"big": [(8192, 8192)] * 2, "layers": layer_shapes(1024) * 24},
    "thorough": {"big": [(8192, 8192)] * 2, "embed": [(151936, 2048)], "layers": layer_shapes(1024) * 24,
                 "layers-l": layer_shapes(4096) * 4},
}


PRIME_BYTES = 31 << 20  # just under glibc's 32 MiB mmap-threshold ceiling


def prime_host_allocator() -> None:
    """Put the C allocator in the state a training process reaches after its first steps:
    freeing a mapped block raises glibc's mmap threshold to that block's size (and the heap's
    trim threshold to twice it), so later blocks up to ~31 MiB come from the heap. Calibration
    and validation both start from this state, whatever ran before."""
    x = torch.empty(PRIME_BYTES // 4)
    x.fill_(0.0)
    del x


def _fresh(size: int, count: int):
    def run(ctx: RunContext) -> dict:
        prime_host_allocator()
        n_el = max(1, size // 4)
        total = float(count * n_el * 4)
        buf = torch.empty(count * n_el, device=ctx.device)

        def fresh() -> None:
            ts = [torch.empty(n_el, device=ctx.device) for _ in range(count)]
            for t in ts:
                t.fill_(1.0)
            del ts

        reuse = ctx.time(lambda: buf.fill_(1.0))
        t = ctx.time(fresh)
        rec = ok(t, bytes=total, tensor_bytes=float(n_el * 4), tensors=count)
        rec["reuse_s"] = reuse.fit_s
        return rec

    return run


def _loss(T: int, V: int):
    def run(ctx: RunContext) -> dict:
        logits = torch.randn(T, V, device=ctx.device).requires_grad_(True)
        y = torch.randint(0, V, (T,), device=ctx.device)

        def step() -> object:
            return torch.autograd.grad(F.cross_entropy(logits, y), (logits,))

        t = ctx.time(fresh_outputs(step, 4.0 * T * V, cold_bytes(ctx.dev.kind)))
        return ok(t, tokens=T, vocab=V, logits=float(T * V))

    return run


def _embedding(T: int, V: int, h: int):
    def run(ctx: RunContext) -> dict:
        w = (torch.randn(V, h, device=ctx.device) * 0.02).requires_grad_(True)
        idx = torch.randint(0, V, (T,), device=ctx.device)
        go = torch.randn(T, h, device=ctx.device)

        def step() -> object:
            return torch.autograd.grad(F.embedding(idx, w), (w,), go)

        t = ctx.time(fresh_outputs(step, 4.0 * V * h, cold_bytes(ctx.dev.kind)))
        # gather: read + write T*h; gradient: zero V*h, read T*h grads, scatter-add T*h rows
        nbytes = 4.0 * (2 * T * h + V * h + 2 * T * h)
        return ok(t, bytes=nbytes, tokens=T, vocab=V, hidden=h, grad_bytes=4.0 * V * h)

    return run


def _cast(n: int, precision: str):
    def run(ctx: RunContext) -> dict:
        dt = DTYPES[precision]
        cold = cold_bytes(ctx.dev.kind)  # the weights were last touched a step ago
        ws = cold_inputs(torch.randn(n, device=ctx.device), cold)
        out = float(n * torch.finfo(dt).bits // 8)
        t = ctx.time(fresh_outputs(lambda: next(ws).to(dt), out, cold))
        return ok(t, bytes=6.0 * n, out_bytes=out)

    return run


def _mask_add(b: int, h: int, seq: int, precision: str):
    def run(ctx: RunContext) -> dict:
        dt = DTYPES[precision]
        scores = torch.randn(b, h, seq, seq, device=ctx.device, dtype=dt)
        mask = torch.zeros(b, 1, seq, seq, device=ctx.device, dtype=torch.float32)
        n = scores.numel()
        t = ctx.time(fresh_outputs(lambda: scores + mask, 4.0 * n, cold_bytes(ctx.dev.kind)))
        return ok(t, bytes=float(n * (scores.element_size() + MASK_ADD_FP32_BYTES)), out_bytes=4.0 * n, elements=n)

    return run


def _rotary_mul(b: int, h: int, seq: int, d: int, precision: str):
    def run(ctx: RunContext) -> dict:
        q = torch.randn(b, h, seq, d, device=ctx.device, dtype=DTYPES[precision])
        cos = torch.randn(1, 1, seq, d, device=ctx.device, dtype=torch.float32)
        n = q.numel()
        t = ctx.time(fresh_outputs(lambda: q * cos, 4.0 * n, cold_bytes(ctx.dev.kind)))
        return ok(t, bytes=float(n * (q.element_size() + 4)), out_bytes=4.0 * n, elements=n)

    return run


def _permute_copy(b: int, h: int, seq: int, d: int, precision: str):
    def run(ctx: RunContext) -> dict:
        x = torch.randn(b, seq, h, d, device=ctx.device, dtype=DTYPES[precision]).transpose(1, 2)
        n, e = x.numel(), x.element_size()
        t = ctx.time(fresh_outputs(lambda: x.contiguous(), float(e * n), cold_bytes(ctx.dev.kind)))
        return ok(t, bytes=float(2 * e * n), out_bytes=float(e * n), elements=n)

    return run


def _optmix(impl: str, shapes: list[tuple[int, ...]]):
    def run(ctx: RunContext) -> dict:
        state = 16.0 * sum(_numel(s) for s in shapes)  # fp32 weight, gradient and two moments
        if state > 0.5 * ctx.dev.usable_memory_gib * 2**30:
            return unsupported(f"needs {state / 2**30:.1f} GiB, more than half of device memory")
        prime_host_allocator()  # the allocator state of a training process, whatever ran before
        params = []
        for shape in shapes:
            p = (torch.randn(shape, device=ctx.device) * 0.02).requires_grad_(True)
            p.grad = torch.randn_like(p) * 1e-3
            params.append(p)
        n = sum(p.numel() for p in params)
        try:
            opt = _adamw(params, impl)
            opt.step()
        except (RuntimeError, ValueError) as exc:
            return unsupported(f"AdamW {impl} on {ctx.device.type}: {exc}")

        def step() -> None:  # a training step's optimizer phase: clip the gradient norm, update
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=impl != "for_loop")
            opt.step()

        timed, faults = counting_faults(step)
        t = time_cold(ctx, timed) if ctx.device.type == "cpu" else ctx.time(timed)
        rec = ok(t, params=n, tensors=len(params), bytes=float((ADAM_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM) * n),
                 fault_bytes=faults())
        rec["tensor_bytes"] = [4.0 * p.numel() for p in params]
        return rec

    return run


def big_mix(shapes: list[tuple[int, ...]], cold: int) -> list[tuple[int, ...]]:
    """The 'big' mix: its tensors repeated until AdamW's state spans ``cold`` bytes (twice the
    last-level cache on a CPU), so that each of foreach AdamW's passes over the tensors reads
    memory, as a model's optimizer step does. Two 24 MiB tensors fit a 480 MiB L3 with their
    state: every pass after the first hit the cache, and the bench ran 15% faster per byte than
    the optimizer steps of 20-70M-parameter models measured alone from cold caches. The state is
    :func:`simulator.physics.memory.state_bytes_per_param` of fp32 AdamW (weight, gradient, two moments)."""
    from simulator.physics.memory import state_bytes_per_param

    per = sum(state_bytes_per_param("fp32", "ddp", "adamw")) * _numel(shapes[0])
    return [shapes[0]] * max(len(shapes), -(-cold // per))


def model_points(model, flop_cap: float) -> dict[str, object]:
    """Extra points with the shapes of ``model`` (``calibrate --for-model``): its loss over the
    vocabulary and its embedding (tokens per :func:`calibration.benches.gemm.model_tokens`), one
    layer's tensors and its embedding matrix for AdamW."""
    V, h = model.vocab_size, model.hidden
    t = model_tokens(V, h, flop_cap / 3)
    return {"loss": [(t, V)], "embed": [(max(t, 512), V, h)],
            "optmix": {f"{model.name}-embed": [(V, h)], f"{model.name}-layer": layer_shapes(h)}}


def plan(ctx: RunContext) -> list[Bench]:
    """Fresh memory, the loss over the vocabulary, embedding, weight casts and AdamW tensor mixes."""
    mode = ctx.settings.mode
    cap = 4e9 if ctx.dev.kind == "cpu" else 4e12
    extra = model_points(ctx.settings.model, cap) if ctx.settings.model is not None else {}
    benches = [Bench(f"fresh/{s}x{t // s}", "fresh", {"tensor_bytes": s, "total": t}, _fresh(s, t // s),
                     ctx.est(40.0 * t, "bytes", t)) for s, t in FRESH[mode]]
    for T, V in LOSS[mode] + extra.get("loss", []):
        benches.append(Bench(f"loss/t{T}v{V}", "loss", {"tokens": T, "vocab": V}, _loss(T, V),
                             ctx.est(40.0 * T * V, "bytes", 4.0 * T * V)))
    for T, V, h in EMBED[mode] + extra.get("embed", []):
        benches.append(Bench(f"embedding/t{T}v{V}h{h}", "embedding", {"tokens": T, "vocab": V, "hidden": h},
                             _embedding(T, V, h), ctx.est(8.0 * V * h, "bytes", 8.0 * V * h)))
    for prec in ctx.half:
        for n in CAST[mode]:
            benches.append(Bench(f"cast/{prec}/{n}", "cast", {"precision": prec, "elements": n},
                                 _cast(n, prec), ctx.est(6.0 * n, "bytes", 4.0 * n)))
        for b, h, seq in (CUDA_MASK_ADD if ctx.dev.kind == "cuda" else MASK_ADD)[mode]:
            n = b * h * seq * seq
            benches.append(Bench(f"mask_add/{prec}/b{b}h{h}s{seq}", "cast", {"precision": prec, "elements": n},
                                 _mask_add(b, h, seq, prec), ctx.est(10.0 * n, "bytes", 6.0 * n)))
        for b, h, seq, d in (CUDA_ROTARY if ctx.dev.kind == "cuda" else ROTARY)[mode]:
            n, key = b * h * seq * d, f"{prec}/b{b}h{h}s{seq}d{d}"
            benches.append(Bench(f"rotary_mul/{key}", "cast", {"precision": prec, "elements": n},
                                 _rotary_mul(b, h, seq, d, prec), ctx.est(6.0 * n, "bytes", 4.0 * n)))
            benches.append(Bench(f"permute_copy/{key}", "cast", {"precision": prec, "elements": n},
                                 _permute_copy(b, h, seq, d, prec), ctx.est(4.0 * n, "bytes", 2.0 * n)))
    mixes = {**(CUDA_OPT_MIX if ctx.dev.kind == "cuda" else OPT_MIX)[mode], **extra.get("optmix", {})}
    if "big" in mixes:
        mixes["big"] = big_mix(mixes["big"], cold_bytes(ctx.dev.kind))
    for impl in ("foreach", "for_loop", "fused"):
        for name, shapes in mixes.items():
            n = sum(_numel(s) for s in shapes)
            benches.append(Bench(f"optmix/{impl}/{name}", "optimizer",
                                 {"impl": impl, "mix": name, "tensors": len(shapes), "params": n},
                                 _optmix(impl, shapes), ctx.est(28.0 * n, "bytes", 8.0 * n)))
    return benches


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
