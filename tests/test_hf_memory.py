"""The hf-trainer stack's peak allocated memory against Hugging Face training steps traced by
PyTorch itself (``calibration/hf_memory_trace.py``: transformers 5.17 models from their published
configs, two AdamW steps under CUDA's autocast policy, every tensor's allocation and release
counted by ``torch.distributed._tools.mem_tracker.MemTracker`` on fake tensors; the rows in
``calibration/results/hf_memory_trace.csv``). Peaks are never under-promised by more than 5%,
and the mean error stays within 8%: the issue-35 bar for real steps on an H200."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.answer.api import simulate
from simulator.model.hf_config import model_from_hf_config

TRACE = Path(__file__).resolve().parent.parent / "calibration" / "results" / "hf_memory_trace.csv"
GIB = 1024**3
#: The bars (issue 35): no step under-predicted by more than 5%, mean |error| at most 8%; and no
#: step over-predicted by more than 15% (a plan refused that would have run).
UNDER, MEAN, OVER = -0.05, 0.08, 0.15


def _rows() -> list[dict[str, str]]:
    with TRACE.open() as fh:
        return list(csv.DictReader(fh))


def _predicted_gib(row: dict[str, str]) -> float:
    """The simulator's allocated peak (GiB) of the traced step: one GPU, one micro-batch, DDP
    (no sharding), AdamW, the row's precision, attention and checkpointing, uncompiled."""
    cfg = json.loads(row["config"])
    spec = model_from_hf_config(cfg, name=row["model"])
    vision = cfg["model_type"] in ("vit", "convnext")
    seq = (getattr(spec, "fixed_seq_len", None) or spec.default_seq_len) if vision else int(row["side"])
    mb = int(row["micro_batch"])
    plan = simulate(spec, "1xh200", seq_len=seq, global_batch=mb, micro_batch=mb, steps=1, optimizer="adamw",
                    precision=row["precision"], attention=row["attention"], compile=False,
                    checkpointing=row["checkpointing"], sharding="ddp", offload="none", stack="hf-trainer")
    return plan.memory_gib["allocated"]


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    out = {}
    for r in _rows():
        key = f"{r['model']} s{r['side']} mb{r['micro_batch']} {r['precision']} {r['attention']} {r['checkpointing']}"
        traced = int(r["peak_bytes"]) / GIB
        out[key] = _predicted_gib(r) / traced - 1.0
    return out


def test_trace_covers_the_kinds_of_steps():
    """GPT-2 (Conv1D, gelu_new, dropout), GPT-NeoX, Llama/Qwen (RMSNorm, rotary, SwiGLU, tied
    embeddings), ViT and ConvNeXt; bf16, fp16, tf32, fp32; SDPA and eager; full checkpointing."""
    rows = _rows()
    kinds = {json.loads(r["config"])["model_type"] for r in rows}
    assert {"gpt2", "gpt_neox", "llama", "qwen2", "vit", "convnext"} <= kinds
    assert {r["precision"] for r in rows} == {"bf16", "fp16", "tf32", "fp32"}
    assert {r["attention"] for r in rows} >= {"sdpa", "eager"} and {r["checkpointing"] for r in rows} == {"none", "full"}


def test_peak_never_under_promised(errors):
    under = {k: f"{e:+.1%}" for k, e in errors.items() if e < UNDER}
    assert not under, f"allocated peak under-predicted by more than {-UNDER:.0%}: {under}"


def test_peak_not_far_over(errors):
    over = {k: f"{e:+.1%}" for k, e in errors.items() if e > OVER}
    assert not over, f"allocated peak over-predicted by more than {OVER:.0%}: {over}"


def test_mean_error(errors):
    mean = float(np.mean(np.abs(list(errors.values()))))
    assert mean <= MEAN, f"mean |error| {mean:.1%} over {len(errors)} traced steps"
