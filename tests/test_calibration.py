"""Calibration: fits recover known parameters; tiny real runs write loadable profiles;
resume skips finished benchmarks; torchrun gloo collectives produce a fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from calibration import cli, host_alloc  # noqa: E402
from calibration import fit as F  # noqa: E402
from calibration.benches.base import Bench  # noqa: E402
from calibration.build import fit_collectives  # noqa: E402
from calibration.collectives import bus_bytes  # noqa: E402
from calibration.store import measurements_path  # noqa: E402
from simulator.hardware.profile import load_profile  # noqa: E402
from simulator.physics import kernels  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# a few benchmarks of every group the profile needs, so the tiny run stays well under 30 s
ONLY = ("launch,bandwidth/copy/*,bandwidth/gelu/*,gemm/fp32/*,gemm_align,grouped_gemm,attention/flash/*,"
        "optimizer/fused/*,optimizer/for_loop/*,host,mask_add/*")


def _shapes(saturating: bool = True):
    """Layer-like GEMM shapes; ``saturating``: with squares up to 65536 (synthetic), whose thickness
    reaches within a few percent of the asymptote, as a grid must for e_max to be measured."""
    sizes = [16, 64, 128, 256, 512, 1024, 2048, 4096]
    squares = [(s, s, s) for s in (16384, 65536)] if saturating else []
    return np.array([(m, n, k) for m in sizes for n in (768, 3072) for k in (768, 4096)] + squares, float).T


@pytest.mark.parametrize("e_max,x_half", [(0.72, 150.0), (0.95, 20.0), (0.3, 600.0)])
def test_fit_gemm_recovers_parameters(e_max, x_half):
    m, n, k = _shapes()
    args = dict(peak_flops=312e12, bytes_per_el=2, bw=2.0e12, bw_eff=0.85, launch_s=5e-6)
    t = kernels.gemm_time(m, n, k, e_max=e_max, x_half=x_half, **args)
    f = F.fit_gemm(m, n, k, t, **args)
    assert f.params["e_max"] == pytest.approx(e_max, rel=1e-3)
    assert f.params["x_half"] == pytest.approx(x_half, rel=1e-3)
    assert f.rms_log < 1e-6


def test_fit_gemm_never_claims_more_than_the_best_point_measured():
    """A grid that stops short of saturation (an H200's quick grid: 0.66 of peak at 2048^3, where
    layer GEMMs reach 0.74-0.77) does not let e_max run to the peak: it is capped at E_MAX_MARGIN
    above the best efficiency measured, and reported as clipped."""
    m, n, k = _shapes(saturating=False)
    args = dict(peak_flops=989e12, bytes_per_el=2, bw=4.8e12, bw_eff=0.8, launch_s=1e-5)
    t = kernels.gemm_time(m, n, k, e_max=0.95, x_half=600.0, **args)
    best = float(np.max(2 * m * n * k / (989e12 * t)))
    f = F.fit_gemm(m, n, k, t, **args)
    assert f.params["e_max"] <= (1 + F.E_MAX_MARGIN) * best + 1e-9 < 0.95
    assert "e_max" in f.clipped and f.params["e_max_cap"] == pytest.approx((1 + F.E_MAX_MARGIN) * best)


def test_fit_gemm_tolerates_noise():
    rng = np.random.default_rng(0)
    m, n, k = _shapes()
    args = dict(peak_flops=100e12, bytes_per_el=4, bw=1e12, bw_eff=0.8, launch_s=4e-6)
    t = kernels.gemm_time(m, n, k, e_max=0.6, x_half=200.0, **args)
    t = t * np.exp(rng.normal(0, 0.03, t.shape))
    f = F.fit_gemm(m, n, k, t, **args)
    assert f.params["e_max"] == pytest.approx(0.6, rel=0.05)
    assert f.params["x_half"] == pytest.approx(200.0, rel=0.15)
    assert 0.01 < f.rms_log < 0.06


def test_fit_grouped_recovers_rows_per_group():
    """Grouped over dense time 1 + m_half / rows: recovered exactly; calls faster than the
    reference (a ratio below 1) fit 0, reported as clipped; the bound holds."""
    rows = np.array([16.0, 64.0, 256.0, 1024.0])
    f = F.fit_grouped(rows, 1.0 + 48.0 / rows, np.ones(4))
    assert f.params["m_half"] == pytest.approx(48.0, rel=1e-4) and f.rms_log < 1e-6 and not f.clipped
    assert F.fit_grouped(rows, np.full(4, 0.8), np.ones(4)).params["m_half"] == pytest.approx(0.0, abs=1e-6)
    assert F.fit_grouped(rows, 1.0 + 1e5 / rows, np.ones(4)).clipped == ["m_half"]


def test_grouped_gemm_bench_computes_the_groups_and_keeps_the_median_round():
    """The grouped call (torch._grouped_mm where it runs, else a loop of torch.mm) multiplies each
    group's rows by its own weight; the record keeps the round with the median grouped/dense ratio."""
    from types import SimpleNamespace

    import torch

    from calibration.benches import grouped_gemm
    from calibration.timing import Timing

    a, b = torch.randn(3 * 8, 16), torch.randn(3, 16, 24)
    fn, impl = grouped_gemm.grouped_call(a, b, 8)
    out = fn()
    if out is None:  # the loop writes into its own buffer; rerun through the reference
        assert impl == "mm_loop"
    else:
        assert impl == "grouped_mm"
        for i in range(3):
            assert torch.allclose(out[i * 8:(i + 1) * 8], a[i * 8:(i + 1) * 8] @ b[i], atol=1e-4)
    seq = iter([2.0, 1.0, 30.0, 1.0, 3.0, 1.0])  # (grouped, dense) per round; round 2 stalled
    ctx = SimpleNamespace(settings=SimpleNamespace(budget_s=0.6), device=torch.device("cpu"),
                          time=lambda fn, budget_s=None: Timing.of_calls([next(seq) * 1e-3]))
    rec = grouped_gemm._bench("fp32", 2, 8, 16, 8)(ctx)
    assert rec["time_s"] / rec["dense_s"] == pytest.approx(3.0) and rec["rows"] == 8.0
    assert sorted(rec["round_ratios"]) == pytest.approx([2.0, 3.0, 30.0])


def test_fit_bandwidth_and_alpha_beta_recover():
    b = np.logspace(4, 9, 12)
    kern = np.where(b > 1e7, 2, 1)
    t = kernels.memory_bound_time(b, 900e9, 0.83, 7e-6, kern)
    assert F.fit_bandwidth(b, t, 900e9, 7e-6, kern).params["bw_eff"] == pytest.approx(0.83, rel=1e-4)

    bus = np.logspace(3, 9, 10)
    t = kernels.collective_time(bus, 25e-6, 80e9)
    f = F.fit_alpha_beta(bus, t)
    assert f.params["alpha_s"] == pytest.approx(25e-6, rel=1e-3)
    assert f.params["bw"] == pytest.approx(80e9, rel=1e-3)


def test_bus_bytes_ring_factors():
    assert bus_bytes("all_reduce", 1000, 4) == pytest.approx(1500)
    assert bus_bytes("all_gather", 1000, 4) == pytest.approx(750)
    assert bus_bytes("reduce_scatter", 1000, 2) == pytest.approx(500)
    assert bus_bytes("all_reduce", 1000, 1) == 0.0


def _run(argv, capsys):
    rc = cli.main([*argv, "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One restricted real calibration run shared by the tests below."""
    out = tmp_path_factory.mktemp("cal") / "tiny.json"
    rc = cli.main(["--tiny", "--no-progress", "--out", str(out), "--only", ONLY])
    return rc, out


def test_tiny_run_writes_loadable_profile(tiny_run):
    rc, out = tiny_run
    assert rc == 0
    prof = load_profile(out)
    assert prof.device.kind == "cpu" and prof.provenance.method == "calibration"
    assert "fp32" in prof.gemm and prof.device.peak_tflops["fp32"] > 0
    assert prof.launch_overhead_us > 0 and 0 < prof.memory_bw_eff <= 1
    assert prof.provenance.command.startswith("calibrate ") and prof.provenance.host
    assert prof.provenance.host_allocator == host_alloc.active()  # in-process: no relaunch
    data = json.loads(measurements_path(out).read_text())
    keys = set(data["results"])
    assert any(k.startswith("gemm/fp32/") for k in keys)
    assert not any(k.startswith("gemm/bf16/") for k in keys)  # --only honoured
    assert "gemm/fp32" in data["fits"]
    # eager attention's mask add under autocast (half scores + fp32 mask, promoted): its own bandwidth class
    assert any(k.startswith("mask_add/") for k in keys) == ("broadcast" in prof.bw_eff_ops)
    assert not prof.bw_eff_ops or 0 < prof.bw_eff_ops.get("broadcast", 1.0) <= 1.0
    # misaligned output rows: a time ratio within its bounds, from the paired bench
    assert "gemm_misaligned/fp32" in data["fits"] and 1.0 <= prof.gemm_misaligned["fp32"] <= 4.0
    # grouped GEMMs against one GEMM of all their rows: rows per group within the bound
    assert "grouped_gemm_m_half/fp32" in data["fits"] and 0.0 <= prof.grouped_gemm_m_half["fp32"] <= 4096.0
    assert all(data["results"][k]["impl"] in ("grouped_mm", "mm_loop") for k in keys if k.startswith("grouped_gemm/"))
    # the fitted parameters make simulator.physics.kernels reproduce the measured GEMMs
    g = prof.gemm["fp32"]
    for key, rec in data["results"].items():
        if key.startswith("gemm/fp32/") and rec["status"] == "ok":
            m, n, k = (int(v) for v in key.rsplit("/", 1)[1].split("x"))
            pred = kernels.gemm_time(m, n, k, prof.device.peak_tflops["fp32"] * 1e12, g.e_max,
                                     g.x_half, 4, prof.device.mem_bw_gbs * 1e9, prof.memory_bw_eff,
                                     prof.launch_overhead_us * 1e-6)
            # the forward fit is to the F.linear layout's time where the layouts were timed apart
            measured = rec.get("layouts_s", {}).get("linear_nt", rec["time_s"])
            assert abs(np.log(pred / measured)) < 3 * data["fits"]["gemm/fp32"]["rms_log"] + 1e-3


def test_existing_output_needs_resume_or_force(tiny_run, capsys):
    _, out = tiny_run
    rc, _, err = _run(["--tiny", "--out", str(out), "--only", "launch"], capsys)
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [ln for ln in err.strip().splitlines() if "error" in ln]
    assert "--resume" in err and "--force" in err and len(err.strip().splitlines()) == 1


def test_resume_skips_done_benchmarks(tiny_run, capsys):
    _, out = tiny_run
    meas = measurements_path(out)
    before = json.loads(meas.read_text())["results"]
    rc, stdout, _ = _run(["--tiny", "--out", str(out), "--only", ONLY, "--resume"], capsys)
    assert rc == 0
    assert " 0 measured" in stdout and f"{len(before)} resumed" in stdout
    after = json.loads(meas.read_text())
    assert {k: r["measured_at"] for k, r in after["results"].items()} == \
        {k: r["measured_at"] for k, r in before.items()}
    assert len(after["runs"]) == 2
    load_profile(out)


def test_refit_rebuilds_profile_without_measuring(tiny_run, capsys):
    _, out = tiny_run
    meas = measurements_path(out)
    before = json.loads(meas.read_text())["results"]
    rc, stdout, err = _run(["--out", str(out), "--refit"], capsys)
    assert rc == 0 and "refitting" in err and " 0 measured" in stdout
    assert json.loads(meas.read_text())["results"] == before
    load_profile(out)


def test_interrupted_run_keeps_measurements_and_resumes(tmp_path, capsys, monkeypatch):
    import calibration.benches as benches

    real_plan = benches.plan

    def boom(ctx):
        raise KeyboardInterrupt

    def plan_with_interrupt(ctx, groups=None):
        return [*real_plan(ctx)[:3], Bench("zz/interrupt", "zz", {}, boom, 0.1)]

    out = tmp_path / "p.json"
    monkeypatch.setattr(benches, "plan", plan_with_interrupt)
    rc, _, err = _run(["--tiny", "--out", str(out), "--only", "launch,zz"], capsys)
    assert rc == 130 and "--resume" in err
    done = json.loads(measurements_path(out).read_text())["results"]
    assert len(done) == 3 and not out.exists()
    monkeypatch.setattr(benches, "plan", real_plan)
    rc, stdout, _ = _run(["--tiny", "--out", str(out), "--only", "launch", "--resume"], capsys)
    assert rc == 0 and "3 resumed" in stdout and "1 measured" in stdout


def test_force_keeps_backup(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert _run(["--tiny", "--out", str(out), "--only", "launch/eager/add"], capsys)[0] == 0
    rc, _, err = _run(["--tiny", "--out", str(out), "--only", "launch/eager/add", "--force"], capsys)
    assert rc == 0 and "kept previous" in err
    backups = sorted(p.name for p in tmp_path.glob("*.bak.json"))
    assert len(backups) == 2 and backups[1].startswith("p.measurements.")
    assert out.exists() and measurements_path(out).exists()


def test_killed_force_run_leaves_the_old_profile_in_place(tmp_path, capsys, monkeypatch):
    """A --force run interrupted before it finishes must not lose the previous profile."""
    import calibration.benches as benches

    out = tmp_path / "p.json"
    assert _run(["--tiny", "--out", str(out), "--only", "launch/eager/add"], capsys)[0] == 0
    old = out.read_bytes()
    real_plan = benches.plan

    def boom(ctx):
        raise KeyboardInterrupt

    monkeypatch.setattr(benches, "plan", lambda ctx, groups=None: [
        *real_plan(ctx)[:1], Bench("zz/interrupt", "zz", {}, boom, 0.1)])
    rc, _, err = _run(["--tiny", "--out", str(out), "--only", "launch,zz", "--force"], capsys)
    assert rc == 130
    assert out.read_bytes() == old  # still there, unchanged
    assert [p.read_bytes() for p in tmp_path.glob("p.2*.bak.json")] == [old]


def test_a_second_calibrate_on_the_same_out_is_refused(tmp_path, capsys):
    """Two calibrate runs writing one --out at once both exited 0 and the later save dropped the
    other's measurements; a run holds <out>.lock (flock) and a second one exits 2 at once."""
    import fcntl

    out = tmp_path / "p.json"
    with open(tmp_path / "p.json.lock", "a") as held:  # the first run, still measuring
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        rc, _, err = _run(["--tiny", "--out", str(out), "--only", "launch/eager/add"], capsys)
        assert rc == 2 and "another calibrate is writing" in err and len(err.strip().splitlines()) == 1
        assert not out.exists() and not measurements_path(out).exists()
        rc, _, err = _run(["--from-runs", str(ROOT / "simulator" / "data" / "validation_dev.csv"),
                           "--no-cv", "--out", str(out)], capsys)
        assert rc == 2 and "another calibrate is writing" in err and not out.exists()
    # once the first run is done, the next one runs and leaves no lock file behind
    assert _run(["--tiny", "--out", str(out), "--only", "launch/eager/add"], capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "p.measurements.json"]


@pytest.mark.parametrize("argv,needle", [
    (["--budget", "-1"], "--budget"),
    (["--quick", "--thorough"], "not allowed"),
    (["--bogus"], "unrecognized"),
    (["--resume", "--force"], "exclude"),
    (["--device", "tpu"], "device"),
    (["--out", "x.txt"], ".json"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle, capsys, tmp_path):
    rc, _, err = _run([*argv] + (["--out", str(tmp_path / "a.json")] if "--out" not in argv else []),
                      capsys)
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_collectives_torchrun_gloo_two_processes(tmp_path):
    out = tmp_path / "coll.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    torchrun = Path(sys.executable).parent / "torchrun"  # the console script, as users run it
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    proc = subprocess.run(
        [*launcher, "--standalone", "--nproc-per-node", "2", "-m", "calibration.collectives", "--out", str(out), "--sizes", "4096,262144,4194304",
         "--budget", "0.03"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["backend"] == "gloo" and rec["world_size"] == 2
    assert {p["op"] for p in rec["points"]} >= {"all_reduce", "all_gather"}
    f = fit_collectives(rec)
    assert f is not None and f.params["bw"] > 1e6 and f.params["alpha_s"] >= 0


def test_calibrate_collectives_flag_fits_local_link(tmp_path, capsys):
    out = tmp_path / "c.json"
    rc, stdout, err = _run(["--tiny", "--collectives", "--out", str(out),
                            "--only", "launch/eager/add,collectives"], capsys)
    assert rc == 0, err
    prof = load_profile(out)
    local = prof.collectives["local"]
    assert local.busbw_gbs > 0 and local.alpha_us >= 0 and "gloo x2" in local.source
    assert "collectives[local]" in stdout


def test_collectives_outside_torchrun_is_usage_error():
    proc = subprocess.run([sys.executable, "-m", "calibration.collectives", "--out", "x.json"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert proc.returncode == 2 and "torchrun" in proc.stderr


@pytest.mark.parametrize("name,mem,gid", [
    ("NVIDIA H200", 139.5, "h200"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb-sxm"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb-sxm"),
    ("NVIDIA GeForce RTX 3090", 23.6, "rtx3090"),
    ("NVIDIA H100 PCIe", 79.1, "h100-pcie"),
    ("NVIDIA A100-PCIE-40GB", 39.4, None),  # not in the catalog: measured peaks instead
])
def test_catalog_match_for_cuda_device_names(name, mem, gid):
    pytest.importorskip("simulator.hardware.catalog")
    from calibration.device import match_catalog_gpu

    gpu = match_catalog_gpu(name, mem)
    assert (gpu.id if gpu else None) == gid


def test_build_profile_recovers_every_section_from_synthetic_measurements(monkeypatch):
    """Records generated with simulator.physics.kernels from known parameters (catalog peaks fixed)
    come back as exactly those parameters, with the conventions simulator.physics.compute uses."""
    import torch

    import calibration.build as build
    from calibration.benches.attention import BWD_FLOPS_FACTOR, attention_flops
    from calibration.device import DeviceContext

    P = {"fp32": 60.0, "bf16": 500.0}  # TFLOPS
    BW, L = 2000e9, 6e-6  # bytes/s, launch seconds
    monkeypatch.setattr(build, "catalog_peaks", lambda dev: ("fake", dict(P), BW / 1e9, "test"))
    dev = DeviceContext("cuda", torch.device("cpu"), "Fake GPU", "fake", ["fp32", "bf16"],
                        80.0, 79.0, 500.0, 8)
    R: dict[str, dict] = {}

    def put(key, t, **kw):
        R[key] = {"status": "ok", "time_s": float(t), **kw}

    for op in ("add", "mul"):
        put(f"launch/eager/{op}", L)
    put("compiled/launch/chain8", 20e-6)
    for n in (1 << 24, 1 << 26, 1 << 28):
        for op, kern in (("copy", 1), ("gelu", 1), ("cross_entropy", 2)):
            b = 8.0 * n
            put(f"bandwidth/{op}/fp32/{n}", kernels.memory_bound_time(b, BW, 0.8, L, kern),
                bytes=b, kernels=kern)
    gem = {"fp32": (0.7, 120.0, 4), "bf16": (0.55, 300.0, 2)}
    for prec, (e, xh, el) in gem.items():
        for m, n, k in [(64, 4096, 4096), (512, 512, 512), (2048, 8192, 2048), (8192, 8192, 8192),
                        (16, 1024, 1024), (4096, 3072, 1024), (32768, 32768, 32768)]:  # the last saturates
            put(f"gemm/{prec}/{m}x{n}x{k}", kernels.gemm_time(m, n, k, P[prec] * 1e12, e, xh, el,
                                                              BW, 0.8, L), flops=2.0 * m * n * k)
    att = {("flash", "bf16"): (0.5, 0.4), ("efficient", "fp32"): (0.3, 0.25)}
    for (backend, prec), (ef, eb) in att.items():
        for s in (512, 1024, 4096):
            f = attention_flops(4, 16, s, 128)
            tf = L + f / (P[prec] * 1e12 * ef)
            tb = L + BWD_FLOPS_FACTOR * f / (P[prec] * 1e12 * eb)
            key = f"b4h16s{s}d128"
            put(f"attention/{backend}/fwd/{prec}/{key}", tf, flops=f, flops_fwd=f)
            put(f"attention/{backend}/fwdbwd/{prec}/{key}", tf + tb, flops=3.5 * f, flops_fwd=f)
    for layers in (1, 4, 8):
        params, tensors = 12.6e6 * layers, 12 * layers
        put(f"optimizer/foreach/h1024x{layers}",
            kernels.memory_bound_time(28 * params, BW, 0.6, L, tensors),
            bytes=28 * params, params=params, tensors=tensors)
        put(f"cpu_adam/fused/h1024x{layers}", params / 2e9, params=params)
    for nb in (1 << 20, 1 << 24, 1 << 28):
        put(f"host/h2d_pinned/{nb}", kernels.collective_time(nb, 10e-6, 25e9), bytes=nb)
    pts = [{"op": op, "bytes": nb, "time_s": float(kernels.collective_time(
        bus_bytes(op, nb, 4), 30e-6, 150e9))} for op in ("all_reduce", "all_gather")
        for nb in (1 << 12, 1 << 20, 1 << 26)]
    R["collectives/nccl/n4"] = {"status": "ok", "backend": "nccl", "world_size": 4,
                                "ops_ok": ["all_gather", "all_reduce"], "points": pts}

    prof = build.build_profile(dev, R, "calibrate --test").profile
    assert prof.device.gpu_id == "fake" and prof.device.peak_tflops == P
    assert prof.launch_overhead_us == pytest.approx(6.0)
    assert prof.compiled_launch_overhead_us == pytest.approx(20.0)
    assert prof.memory_bw_eff == pytest.approx(0.8, rel=1e-4)
    for prec, (e, xh, _) in gem.items():
        assert prof.gemm[prec].e_max == pytest.approx(e, rel=1e-3)
        assert prof.gemm[prec].x_half == pytest.approx(xh, rel=1e-3)
    a = prof.attention
    assert (a.flash_fwd, a.flash_bwd) == (pytest.approx(0.5, rel=1e-4), pytest.approx(0.4, rel=1e-4))
    assert a.mem_efficient_fwd == pytest.approx(0.3, rel=1e-4)
    assert a.mem_efficient_bwd == pytest.approx(0.25, rel=1e-4)
    assert prof.optimizer_bw_eff == {"foreach": pytest.approx(0.6, rel=1e-4)}
    assert prof.host_to_device_gbs == pytest.approx(25.0, rel=1e-3)
    assert prof.cpu_adam_gparams_per_s == pytest.approx(2.0)
    c = prof.collectives["local"]
    assert c.alpha_us == pytest.approx(30.0, rel=1e-3) and c.busbw_gbs == pytest.approx(150.0, rel=1e-3)


def test_only_that_matches_nothing_is_a_usage_error(tmp_path, capsys):
    """A mistyped --only names the groups and writes no profile (it used to fit one from nothing)."""
    out = tmp_path / "p.json"
    rc, _, err = _run(["--tiny", "--out", str(out), "--only", "gemm,nosuchbench"], capsys)
    assert rc == 2 and "'nosuchbench' matches no benchmark" in err and "gemm" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "p.measurements.json").exists()
