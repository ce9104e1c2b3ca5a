"""Validation suites: read a YAML/JSON suite of configurations and check every value in it.

A suite (``calibration/suites/*.yaml``) names models (presets or ModelSpec overrides), the shape of
each configuration's step (sequence length, micro-batch, gradient accumulation) and its execution
knobs (precision, attention, checkpointing, ``torch.compile``), plus the timing settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simulator.core.errors import UsageError
from simulator.core.vocab import FP8, PRECISIONS
from simulator.model.presets import get_model
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import CHECKPOINTINGS as CHECKPOINTING

from .. import host_load

SUITE_DIR = Path(__file__).resolve().parents[1] / "suites"
DEFAULT_SUITE = SUITE_DIR / "cpu_default.yaml"
GPU_DEFAULT_SUITE = SUITE_DIR / "gpu_default.yaml"
#: the precisions a suite may measure: plain PyTorch training steps (autocast), so not fp8
MEASURED_PRECISIONS = tuple(p for p in PRECISIONS if p != FP8)
#: timed seconds per round at least (suite ``min_round_s``, ``--min-round-s``): steps of a few
#: milliseconds are timed dozens of times, as a shared host's speed moves by 20-50% for seconds at a
#: time (a 2-core Zen 4 guest, 2026-12-03: 1-2 steps per round of 10-100 ms configs spread 1.5-2.3x)
MIN_ROUND_S = 0.5


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
    each round times steps for at least ``min_round_s`` seconds, :func:`calibration.validate.measuring.timed_steps`)."""

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



def check_min_round_s(value: Any, what: str = "--min-round-s") -> None:
    """Usage error unless ``value`` is a finite number of seconds in [0, 60]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 60:
        raise UsageError(f"{what} must be a number of seconds from 0 to 60, got {value!r}")

