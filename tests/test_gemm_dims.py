"""Per-dimension GEMM efficiency of blocked CPU kernels (kernels.gemm_efficiency's m/n/k terms) and its fit."""

from __future__ import annotations

import numpy as np
import pytest

from calibration import fit as F
from simulator.hardware.profile import GemmEfficiency
from simulator.physics import kernels

PEAK, BW = 1.6e11, 3.4e10


def test_zero_halves_give_the_thickness_model():
    m, n, k = np.array([16, 512, 4096]), np.array([64, 768, 50304]), np.array([32, 768, 1024])
    assert np.allclose(kernels.gemm_efficiency(m, n, k, 0.9, 40.0), kernels.gemm_efficiency(m, n, k, 0.9, 40.0,
                                                                                             (0, 0, 0), 5.0))


@pytest.mark.parametrize("power", [1.0, 2.5, 8.0])
def test_time_never_falls_as_the_reduction_grows_and_stays_finite(power):
    k = np.arange(1, 4097, dtype=float)
    t = kernels.gemm_time(512.0, 768.0, k, PEAK, 0.8, 0.0, 4, BW, 1.0, 0.0, halves=(30.0, 0.0, 90.0),
                          k_power=power)
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= -1e-15 * t[1:])
    for dim in range(2):  # more rows or columns: never less time either
        shape = [512.0, 768.0, 256.0]
        shape[dim] = np.arange(1, 4097, dtype=float)
        t = kernels.gemm_time(*shape, PEAK, 0.8, 0.0, 4, BW, 1.0, 0.0, halves=(30.0, 10.0, 90.0), k_power=power)
        assert np.all(np.diff(t) >= 0)


def test_a_steep_k_term_matches_short_reductions_that_run_far_below_peak():
    eff = kernels.gemm_efficiency(8192, 1024, np.array([32.0, 64.0, 128.0, 1024.0]), 0.8, 0.0, (0.0, 0.0, 90.0), 6.0)
    assert eff[0] < 0.3 * eff[-1] and eff[2] > 0.85 * eff[-1]  # the drop is steep, not hyperbolic
    assert eff[-1] <= 0.8


def _grid():
    """Layer-like shapes plus two large squares that reach saturation, so the fit's e_max cap
    (at most 1.05x the best point measured, calibration.fit.E_MAX_MARGIN) does not bind."""
    s = [16, 64, 128, 512, 2048]
    shapes = [(a, b, c) for a in s for b in (256, 1024, 4096) for c in (32, 64, 128, 768)]
    shapes += [(x, x, x) for x in (16384, 65536)]
    m, n, k = (np.array(v, dtype=float) for v in zip(*shapes, strict=True))
    return m, n, k


def test_fit_recovers_per_dimension_terms_despite_a_slowed_point():
    m, n, k = _grid()
    truth = dict(e_max=0.8, halves=(25.0, 0.0, 70.0), k_power=4.0)
    t = kernels.gemm_time(m, n, k, PEAK, truth["e_max"], 0.0, 4, BW, 1.0, 0.0, halves=truth["halves"],
                          k_power=truth["k_power"])
    t[7] *= 2.5  # one minimum taken while the machine was busy
    f = F.fit_gemm(m, n, k, t, PEAK, 4, BW, 1.0, 0.0)
    p = f.params
    assert p["e_max"] == pytest.approx(0.8, rel=0.05)
    assert p["m_half"] == pytest.approx(25.0, rel=0.2) and p["k_half"] == pytest.approx(70.0, rel=0.1)
    assert p["k_power"] == pytest.approx(4.0, rel=0.2) and p["x_half"] == 0.0


def test_fit_keeps_the_thickness_model_where_it_describes_the_points():
    m, n, k = _grid()
    t = kernels.gemm_time(m, n, k, PEAK, 0.7, 50.0, 4, BW, 1.0, 0.0)
    p = F.fit_gemm(m, n, k, t, PEAK, 4, BW, 1.0, 0.0).params
    assert "k_half" not in p and p["x_half"] == pytest.approx(50.0, rel=0.02)


def test_profile_bounds_the_k_power():
    with pytest.raises(ValueError):
        GemmEfficiency(e_max=0.8, x_half=0.0, k_half=90.0, k_power=0.5, source="t")
    g = GemmEfficiency(e_max=0.8, x_half=0.0, m_half=25.0, k_half=90.0, k_power=4.0, source="t")
    assert g.halves == (25.0, 0.0, 90.0)


def _noisy_thickness_points(seed: int, npts: int = 16):
    """GEMMs whose truth is the two-term thickness model, each timed with 20% log-normal noise."""
    rng = np.random.default_rng(seed)
    m = rng.choice([16, 64, 128, 512, 2048], npts).astype(float)
    n = rng.choice([256, 1024, 4096], npts).astype(float)
    k = rng.choice([32, 64, 768, 4096], npts).astype(float)
    t = kernels.gemm_time(m, n, k, PEAK, 0.7, 50.0, 4, BW, 1.0, 0.0) * np.exp(rng.normal(0.0, 0.2, npts))
    return m, n, k, t


def _picks_dims(points) -> bool:
    return "k_half" in F.fit_gemm(*points, PEAK, 4, BW, 1.0, 0.0).params


def test_cross_validation_turns_down_per_dimension_terms_that_follow_noise(monkeypatch):
    seeds = range(30)
    with_cv = sum(_picks_dims(_noisy_thickness_points(s)) for s in seeds)
    # the in-sample rule alone (the held-out comparison always won by the per-dimension model)
    calls = iter([0.0, 1.0] * 1000)
    monkeypatch.setattr(F, "_cv_soft_l1", lambda *a: next(calls))
    in_sample = sum(_picks_dims(_noisy_thickness_points(s)) for s in seeds)
    assert in_sample >= 6 and with_cv <= in_sample // 2, (in_sample, with_cv)
    assert _picks_dims(_noisy_thickness_points(8))  # one of them, under the in-sample rule


def test_cross_validation_keeps_the_thickness_model_for_one_noisy_draw():
    assert not _picks_dims(_noisy_thickness_points(8))


def test_cross_validation_folds_span_the_sizes():
    flops = np.arange(20.0)[::-1]
    seen = []
    F._cv_soft_l1(lambda train, test: seen.append((set(train), set(test))) or np.zeros(len(test)), flops)
    assert len(seen) == F.CV_FOLDS and set().union(*(te for _, te in seen)) == set(range(20))
    for train, test in seen:
        assert not train & test and len(test) == 4
        assert max(flops[list(test)]) - min(flops[list(test)]) >= 15  # every fold reaches across the sizes
