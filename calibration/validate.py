"""``validate``: real training steps in torch against the simulator's predicted step time.

For every configuration of a suite (``calibration/suites/*.yaml``) it builds the model
(:mod:`calibration.torch_model`), runs warm-up steps and then timed optimizer steps (forward,
backward, gradient clipping at 1.0 and AdamW; gradient accumulation; bf16 autocast; eager or SDPA; full or selective
activation checkpointing; ``torch.compile``), takes the median of the timed steps, and compares it
with ``simulator.answer.api.simulate(..., "Nxlocal", profile=...)`` per pass (forward, backward,
recomputation timed inside backward, optimizer) and per step. Times are in seconds. On CUDA it also
records the timed steps' peak memory (``torch.cuda.max_memory_allocated`` and
``max_memory_reserved``, GiB) beside the predicted peaks (:func:`predicted_peaks`); a CPU leaves
the measured columns empty.

Under ``torchrun --nproc-per-node N`` (or ``--nproc N``, which launches torchrun) the model is
wrapped in DDP (gloo on CPU, NCCL on CUDA), accumulation skips gradient sync until the last
micro-batch, and each rank's step time is reduced to the slowest rank's.

The training steps are the check, never the fit: nothing here changes simulator constants;
``--update-profile`` only stores the residuals log(measured / predicted) for intervals.

Exit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator.answer.uncertainty import LEVEL, left_out_coverage
from simulator.core.atomic import check_writable
from simulator.core.errors import UsageError, UsageParser, run_cli
from simulator.core.vocab import FP8, PRECISIONS
from simulator.model.presets import get_model
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import CHECKPOINTINGS as CHECKPOINTING

from . import host_alloc, host_load
from .host_alloc import ALLOCATORS

SUITE_DIR = Path(__file__).resolve().parent / "suites"
DEFAULT_SUITE = SUITE_DIR / "cpu_default.yaml"
GPU_DEFAULT_SUITE = SUITE_DIR / "gpu_default.yaml"
#: the precisions a suite may measure: plain PyTorch training steps (autocast), so not fp8
MEASURED_PRECISIONS = tuple(p for p in PRECISIONS if p != FP8)
#: timed seconds per round at least (suite ``min_round_s``, ``--min-round-s``): steps of a few
#: milliseconds are timed dozens of times, as a shared host's speed moves by 20-50% for seconds at a
#: time (a 2-core Zen 4 guest, 2026-12-03: 1-2 steps per round of 10-100 ms configs spread 1.5-2.3x)
MIN_ROUND_S = 0.5
#: the most warm-up or timed steps per config and round ``--warmup``/``--steps`` (or a suite) may
#: ask for: a median needs a handful, and 1,000 steps of the largest suite's 1 s configs already
#: take 17 minutes each (an assumption bounding a typo such as ``--steps 1000000000``)
MAX_STEPS = 1000
GIB = 1024**3
#: the most timed steps one round takes to reach :data:`MIN_ROUND_S`
MAX_ROUND_STEPS = 64
#: per-pass columns: name -> (measured, predicted) fields, all micro-batches of a step
COMPONENTS = {"fwd": ("measured_fwd_s", "predicted_fwd_s"), "bwd": ("measured_bwd_s", "predicted_bwd_s"),
              "rec": ("measured_rec_s", "predicted_rec_s"), "opt": ("measured_opt_s", "predicted_opt_s")}
CSV_FIELDS = (
    "id", "model", "params", "n_layers", "hidden", "seq_len", "micro_batch", "grad_accum", "world",
    "precision", "attention", "checkpointing", "compile", "status", "reason",
    "measured_step_s", "predicted_step_s", "error_pct", "log_ratio", "measured_min_s", "spread",
    "measured_fwd_s", "predicted_fwd_s", "measured_bwd_s", "predicted_bwd_s",
    "measured_rec_s", "predicted_rec_s", "measured_opt_s", "predicted_opt_s",
    "measured_mem_gib", "predicted_mem_gib", "mem_error_pct", "measured_reserved_gib", "predicted_reserved_gib",
    "compile_s", "steps", "warmup",
    "rounds", "device", "profile", "suite", "date", "torch", "loadavg_1min", "other_cores", "host_speed", "host_allocator",
)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# ---------------------------------------------------------------------------- suites
@dataclass(frozen=True)
class Config:
    """One validation configuration: model, shape of a step and execution knobs."""

    id: str
    model: str
    spec: ModelSpec
    seq_len: int  # tokens per sequence
    micro_batch: int  # sequences per micro-batch per rank
    grad_accum: int  # micro-batches per optimizer step
    precision: str = "fp32"
    attention: str = "sdpa"
    checkpointing: str = "none"
    compile: bool = False


@dataclass
class Suite:
    """A named list of configurations with timing settings (``warmup`` steps after the first, which
    creates the optimizer's state, and timed ``steps``, split
    over ``rounds``; None: the device's default, :func:`calibration.host_load.default_rounds`;
    each round times steps for at least ``min_round_s`` seconds, :func:`timed_steps`)."""

    name: str
    configs: list[Config]
    warmup: int = 2
    steps: int = 5
    path: str = ""
    rounds: int | None = None
    min_round_s: float = MIN_ROUND_S


def _spec_from(name: str, entry: Any) -> ModelSpec:
    """A preset name, or a mapping with optional ``base`` preset plus ModelSpec field overrides."""
    if isinstance(entry, str):
        return get_model(entry)
    if not isinstance(entry, dict):
        raise UsageError(f"suite model {name!r}: expected a preset name or a mapping")
    data = dict(entry)
    base = data.pop("base", None)
    fields = get_model(base).model_dump() if base else {}
    fields.update(name=name, display=None, hf_id=None, source="validation suite")
    fields.update(data)
    try:
        return ModelSpec(**fields)
    except Exception as exc:  # pydantic ValidationError: one line
        msg = str(exc).splitlines()
        raise UsageError(f"suite model {name!r} is invalid: {' '.join(msg[:3])}") from None


def config_id(model: str, seq_len: int, mb: int, ga: int, precision: str, attention: str,
              checkpointing: str, compiled: bool) -> str:
    """Stable id, e.g. ``neox-4x256-s128-mb4x2-bf16-sdpa-ckpt-compiled``."""
    parts = [model, f"s{seq_len}", f"mb{mb}x{ga}", precision, attention]
    if checkpointing != "none":
        parts.append("ckpt" if checkpointing == "full" else checkpointing)
    if compiled:
        parts.append("compiled")
    return "-".join(parts)


def load_suite(path: str | os.PathLike) -> Suite:
    """Read a YAML/JSON suite: ``name``, ``warmup``, ``steps``, ``rounds``, ``models`` and ``configs``."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read suite {str(p)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"suite {str(p)!r} is not valid YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("configs"), list) or not raw["configs"]:
        raise UsageError(f"suite {str(p)!r}: needs a non-empty 'configs' list")
    models = {str(k): _spec_from(str(k), v) for k, v in (raw.get("models") or {}).items()}
    defaults = raw.get("defaults") or {}
    configs: list[Config] = []
    seen: set[str] = set()
    for i, c in enumerate(raw["configs"]):
        if not isinstance(c, dict):
            raise UsageError(f"suite {str(p)!r}: config #{i + 1} must be a mapping")
        c = {**defaults, **c}
        if "model" not in c:
            raise UsageError(f"suite {str(p)!r}: config #{i + 1} needs a 'model' (or one under 'defaults')")
        name = str(c["model"])
        spec = models.get(name) or get_model(name)
        try:
            seq = int(c.get("seq_len", min(spec.default_seq_len, 128)))
            mb, ga = int(c.get("micro_batch", 1)), int(c.get("grad_accum", 1))
        except (TypeError, ValueError):
            raise UsageError(f"suite {str(p)!r}: config #{i + 1}: seq_len, micro_batch and grad_accum "
                             "must be integers") from None
        prec, attn = str(c.get("precision", "fp32")), str(c.get("attention", "sdpa"))
        ckpt, comp = str(c.get("checkpointing", "none")), bool(c.get("compile", False))
        if min(seq, mb, ga) < 1:
            raise UsageError(f"suite {str(p)!r}: config #{i + 1}: sizes must be positive")
        if prec not in MEASURED_PRECISIONS or attn not in ("eager", "sdpa") or ckpt not in CHECKPOINTING:
            raise UsageError(f"suite {str(p)!r}: config #{i + 1}: precision in {MEASURED_PRECISIONS}, attention "
                             f"eager|sdpa, checkpointing {'|'.join(CHECKPOINTING)}")
        if spec.pos_embedding == "learned" and seq > spec.max_positions:
            raise UsageError(f"suite {str(p)!r}: config #{i + 1}: seq_len {seq} > max_positions "
                             f"{spec.max_positions} of {name!r}")
        cid = str(c.get("id") or config_id(name, seq, mb, ga, prec, attn, ckpt, comp))
        if cid in seen:
            raise UsageError(f"suite {str(p)!r}: duplicate config id {cid!r}")
        seen.add(cid)
        configs.append(Config(cid, name, spec, seq, mb, ga, prec, attn, ckpt, comp))
    rounds = raw.get("rounds")
    host_load.check_rounds(rounds, f"suite {str(p)!r}: rounds")
    min_round_s = raw.get("min_round_s", MIN_ROUND_S)
    check_min_round_s(min_round_s, f"suite {str(p)!r}: min_round_s")
    return Suite(str(raw.get("name") or p.stem), configs, int(raw.get("warmup", 2)),
                 int(raw.get("steps", 5)), str(p), rounds, float(min_round_s))


# ---------------------------------------------------------------------------- distributed
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


# ---------------------------------------------------------------------------- measuring
def check_min_round_s(value: Any, what: str = "--min-round-s") -> None:
    """Usage error unless ``value`` is a finite number of seconds in [0, 60]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        raise UsageError(f"{what} must be a number of seconds from 0 to 60, got {value!r}")


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


def measure(cfg: Config, dist: Dist, warmup: int = 2, steps: int = 5, seed: int = 0,
            min_s: float = 0.0) -> Measured:
    """Run one step, ``warmup`` more (:func:`calibration.torch_model.warm_up`), then ``steps`` optimizer
    steps of ``cfg`` and time them (median, seconds); more timed steps where ``steps`` take under
    ``min_s`` seconds (:func:`timed_steps`, from the first timed step; under DDP the most any rank asks for).

    Every phase boundary synchronises the device, so the times are what the device executed.
    Under DDP the slowest rank's medians are reported.
    """
    import torch
    import torch.distributed as tdist

    from .torch_model import build_model, warm_up

    dev = dist.device
    torch.manual_seed(seed + dist.rank)
    if cfg.precision == "fp16" and dev.type != "cuda":
        return Measured("skipped", "fp16 mixed precision needs CUDA (GradScaler)")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = cfg.precision == "tf32"
    elif cfg.precision == "tf32":
        return Measured("skipped", "tf32 exists only on CUDA tensor cores")
    model = build_model(cfg.spec, cfg.attention, cfg.checkpointing, device=dev)
    model.train()
    # foreach is the implementation the simulator's optimizer term models (profile 'foreach')
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
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

    def one_step() -> tuple[float, float, float, float, float]:
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

    out = Measured()
    try:
        first = warm_up(one_step, opt, warmup)
        if cfg.compile:
            out.compile_s = first
    except Exception as exc:  # noqa: BLE001 - a failed config is a row, not a crash
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        what = "torch.compile failed" if cfg.compile else "training step failed"
        return Measured("skipped" if cfg.compile else "error", f"{what}: {type(exc).__name__}: {first}")
    samples: list[tuple[float, float, float, float, float]] = []
    if dev.type == "cuda":  # the timed steps' peaks, past the first steps' allocations
        torch.cuda.reset_peak_memory_stats(dev)
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
    med = [statistics.median(s[j] for s in samples) for j in range(5)]
    if dist.initialized:
        t = torch.tensor(med, dtype=torch.float64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        med = t.tolist()
    lo, hi = min(s[0] for s in samples), max(s[0] for s in samples)
    if dist.initialized:
        t = torch.tensor([lo, hi], dtype=torch.float64)
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        lo, hi = t.tolist()
    out.step_s, out.fwd_s, out.bwd_s, out.opt_s, out.rec_s = med
    out.min_s, out.spread = lo, hi / lo
    out.samples = [s[0] for s in samples]
    if dev.type == "cuda":
        peaks = [float(torch.cuda.max_memory_allocated(dev)), float(torch.cuda.max_memory_reserved(dev))]
        if dist.initialized:  # the fullest rank's
            t = torch.tensor(peaks, dtype=torch.float64, device=dev)
            tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
            peaks = t.tolist()
        out.mem_gib, out.reserved_gib = peaks[0] / GIB, peaks[1] / GIB
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------------------- predicting
def check_fits_memory(configs: list[Config], memory_gib: float, where: str) -> None:
    """Refuse, before anything is built, a config whose model states alone (weights, gradients
    and AdamW's two moments as one DDP rank holds them, :func:`simulator.physics.memory.state_bytes_per_param`)
    exceed ``memory_gib`` (GiB): building it would end in an out-of-memory kill, not a row."""
    from simulator.physics.memory import state_bytes_per_param

    for cfg in configs:
        per_param = sum(state_bytes_per_param(cfg.precision, "ddp", "adamw"))
        need = cfg.spec.n_params() * per_param / 2**30
        if need > memory_gib:
            raise UsageError(f"suite config {cfg.id!r}: {cfg.model}'s {cfg.spec.n_params() / 1e9:.2f} B parameters need "
                             f"at least {need:,.1f} GiB ({per_param} bytes each: weights, gradients, AdamW moments), "
                             f"{where} has {memory_gib:,.1f} GiB; leave it out (--only) or use a smaller model")


def predict(cfg: Config, profile, world: int = 1) -> dict[str, Any]:
    """The simulator's step time (s) and breakdown for ``cfg`` on ``world`` local devices.

    Returns keys ``step``, ``fwd``, ``bwd``, ``rec`` (recomputation), ``opt``, the peak memory per
    device ``mem`` (allocated) and ``reserved`` (GiB, :func:`predicted_peaks`), and ``note`` (why
    there is no prediction, else empty).
    """
    from simulator.answer.api import simulate

    if world > 1 and "local" not in profile.collectives:
        return {"step": None, "note": f"profile {profile.name!r} has no 'local' collectives fit "
                "(run `calibrate --collectives`); no prediction for multi-process runs"}
    try:
        plan = simulate(cfg.spec, f"{world}xlocal", profile=profile, seq_len=cfg.seq_len,
                        global_batch=cfg.micro_batch * cfg.grad_accum * world, steps=1,
                        optimizer="adamw", precision=cfg.precision, attention=cfg.attention,
                        compile=cfg.compile, checkpointing=cfg.checkpointing, sharding="ddp",
                        offload="none", micro_batch=cfg.micro_batch)
    except UsageError as exc:
        return {"step": None, "note": f"simulate: {exc}"}
    b = plan.breakdown_s
    if plan.strategy.get("grad_accum") != cfg.grad_accum:
        return {"step": None, "note": f"simulate chose grad_accum {plan.strategy.get('grad_accum')}"}
    mem, reserved = predicted_peaks(plan, cfg.spec.n_params(), cfg.precision)
    return {"step": plan.step_time_s, "fwd": b["forward"], "bwd": b["backward"], "rec": b["recompute"],
            "opt": b["optimizer"], "mem": mem, "reserved": reserved, "note": "" if plan.feasible
            else "predicted infeasible: " + "; ".join(plan.reasons)}


def predicted_peaks(plan, n_params: float, precision: str) -> tuple[float, float]:
    """(allocated, reserved) peak GiB per device of a validation step: the plan's (``allocated``;
    ``total`` adds the caching allocator's reserve), or the optimizer step of this loop's foreach
    AdamW where that is larger: the states, buffers, every gradient and ``torch._foreach_sqrt``'s
    fp32 copy of the second moments (4 bytes per parameter). The simulator's stacks step with
    fused or per-tensor optimizers, which allocate no such copy."""
    from simulator.physics.memory import state_bytes_per_param

    m = plan.memory_gib
    reserve = m["total"] - m["allocated"]
    grads = state_bytes_per_param(precision, "ddp", "adamw")[1] * n_params
    step = m["weights"] + m["optimizer"] + m["other"] - reserve + (grads + 4.0 * n_params) / GIB
    return max(m["allocated"], step), max(m["total"], step)


# ---------------------------------------------------------------------------- rows and summary
def make_row(cfg: Config, m: Measured, pred: dict[str, Any], world: int, meta: dict[str, Any]) -> dict[str, Any]:
    """One result row (CSV_FIELDS); error_pct = 100 (predicted - measured) / measured, and
    mem_error_pct the same for the allocated peak memory."""
    p = pred.get("step")
    row: dict[str, Any] = {
        "id": cfg.id if world == 1 else f"{cfg.id}-w{world}", "model": cfg.model,
        "params": cfg.spec.n_params(), "n_layers": cfg.spec.n_layers, "hidden": cfg.spec.hidden,
        "seq_len": cfg.seq_len, "micro_batch": cfg.micro_batch, "grad_accum": cfg.grad_accum,
        "world": world, "precision": cfg.precision, "attention": cfg.attention,
        "checkpointing": cfg.checkpointing, "compile": cfg.compile, "status": m.status,
        "reason": "; ".join(x for x in (m.reason, pred.get("note", "")) if x),
        "measured_step_s": m.step_s, "predicted_step_s": p, "error_pct": None, "log_ratio": None,
        "measured_min_s": m.min_s, "spread": m.spread,
        "measured_fwd_s": m.fwd_s, "predicted_fwd_s": pred.get("fwd"),
        "measured_bwd_s": m.bwd_s, "predicted_bwd_s": pred.get("bwd"),
        "measured_rec_s": m.rec_s, "predicted_rec_s": pred.get("rec"),
        "measured_opt_s": m.opt_s, "predicted_opt_s": pred.get("opt"), "compile_s": m.compile_s,
        "measured_mem_gib": m.mem_gib, "predicted_mem_gib": pred.get("mem"), "mem_error_pct": None,
        "measured_reserved_gib": m.reserved_gib, "predicted_reserved_gib": pred.get("reserved"),
        **meta,
    }
    if m.step_s and p:
        row["error_pct"] = 100.0 * (p - m.step_s) / m.step_s
        row["log_ratio"] = math.log(m.step_s / p)
    if m.mem_gib and pred.get("mem"):
        row["mem_error_pct"] = 100.0 * (pred["mem"] - m.mem_gib) / m.mem_gib
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n, MAPE (percent, of the median step), worst absolute error and log(measured/predicted)
    residuals over rows with both times; ``mape_min_pct`` is the same against the fastest timed
    step (a noise check); ``components`` the MAPE per pass (forward, backward, recomputation,
    optimizer) over rows where that pass takes measurable time; ``steady`` the n, MAPE and worst
    error over rows measured while the host ran at no less than ``host_load.SLOW_SHARE`` of its
    calibrated speed (where ``host_speed`` was measured)."""
    done = [r for r in rows if r.get("error_pct") is not None]
    mape = statistics.fmean(abs(r["error_pct"]) for r in done) if done else None
    comps = {}
    for name, (mk, pk) in COMPONENTS.items():
        errs = [100.0 * abs(r[pk] - r[mk]) / r[mk] for r in done
                if r.get(mk) and r.get(pk) is not None and r[mk] > 0.01 * r["measured_step_s"]]
        if errs:
            comps[name] = {"n": len(errs), "mape_pct": statistics.fmean(errs),
                           "signed_pct": statistics.fmean(
                               100.0 * (r[pk] - r[mk]) / r[mk] for r in done
                               if r.get(mk) and r.get(pk) is not None and r[mk] > 0.01 * r["measured_step_s"])}
    mins = [100.0 * abs(r["predicted_step_s"] - r["measured_min_s"]) / r["measured_min_s"]
            for r in done if r.get("measured_min_s")]
    speeds = [(r, _num(r.get("host_speed"))) for r in done]
    steady = [abs(r["error_pct"]) for r, s in speeds if s is not None and s >= host_load.SLOW_SHARE]
    return {"n": len(done), "mape_pct": mape, "mape_min_pct": statistics.fmean(mins) if mins else None,
            "memory": summarize_memory(rows),
            "worst_pct": max((abs(r["error_pct"]) for r in done), default=None), "components": comps,
            "steady": ({"n": len(steady), "mape_pct": statistics.fmean(steady), "worst_pct": max(steady)}
                       if steady and any(s is not None for _, s in speeds) else None),
            "log_ratio_residuals": [r["log_ratio"] for r in done]}


def summarize_memory(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Peak allocated memory, predicted against measured, over rows with both: n, mean absolute
    and mean signed error (percent), the worst under-prediction (most negative error, percent) and
    how many rows are under-predicted by more than 5%; None without such rows (CPU runs)."""
    errs = [e for e in (_num(r.get("mem_error_pct")) for r in rows) if e is not None]
    if not errs:
        return None
    return {"n": len(errs), "mape_pct": statistics.fmean(abs(e) for e in errs),
            "signed_pct": statistics.fmean(errs), "worst_under_pct": min(errs),
            "under_5pct": sum(e < -5.0 for e in errs)}


def _num(v: Any) -> float | None:
    """A number from a row value (CSV rows hold strings), None if empty."""
    try:
        return None if v in (None, "") else float(v)
    except (TypeError, ValueError):
        return None


def _fmt(x: Any, scale: float = 1e3, nd: int = 1) -> str:
    return "—" if x is None else f"{x * scale:.{nd}f}"


def format_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """Plain-text table of predicted vs measured step time (ms), peak allocated memory (GiB, where
    measured) and the MAPEs."""
    w = max([len(r["id"]) for r in rows] + [6])
    lines = [f"{'config':<{w}}  {'pred ms':>9}  {'meas ms':>9}  {'err %':>7}   "
             f"{'fwd p/m':>15}  {'bwd p/m':>15}  {'rec p/m':>15}  {'opt p/m':>13}  {'spread':>6}  {'GiB p/m':>11}"]
    for r in rows:
        err = "—" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        lines.append(
            f"{r['id']:<{w}}  {_fmt(r['predicted_step_s']):>9}  {_fmt(r['measured_step_s']):>9}  {err:>7}   "
            f"{_fmt(r['predicted_fwd_s']):>7}/{_fmt(r['measured_fwd_s']):<7}  "
            f"{_fmt(r['predicted_bwd_s']):>7}/{_fmt(r['measured_bwd_s']):<7}  "
            f"{_fmt(r['predicted_rec_s']):>7}/{_fmt(r['measured_rec_s']):<7}  "
            f"{_fmt(r['predicted_opt_s']):>6}/{_fmt(r['measured_opt_s']):<6}  {_fmt(r['spread'], 1, 2):>6}  "
            f"{_fmt(_num(r.get('predicted_mem_gib')), 1):>5}/{_fmt(_num(r.get('measured_mem_gib')), 1):<5}"
            + (f"  [{r['status']}: {r['reason']}]" if r["reason"] else ""))
    if summary["mape_pct"] is not None:
        lines.append(f"\nmean absolute percentage error over {summary['n']} configurations: "
                     f"{summary['mape_pct']:.1f}% (median step; against the fastest step: "
                     f"{summary['mape_min_pct']:.1f}%); worst {summary['worst_pct']:.1f}%")
        names = {"fwd": "forward", "bwd": "backward", "rec": "recompute", "opt": "optimizer"}
        for name, c in summary.get("components", {}).items():
            lines.append(f"  {names[name]:<10} MAPE {c['mape_pct']:5.1f}%  mean signed error "
                         f"{c['signed_pct']:+6.1f}%  ({c['n']} configurations)")
        mem = summary.get("memory")
        if mem:
            lines.append(f"  peak memory (allocated) MAPE {mem['mape_pct']:.1f}%  mean signed error "
                         f"{mem['signed_pct']:+.1f}%  worst under-prediction {mem['worst_under_pct']:+.1f}%  "
                         f"({mem['under_5pct']} of {mem['n']} configurations under by more than 5%)")
        st = summary.get("steady")
        if st:
            lines.append(f"  with the host at >= {host_load.SLOW_SHARE} of its calibrated speed (host_speed): "
                         f"{st['n']} of {summary['n']} configurations, MAPE {st['mape_pct']:.1f}%, "
                         f"worst {st['worst_pct']:.1f}%")
    else:
        lines.append("\nno configuration has both a prediction and a measurement")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- devices
def check_device(profile, device_name: str | None, memory_gib: float | None = None, where: str = "") -> str | None:
    """UsageError unless ``profile`` describes the device the steps ran on, ``device_name`` (as
    :func:`calibration.device.detect` names it; ``memory_gib`` its memory where known): the same
    processor (:func:`calibration.device.processor`), or the same catalog GPU
    (:func:`simulator.hardware.catalog.profile_is_for`, simulate's rule). A profile predicts its own device:
    another device's steps against it give neither a check of it nor residuals for its interval.
    Returns a warning where the same CPU ran with another thread count (torchrun gives each rank
    one), else None. ``where`` says where the name comes from (a --measured file)."""
    from simulator.hardware.catalog import profile_is_for

    from .device import match_catalog_gpu, processor

    if not device_name:
        raise UsageError(f"{where or 'the measurement'} names no device (column 'device'); cannot tell it was "
                         f"measured on {profile.device.name!r}, the device profile {profile.name!r} describes")
    if device_name == profile.device.name:
        return None
    if processor(device_name) == processor(profile.device.name):
        on = f"the steps in {where} ran as" if where else "the steps run as"
        return f"profile {profile.name!r} measured {profile.device.name!r}, {on} {device_name!r}"
    gpu = match_catalog_gpu(device_name, memory_gib) if profile.device.gpu_id else None
    if gpu is not None and profile_is_for(profile, gpu):
        return None
    on = f"the steps in {where} ran on" if where else "the steps run on"
    raise UsageError(f"profile {profile.name!r} describes {profile.device.name!r}, but {on} {device_name!r}: its "
                     "predictions and residuals are another device's; validate with a profile of that device "
                     "(calibrate on it)")


# ---------------------------------------------------------------------------- files
def merge_csv(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Merge ``rows`` into the CSV at ``path`` by ``id`` (new rows replace same-id rows, others
    are kept) and write it atomically."""
    from simulator.core.atomic import write_text_atomic

    p = Path(path)
    old: list[dict[str, Any]] = []
    cols = list(CSV_FIELDS)
    if p.exists():
        try:
            with p.open(newline="") as fh:
                reader = csv.DictReader(fh)
                old = list(reader)
                cols += [c for c in (reader.fieldnames or []) if c not in cols]
        except (OSError, csv.Error) as exc:
            raise UsageError(f"cannot read existing CSV {str(p)!r} to merge into: {exc}") from None
        if old and "id" not in old[0]:
            raise UsageError(f"{str(p)!r} has no 'id' column; refusing to overwrite it")
    new_ids = {r["id"] for r in rows}
    merged = [r for r in old if r.get("id") not in new_ids] + rows
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    wr.writeheader()
    for r in merged:
        wr.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return write_text_atomic(p, buf.getvalue())


def update_profile(path: str | os.PathLike, summary: dict[str, Any], source: str) -> None:
    """Write the residuals into the profile's ``validation`` field (atomically, validated)."""
    from simulator.hardware.profile import ValidationSummary, load_profile, save_profile

    prof = load_profile(path)
    if not summary["n"]:
        raise UsageError("--update-profile: no configuration has both a prediction and a measurement")
    val = ValidationSummary(source=source, n=summary["n"], mape=summary["mape_pct"],
                            log_ratio_residuals=[float(x) for x in summary["log_ratio_residuals"]])
    save_profile(prof.model_copy(update={"validation": val}), path)


def read_measured(path: str | os.PathLike) -> dict[str, tuple[Measured, dict[str, Any]]]:
    """Measured steps of a ``--csv`` file by config id (single-process rows): the times, the peak
    memory (where measured) and the
    row's own metadata (steps, warm-up, device, date, torch version, load average, other processes'
    CPU use, the host's speed against the calibration)."""
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise UsageError(f"--measured: cannot read {str(p)!r}: {exc}") from None
    if rows and "measured_step_s" not in rows[0]:
        raise UsageError(f"--measured: {str(p)!r} is not a validate CSV (no 'measured_step_s' column)")
    out = {}
    for r in rows:
        if r.get("world", "1") not in ("1", "") or r.get("status") != "ok":
            continue
        m = Measured("ok", "", _num(r.get("measured_step_s")), _num(r.get("measured_fwd_s")),
                     _num(r.get("measured_bwd_s")), _num(r.get("measured_rec_s")), _num(r.get("measured_opt_s")),
                     _num(r.get("compile_s")), _num(r.get("measured_min_s")), _num(r.get("spread")),
                     mem_gib=_num(r.get("measured_mem_gib")), reserved_gib=_num(r.get("measured_reserved_gib")))
        meta = {k: r.get(k) for k in ("steps", "warmup", "rounds", "device", "suite", "date", "torch",
                                      "loadavg_1min", "other_cores", "host_speed")}
        out[r["id"]] = (m, meta)
    return out


def _remeasured(path: Path, configs: list[Config], profile) -> list[dict[str, Any]]:
    """Rows of ``configs`` from the measurements in the ``--csv`` file ``path``, predicted with ``profile``."""
    known = read_measured(path)
    todo = [c for c in configs if c.id in known]
    if not todo:
        raise UsageError(f"--measured {str(path)!r} has no measured row of this suite's configs")
    for name in dict.fromkeys(known[c.id][1]["device"] for c in todo):
        warning = check_device(profile, name, where=f"--measured {str(path)!r}")
        if warning:
            print(f"validate: warning: {warning}", file=sys.stderr)
    rows = []
    for cfg in todo:
        m, meta = known[cfg.id]
        rows.append(make_row(cfg, m, predict(cfg, profile), 1, {**meta, "profile": profile.name}))
    return rows


def draw_coverage(draws: list[list[dict[str, Any]]], level: float = LEVEL) -> list[float | None]:
    """Per draw (the rows of one measurement of a suite), the share of its rows whose
    log(measured/predicted) lies inside the ``level`` interval built from the other draws' residuals
    (:func:`simulator.answer.uncertainty.left_out_coverage`): whether an interval from some draws of the
    host covers another as it claims; None for a draw without residuals or whose others have fewer
    than 3. Empty with fewer than two draws."""
    if len(draws) < 2:
        return []
    return left_out_coverage([[r["log_ratio"] for r in d if r.get("log_ratio") is not None] for d in draws], level)


# ---------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="validate", description=(
        "Run real training steps in torch and compare the measured step time with the "
        "simulator's prediction from a calibration profile."))
    p.add_argument("--profile", required=True, type=Path, help="calibration profile JSON (from `calibrate`)")
    p.add_argument("--suite", type=Path, default=None,
                   help=f"suite YAML/JSON (default: {DEFAULT_SUITE.relative_to(DEFAULT_SUITE.parents[2])} on a CPU, "
                        f"{GPU_DEFAULT_SUITE.relative_to(GPU_DEFAULT_SUITE.parents[2])} on CUDA)")
    p.add_argument("--only", help="comma-separated config ids (or substrings) to run")
    p.add_argument("--steps", type=int, help="timed steps per config (default: the suite's)")
    p.add_argument("--warmup", type=int, help="warm-up steps per config after its first, which creates the "
                   "optimizer's state (default: the suite's)")
    p.add_argument("--rounds", type=int, help="passes over the suite, each config built again and its timed steps "
                   f"split over them (default: the suite's, else {host_load.CPU_ROUNDS} on a CPU, whose shared host "
                   "changes speed for minutes at a time, and 1 on a GPU)")
    p.add_argument("--min-round-s", type=float, default=None,
                   help=f"time each config's steps for at least this many seconds per round, up to "
                        f"{MAX_ROUND_STEPS} steps (default: the suite's, else {MIN_ROUND_S}; 0: exactly --steps)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--nproc", type=int, default=None,
                   help="relaunch under `torchrun --nproc-per-node N` (DDP; predicted as Nxlocal)")
    p.add_argument("--allocator", choices=ALLOCATORS, default=None,
                   help="CPU: how the C allocator treats freed memory (calibration/host_alloc.py; default: "
                        "the setting the profile was measured with)")
    p.add_argument("--json", action="store_true", help="print rows and summary as JSON")
    p.add_argument("--csv", type=Path, help="merge rows into this CSV by config id (atomic write)")
    p.add_argument("--update-profile", action="store_true",
                   help=f"store the residuals in the profile's 'validation' field ({100 * LEVEL:.0f}%% intervals)")
    p.add_argument("--no-compile", action="store_true", help="skip configs that use torch.compile")
    p.add_argument("--measured", type=Path, nargs="+", default=None, metavar="CSV",
                   help="re-predict the measured steps of earlier `--csv` files of this suite with --profile "
                        "instead of running them (to compare two calibrations on the same measurements); "
                        "several files are several draws of the host, pooled (with --update-profile, the "
                        "interval's residuals) and checked against each other (leave-one-draw-out coverage)")
    return p


def _relaunch(argv: list[str], nproc: int) -> int:
    """Run this command again under torchrun with ``nproc`` processes."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "calibration.validate", *rest]
    return subprocess.call(cmd)


def run(a: argparse.Namespace, argv: list[str], relaunch: bool = False) -> int:
    """Validation itself (after argument parsing); returns the exit status."""
    from simulator.hardware.profile import load_profile

    if a.nproc is not None and a.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {a.nproc}")
    profile = load_profile(a.profile)
    # fail before the suite runs (or torchrun starts), not after
    if a.update_profile:
        check_writable(a.profile, "--update-profile: profile")
    if a.csv:
        check_writable(a.csv, "--csv")
    cuda = str(a.device or "").startswith("cuda") or (not a.device and _cuda_available())
    if relaunch and not cuda and a.measured is None:  # before torchrun, whose workers inherit the setting
        host_alloc.relaunch_for(a.allocator or host_alloc.recorded(profile.provenance))
    if a.nproc and a.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if a.measured is None:  # another device's profile: one line here, not one per torchrun worker
            from .device import detect

            ctx = detect(a.device)
            check_device(profile, ctx.name, ctx.memory_gib if ctx.kind == "cuda" else None)
        return _relaunch(argv, a.nproc)
    suite = load_suite(a.suite or (GPU_DEFAULT_SUITE if cuda else DEFAULT_SUITE))
    configs = suite.configs
    if a.only:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        configs = [c for c in configs if any(k == c.id or k in c.id for k in keys)]
        if not configs:
            raise UsageError(f"--only {a.only!r} matches no config of suite {suite.name!r}")
    if a.no_compile:
        configs = [c for c in configs if not c.compile]
    warmup = suite.warmup if a.warmup is None else a.warmup
    steps = suite.steps if a.steps is None else a.steps
    for flag, n in (("--warmup", warmup), ("--steps", steps)):
        if not 1 <= n <= MAX_STEPS:
            raise UsageError(f"{flag} must be from 1 to {MAX_STEPS} steps per config and round, got {n:,}")
    host_load.check_rounds(a.rounds)
    min_round_s = suite.min_round_s if a.min_round_s is None else a.min_round_s
    check_min_round_s(min_round_s)
    if a.measured is not None:
        if a.nproc and a.nproc > 1:
            raise UsageError("--measured re-predicts single-process rows; drop --nproc")
        twice = sorted({str(p) for p in a.measured if sum(q.resolve() == p.resolve() for q in a.measured) > 1})
        if twice:
            raise UsageError(f"--measured names {twice[0]!r} more than once: each file is one draw of the host; "
                             "pass each once")
        if a.csv and len(a.measured) > 1:
            raise UsageError(f"--csv takes the rows of one --measured file, got {len(a.measured)} (the draws "
                             "share config ids); drop --csv or pass one file")
        draws = [_remeasured(path, configs, profile) for path in a.measured]
        rows = [r for d in draws for r in d]
        return _report(a, rows, suite.name, rows[0]["device"], profile.name, 1, rows[0]["date"],
                       draws=draws if len(draws) > 1 else None)
    try:
        import torch
    except ImportError:
        print("validate: error: torch is required: pip install 'pretrain-simulator[calibration]'",
              file=sys.stderr)
        return 1
    dist = init_dist(a.device)
    try:
        from .device import detect

        ctx = detect(str(dist.device) if dist.device.type == "cuda" else "cpu")
        dev_name = ctx.name
        warning = check_device(profile, dev_name, ctx.memory_gib if ctx.kind == "cuda" else None)
        if warning and dist.is_main:
            print(f"validate: warning: {warning}", file=sys.stderr)
        check_fits_memory(configs, ctx.memory_gib, "this GPU" if ctx.kind == "cuda" else "this host's RAM")
        date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        rounds = a.rounds or suite.rounds or host_load.default_rounds(dist.device.type)
        meta = {"warmup": warmup, "rounds": rounds, "device": dev_name, "profile": profile.name,
                "suite": suite.name, "date": date, "torch": torch.__version__}
        if dist.device.type == "cpu":
            from .benches.stepops import prime_host_allocator

            meta["host_allocator"] = host_alloc.active()
            if dist.is_main and meta["host_allocator"] != host_alloc.recorded(profile.provenance):
                print(f"validate: warning: measuring with the {meta['host_allocator']!r} host allocator, profile "
                      f"{profile.name!r} was calibrated with {host_alloc.recorded(profile.provenance)!r}: "
                      "page-fault costs differ (calibration/host_alloc.py)", file=sys.stderr)
            prime_host_allocator()  # the allocator state calibration's fresh-page fit assumed
        got: dict[str, list[Measured]] = {cfg.id: [] for cfg in configs}
        seen: dict[str, dict[str, list[float]]] = {cfg.id: {"load": [], "other": [], "speed": []} for cfg in configs}
        for r, n_steps in enumerate(round_steps(steps, rounds)):
            for i, cfg in enumerate(configs):
                if got[cfg.id] and got[cfg.id][-1].status != "ok":
                    continue  # failed or skipped in an earlier round
                if dist.is_main and not a.json:
                    where = f"round {r + 1}/{rounds} " if rounds > 1 else ""
                    print(f"[{where}{i + 1}/{len(configs)}] {cfg.id} ...", file=sys.stderr, flush=True)
                if hasattr(os, "getloadavg"):
                    seen[cfg.id]["load"].append(round(os.getloadavg()[0], 2))
                cpu = dist.device.type == "cpu" and dist.is_main  # one probe: ranks probing at once would slow each other
                speed0 = host_load.host_speed(profile) if cpu else None
                before = host_load.sample()
                got[cfg.id].append(measure(cfg, dist, warmup, n_steps, min_s=min_round_s))
                other = host_load.other_cores(before, host_load.sample())
                speed1 = host_load.host_speed(profile) if cpu else None
                if other is not None:
                    seen[cfg.id]["other"].append(other)
                if speed0 is not None and speed1 is not None:
                    seen[cfg.id]["speed"].append(min(speed0, speed1))
        rows = []
        for cfg in configs:
            m, s = merge_measured(got[cfg.id]), seen[cfg.id]
            pred = predict(cfg, profile, dist.world)
            rows.append(make_row(cfg, m, pred, dist.world, {
                **meta, "steps": len(m.samples) or steps, "rounds": m.rounds, "loadavg_1min": max(s["load"], default=None),
                "other_cores": max(s["other"], default=None),
                "host_speed": round(min(s["speed"]), 2) if s["speed"] else None}))
        busy = [r["other_cores"] for r in rows if host_load.is_busy(r["other_cores"])]
        if dist.is_main and busy and dist.device.type == "cpu":
            print(f"validate: warning: machine was busy (other processes used up to {max(busy):.2f} of "
                  f"{os.cpu_count()} cores) during {len(busy)} configs; CPU step times are inflated "
                  "and noisy (see the spread column)", file=sys.stderr)
        slow = [r["host_speed"] for r in rows if r["host_speed"] is not None and r["host_speed"] < host_load.SLOW_SHARE]
        if dist.is_main and slow:
            print(f"validate: warning: the host ran at down to {min(slow):.2f} of its calibrated speed (a probe GEMM and copy "
                  f"before and after each config) during {len(slow)} configs; other guests share this machine, "
                  "so those step times are slower than the profile describes (see the host_speed column)",
                  file=sys.stderr)
        if not dist.is_main:
            return 0
        return _report(a, rows, suite.name, dev_name, profile.name, dist.world, date)
    finally:
        if dist.initialized:
            import torch.distributed as tdist

            tdist.destroy_process_group()


def _report(a: argparse.Namespace, rows: list[dict[str, Any]], suite: str, dev_name: str, profile: str,
            world: int, date: str, draws: list[list[dict[str, Any]]] | None = None) -> int:
    """Print the rows and summary (table or JSON), merge them into ``--csv`` and store the
    residuals with ``--update-profile``; with ``draws`` (several measurements of the suite, pooled
    in ``rows``) also each draw's MAPE and its leave-one-draw-out interval coverage
    (:func:`draw_coverage`); returns the exit status."""
    summary = summarize(rows)
    if draws:
        each = [summarize(d) for d in draws]
        summary["draws"] = [{"n": e["n"], "mape_pct": e["mape_pct"], "coverage": c}
                            for e, c in zip(each, draw_coverage(draws), strict=True)]
    if a.json:
        print(json.dumps({"suite": suite, "device": dev_name, "profile": profile, "world": world, "date": date,
                          "rows": rows, **summary}, indent=2))
    else:
        print(format_table(rows, summary))
        if draws:
            print(f"pooled over {len(draws)} draws; each draw's MAPE and the share of its rows inside the "
                  f"{100 * LEVEL:.0f}% interval from the other draws' residuals: " + ", ".join(
                      ("—" if d["mape_pct"] is None else f"{d['mape_pct']:.1f}%") + " / "
                      + ("—" if d["coverage"] is None else f"{100 * d['coverage']:.0f}%")
                      for d in summary["draws"]))
    if a.csv:
        merge_csv(a.csv, rows)
        if not a.json:
            print(f"merged {len(rows)} rows into {a.csv}")
    if a.update_profile:
        source = (f"validate {suite} on {dev_name} {str(date)[:10]}"
                  + (f", {len(draws)} draws pooled ({', '.join(sorted({str(d[0]['date'])[:16] for d in draws}))})"
                     if draws else ""))
        update_profile(a.profile, summary, source)
        if not a.json:
            print(f"wrote validation ({summary['n']} residuals, MAPE {summary['mape_pct']:.1f}%) into {a.profile}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``validate`` console script; returns the exit status."""
    from_cli = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("validate", lambda: run(build_parser().parse_args(argv), argv, relaunch=from_cli))


if __name__ == "__main__":
    sys.exit(main())
