"""Host time per kernel of eager passes under autocast: calibrated apart from fp32 (autocast casts
each linear layer's inputs and dispatches every op through its own key), used for bf16/fp16 steps
only, and fitted from the ``dispatch/.../<half>`` benches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration.build import build_profile
from calibration.device import detect
from tests.test_calibration_generalizes import _cpu_profile, _step

MEAS = Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-intel-xeon.measurements.json"


def test_autocast_overhead_moves_only_mixed_precision_eager_steps():
    base = _cpu_profile(train_fwd_kernel_us=20.0, train_bwd_kernel_us=10.0)
    amp = _cpu_profile(train_fwd_kernel_us=20.0, train_bwd_kernel_us=10.0,
                       train_fwd_kernel_us_amp=40.0, train_bwd_kernel_us_amp=20.0)
    kw = {"model": "pythia-14m", "seq_len": 64, "micro_batch": 1, "global_batch": 1}
    assert _step(amp, **kw).step_time_s == pytest.approx(_step(base, **kw).step_time_s)  # fp32
    assert _step(amp, precision="bf16", **kw).step_time_s > _step(base, precision="bf16", **kw).step_time_s
    assert _step(amp, precision="bf16", compile=True, **kw).step_time_s == pytest.approx(
        _step(base, precision="bf16", compile=True, **kw).step_time_s)


def test_fit_takes_the_autocast_benches_apart():
    """The Intel fp32 dispatch benches plus bf16 copies taking 1.5x as long: the autocast values
    come out above the fp32 ones, which stay as they were."""
    results = {k: v for k, v in json.loads(MEAS.read_text())["results"].items()}
    dev = detect("cpu")
    before = build_profile(dev, results, "test").profile
    assert before.train_fwd_kernel_us_amp is None
    for key, rec in list(results.items()):
        if key.startswith("dispatch/") and rec.get("status") == "ok":
            results[f"{key}/bf16"] = {**rec, "precision": "bf16", "fwd_s": 1.5 * rec["fwd_s"],
                                      "bwd_s": 1.5 * rec["bwd_s"]}
    after = build_profile(dev, results, "test").profile
    assert after.train_fwd_kernel_us == pytest.approx(before.train_fwd_kernel_us)
    assert after.train_fwd_kernel_us_amp > after.train_fwd_kernel_us
    assert after.train_bwd_kernel_us_amp > after.train_bwd_kernel_us


def test_dispatch_bench_runs_under_autocast():
    """The real bench, once in bf16: an ok record carrying its precision and both pass times."""
    from calibration.benches.base import RunContext, Settings
    from calibration.benches.dispatch import plan

    ctx = RunContext(detect("cpu"), Settings(mode="tiny", budget_s=0.01, max_call_s=1.0, min_runs=2, compile=False))
    bench = next(b for b in plan(ctx) if b.key == "dispatch/llama-sdpa/L1/bf16")
    rec = bench.run(ctx)
    assert rec["status"] == "ok" and rec["precision"] == "bf16"
    assert rec["fwd_s"] > 0 and rec["bwd_s"] > 0
