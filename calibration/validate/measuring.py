"""Measuring real training steps in torch: the process group, timed optimizer steps of one
configuration, and the merge of a configuration's rounds. Times are in seconds, memory in GiB.

Under ``torchrun`` the model is wrapped in DDP (gloo on CPU, NCCL on CUDA), accumulation skips
gradient sync until the last micro-batch, and each rank's times are reduced to the slowest rank's.
torch is imported inside the functions, so the package loads without it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.core.errors import UsageError

from .suite import Config

#: The AdamW implementation the loop steps with, which its prediction takes in place of the default stack's
#: (hf-trainer's fused): foreach, the profile's 'foreach' rate, as the committed measurements were taken
VALIDATE_OPTIMIZER = "foreach"

GIB = 1024**3
#: the most timed steps one round takes to reach :data:`calibration.validate.suite.MIN_ROUND_S`
MAX_ROUND_STEPS = 64


@dataclass
class Dist:
    """Process-group facts: world size, rank, local rank, and the torch device of this rank."""

    world: int = 1
    rank: int = 0
    local_rank: int = 0
    device: Any = None
    initialized: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_dist(device_arg: str | None) -> Dist:
    """Join torchrun's process group if WORLD_SIZE > 1 (gloo on CPU, NCCL on CUDA)."""
    import torch
    import torch.distributed as tdist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    want = device_arg or ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("--device cuda requested but torch reports no CUDA device")
        idx = local if world > 1 else (torch.device(want).index or 0)
        torch.cuda.set_device(idx)
        device = torch.device("cuda", idx)
    elif want == "cpu":
        device = torch.device("cpu")
    else:
        raise UsageError(f"unsupported device {device_arg!r}; use 'cpu' or 'cuda[:N]'")
    d = Dist(world, rank, local, device)
    if world > 1:
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        d.initialized = True
    return d


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)



def timed_steps(steps: int, first_s: float, min_s: float, most: int = MAX_ROUND_STEPS) -> int:
    """Timed steps of a round that asks for ``steps`` and at least ``min_s`` seconds, given its
    first timed step took ``first_s`` seconds: never fewer than ``steps``, never more than
    ``most`` to reach ``min_s``."""
    if min_s <= 0 or first_s <= 0:
        return steps
    return max(steps, min(most, math.ceil(min_s / first_s)))


def round_steps(steps: int, rounds: int) -> list[int]:
    """Timed steps in each of ``rounds`` rounds: ``steps`` split as evenly as it goes, at least
    one per round."""
    return [max(1, steps // rounds + (r < steps % rounds)) for r in range(rounds)]


@dataclass
class Measured:
    """Medians over timed steps (s): whole step, forward (all micro-batches), backward (without
    recomputation), recomputation of checkpointed code during backward, optimizer; ``min_s`` the
    fastest timed step, ``spread`` slowest / fastest step (noise indicator); on CUDA the peak
    memory of the timed steps (GiB): ``mem_gib`` allocated (``torch.cuda.max_memory_allocated``),
    ``reserved_gib`` held by the caching allocator (``torch.cuda.max_memory_reserved``); None on a CPU."""

    status: str = "ok"
    reason: str = ""
    step_s: float | None = None
    fwd_s: float | None = None
    bwd_s: float | None = None
    rec_s: float | None = None
    opt_s: float | None = None
    compile_s: float | None = None
    min_s: float | None = None
    spread: float | None = None
    samples: list[float] = field(default_factory=list)
    rounds: int = 1
    mem_gib: float | None = None
    reserved_gib: float | None = None


def merge_measured(rounds: list[Measured]) -> Measured:
    """One config's measurement from its rounds: each time the median of the rounds' medians,
    ``min_s`` the fastest step of any round, ``spread`` the slowest step of any round over that,
    ``compile_s`` the first round's, the memory peaks the largest of any round; the first round that
    did not succeed, if any, instead."""
    bad = [m for m in rounds if m.status != "ok"]
    if bad or len(rounds) == 1:
        return bad[0] if bad else rounds[0]

    def med(name: str) -> float:
        return statistics.median(getattr(m, name) for m in rounds)

    lo = min(m.min_s for m in rounds)
    hi = max(m.min_s * m.spread for m in rounds)

    def peak(name: str) -> float | None:
        vals = [getattr(m, name) for m in rounds if getattr(m, name) is not None]
        return max(vals) if vals else None

    return Measured("ok", "", med("step_s"), med("fwd_s"), med("bwd_s"), med("rec_s"), med("opt_s"),
                    rounds[0].compile_s, lo, hi / lo, [t for m in rounds for t in m.samples], len(rounds),
                    peak("mem_gib"), peak("reserved_gib"))


#: one timed step (s): whole step, forward, backward without recomputation, optimizer, recomputation
Sample = tuple[float, float, float, float, float]


def measure(cfg: Config, dist: Dist, warmup: int = 2, steps: int = 5, seed: int = 0,
            min_s: float = 0.0) -> Measured:
    """Run one step, ``warmup`` more (:func:`calibration.torch_model.warm_up`), then ``steps`` optimizer
    steps of ``cfg`` and time them (median, seconds); more timed steps where ``steps`` take under
    ``min_s`` seconds (:func:`timed_steps`, from the first timed step; under DDP the most any rank asks for).

    Every phase boundary synchronises the device, so the times are what the device executed.
    Under DDP the slowest rank's medians are reported.
    """
    import torch

    from ..torch_model import warm_up

    torch.manual_seed(seed + dist.rank)
    skip = _set_precision(cfg, dist.device)
    if skip:
        return Measured("skipped", skip)
    one_step, opt = _training_step(cfg, dist, seed)
    out = Measured()
    try:
        first = warm_up(one_step, opt, warmup)
        if cfg.compile:
            out.compile_s = first
    except Exception as exc:  # noqa: BLE001 - a failed config is a row, not a crash
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        what = "torch.compile failed" if cfg.compile else "training step failed"
        return Measured("skipped" if cfg.compile else "error", f"{what}: {type(exc).__name__}: {first}")
    if dist.device.type == "cuda":  # the timed steps' peaks, past the first steps' allocations
        torch.cuda.reset_peak_memory_stats(dist.device)
    samples = _timed_samples(one_step, dist, steps, min_s)
    _store_times(out, samples, dist)
    if dist.device.type == "cuda":
        out.mem_gib, out.reserved_gib = _peak_memory_gib(dist)
    return out


def _set_precision(cfg: Config, dev: Any) -> str | None:
    """Why ``cfg`` cannot run on ``dev`` (fp16 and tf32 need CUDA), else None; on CUDA, allow TF32
    matmuls exactly when ``cfg`` asks for tf32."""
    import torch

    if cfg.precision == "fp16" and dev.type != "cuda":
        return "fp16 mixed precision needs CUDA (GradScaler)"
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = cfg.precision == "tf32"
    elif cfg.precision == "tf32":
        return "tf32 exists only on CUDA tensor cores"
    return None


def _training_step(cfg: Config, dist: Dist, seed: int) -> tuple[Callable[[], Sample], Any]:
    """Build ``cfg``'s model (DDP-wrapped under torchrun, compiled if asked), its foreach AdamW and
    random token batches; returns one timed optimizer step (:data:`Sample`, a callable) and the optimizer."""
    import torch

    from ..torch_model import build_model

    dev = dist.device
    model = build_model(cfg.spec, cfg.attention, cfg.checkpointing, device=dev)
    model.train()
    # the implementation the prediction takes (VALIDATE_OPTIMIZER)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **{VALIDATE_OPTIMIZER: True})
    runner: Any = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        runner = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if cfg.compile:
        runner = torch.compile(runner)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
    gen = torch.Generator(device="cpu").manual_seed(seed + 1000 * dist.rank)
    v = cfg.spec.vocab_size
    data = [(torch.randint(0, v, (cfg.micro_batch, cfg.seq_len), generator=gen).to(dev),
             torch.randint(0, v, (cfg.micro_batch, cfg.seq_len), generator=gen).to(dev))
            for _ in range(cfg.grad_accum)]

    def one_step() -> Sample:
        t_f = t_b = 0.0
        r0 = model.clock.seconds
        _sync(dev)
        t0 = time.perf_counter()
        for i, (x, y) in enumerate(data):
            last = i == len(data) - 1
            ctx = runner.no_sync() if (dist.world > 1 and not last and hasattr(runner, "no_sync")) \
                else _null()
            with ctx:
                a = time.perf_counter()
                with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
                    loss = runner(x, y) / cfg.grad_accum
                _sync(dev)
                b = time.perf_counter()
                model.clock.in_backward = True
                try:
                    (scaler.scale(loss) if scaler else loss).backward()
                    _sync(dev)
                finally:
                    model.clock.in_backward = False
                c = time.perf_counter()
            t_f, t_b = t_f + (b - a), t_b + (c - b)
        a = time.perf_counter()
        if scaler:
            scaler.unscale_(opt)
        # gradient-norm clipping at 1.0, as the simulated stack (Hugging Face Trainer) does
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(dev)
        end = time.perf_counter()
        rec = model.clock.seconds - r0
        return end - t0, t_f, t_b - rec, end - a, rec

    return one_step, opt


def _timed_samples(one_step: Callable[[], Sample], dist: Dist, steps: int, min_s: float) -> list[Sample]:
    """Time ``steps`` steps, or more to fill ``min_s`` seconds (:func:`timed_steps`, decided from
    the first timed step; under DDP the most any rank asks for, each step starting at a barrier)."""
    import torch
    import torch.distributed as tdist

    samples: list[Sample] = []
    n = steps
    while len(samples) < n:
        if dist.initialized:
            tdist.barrier()
        samples.append(one_step())
        if len(samples) == 1:
            n = timed_steps(steps, samples[0][0], min_s)
            if dist.initialized:
                t = torch.tensor([n], dtype=torch.int64)
                tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
                n = int(t.item())
    return samples


def _slowest_rank(values: list[float], dist: Dist, device: Any = None) -> list[float]:
    """``values`` reduced to their largest over the ranks under DDP (float64 tensors on ``device``;
    None: torch's default), else unchanged."""
    if not dist.initialized:
        return values
    import torch
    import torch.distributed as tdist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t.tolist()


def _store_times(out: Measured, samples: list[Sample], dist: Dist) -> None:
    """Fill ``out``'s medians per phase, fastest step and spread from ``samples`` (the slowest rank's)."""
    med = _slowest_rank([statistics.median(s[j] for s in samples) for j in range(5)], dist)
    lo, hi = _slowest_rank([min(s[0] for s in samples), max(s[0] for s in samples)], dist)
    out.step_s, out.fwd_s, out.bwd_s, out.opt_s, out.rec_s = med
    out.min_s, out.spread = lo, hi / lo
    out.samples = [s[0] for s in samples]


def _peak_memory_gib(dist: Dist) -> tuple[float, float]:
    """(allocated, reserved) peak GiB of the timed steps on this CUDA device (the fullest rank's)."""
    import torch

    dev = dist.device
    peaks = _slowest_rank([float(torch.cuda.max_memory_allocated(dev)),
                           float(torch.cuda.max_memory_reserved(dev))], dist, dev)
    return peaks[0] / GIB, peaks[1] / GIB


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
