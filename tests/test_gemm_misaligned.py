"""Misaligned GEMMs: on a CPU, forward outputs whose rows are not whole cache lines take the profile's
gemm_misaligned factor (GPT-2's 50257-token head); on a GPU, weight dimensions that are not a multiple of
16 bytes take it forward and gemm_misaligned_bwd in both backward GEMMs, unless torch.compile pads them;
the fit recovers a known ratio within its bounds, the GPU bench times the three layouts, the catalog's
Hopper factors are the H200's measurement, and bad values are rejected with the field's name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibration import fit as F
from simulator.core.errors import UsageError
from simulator.hardware.device import device_from_profile
from simulator.hardware.profile import load_profile, parse_profile
from simulator.model.families.base import Op
from simulator.physics import compute

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "calibration" / "profiles" / "cpu-amd-epyc.json"
H200 = ROOT / "hardware_catalog" / "microbenchmark" / "h200.json"
SHAPES = ROOT / "calibration" / "results" / "h200" / "microbench_shapes.csv"


def _dev(factor: dict):
    prof = load_profile(PROFILE).model_copy(update={"gemm_misaligned": factor})
    return device_from_profile(prof)


def _head(n: int) -> Op:
    return Op("logits", "gemm", m=np.array([512.0, 1024.0]), n=float(n), k=256.0)


@pytest.mark.parametrize(("n", "applies"), [(50257, True), (50304, False), (32000, False), (1001, True)])
def test_factor_applies_to_forward_outputs_with_partial_cache_lines(n, applies):
    f0, d0, w0 = compute.gemm_pass_times([_head(n)], _dev({}), "fp32")
    f1, d1, w1 = compute.gemm_pass_times([_head(n)], _dev({"fp32": 1.5}), "fp32")
    np.testing.assert_allclose(f1, f0 * (1.5 if applies else 1.0), rtol=1e-12)
    np.testing.assert_allclose(d1, d0, rtol=1e-12)  # backward layouts unchanged
    np.testing.assert_allclose(w1, w0, rtol=1e-12)


def test_other_precisions_are_unaffected():
    f0, _ = compute.gemm_times([_head(50257)], _dev({}), "bf16")
    f1, _ = compute.gemm_times([_head(50257)], _dev({"fp32": 1.5}), "bf16")
    np.testing.assert_allclose(f1, f0, rtol=1e-12)


def test_gemm_times_is_the_sum_of_the_pass_times():
    ops = [_head(50257), Op("qkv", "gemm", m=np.array([512.0, 1024.0]), n=768.0, k=256.0)]
    f, b = compute.gemm_times(ops, _dev({"fp32": 1.3}), "fp32")
    pf, pd, pw = compute.gemm_pass_times(ops, _dev({"fp32": 1.3}), "fp32")
    np.testing.assert_allclose(f, pf)
    np.testing.assert_allclose(b, pd + pw)


def test_fit_ratio_recovers_and_clips():
    fast = np.array([0.01, 0.02, 0.03])
    fit = F.fit_ratio(1.4 * fast * np.array([1.02, 0.98, 1.0]), fast)
    assert fit.params["ratio"] == pytest.approx(1.4, rel=0.02) and fit.n == 3 and not fit.clipped
    assert F.fit_ratio(0.9 * fast, fast).params["ratio"] == 1.0  # never faster than aligned
    assert F.fit_ratio(9.0 * fast, fast).clipped == ["ratio"]


def _gpu(fwd: dict, bwd: dict):
    prof = load_profile(H200).model_copy(update={"gemm_misaligned": fwd, "gemm_misaligned_bwd": bwd})
    return device_from_profile(prof)


@pytest.mark.parametrize(("n", "k", "applies"), [(50257, 1600, True), (50304, 1600, False), (4096, 1001, True),
                                                 (32000, 4096, False), (50260, 768, True)])
def test_gpu_factor_applies_to_weight_dims_off_16_bytes_in_every_pass(n, k, applies):
    """bf16: 8 elements to 16 bytes, so 50260 (a multiple of 4, not of 8) is misaligned and 50304 is not;
    k counts as n does (the input gradient contracts over n, the forward over k)."""
    op = Op("logits", "gemm", m=np.array([4096.0, 8192.0]), n=float(n), k=float(k))
    f0, d0, w0 = compute.gemm_pass_times([op], _gpu({}, {}), "bf16")
    f1, d1, w1 = compute.gemm_pass_times([op], _gpu({"bf16": 7.0}, {"bf16": 5.0}), "bf16")
    np.testing.assert_allclose(f1, f0 * (7.0 if applies else 1.0), rtol=1e-12)
    np.testing.assert_allclose(d1, d0 * (5.0 if applies else 1.0), rtol=1e-12)
    np.testing.assert_allclose(w1, w0 * (5.0 if applies else 1.0), rtol=1e-12)


def test_gpu_factor_spares_compiled_and_batched_gemms():
    """torch.compile's Inductor pads misaligned matmul operands on a GPU (pad_mm); attention's batched
    GEMMs of 197 tokens (ViT) were not measured misaligned and take no factor; a CPU's rule ignores
    compilation (pad_mm pads no CPU matmul)."""
    dev = _gpu({"bf16": 7.0}, {"bf16": 5.0})
    head = Op("logits", "gemm", m=np.array([8192.0]), n=50257.0, k=1600.0)
    aligned = compute.gemm_pass_times([head], _gpu({}, {}), "bf16")
    for got, ref in zip(compute.gemm_pass_times([head], dev, "bf16", compiled=True), aligned, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-12)
    scores = Op("scores", "gemm", m=np.array([197.0]), n=197.0, k=64.0, batch=np.array([256.0]))
    for got, ref in zip(compute.gemm_pass_times([scores], dev, "bf16"),
                        compute.gemm_pass_times([scores], _gpu({}, {}), "bf16"), strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-12)
    f_c = compute.gemm_pass_times([_head(50257)], _dev({"fp32": 1.5}), "fp32", compiled=True)[0]
    np.testing.assert_allclose(f_c, compute.gemm_pass_times([_head(50257)], _dev({}), "fp32")[0] * 1.5, rtol=1e-12)


def _measured_heads() -> list[dict]:
    import csv

    with open(SHAPES, newline="") as f:
        return [r for r in csv.DictReader(f) if r["group"] == "gemm" and r["n"] == "50257"]


def test_catalog_hopper_factors_predict_the_measured_misaligned_head():
    """The H200 microbenchmark profile (the catalog's base) predicts GPT-2 XL's 50257-column LM head as an
    H200 ran it: each precision's layouts together within 10% (bf16 and tf32: three layouts; fp16 and fp32:
    forward; 2026-12-07: -6.2%, -5.4%, -6.8%, -1.1%), each layout within 30% (tf32's input gradient -25%: the
    backward factor is the mean of its two layouts', 2.45 and 1.77). Without the factors bf16 read 5-7x fast
    (94-139 TFLOP/s measured); fp32's CUDA-core kernel has no penalty. The H100s carry the same factors
    (same SM90 chip and kernels)."""
    dev = device_from_profile(load_profile(H200))
    rows = _measured_heads()
    assert {(r["precision"], r["layout"]) for r in rows} >= {("bf16", "fwd"), ("bf16", "dgrad"), ("bf16", "wgrad"),
                                                             ("tf32", "wgrad"), ("fp16", "fwd"), ("fp32", "fwd")}
    total: dict[str, list[float]] = {}
    for r in rows:
        op = Op("logits", "gemm", m=np.array([float(r["m"])]), n=float(r["n"]), k=float(r["k"]))
        t = float(compute.gemm_pass_times([op], dev, r["precision"])[("fwd", "dgrad", "wgrad").index(r["layout"])][0, 0])
        assert t / float(r["time_s"]) - 1.0 == pytest.approx(0.0, abs=0.30), r
        pred, meas = total.setdefault(r["precision"], [0.0, 0.0])
        total[r["precision"]] = [pred + t, meas + float(r["time_s"])]
    for prec, (pred, meas) in total.items():
        assert pred / meas - 1.0 == pytest.approx(0.0, abs=0.10), prec
    h200 = load_profile(H200)
    for gpu in ("h100-sxm", "h100-pcie"):
        sib = load_profile(ROOT / "hardware_catalog" / "microbenchmark" / f"{gpu}.json")
        assert (sib.gemm_misaligned, sib.gemm_misaligned_bwd) == (h200.gemm_misaligned, h200.gemm_misaligned_bwd)
    assert "fp32" not in h200.gemm_misaligned and "2026-12-04" in h200.gemm_misaligned_source


def test_gpu_bench_times_three_layouts_and_the_fit_splits_them():
    """On a GPU the bench times the forward and both backward GEMMs (each call's output the layout's
    shape), and the build fits the forward into gemm_misaligned and the backward pair into
    gemm_misaligned_bwd; records without a layout (a CPU's) stay forward."""
    from types import SimpleNamespace

    import torch

    from calibration.benches.gemm_align import _call
    from calibration.build import misaligned_section

    shapes = {lay: tuple(_call(lay, 8, 65, 16, torch.device("cpu"), torch.float32)().shape)
              for lay in ("fwd", "dgrad", "wgrad")}
    assert shapes == {"fwd": (8, 65), "dgrad": (8, 16), "wgrad": (65, 16)}

    def rec(lay, ratio):
        return {"status": "ok", "time_s": ratio * 1e-3, "aligned_s": 1e-3, "flops": 2.0, "aligned_flops": 2.0,
                **({"layout": lay} if lay else {})}

    results = {"gemm_align/bf16/fwd/a": rec("fwd", 7.0), "gemm_align/bf16/dgrad/a": rec("dgrad", 5.0),
               "gemm_align/bf16/wgrad/a": rec("wgrad", 5.0), "gemm_align/fp32/a": rec(None, 1.2)}
    for kind in ("cuda", "cpu"):
        part = misaligned_section(SimpleNamespace(precisions=["fp32", "bf16"], kind=kind), results, "t")
        assert part.fields["gemm_misaligned"] == pytest.approx({"bf16": 7.0, "fp32": 1.2})
        assert part.fields["gemm_misaligned_bwd"] == pytest.approx({"bf16": 5.0})


@pytest.mark.parametrize("bad", [{"fp32": 0.5}, {"fp32": float("nan")}, {"int8": 1.2}, {"bf16": 12.0}])
@pytest.mark.parametrize("field", ["gemm_misaligned", "gemm_misaligned_bwd"])
def test_bad_values_are_rejected(bad, field):
    data = json.loads(PROFILE.read_text())
    data[field] = bad
    with pytest.raises(UsageError, match=field):
        parse_profile(data)
