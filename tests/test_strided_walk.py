"""Issue 10, bf16 backward on a CPU without bf16 BLAS: PyTorch's reference ``mm`` NN kernel (the
input gradient g @ W) walks a column of W per dot product; its speed depends on the L1/L2 sets the
column's stride reaches and on the column's length (simulator.physics.kernels.strided_walk_factor)."""

from __future__ import annotations

import numpy as np
import pytest

from calibration import fit as F
from calibration.benches import gemm as G
from simulator.hardware.profile import GemmEfficiency, StridedWalk
from simulator.model.presets import get_model
from simulator.physics import kernels
from tests.test_calibration_generalizes import _cpu_profile, _step

GEOMETRY = {"line_bytes": 64, "l1_sets": 64, "l1_ways": 8, "l2_sets": 1024, "l2_ways": 8}


def _walk(**kw) -> StridedWalk:
    args = dict(GEOMETRY, conflict_lines=100.0, conflict_floor=0.5, sharpness=8.0, column_half=0.5,
                column_floor=0.3, source="t")
    args.update(kw)
    return StridedWalk(**args)


def test_capacity_of_a_strided_walk_follows_the_sets_it_reaches():
    cap = kernels.strided_capacity_lines(np.array([4096, 2048, 1024, 768, 384, 96, 32]), 64, 8, 64)
    # 4 KiB apart: one set (8 lines); 2 KiB: 2 sets; 768 B = 12 lines: gcd 4 -> 16 sets; 384 B: 32 sets;
    # not a whole number of lines (96 B) or under one line: every set
    assert cap.tolist() == [8, 16, 32, 128, 256, 512, 512]


def test_walk_factor_punishes_power_of_two_strides_and_long_columns():
    w = _walk()
    odd, pow2 = kernels.strided_walk_factor(np.array([384, 512]), 512, 2, w)  # 768 B vs 1 KiB strides
    assert odd > 1.5 * pow2 and 0 < pow2 < odd <= 1
    f = kernels.strided_walk_factor(384, np.array([256, 1024, 4096, 65536]), 2, w)
    conflict = 0.5 + 0.5 / (1 + (100 / 128) ** 8)  # 768 B apart: 16 L1 sets, 128 lines
    u = 65536 / 2048  # the L2 keeps 2048 lines at that stride (gcd 4 of 1024 sets)
    assert np.all(np.diff(f) < 0) and f[-1] == pytest.approx(conflict * (0.3 + 0.7 / (1 + u / 0.5)))


def test_fit_recovers_a_strided_walk():
    rng = np.random.default_rng(1)
    n = rng.choice([192, 384, 512, 640, 768, 1024, 1152, 2048], 40).astype(float)
    k = rng.choice([256, 512, 2048, 8192, 24576], 40).astype(float)
    m = rng.choice([16, 32, 512], 40).astype(float)
    true = _walk(conflict_lines=90.0, conflict_floor=0.55, column_half=0.4, column_floor=0.25)
    peak = 3e10
    t = kernels.gemm_time(m, n, k, peak, 0.08, 0.0, 2, 1e11, 1.0, 0.0,
                          walk_factor=kernels.strided_walk_factor(n, k, 2, true))
    fit = F.fit_gemm_strided(m, n, k, t, peak, 2, 1e11, 1.0, 0.0, GEOMETRY)
    p = fit.params
    assert fit.rms_log < 0.01
    assert p["e_max"] == pytest.approx(0.08, rel=0.05) and p["conflict_floor"] == pytest.approx(0.55, rel=0.05)
    assert p["column_half"] == pytest.approx(0.4, rel=0.1) and p["column_floor"] == pytest.approx(0.25, abs=0.03)
    assert 64 < p["conflict_lines"] < 128  # between the capacities the strides give (64 and 128 lines)


def test_build_keeps_the_walk_only_where_it_fits_better():
    from calibration.build import _strided_walk

    n = np.array([192, 384, 512, 768, 1024, 384, 384, 512], float)
    k = np.array([1536, 512, 512, 512, 256, 4096, 16384, 2048], float)
    m = np.full(n.shape, 32.0)
    peak = 3e10
    walk = kernels.strided_walk_factor(n, k, 2, _walk())
    for ts, replaced in ((kernels.gemm_time(m, n, k, peak, 0.08, 0.0, 2, 1e11, 1.0, 0.0, walk_factor=walk), True),
                         (kernels.gemm_time(m, n, k, peak, 0.08, 0.0, 2, 1e11, 1.0, 0.0), False)):
        plain = F.fit_gemm(m, n, k, ts, peak, 2, 1e11, 1.0, 0.0, operand_bytes=k * n * 2)
        dest = {"bf16": {"e_max": plain.params["e_max"], "x_half": plain.params["x_half"], "source": "plain"}}
        fits: dict = {}
        _strided_walk(fits, dest, "bf16", plain, "t", [m, n, k], ts, peak, 1e11, 1.0, 0.0, GEOMETRY)
        assert "gemm_bwd_strided/bf16" in fits
        assert ("strided" in dest["bf16"]) is replaced
        if replaced:
            g = GemmEfficiency(**dest["bf16"])  # a valid profile entry
            assert g.strided.l1_sets == 64 and g.strided.sharpness == F.WALK_SHARPNESS


def test_walk_moves_only_the_backward_and_favours_odd_strides():
    base = _cpu_profile()
    g = base.gemm["bf16"]
    walked = _cpu_profile(gemm_bwd={"bf16": GemmEfficiency(e_max=g.e_max, x_half=g.x_half, strided=_walk(),
                                                           source="t")})
    kw = dict(seq_len=64, micro_batch=1, global_batch=1, precision="bf16")

    def model(h):
        return get_model("gpt2").model_copy(update={"hidden": h, "n_heads": h // 64, "ffn_hidden": 4 * h,
                                                    "n_layers": 2, "vocab_size": 4096})

    for h in (384, 512):
        a, b = _step(base, model(h), **kw).breakdown_s, _step(walked, model(h), **kw).breakdown_s
        assert b["forward"] == pytest.approx(a["forward"]) and b["backward"] > a["backward"]
    # per backward FLOP, hidden 512 (1 KiB strides, 4 L1 sets) runs slower than hidden 384 (768 B, 16 sets)
    slow = {h: _step(walked, model(h), **kw).breakdown_s["backward"] / _step(base, model(h), **kw).breakdown_s["backward"]
            for h in (384, 512)}
    assert slow[512] > slow[384]
    fp32 = _step(walked, model(384), seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    assert fp32 == _step(base, model(384), seq_len=64, micro_batch=1, global_batch=1).breakdown_s


def test_cache_geometry_reads_sysfs(tmp_path):
    def cache(i, level, kind, sets, ways):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, v in (("level", level), ("type", kind), ("number_of_sets", sets),
                        ("ways_of_associativity", ways), ("coherency_line_size", 64)):
            (d / name).write_text(f"{v}\n")

    cache(0, 1, "Data", 64, 8)
    cache(1, 1, "Instruction", 64, 8)
    assert G.cache_geometry(str(tmp_path)) is None  # no L2
    cache(2, 2, "Unified", 1024, 8)
    cache(3, 3, "Unified", 32768, 16)
    assert G.cache_geometry(str(tmp_path)) == GEOMETRY
    assert G.cache_geometry(str(tmp_path / "missing")) is None


def test_quick_plan_times_the_walk_shapes_in_bf16_only(monkeypatch):
    from calibration.benches import plan
    from calibration.benches.base import RunContext, Settings
    from calibration.device import detect

    monkeypatch.setattr(G, "cache_geometry", lambda root=G.SYSFS_CACHE: dict(GEOMETRY))
    dev = detect("cpu")
    if "bf16" not in dev.precisions:
        pytest.skip("no bf16 on this CPU")
    keys = {b.key for b in plan(RunContext(dev, Settings("quick", 0.05, 0.3, False, 2)))}
    walk = {f"gemm/bf16/{m}x{n}x{k}" for m, n, k in G.WALK_SHAPES["quick"]}
    assert walk <= keys and not {f"gemm/fp32/{m}x{n}x{k}" for m, n, k in G.WALK_SHAPES["quick"]} & keys
