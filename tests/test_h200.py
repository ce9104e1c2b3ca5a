"""One NVIDIA H200 measured by the project (2026-12-04; calibration/results/h200/README.md):
its quick calibration refits on any machine, and the profile fitted from it holds to timings
taken at the shapes of real training steps."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibration import cli  # noqa: E402
from calibration.device import from_description  # noqa: E402
from calibration.store import measurements_path  # noqa: E402
from simulator.core.errors import UsageError  # noqa: E402
from simulator.hardware.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "calibration" / "results" / "h200"


@pytest.fixture(scope="module")
def refitted(tmp_path_factory):
    """The H200's quick-calibration measurements refitted here (a CPU machine): (rc, profile path, stdout)."""
    out = tmp_path_factory.mktemp("h200") / "nvidia-h200.json"
    shutil.copy(DATA / "calibrate_quick_measurements.json", measurements_path(out))
    rc = cli.main(["--refit", "--out", str(out), "--no-progress"])
    return rc, out


def test_refit_of_another_devices_measurements_keeps_that_device(refitted):
    rc, out = refitted
    assert rc == 0
    prof = load_profile(out)
    assert prof.device.kind == "cuda" and prof.device.name == "NVIDIA H200" and prof.device.gpu_id == "h200"
    assert prof.provenance.torch == "2.11.0+cu130" and prof.provenance.cuda == "13.0"
    assert prof.provenance.host != socket.gethostname()  # not this machine
    assert 130 < prof.device.memory_gib < 145  # the catalog's H200 (the file predates recorded memory)
    assert json.loads(measurements_path(out).read_text())["device"]["name"] == "NVIDIA H200"


def test_device_description_without_memory_is_refused_for_a_cpu():
    with pytest.raises(UsageError, match="memory"):
        from_description({"kind": "cpu", "name": "Some CPU (4 threads)"})
    with pytest.raises(UsageError, match="kind"):
        from_description({"kind": "tpu", "name": "x"})


def test_refit_bounds_e_max_by_the_best_gemm_measured_and_says_so(refitted):
    """The quick grid's best bf16 GEMM ran at 662 TFLOP/s (0.67 of the 989 peak); before the bound the
    fit put e_max at the peak itself. Now it stays within E_MAX_MARGIN of that point, and the profile
    carries the warning calibrate printed."""
    from calibration.fit import E_MAX_MARGIN

    _, out = refitted
    prof = load_profile(out)
    g = prof.gemm["bf16"]
    assert g.e_max <= (1 + E_MAX_MARGIN) * 662.2 / 989.0 + 1e-3
    assert any(w.startswith("gemm bf16: e_max at its bound") for w in prof.fit_warnings)
    assert any("attention mem_efficient_fwd" in w for w in prof.fit_warnings)


# --- the committed H200 profile against timings at the shapes of real training steps -------------------

PROFILE = ROOT / "calibration" / "profiles" / "nvidia-h200.json"
#: isolated calls (one CUDA-event pair around each, synchronized) carry ~25 us of host launch latency
#: that back-to-back training kernels hide (a 1024^3 bf16 GEMM reads 66 TFLOP/s that way): only calls of
#: at least this many seconds are compared
MIN_CALL_S = 2e-4
#: median |predicted / measured - 1| the profile must hold at real layer shapes, per precision and layout
GEMM_TOLERANCE = 0.15


def _rows(group: str) -> list[dict]:
    import csv

    with open(DATA / "microbench_shapes.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["group"] == group and float(r["time_s"]) >= MIN_CALL_S]


def _gemm_errors(profile: Path = PROFILE) -> dict[tuple[str, str], list[float]]:
    """(precision, layout) -> predicted/measured - 1 of each GEMM of microbench_shapes.csv, with the
    simulator's own per-layout GEMM times (forward (m,n,k); input gradient (m,k,n); weight gradient (n,k,m))
    under ``profile``."""
    import numpy as np

    from simulator.hardware.device import device_from_profile
    from simulator.model.workload import Gemm
    from simulator.physics.compute import gemm_pass_times

    dev = device_from_profile(load_profile(profile))
    out: dict[tuple[str, str], list[float]] = {}
    for r in _rows("gemm"):
        m, k, n = int(r["m"]), int(r["k"]), int(r["n"])
        times = gemm_pass_times([Gemm("g", np.array([float(m)]), float(n), float(k), 1)], dev, r["precision"])
        pred = float(times[("fwd", "dgrad", "wgrad").index(r["layout"])][0, 0])
        out.setdefault((r["precision"], r["layout"]), []).append(pred / float(r["time_s"]) - 1.0)
    return out


def test_h200_profile_predicts_real_layer_gemms():
    """bf16 and tf32 in the three layouts, fp32 and fp16 forward: 32-56 shapes each (hidden 768-4096,
    4k and 16k tokens, LM heads to 152k). Measured with the quick grid's e_max bound (before it, bf16's
    median error was 27-32%, optimistic); now 3-4% bf16, 2% fp32, 7-13% tf32, 11% fp16."""
    import statistics

    errs = _gemm_errors()
    assert {("bf16", lay) for lay in ("fwd", "dgrad", "wgrad")} <= set(errs)
    assert {("tf32", lay) for lay in ("fwd", "dgrad", "wgrad")} <= set(errs) and ("fp32", "fwd") in errs
    for key, e in errs.items():
        assert len(e) >= 30, key
        assert statistics.median(abs(x) for x in e) <= GEMM_TOLERANCE, (key, statistics.median(abs(x) for x in e))


@pytest.mark.xfail(strict=True, reason=(
    "the catalog h200 profile's bf16/fp16 GEMMs are the published MAMF rates scaled by the H100 runs' "
    "end-to-end tensor_sustained fit (0.75), not the H200's own real-shape timings: median +23% to +26% slow "
    "at the 32-34 shapes of microbench_shapes.csv (tf32 and fp32, which keep microbenchmark rates: -13% to "
    "0%). On the profiled Pythia-160M step (prof_p160m_sdpa_s2048_mb8.txt) its GEMMs read 25.1 ms against "
    "16.8 ms of aten::mm/addmm, and the LM head 7.6 ms against 4.8, while the rest of Hugging Face's "
    "eager work (copies, cat, norms, loss) reads 22 ms against about 36: the step total is within 7% only "
    "because the two cancel; dropping the factor needs that eager work counted first"))
def test_catalog_h200_profile_predicts_real_layer_gemms():
    """The catalog h200 profile (what `simulate --gpus 8xh200` uses) at the same real layer shapes and
    tolerance as the calibrated profile: a known gap until its bf16 GEMMs stop borrowing the H100 fit."""
    import statistics

    for key, e in _gemm_errors(ROOT / "hardware_catalog" / "profiles" / "h200.json").items():
        assert statistics.median(abs(x) for x in e) <= GEMM_TOLERANCE, (key, statistics.median(abs(x) for x in e))


def _attention_errors(profile, kernel: str = "flash") -> list[float]:
    """predicted/measured - 1 of each SDPA call of microbench_shapes.csv (causal bf16, forward and
    forward+backward) with ``profile``'s fused-attention rates of ``kernel``."""
    from simulator.hardware.device import device_from_profile
    from simulator.physics.compute import fused_attention_rate

    dev = device_from_profile(profile)
    errs = []
    for r in _rows("attention"):
        peak, e_f, e_b = fused_attention_rate(dev, "bf16", int(r["d"]), int(r["s"]), True, kernel)
        fwd = float(r["flops"]) / (1.0 if r["name"] == "sdpa_fwd" else 3.5)  # the script's causal FLOPs
        pred = fwd / (peak * e_f) + (2.5 * fwd / (peak * e_b) if r["name"] == "sdpa_fwd_bwd" else 0.0)
        errs.append(pred / float(r["time_s"]) - 1.0)
    return errs


@pytest.mark.xfail(strict=True, reason="the 2026-12-04 quick run timed SDPA forced onto FlashAttention-2 (298 "
                   "TFLOP/s at 4 x 16 heads x 4k x 128) where SDPA's default picks cuDNN's sm90 kernel (550 at that "
                   "shape): its fit is 0-160% pessimistic; calibrate now times the default fused kernels and larger "
                   "shapes, and needs a GPU run to refit")
def test_h200_profile_predicts_real_attention():
    import statistics

    errs = _attention_errors(load_profile(PROFILE))
    assert len(errs) >= 20 and statistics.median(abs(x) for x in errs) <= 0.25


def test_catalog_hopper_cudnn_attention_is_the_measured_kernel_and_no_fit_moves_it():
    """The catalog H200's and H100's cuDNN attention (what torch SDPA runs on sm90: the hf-trainer and
    megatron-lm stacks) is fitted to the 30 SDPA calls at training shapes; the FlashAttention-2 figures
    (the flash-attn package: llm-foundry) stay the chart's times the runs' attention_scale, 2.4x slower
    there. An end-to-end fit moves neither the measured kernel nor any profile's fp32 (mem-efficient) one:
    scaled by the bf16 fit, tf32 steps read 2.2x too slow."""
    import statistics

    from calibration.from_runs import apply, microbenchmark_profile
    from simulator.strategy.stacks import get_stack

    for gpu in ("h200", "h100-sxm"):
        cat = load_profile(ROOT / "hardware_catalog" / "profiles" / f"{gpu}.json")
        errs = _attention_errors(cat, "cudnn")
        assert len(errs) >= 20 and statistics.median(abs(x) for x in errs) <= 0.10 and max(map(abs, errs)) <= 0.25
        assert statistics.median(_attention_errors(cat, "flash")) > 1.0  # FA2 chart x 0.57: over 2x the time
    assert get_stack("hf-trainer").attention_kernel == "cudnn" and get_stack("llm-foundry").attention_kernel == "flash"
    base = microbenchmark_profile("h200")
    scaled = apply(base, {"attention_scale": 0.5})
    assert scaled.attention_kernels == base.attention_kernels and base.attention_kernels["cudnn"].basis == "measured"
    assert scaled.attention.flash_fwd == pytest.approx(0.5 * base.attention.flash_fwd)
    assert (scaled.attention.mem_efficient_fwd, scaled.attention.mem_efficient_bwd) == (
        base.attention.mem_efficient_fwd, base.attention.mem_efficient_bwd)


@pytest.mark.parametrize("profile, mape_max, worst_max", [
    # was 26.1% and 122% (tf32), 2026-12-05: 7.7 / 15.4; 2026-12-07 (Hugging Face's rotary at the broadcast
    # class): 8.2 / 21.0; 2026-12-08, predicted with the suite's own modules (nn.RMSNorm, fused QKV and
    # gate/up, half rotary tables; predicting.VALIDATE_STACK) where transformers' were counted: 5.8 / 16.7
    ("hardware_catalog/profiles/h200.json", 7.0, 20.0),
    # was 11.2% and 37.1%, 2026-12-05: 9.0 / 19.6; 2026-12-07 8.3 / 20.0; 2026-12-08 7.1 / 19.0
    ("calibration/profiles/nvidia-h200.json", 8.5, 22.0),
])
def test_h200_profiles_predict_the_measured_gpu_default_steps(profile, mape_max, worst_max):
    """validate --measured on the 14 steps of gpu_default.yaml measured on the H200 (bf16/tf32/fp32, SDPA and
    eager, checkpointing, compile, gradient accumulation): mean and worst error of the whole step."""
    from calibration.validate.cli import _remeasured
    from calibration.validate.report import summarize
    from calibration.validate.suite import load_suite

    suite = load_suite(ROOT / "calibration" / "suites" / "gpu_default.yaml")
    rows = _remeasured(DATA / "validate_gpu_default.csv", suite.configs, load_profile(ROOT / profile))
    summary = summarize(rows)
    assert summary["n"] == 14
    assert summary["mape_pct"] <= mape_max and summary["worst_pct"] <= worst_max, summary


def test_bf16_end_to_end_fit_leaves_tf32_and_fp32_rates_alone():
    """The published runs the catalog's Hopper profiles are fitted to are all bf16: their sustained-tensor
    factor (0.75 on H100) scaled the tf32 rate too, and the catalog H200 predicted tf32 GEMMs at 0.60 of peak
    where one measured 0.78 (fp32: 0.89, V100's row, where Hopper measured 0.78)."""
    from calibration.from_runs import apply, microbenchmark_profile

    base = microbenchmark_profile("h200")
    fitted = apply(base, {"tensor_sustained": 0.75})
    for prec in ("tf32", "fp32"):
        assert fitted.gemm[prec].e_max == base.gemm[prec].e_max
    assert fitted.gemm["bf16"].e_max == pytest.approx(0.75 * base.gemm["bf16"].e_max)
    for gpu in ("h200", "h100-sxm"):
        cat = load_profile(ROOT / "hardware_catalog" / "profiles" / f"{gpu}.json")
        assert cat.gemm["fp32"].e_max == pytest.approx(52.05 / 67.0, abs=1e-3)  # H200, 2026-12-04
        assert cat.gemm["tf32"].e_max >= 0.78  # measured (H200 386.7 of 494.5) or published (H100 396)
        assert "2026-12-04" in cat.gemm["fp32"].source


def test_hugging_face_rotary_and_transposes_run_at_the_broadcast_rate():
    """Hugging Face's eager rotary (half Q/K times fp32 [1, 1, s, d] tables) and the copies of permuted views
    are their own op at the profile's broadcast class (an H200 ran the rotary multiplies at 1.3-1.4 TB/s:
    Pythia-160M's [8, 12, 2048, 16] x [1, 1, 2048, 16] in 14.7 us, the 8x1024 Llama's [8, 16, 2048, 64] in
    71 us, 6 bytes an element; a contiguous copy 3.6); the bytes are the ones the lump counted before, so
    memory and the other stacks are unchanged. On the profiled steps (2026-12-07) the catalog read -6.7%,
    -3.9%, -3.6% before and +2.4%, -0.7%, +6.0% after; the calibrated profile -7.2%, -11.5%, -5.2% before and
    +1.4%, -8.5%, +3.8% after."""
    import numpy as np

    from simulator.model import hf_eager, workload
    from simulator.model.graphs import graph
    from simulator.model.presets import get_model

    m, mb = get_model("pythia-160m"), np.array([8.0])
    hf = graph(m, 2048, mb, "bf16", "sdpa", False, "hf-trainer")
    fused = graph(m, 2048, mb, "bf16", "sdpa", False, "megatron-lm")
    ops = {op.name: op for op in hf.blocks[0].ops}
    assert ops["rotary_layout"].bandwidth == "broadcast" and "rotary_layout" not in {op.name for op in fused.blocks[0].ops}
    compiled = graph(m, 2048, mb, "bf16", "sdpa", True, "hf-trainer")
    assert "rotary_layout" not in {op.name for op in compiled.blocks[0].ops}
    before = workload.layer_elementwise(m, mb, 2048, 2, False, True)
    xf, xb, _, _ = hf_eager.autocast_elementwise(m, 2)
    rf, rb, _, _ = hf_eager.rotary_autocast_extra(m, 2)
    elem = [op for op in hf.blocks[0].ops if op.kind == "elementwise" and op.name in ("rotary_layout",
                                                                                     "norms_residual_activation")]
    act = workload.activation_bytes(m, mb, 2048, 2)
    total_f = sum(float(np.ravel(op.bytes_fwd)[0]) for op in elem) * m.n_layers + float(act.nbytes[0])
    assert total_f == pytest.approx(float(before[0].nbytes[0]) + 2048 * 8 * (xf + rf) * m.n_layers, rel=1e-9)
    assert rb == rf and xb > 0


def test_eager_softmax_under_autocast_counts_its_fp32_round_trip():
    """torch.autocast runs softmax in fp32: the scores are cast up, softmaxed in fp32 and cast back (an H200
    timed that at 20 bytes per score, 4x a bf16 softmax). Eager bf16 steps on the H200 were predicted 55-62%
    too fast; counting it: 38-39%."""
    import numpy as np

    from simulator.model import workload
    from simulator.model.presets import get_model

    m, mb = get_model("pythia-70m"), np.array([1.0])
    elems = m.n_heads * 2048**2 * m.n_layers
    half = workload.eager_softmax_bytes(m, mb, 2048, 2)
    up = workload.eager_softmax_bytes(m, mb, 2048, 2, upcast=True)
    mask = workload.eager_mask_add_bytes(m, mb, 2048, 2)
    assert half[0].nbytes[0] == pytest.approx(12 * elems) and up[0].nbytes[0] == pytest.approx(18 * elems)
    assert mask.nbytes[0] == pytest.approx(10 * elems)  # 28 bytes a score forward in all, 4 kernels
    assert float(up[0].kernels) + float(mask.kernels) == 4 * m.n_layers
    # backward: 32 bytes a score and 5 kernels, + the separate gradient x probabilities product over rows > 1024
    assert up[1].nbytes[0] == pytest.approx(44 * elems) and float(up[1].kernels) == 6 * m.n_layers
    # compiled (fused) softmax and fp32 training are unchanged
    assert workload.eager_softmax_bytes(m, mb, 2048, 2, True, True)[0].nbytes[0] == pytest.approx(8 * elems)


#: torch.profiler's CUDA time of one Hugging Face training step on the H200 (transformers 5.17,
#: AutoModelForCausalLM.from_config, bf16 autocast over fp32 weights, 2048 tokens x 8, fused AdamW):
#: (file, gpu_default model, attention, "Self CUDA time total" in ms)
HF_STEPS = [("prof_p160m_sdpa_s2048_mb8.txt", "pythia-160m", "sdpa", 61.189),
            ("prof_p160m_eager_s2048_mb8.txt", "pythia-160m", "eager", 174.283),
            ("prof_llama8x1024_sdpa_s2048_mb8.txt", "llama-8x1024-gqa", "sdpa", 59.774)]


@pytest.mark.parametrize("profile, tolerance", [("hardware_catalog/profiles/h200.json", 0.10),
                                                ("calibration/profiles/nvidia-h200.json", 0.15)])
@pytest.mark.parametrize("name, model, attention, cuda_ms", HF_STEPS)
def test_h200_profiles_predict_hugging_face_steps(name, model, attention, cuda_ms, profile, tolerance):
    """The H200 profiles against the device time of real Hugging Face steps (the kernel tables' totals
    under the profiler, no host gaps; the stack's fused AdamW, as they ran). Catalog within 10%
    (2026-12-07: +2.4%, -0.7%, +6.0%; 2026-12-05, before the rotary's broadcast class: -6.7%, -3.9%, -3.6%;
    before the H200's own attention, optimizer, mask-add and softmax-backward figures, with foreach AdamW:
    +5.0%, -23.0%, +6.3%); the calibrated profile within 15% (+1.4%, -8.5%, +3.8%; -7.2%, -11.5%, -5.2% before:
    its attention fit is the quick run's)."""
    from calibration.validate.suite import load_suite
    from simulator.answer.api import simulate

    assert f"Self CUDA time total: {cuda_ms:.3f}ms" in (DATA / name).read_text()
    spec = {c.model: c.spec for c in load_suite(ROOT / "calibration" / "suites" / "gpu_default.yaml").configs}[model]
    plan = simulate(spec, "1xlocal", profile=load_profile(ROOT / profile),
                    seq_len=2048, global_batch=8, micro_batch=8, steps=1, optimizer="adamw", precision="bf16",
                    attention=attention, compile=False, checkpointing="none", sharding="ddp", offload="none")
    assert abs(plan.step_time_s * 1e3 / cuda_ms - 1.0) <= tolerance


def test_stack_attention_kernels_are_the_profiles_kernels():
    """A stack names FlashAttention-2 ('flash', a profile's ``attention``) or a kernel a profile may time
    apart (ATTENTION_KERNELS): one list of names, so a new kernel cannot be asked for that no profile holds."""
    from typing import get_args

    from simulator.hardware.profile import ATTENTION_KERNELS
    from simulator.strategy.stacks import Stack

    assert set(get_args(Stack.model_fields["attention_kernel"].annotation)) == {"flash", *ATTENTION_KERNELS}
