"""The hf-trainer stack's peak allocated memory against Hugging Face training steps traced by
PyTorch itself (``calibration/hf_memory_trace.py``: transformers 5.17 models from their published
configs, two AdamW steps under CUDA's autocast policy, every tensor's allocation and release
counted by ``torch.distributed._tools.mem_tracker.MemTracker`` on fake tensors; the rows in
``calibration/results/hf_memory_trace.csv``). Peaks are never under-promised by more than 5%,
and the mean error stays within 8%: the issue-35 bar for real steps on an H200. The same bar holds
the plan's total (allocated plus the stack's reserve) to the least device memory each step runs in
under the CUDA caching allocator (``calibration/allocator_replay.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration import allocator_fit

GIB = 1024**3
#: The bars (issue 35): no step under-predicted by more than 5%, mean |error| at most 8%; and no
#: step over-predicted by more than 15% (a plan refused that would have run).
UNDER, MEAN, OVER = -0.05, 0.08, 0.15


def _rows() -> list[dict[str, str]]:
    return allocator_fit.rows()


def _key(r: dict[str, str]) -> str:
    return f"{r['model']} s{r['side']} mb{r['micro_batch']} {r['precision']} {r['attention']} {r['checkpointing']}"


@pytest.fixture(scope="module")
def plans() -> dict[str, tuple[dict[str, float], dict[str, str]]]:
    return {_key(r): (allocator_fit.plan_memory(r), r) for r in _rows()}


@pytest.fixture(scope="module")
def errors(plans) -> dict[str, float]:
    """The allocated peak (torch.cuda.max_memory_allocated's counterpart) against the traced one."""
    return {k: m["allocated"] / (int(r["peak_bytes"]) / GIB) - 1.0 for k, (m, r) in plans.items()}


@pytest.fixture(scope="module")
def reserve_errors(plans) -> dict[str, float]:
    """The plan's total (what feasibility checks) against the least device memory the step runs in
    under the CUDA caching allocator (calibration/allocator_replay.py)."""
    return {k: m["total"] / (int(r["allocator_device_bytes"]) / GIB) - 1.0 for k, (m, r) in plans.items()}


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


def test_total_covers_the_allocators_reserve(reserve_errors):
    """Feasibility's number, allocated plus the stack's reserve (fitted by calibration/allocator_fit.py),
    never under-states the device memory a traced step runs in by more than 5%, 8% on average."""
    under = {k: f"{e:+.1%}" for k, e in reserve_errors.items() if e < UNDER}
    mean = float(np.mean(np.abs(list(reserve_errors.values()))))
    assert not under and mean <= MEAN, f"mean |error| {mean:.1%}; under-stated: {under}"


# --- compiled steps: what torch.compile keeps for backward ------------------------------------
COMPILED = allocator_fit.TRACE.parent / "hf_compiled_saved.csv"


def _csv_rows(path) -> list[dict[str, str]]:
    import csv

    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("row", [pytest.param(r, id=f"{r['model']}-{r['precision']}-{r['attention']}")
                                 for r in _csv_rows(COMPILED)])
def test_compiled_saved_set(row):
    """The simulator's compiled activations, logits and autocast weight copies against the saved
    set Inductor's partitioner chooses for the same step (calibration/hf_compiled_saved.py,
    simulator/model/hf_compiled.py): not under by more than 5%, not over by more than 15%. The
    zero-filled gradients of the outputs (the KV cache's K and V, the logits) are held beside the
    saved set but are not in it: left out here, held to real compiled steps below."""
    from simulator.model import hf_compiled, workload
    from simulator.model.hf_config import model_from_hf_config
    from simulator.physics import memory
    from simulator.strategy.stacks import get_stack

    spec = model_from_hf_config(json.loads(row["config"]), name=row["model"])
    seq, mb, p, stack = int(row["side"]), np.array([float(row["micro_batch"])]), row["precision"], get_stack("hf-trainer")
    held, rebuilt = memory.activation_terms(spec, seq, mb, p, row["attention"], "none", True, stack)
    held = held - spec.n_layers * seq * mb * hf_compiled.cache_tangent_bytes_per_token(spec, p)  # not saved
    # what the compiled loss saves of its peak (Stack.loss_bytes_per_logit, 3e): the half logits
    # (Inductor decomposes log_softmax and recomputes it in backward), not their gradient nor the
    # returned logits' zero-filled one (e bytes a logit each, no saved tensor)
    e = workload.act_bytes(p)
    logits = workload.logits_elements(spec, seq, mb) * (stack.loss_bytes_per_logit(e, True) - 2 * e)
    copies = memory.autocast_weight_copies(float(spec.n_params()), np.array(memory.autocast_fp32_params(p, "ddp", stack)),
                                           np.array(0.0), 0.0)
    counted = float((held + rebuilt + logits)[0] + copies)
    error = counted / int(row["saved_bytes"]) - 1.0
    assert UNDER <= error <= OVER, f"{row['model']} {p}: counted {counted / GIB:.2f} GiB, {error:+.1%}"


PEAK = allocator_fit.TRACE.parent / "hf_compiled_peak.csv"


@pytest.mark.parametrize("row", [pytest.param(r, id=f"{r['model']}-{r['precision']}") for r in _csv_rows(PEAK)])
def test_compiled_step_peak(row):
    """A compiled hf-trainer plan's allocated peak above its states (weights and AdamW's moments:
    gradients, activations, loss buffers, autocast's weight copies) against real Inductor-compiled
    Hugging Face steps run on the CPU (calibration/hf_compiled_peak.py: the allocator's own
    events): not under by more than 5%, not over by more than 15%. Without the zero-filled
    gradients of the returned logits and KV cache (Stack.returns_outputs,
    hf_compiled.cache_tangent_bytes_per_token) Pythia-410M in fp32 read 8% under."""
    from simulator.answer.api import simulate
    from simulator.model.hf_config import model_from_hf_config

    spec = model_from_hf_config(json.loads(row["config"]), name=row["model"])
    mb = int(row["micro_batch"])
    plan = simulate(spec, "1xh200", seq_len=int(row["side"]), global_batch=mb, micro_batch=mb, steps=1,
                    optimizer="adamw", precision=row["precision"], attention=row["attention"], compile=True,
                    checkpointing="none", sharding="ddp", offload="none", stack="hf-trainer")
    m = plan.memory_gib
    assert m["weights"] + m["optimizer"] == pytest.approx(int(row["states_bytes"]) / GIB, rel=1e-3)
    error = (m["allocated"] - m["weights"] - m["optimizer"]) / (int(row["peak_above_states_bytes"]) / GIB) - 1.0
    assert UNDER <= error <= OVER, f"{row['model']} {row['precision']}: {error:+.1%}"


def test_the_stacks_reserve_is_the_fit(plans):
    """hf-trainer's fragmentation and loss_fragmentation are what calibration/allocator_fit.py
    fits to the committed trace (stacks.yaml cannot drift from its source)."""
    from simulator.strategy.stacks import get_stack

    m, device = zip(*[(m, int(r["allocator_device_bytes"]) / GIB) for m, r in plans.values()], strict=True)
    fitted = allocator_fit.fit(*(np.array([x[k] for x in m]) for k in ("allocated", "activations", "logits")),
                               np.array(device))
    stack = get_stack("hf-trainer")
    assert fitted == pytest.approx((stack.fragmentation, stack.loss_fragmentation))


@pytest.mark.parametrize("tool", ["hf_memory_trace", "hf_compiled_saved", "hf_compiled_peak"])
def test_tracers_refuse_bad_input_in_one_line(tool, monkeypatch, capsys):
    """An unknown model name, or transformers missing (an extra, not a dependency): one line, exit 2."""
    import importlib
    import sys

    main = importlib.import_module(f"calibration.{tool}").main
    assert main(["no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no-such-model" in err and "valid: pythia-160m" in err and len(err.splitlines()) == 1
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    assert main(["pythia-160m"]) == 2
    err = capsys.readouterr().err.strip()
    assert 'pip install -e ".[trace]"' in err and len(err.splitlines()) == 1
