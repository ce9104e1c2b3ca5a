"""calibrate --from-runs: the fit recovers known parameters, stays physical, stores provenance."""

import datetime
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration import from_runs as fr
from calibration.cli import main as calibrate
from simulator.answer import runs
from simulator.hardware.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent

HEADER = "model,gpus,seq_len,global_batch,micro_batch,precision,sharding,checkpointing,compile,attention,tokens_per_s,source\n"
ROWS = [  # model, gpus, seq, global batch, micro-batch, sharding, checkpointing, source
    ("pythia-160m", "8xa100-80gb-sxm", 2048, 256, 16, "ddp", "none", "teamA"),
    ("pythia-410m", "8xa100-80gb-sxm", 2048, 256, 8, "zero1", "none", "teamA"),
    ("pythia-1b", "8xa100-80gb-sxm", 2048, 512, 8, "fsdp-full", "none", "teamB"),
    ("pythia-1b", "2x8xa100-80gb-sxm", 4096, 256, 4, "fsdp-full", "full", "teamB"),
    ("pythia-2.8b", "2x8xa100-80gb-sxm", 2048, 512, 4, "fsdp-full", "full", "teamC"),
    ("pythia-410m", "8xa100-80gb-sxm", 8192, 64, 2, "ddp", "none", "teamC"),
]


def _write(path, tok_s):
    lines = [f"{m},{g},{s},{gb},{mb},bf16,{sh},{ck},false,sdpa,{t:.1f},{src}\n"
             for (m, g, s, gb, mb, sh, ck, src), t in zip(ROWS, tok_s, strict=True)]
    path.write_text(HEADER + "".join(lines))


def _synthetic(tmp_path, truth):
    """Runs 'measured' on a profile with known parameters: the fit must find them again."""
    f = tmp_path / "runs.csv"
    _write(f, [1.0] * len(ROWS))
    table = runs.simulable(runs.load_runs(f))
    base = fr.microbenchmark_profile("a100-80gb-sxm")
    true_prof = fr.apply(base, truth)
    times = [fr._resolve(r, base).step_time(true_prof) for _, r in table.iterrows()]
    _write(f, [gb * s / t for (_, _, s, gb, *_), t in zip(ROWS, times, strict=True)])
    return f


def test_fit_recovers_known_parameters(tmp_path):
    truth = {"tensor_sustained": 0.8, "attention_scale": 0.7}
    f = _synthetic(tmp_path, truth)
    table = runs.simulable(runs.load_runs(f))
    fitter = fr.Fitter(table, {"a100-80gb-sxm": fr.microbenchmark_profile("a100-80gb-sxm")},
                       params=("tensor_sustained", "attention_scale"))
    start = fr.mape_of(fitter.residuals(fitter.x0))
    fit = fitter.fit(cross_validate=True)
    got = fit.values("a100-80gb-sxm")
    assert start > 10
    assert got["tensor_sustained"] == pytest.approx(0.8, abs=0.02)
    assert got["attention_scale"] == pytest.approx(0.7, abs=0.05)
    assert fr.mape_of(fit.residuals) < 1.0 and fr.mape_of(fit.loo) < 2.0 and fr.mape_of(fit.loso) < 3.0


def test_apply_never_exceeds_peak():
    base = fr.microbenchmark_profile("rtx3090")
    hot = fr.apply(base, {"tensor_sustained": 1.0, "attention_scale": 1.1, "memory_bw_scale": 1.1})
    assert all(g.e_max <= 1.0 for g in hot.gemm.values())
    assert hot.attention.flash_fwd <= 1.0 and hot.memory_bw_eff <= 1.0
    assert max(hot.optimizer_bw_eff.values()) <= 1.0
    same = fr.apply(base, {p: v[0] for p, v in fr.PARAMS.items() if p != "layer_overhead_us"})
    assert same.gemm == base.gemm and same.attention == base.attention
    split = base.model_copy(update={"gemm_bwd": {"bf16": base.gemm["bf16"]}, "bw_eff_ops": {"norm": 0.5}})
    cool = fr.apply(split, {"tensor_sustained": 0.5, "memory_bw_scale": 0.5})
    assert cool.gemm_bwd["bf16"].e_max == pytest.approx(0.5 * base.gemm["bf16"].e_max)
    assert cool.bw_eff_ops["norm"] == pytest.approx(0.25)


def test_calibrate_from_runs_cli_writes_profile_with_provenance(tmp_path, capsys):
    f = _synthetic(tmp_path, {"tensor_sustained": 0.85, "collective_overlap": 0.5})
    out = tmp_path / "fitted.json"
    code = calibrate(["--from-runs", str(f), "--base-profile", "a100-80gb-sxm", "--out", str(out),
                      "--params", "tensor_sustained,collective_overlap"])
    text = capsys.readouterr().out
    assert code == 0 and "leave-one-source-out" in text and "teamB" in text
    prof = load_profile(out)
    # its own name and provenance: fitted today from these runs (it carried the base's, "published")
    today = datetime.date.today().isoformat()
    assert prof.name == f"a100-80gb-sxm (fitted to runs.csv {today})"
    assert prof.provenance.method == "fitted" and prof.provenance.date == today
    assert str(f) in prof.provenance.sources[0] and "a100-80gb-sxm-published" in prof.provenance.sources[1]
    assert prof.fit.n_runs == len(ROWS) and prof.fit.sources == {"teamA": 2, "teamB": 2, "teamC": 2}
    p = prof.fit.parameters["tensor_sustained"]
    assert p.lower <= p.value <= p.upper and p.value == pytest.approx(0.85, abs=0.03)
    assert prof.fit.mape_loo is not None and len(prof.validation.log_ratio_residuals) == len(ROWS)
    assert json.loads(out.read_text())["fit"]["base_profile"] == "a100-80gb-sxm-published"


def test_runs_of_another_device_than_the_base_profile_are_refused(tmp_path, capsys):
    """A CPU profile as --base-profile with A100 runs wrote a CPU profile carrying A100 factors and
    residuals; runs on another GPU than the base's are refused, one line, nothing written."""
    f = tmp_path / "runs.csv"
    _write(f, [1e5] * len(ROWS))
    out = tmp_path / "fitted.json"
    cpu = ROOT / "calibration" / "profiles" / "cpu-amd-epyc-avx512.json"
    for base in (str(cpu), "h100-sxm"):
        assert calibrate(["--from-runs", str(f), "--base-profile", base, "--out", str(out), "--no-cv"]) == 2
        err = capsys.readouterr().err
        assert "a100-80gb-sxm" in err and "one device" in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    mixed = f.read_text().replace("pythia-160m,8xa100-80gb-sxm", "pythia-160m,8xh100-sxm")
    f.write_text(mixed)
    assert calibrate(["--from-runs", str(f), "--out", str(out), "--no-cv"]) == 2  # base: the first run's GPU
    err = capsys.readouterr().err
    assert "h100-sxm" in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_physically_impossible_run_is_refused(tmp_path, capsys):
    """tokens_per_s=1e30 was fitted (every parameter at its bound, exit 0, no warning): a run
    above 100% of its GPUs' dense peak in model FLOPs is refused, one line, nothing written."""
    f = tmp_path / "runs.csv"
    _write(f, [1e5] * (len(ROWS) - 1) + [1e30])
    out = tmp_path / "fitted.json"
    assert calibrate(["--from-runs", str(f), "--base-profile", "a100-80gb-sxm", "--out", str(out), "--no-cv"]) == 2
    err = capsys.readouterr().err
    assert "runs.csv:7" in err and "MFU" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_parameters_at_a_bound_are_warned_about(tmp_path, capsys):
    """Runs faster than tensor cores at the full microbenchmark efficiency allow push
    tensor_sustained to its upper bound: the fit says so."""
    f = _synthetic(tmp_path, {"tensor_sustained": 1.0})
    lines = f.read_text().splitlines()
    rows = [ln.rsplit(",", 2) for ln in lines[1:]]
    f.write_text("\n".join([lines[0]] + [f"{a},{1.25 * float(t):.1f},{s}" for a, t, s in rows]) + "\n")
    code = calibrate(["--from-runs", str(f), "--base-profile", "a100-80gb-sxm", "--params", "tensor_sustained",
                      "--no-cv"])
    err = capsys.readouterr().err
    assert code == 0 and "warning" in err and "tensor_sustained[all] 1 (upper bound)" in err, err


@pytest.mark.parametrize("argv, msg", [
    (["--base-profile", "a100"], "--base-profile needs --from-runs"),
    (["--from-runs", "/nonexistent.csv"], "no such file"),
    (["--from-runs", "RUNS", "--params", "warp_speed"], "unknown fit parameter"),
    (["--from-runs", "RUNS", "--out", "x.txt"], "--out must end in .json"),
])
def test_calibrate_from_runs_bad_input(tmp_path, capsys, argv, msg):
    f = tmp_path / "runs.csv"
    _write(f, [1e5] * len(ROWS))
    argv = [str(f) if a == "RUNS" else a for a in argv]
    assert calibrate(argv) == 2
    assert msg in capsys.readouterr().err


def test_excluded_rows_are_skipped_with_reason(tmp_path):
    f = tmp_path / "runs.csv"
    _write(f, [1e5] * len(ROWS))
    df = pd.read_csv(f)
    df["tp"] = [1, 1, 1, 1, 2, 1]  # tensor parallelism is simulated (simulator.physics.parallel)
    df["micro_batch"] = df["micro_batch"].astype(float)
    df.loc[df.index[-1], "micro_batch"] = float("nan")
    df.to_csv(f, index=False)
    t = runs.load_runs(f)
    assert list(t["excluded"] == "") == [True] * 5 + [False]
    assert "micro-batch" in t["excluded"].iloc[-1]
    assert np.isfinite(t["grad_accum"].iloc[0])


def test_interval_bounds_widen_and_contain_the_estimate():
    from simulator.answer.uncertainty import bounds

    r = np.linspace(-0.2, 0.3, 41)
    lo, hi = bounds(r)
    wlo, whi = bounds(r, widen=1.5)
    assert wlo < lo <= 0.0 <= hi < whi
    assert bounds([0.1, 0.2, 0.3])[0] == 0.0  # all runs slower: the interval still holds the estimate


def test_left_out_coverage_is_leave_one_out_for_single_runs_and_per_group_otherwise():
    from simulator.answer.uncertainty import bounds, left_out_coverage

    held = np.random.default_rng(3).normal(0.0, 0.2, 12)
    by_hand = [float(bounds(np.delete(held, i))[0] <= held[i] <= bounds(np.delete(held, i))[1]) for i in range(12)]
    assert left_out_coverage([[x] for x in held]) == by_hand
    # a group shifted far from the others lies outside their interval; too few others: None
    assert left_out_coverage([held, held, held - 2.0])[2] == 0.0
    assert left_out_coverage([held[:2], []]) == [None, None]


def test_tensor_pipeline_runs_are_fitted_through_their_layout():
    """A run with tp or pp above 1 (Korthikanti et al. 2022: TP 8, PP 1-64) is evaluated under its
    one pinned layout: the fit's step time is simulate's with the same layout, for any profile,
    and the tensor-parallel collectives and pipeline bubble are in it (more than the plain view)."""
    from simulator.validation.published import simulate_run

    table = runs.simulable(runs.korthikanti_runs())
    assert len(table) == 8 and (table["tp"] == 8).all() and table["sequence_parallel"].sum() == 4
    base = fr.microbenchmark_profile("a100-80gb-sxm")
    slow = fr.apply(base, {"tensor_sustained": 0.6, "collective_busbw_eff": 0.5})
    for _, r in table.iloc[[1, 2]].iterrows():  # TP 8 PP 1 (sequence parallel), TP 8 PP 8
        m = fr._resolve(r, base)
        assert m.layout is not None and (m.layout.tp, m.layout.pp) == (int(r["tp"]), int(r["pp"]))
        for prof in (base, slow):
            assert m.step_time(prof) == pytest.approx(simulate_run(r, profile=prof).step_time_s, rel=1e-9)
        assert m.step_time(slow) > m.step_time(base)


def test_default_runs_span_three_a100_sources():
    t = runs.simulable(runs.default_runs())
    a100 = t[t["gpu"].str.startswith("a100")]
    assert len(a100) == 19 and a100["source"].map(runs.source_key).nunique() == 3


def test_fit_and_validate_published_simulate_a_run_alike(monkeypatch):
    """One definition of a run's knobs (runs.run_knobs): the fit's step time of a run equals
    validate-published's, for one run of every source and stack, under a non-default profile;
    and both go through run_knobs (a knob changed there changes both)."""
    from simulator.validation import published

    table = runs.simulable(runs.default_runs())
    keys = [table["source"].map(runs.source_key), "stack", "gpu", "checkpointing", "sharding", "sequence_parallel"]
    sample = table.groupby(keys, sort=False).head(1)
    assert len(sample) >= 8 and sample["stack"].nunique() >= 4 and (sample["tp"] > 1).any()
    for _, r in sample.iterrows():
        base = fr.microbenchmark_profile(r["gpu"])
        prof = fr.apply(base, {"tensor_sustained": 0.8, "attention_scale": 0.9, "collective_overlap": 0.5})
        assert fr._resolve(r, base).step_time(prof) == pytest.approx(
            published.simulate_run(r, profile=prof).step_time_s, rel=1e-9), r["run"]
    r = sample[sample["checkpointing"] == "none"].iloc[0]
    real = runs.run_knobs
    monkeypatch.setattr(runs, "run_knobs", lambda run: {**real(run), "checkpointing": "full"})
    prof = fr.microbenchmark_profile(r["gpu"])
    full = published.simulate_run(r, profile=prof)
    assert full.strategy["checkpointing"] == "full"
    assert fr._resolve(r, prof).step_time(prof) == pytest.approx(full.step_time_s, rel=1e-9)


def test_predict_applies_each_profile_once_per_parameter_vector(monkeypatch):
    """Fitter.predict builds one profile per GPU (and group) per parameter vector, not one per
    run, and reuses a run's step time when its group's values are unchanged; the numbers are the
    uncached ones."""
    table = runs.simulable(runs.default_runs())
    table = table[table["gpu"].isin(["a100-40gb-sxm", "h100-sxm"])].groupby("gpu").head(3).reset_index(drop=True)
    bases = {g: fr.microbenchmark_profile(g) for g in table["gpu"].unique()}
    fitter = fr.Fitter(table, bases, params=("tensor_sustained", "collective_overlap"))
    calls = []
    real = fr.apply
    monkeypatch.setattr(fr, "apply", lambda base, vals: calls.append(base.device.gpu_id) or real(base, vals))
    x = np.array([0.8, 0.9, 0.5])  # tensor_sustained per group (a100, h100), overlap shared
    got = fitter.predict(x)
    assert sorted(calls) == ["a100-40gb-sxm", "h100-sxm"]
    vals = fr._unpack(fitter.params, fitter.groups, x)
    want = [m.step_time(real(bases[g], vals[g])) for m, g in zip(fitter.models, fitter.run_gpu, strict=True)]
    assert got == pytest.approx(want, rel=1e-12)
    calls.clear()
    x2 = x.copy()
    x2[0] = 0.7  # only the A100 group's tensor factor moves: the H100 runs are not simulated again
    fitter.predict(x2)
    assert calls == ["a100-40gb-sxm"]


def test_microbenchmark_profile_is_read_once_and_copied(monkeypatch):
    fr._read_microbenchmark.cache_clear()
    reads = []
    real = fr.load_profile
    monkeypatch.setattr(fr, "load_profile", lambda f: reads.append(f) or real(f))
    a = fr.microbenchmark_profile("a100-80gb-sxm")
    b = fr.microbenchmark_profile("a100-80gb-sxm")
    assert len(reads) == 1 and a == b and a is not b
    a.layer_overhead_us = 123.0  # a caller's change does not reach the next caller
    assert fr.microbenchmark_profile("a100-80gb-sxm").layer_overhead_us != 123.0
