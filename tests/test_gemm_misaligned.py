"""Forward GEMMs whose output rows are not whole cache lines: the profile's gemm_misaligned factor
applies to exactly those (GPT-2's 50257-token head), the fit recovers a known ratio within its
bounds, and bad values are rejected with the field's name."""

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


@pytest.mark.parametrize("bad", [{"fp32": 0.5}, {"fp32": float("nan")}, {"int8": 1.2}])
def test_bad_values_are_rejected(bad):
    data = json.loads(PROFILE.read_text())
    data["gemm_misaligned"] = bad
    with pytest.raises(UsageError, match="gemm_misaligned"):
        parse_profile(data)
