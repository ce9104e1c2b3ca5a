"""validate: torch models match ModelSpec counts; real steps give predicted/measured rows; the
profile's validation summary feeds simulate's interval; CSV merge; torchrun DDP smoke run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibration import validate as V  # noqa: E402
from calibration.device import detect  # noqa: E402
from calibration.torch_model import build_model  # noqa: E402
from simulator.answer.api import simulate  # noqa: E402
from simulator.core.errors import UsageError  # noqa: E402
from simulator.hardware import catalog as hardware  # noqa: E402
from simulator.hardware.profile import CollectiveFit, DeviceInfo, load_profile, save_profile  # noqa: E402
from simulator.model.presets import get_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = {"base": "pythia-14m", "n_layers": 2, "hidden": 64, "n_heads": 4, "ffn_hidden": 128,
        "vocab_size": 256, "max_positions": 256, "default_seq_len": 32}


#: this host's CPU as calibrate and validate name it: validate refuses another device's profile
HOST = detect("cpu").name


def _profile(path: Path, local_fit: bool = False) -> Path:
    """A loadable profile of this host's CPU (the RTX 3090 default efficiencies on made-up CPU peaks)."""
    p = hardware.default_profile("rtx3090")
    dev = DeviceInfo(kind="cpu", name=HOST, peak_tflops={"fp32": 0.05, "bf16": 0.01},
                     mem_bw_gbs=10.0, memory_gib=8.0, usable_memory_gib=7.0)
    coll = {"local": CollectiveFit(alpha_us=50.0, busbw_gbs=2.0, source="test")} if local_fit else {}
    save_profile(p.model_copy(update={"device": dev, "name": "test-cpu", "collectives": coll,
                                      "validation": None}), path)
    return path


def _suite(path: Path, configs: list[dict]) -> Path:
    path.write_text(json.dumps({"name": "unit", "warmup": 1, "steps": 1, "models": {"tiny": TINY},
                                "configs": configs}))
    return path


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = V.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name", ["pythia-160m", "gpt2", "llama-3-8b", "mistral-7b", "mpt-7b-hf",
                                  "mpt-125m", "tinyllama-1.1b", "qwen2.5-0.5b", "gpt2-medium"])
def test_torch_param_count_matches_spec(name):
    spec = get_model(name)
    assert sum(p.numel() for p in build_model(spec, device="meta").parameters()) == spec.n_params()


def test_default_suite_models_match_and_suite_is_varied():
    suite = V.load_suite(V.DEFAULT_SUITE)
    assert len(suite.configs) >= 12
    for c in suite.configs:
        assert sum(p.numel() for p in build_model(c.spec, device="meta").parameters()) == c.spec.n_params()
    knobs = {(c.precision, c.attention, c.checkpointing) for c in suite.configs}
    assert {"fp32", "bf16"} <= {k[0] for k in knobs} and {"eager", "sdpa"} <= {k[1] for k in knobs}
    assert {"none", "full"} <= {k[2] for k in knobs}
    assert len({c.spec.hidden for c in suite.configs}) >= 3 and len({c.seq_len for c in suite.configs}) >= 3


@pytest.mark.parametrize("model", [TINY, {**TINY, "base": "mpt-7b-hf"},
                                   {**TINY, "base": "tinyllama-1.1b", "n_kv_heads": 2},
                                   {**TINY, "base": "gpt2"}])
def test_eager_and_sdpa_attention_agree(model):
    spec = V.suite._spec_from("t", model)
    torch.manual_seed(0)
    a = build_model(spec, "eager")
    b = build_model(spec, "sdpa")
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, spec.vocab_size, (2, 16))
    y = torch.randint(0, spec.vocab_size, (2, 16))
    assert torch.allclose(a(x, y), b(x, y), atol=1e-5)
    ck = build_model(spec, "sdpa", "full")
    ck.load_state_dict(a.state_dict())
    ck(x, y).backward()
    a(x, y).backward()
    assert torch.allclose(ck.blocks[0].attn.qkv.weight.grad, a.blocks[0].attn.qkv.weight.grad, atol=1e-5)


def test_one_config_produces_predicted_and_measured(tmp_path, capsys):
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 32, "micro_batch": 2,
                                          "grad_accum": 2, "attention": "eager", "checkpointing": "full"}])
    rc, out, err = _run(["--profile", str(prof), "--suite", str(suite), "--json"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    (row,) = res["rows"]
    assert row["id"] == "tiny-s32-mb2x2-fp32-eager-ckpt" and row["status"] == "ok"
    assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0
    assert row["measured_fwd_s"] > 0 and row["measured_bwd_s"] > 0 and row["measured_opt_s"] > 0
    assert res["n"] == 1 and res["mape_pct"] == pytest.approx(abs(row["error_pct"]))


def test_update_profile_gives_interval_and_csv_merges(tmp_path, capsys):
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [
        {"model": "tiny", "seq_len": 16, "micro_batch": 1},
        {"model": "tiny", "seq_len": 32, "micro_batch": 2, "attention": "eager"},
        {"model": "tiny", "seq_len": 16, "micro_batch": 2, "precision": "bf16"},
    ])
    out_csv = tmp_path / "r.csv"
    out_csv.write_text("id,measured_step_s,note\nolder-run,1.0,kept\n")  # an earlier result
    rc, out, err = _run(["--profile", str(prof), "--suite", str(suite), "--csv", str(out_csv),
                         "--update-profile"], capsys)
    assert rc == 0, err
    assert "mean absolute percentage error over 3 configurations" in out
    val = load_profile(prof).validation
    assert val is not None and val.n == 3 and len(val.log_ratio_residuals) == 3
    assert val.source.startswith("validate unit on ") and val.mape >= 0
    spec = V.suite._spec_from("tiny", TINY)
    plan = simulate(spec, "1xlocal", profile=str(prof), seq_len=32, global_batch=2, steps=10)
    assert plan.interval_days is not None and plan.interval_days[0] <= plan.days <= plan.interval_days[1]
    rows = list(csv.DictReader(out_csv.open()))
    assert [r["id"] for r in rows][0] == "older-run" and rows[0]["note"] == "kept" and len(rows) == 4
    # a second run replaces same-id rows, keeps the rest; no temp files are left behind
    V.merge_csv(out_csv, [{"id": rows[1]["id"], "measured_step_s": 9.0}, {"id": "new", "model": "m"}])
    rows2 = list(csv.DictReader(out_csv.open()))
    assert len(rows2) == 5 and {r["id"] for r in rows2} >= {"older-run", "new"}
    assert [r["measured_step_s"] for r in rows2 if r["id"] == rows[1]["id"]] == ["9.0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "r.csv", "s.json"]


def test_measured_rows_are_repredicted_without_running(tmp_path, capsys, monkeypatch):
    """--measured keeps the measured times of an earlier --csv and predicts them again with
    another profile; no training step runs."""
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1},
                                         {"model": "tiny", "seq_len": 32, "micro_batch": 2}])
    cfgs = V.load_suite(suite).configs
    slow = _profile(tmp_path / "slow.json")
    m = V.Measured("ok", "", 0.5, 0.2, 0.25, 0.0, 0.05, None, 0.45, 1.2)
    meta = {"steps": 3, "warmup": 1, "device": HOST, "suite": "unit", "date": "2026-12-01T00:00:00+00:00",
            "torch": "x", "loadavg_1min": 0.1, "profile": "old"}
    V.merge_csv(tmp_path / "r.csv", [V.make_row(c, m, V.predict(c, load_profile(slow)), 1, meta) for c in cfgs[:1]])
    monkeypatch.setattr(V.cli, "measure", lambda *a, **k: pytest.fail("--measured must not run training steps"))
    fast = load_profile(slow).model_copy(update={"device": load_profile(slow).device.model_copy(
        update={"peak_tflops": {"fp32": 0.5, "bf16": 0.1}, "mem_bw_gbs": 100.0}), "name": "fast"})
    save_profile(fast, tmp_path / "fast.json")
    out = {}
    for name in ("slow", "fast"):
        rc, text, err = _run(["--profile", str(tmp_path / f"{name}.json"), "--suite", str(suite),
                              "--measured", str(tmp_path / "r.csv"), "--json"], capsys)
        assert rc == 0, err
        (row,) = json.loads(text)["rows"]  # only the config with a measured row
        assert row["id"] == cfgs[0].id and row["measured_step_s"] == 0.5 and row["measured_opt_s"] == 0.05
        assert row["date"] == meta["date"] and row["profile"] == load_profile(tmp_path / f"{name}.json").name
        assert row["predicted_step_s"] == pytest.approx(V.predict(cfgs[0], load_profile(tmp_path / f"{name}.json"))["step"])
        out[name] = row["predicted_step_s"]
    assert out["fast"] < out["slow"]
    rc, _, err = _run(["--profile", str(slow), "--suite", str(suite), "--measured", str(tmp_path / "no.csv")], capsys)
    assert rc == 2 and "--measured" in err and len(err.strip().splitlines()) == 1


def test_draw_coverage_checks_each_draw_against_the_others():
    rows = lambda xs: [{"log_ratio": x} for x in xs]  # noqa: E731
    same = [rows(np.linspace(-0.1, 0.1, 21)) for _ in range(3)]
    assert all(c >= 0.75 for c in V.draw_coverage(same))
    # a draw measured while the host ran a third faster than in the others lies outside their interval
    shifted = same[:2] + [rows(np.linspace(-0.1, 0.1, 21) - 0.3)]
    assert V.draw_coverage(shifted)[2] == 0.0
    assert V.draw_coverage(same[:1]) == [] and V.draw_coverage([rows([0.1]), []])[1] is None


def test_several_measured_draws_are_pooled_into_the_profiles_interval(tmp_path, capsys, monkeypatch):
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": s, "micro_batch": 1} for s in (8, 16, 24, 32)])
    cfgs = V.load_suite(suite).configs
    prof = _profile(tmp_path / "p.json")
    meta = {"steps": 3, "warmup": 1, "device": HOST, "suite": "unit", "torch": "x", "loadavg_1min": 0.1}
    for i, scale in enumerate((1.0, 1.5)):
        rows = []
        for c in cfgs:
            step = scale * V.predict(c, load_profile(prof))["step"]
            m = V.Measured("ok", "", step, 0.3 * step, 0.5 * step, 0.0, 0.2 * step, None, step, 1.1)
            rows.append(V.make_row(c, m, V.predict(c, load_profile(prof)), 1, {**meta, "date": f"2026-12-0{i + 1}T00:00"}))
        V.merge_csv(tmp_path / f"d{i}.csv", rows)
    monkeypatch.setattr(V.cli, "measure", lambda *a, **k: pytest.fail("--measured must not run training steps"))
    draws = [str(tmp_path / "d0.csv"), str(tmp_path / "d1.csv")]
    rc, text, err = _run(["--profile", str(prof), "--suite", str(suite), "--measured", *draws, "--json",
                          "--update-profile"], capsys)
    assert rc == 0, err
    out = json.loads(text)
    assert out["n"] == 8 and [d["n"] for d in out["draws"]] == [4, 4]
    assert [round(d["mape_pct"]) for d in out["draws"]] == [0, 33]
    val = load_profile(prof).validation
    assert val.n == 8 and "2 draws pooled" in val.source and len(val.log_ratio_residuals) == 8
    rc, _, err = _run(["--profile", str(prof), "--suite", str(suite), "--measured", *draws,
                       "--csv", str(tmp_path / "x.csv")], capsys)
    assert rc == 2 and "--csv takes the rows of one --measured file" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.csv").exists()
    # the same draw twice would count its residuals twice
    rc, _, err = _run(["--profile", str(prof), "--suite", str(suite), "--measured", draws[0], draws[1], draws[0]],
                      capsys)
    assert rc == 2 and "more than once" in err and "d0.csv" in err and len(err.strip().splitlines()) == 1


def test_read_only_csv_is_refused_before_the_suite_runs(tmp_path, capsys, monkeypatch):
    """--csv to a file the user may not write used to run the whole suite and then exit 2
    without the rows; now it is checked first, as --update-profile is."""
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1}])
    out_csv = tmp_path / "r.csv"
    out_csv.write_text("id,measured_step_s\nolder-run,1.0\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode & os.W_OK and Path(p) == out_csv
                        else real_access(p, mode))
    monkeypatch.setattr(V.cli, "measure", lambda *a, **k: pytest.fail("the suite ran before --csv was checked"))
    rc, _, err = _run(["--profile", str(prof), "--suite", str(suite), "--csv", str(out_csv)], capsys)
    assert rc == 2 and "--csv" in err and "not writable" in err and len(err.strip().splitlines()) == 1
    assert out_csv.read_text() == "id,measured_step_s\nolder-run,1.0\n"


def test_another_devices_profile_is_refused_and_kept(tmp_path, capsys, monkeypatch):
    """validate --update-profile stored one device's residuals in another device's profile: a GPU
    profile's interval from CPU steps ("real runs 2,048% slower"), after a warning or none at all
    (--measured). Refused now, as simulate refuses it: one line naming both devices, file intact."""
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1}])
    cfg = V.load_suite(suite).configs[0]
    cpu = load_profile(_profile(tmp_path / "cpu.json"))
    m = V.Measured("ok", "", 0.5, 0.2, 0.25, 0.0, 0.05, None, 0.45, 1.2)
    meta = {"steps": 3, "warmup": 1, "suite": "unit", "date": "2026-12-01T00:00:00+00:00", "torch": "x"}
    V.merge_csv(tmp_path / "cpu.csv", [V.make_row(cfg, m, V.predict(cfg, cpu), 1, {**meta, "device": HOST})])
    monkeypatch.setattr(V.cli, "measure", lambda *a, **k: pytest.fail("another device's profile was measured against"))
    for gpu in ("rtx3090", "a100-80gb-sxm"):
        prof = tmp_path / f"{gpu}.json"
        save_profile(hardware.default_profile(gpu), prof)
        before = prof.read_bytes()
        name = hardware.default_profile(gpu).device.name
        for how in (["--measured", str(tmp_path / "cpu.csv")], []):  # earlier rows, and steps run here
            rc, _, err = _run(["--profile", str(prof), "--suite", str(suite), *how, "--update-profile"], capsys)
            assert rc == 2 and len(err.strip().splitlines()) == 1, err
            assert repr(name) in err and repr(HOST) in err
            assert prof.read_bytes() == before
    # rows of the profile's own catalog GPU, as torch names it, are its own
    a100 = tmp_path / "a100-80gb-sxm.json"
    V.merge_csv(tmp_path / "a100.csv", [V.make_row(cfg, m, {}, 1, {**meta, "device": "NVIDIA A100-SXM4-80GB"})])
    rc, _, err = _run(["--profile", str(a100), "--suite", str(suite), "--measured", str(tmp_path / "a100.csv"),
                       "--update-profile"], capsys)
    assert rc == 0, err
    assert load_profile(a100).validation.n == 1
    V.merge_csv(tmp_path / "a40.csv", [V.make_row(cfg, m, {}, 1, {**meta, "device": "NVIDIA A100-SXM4-40GB"})])
    rc, _, err = _run(["--profile", str(a100), "--suite", str(suite), "--measured", str(tmp_path / "a40.csv")],
                      capsys)
    assert rc == 2 and "NVIDIA A100-SXM4-40GB" in err
    # the same CPU with another thread count (torchrun gives each rank one): a warning, as before
    other = HOST.rsplit(" (", 1)[0] + " (7 threads)"
    V.merge_csv(tmp_path / "t7.csv", [V.make_row(cfg, m, {}, 1, {**meta, "device": other})])
    rc, _, err = _run(["--profile", str(tmp_path / "cpu.json"), "--suite", str(suite), "--measured",
                       str(tmp_path / "t7.csv")], capsys)
    assert rc == 0 and "warning" in err and repr(other) in err


def test_csv_without_id_column_is_not_overwritten(tmp_path):
    f = tmp_path / "other.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError):
        V.merge_csv(f, [{"id": "x"}])
    assert f.read_text() == "a,b\n1,2\n"


def test_multi_process_prediction_needs_local_fit(tmp_path):
    cfg = V.load_suite(_suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16}])).configs[0]
    bare = load_profile(_profile(tmp_path / "p.json"))
    assert "no 'local' collectives fit" in V.predict(cfg, bare, world=2)["note"]
    fitted = load_profile(_profile(tmp_path / "q.json", local_fit=True))
    pred = V.predict(cfg, fitted, world=2)
    assert pred["step"] > V.predict(cfg, fitted, world=1)["step"]


@pytest.mark.parametrize("argv,needle", [
    (["--suite", "x.yaml"], "--profile"),
    (["--profile", "missing.json"], "cannot read profile"),
])
def test_usage_errors_are_one_line(argv, needle, capsys):
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_torchrun_ddp_two_processes(tmp_path):
    prof = _profile(tmp_path / "p.json", local_fit=True)
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 32, "micro_batch": 2,
                                          "grad_accum": 2}])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "calibration.validate", "--profile", str(prof), "--suite", str(suite), "--json",
         "--csv", str(tmp_path / "ddp.csv")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)  # only rank 0 prints
    (row,) = res["rows"]
    assert res["world"] == 2 and row["world"] == 2 and row["id"].endswith("-w2")
    assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0
    assert len(list(csv.DictReader((tmp_path / "ddp.csv").open()))) == 1


def test_gpu_default_suite_loads_with_at_least_12_configs():
    from calibration.validate import GPU_DEFAULT_SUITE, load_suite

    suite = load_suite(GPU_DEFAULT_SUITE)
    assert len(suite.configs) >= 12


def test_summary_reports_the_configs_measured_on_a_steady_host():
    """Rows measured while the host ran below 0.8 of its calibrated speed are counted apart (CSV
    rows hold strings); without host_speed there is no such line."""
    def row(err, speed):
        return {"error_pct": err, "log_ratio": 0.0, "predicted_step_s": 1.0, "measured_step_s": 1.0,
                "measured_min_s": 1.0, "host_speed": speed}

    s = V.summarize([row(-10.0, "0.95"), row(-40.0, "0.5"), row(20.0, 1.1)])
    assert s["steady"] == {"n": 2, "mape_pct": 15.0, "worst_pct": 20.0}
    assert "2 of 3 configurations, MAPE 15.0%" in V.format_table([], s)
    assert V.summarize([row(-10.0, None), row(5.0, "")])["steady"] is None


def test_timed_steps_reach_the_minimum_time_within_bounds():
    assert V.timed_steps(3, 0.01, 0.5) == 50  # 10 ms steps: 50 of them fill half a second
    assert V.timed_steps(3, 1.0, 0.5) == 3  # never fewer than asked
    assert V.timed_steps(1, 1e-4, 0.5) == V.MAX_ROUND_STEPS  # never more than the cap
    assert V.timed_steps(5, 0.01, 0.0) == 5  # 0: exactly the steps asked


def test_short_steps_are_timed_for_the_minimum_round_time(tmp_path, capsys):
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1}])
    base = ["--profile", str(prof), "--suite", str(suite), "--json", "--rounds", "1"]
    rc, out, err = _run([*base, "--min-round-s", "0"], capsys)
    assert rc == 0, err
    assert json.loads(out)["rows"][0]["steps"] == 1
    rc, out, err = _run([*base, "--min-round-s", "0.2"], capsys)
    (row,) = json.loads(out)["rows"]
    # a tiny step takes a few ms: more than one is timed, the cap bounds them
    assert rc == 0 and 1 < row["steps"] <= V.MAX_ROUND_STEPS and row["spread"] >= 1.0


@pytest.mark.parametrize("bad", ["-1", "nan", "61"])
def test_min_round_s_out_of_range_is_a_usage_error(bad, tmp_path, capsys):
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1}])
    rc, _, err = _run(["--profile", str(prof), "--suite", str(suite), "--min-round-s", bad], capsys)
    assert rc == 2 and "--min-round-s" in err and len(err.strip().splitlines()) == 1
    raw = json.loads(suite.read_text())
    suite.write_text(json.dumps({**raw, "min_round_s": "long"}))
    rc, _, err = _run(["--profile", str(prof), "--suite", str(suite)], capsys)
    assert rc == 2 and "min_round_s" in err and "'long'" in err


def test_timed_steps_start_after_the_step_that_settles_the_heap(tmp_path, capsys, monkeypatch):
    """The first step creates the optimizer's state; ``warmup`` steps follow it before any is timed,
    so a suite's warmup 1 never times the second step (a heap-growing transient on a CPU)."""
    calls = []
    real = torch.optim.AdamW.step

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted)
    prof = _profile(tmp_path / "p.json")
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 16, "micro_batch": 1}])
    rc, out, err = _run(["--profile", str(prof), "--suite", str(suite), "--json", "--rounds", "1",
                         "--min-round-s", "0"], capsys)
    assert rc == 0, err
    assert json.loads(out)["rows"][0]["steps"] == 1
    assert len(calls) == 3  # the first step, the suite's one warm-up step, the timed step


def test_warm_up_seeds_the_state_after_the_first_step():
    from calibration.torch_model import SEEN_SECOND_MOMENT, warm_up

    w = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([w], lr=1e-3, foreach=True)
    seen = []

    def step():
        seen.append(opt.state[w]["exp_avg_sq"].clone() if w in opt.state else None)
        (w * torch.tensor([1.0, 0.0, 0.0, 0.0])).sum().backward()  # three entries never get a gradient
        opt.step()
        opt.zero_grad(set_to_none=True)

    assert warm_up(step, opt, 2) > 0
    assert len(seen) == 3 and seen[0] is None
    assert torch.all(seen[1][1:] == SEEN_SECOND_MOMENT)  # seeded before the second step ran


def test_peak_memory_is_recorded_predicted_and_summarized(tmp_path, capsys):
    """A row holds the measured peak memory (CUDA: max_memory_allocated / max_memory_reserved; a
    CPU leaves it empty) beside the predicted one; the error, the CSV round trip (--measured) and
    the summary's memory line follow. The prediction covers this loop's foreach AdamW step (every
    gradient plus an fp32 copy of the second moments) and the reserve is never below the
    allocated peak."""
    suite = _suite(tmp_path / "s.json", [{"model": "tiny", "seq_len": 32, "micro_batch": 2}])
    (cfg,) = V.load_suite(suite).configs
    prof = load_profile(_profile(tmp_path / "p.json"))
    pred = V.predict(cfg, prof)
    P = cfg.spec.n_params()
    assert pred["reserved"] >= pred["mem"] >= (4 + 8 + 4 + 4) * P / V.GIB  # weights, moments, grads, sqrt copy
    m = V.Measured("ok", "", 0.5, 0.2, 0.25, 0.0, 0.05, None, 0.45, 1.2, mem_gib=0.9 * pred["mem"],
                   reserved_gib=pred["reserved"])
    meta = {"steps": 3, "warmup": 1, "device": "test cpu", "suite": "unit", "date": "2026-12-01T00:00:00+00:00",
            "torch": "x", "profile": "p"}
    row = V.make_row(cfg, m, pred, 1, meta)
    assert row["mem_error_pct"] == pytest.approx(100 / 0.9 - 100)
    V.merge_csv(tmp_path / "r.csv", [row])
    again, _ = V.read_measured(tmp_path / "r.csv")[cfg.id]
    assert again.mem_gib == pytest.approx(m.mem_gib) and again.reserved_gib == pytest.approx(m.reserved_gib)
    s = V.summarize([row, {**row, "mem_error_pct": -8.0}, {**row, "mem_error_pct": None}])
    assert s["memory"] == {"n": 2, "mape_pct": pytest.approx((100 / 0.9 - 100 + 8) / 2),
                           "signed_pct": pytest.approx((100 / 0.9 - 100 - 8) / 2), "worst_under_pct": -8.0,
                           "under_5pct": 1}
    assert "worst under-prediction -8.0%  (1 of 2 configurations" in V.format_table([row], s)
    cpu = V.make_row(cfg, V.Measured("ok", "", 0.5, 0.2, 0.25, 0.0, 0.05, None, 0.45, 1.2), pred, 1, meta)
    assert cpu["measured_mem_gib"] is None and cpu["mem_error_pct"] is None
    assert V.summarize([cpu])["memory"] is None


def test_validate_predicts_the_modules_its_torch_model_runs():
    """The loop's model (calibration/torch_model.py) is not transformers': nn.RMSNorm, one QKV and one
    gate/up projection, rotary tables cast to half. Its prediction counts those modules (a Llama block
    moves less than transformers' LlamaRMSNorm, q/k/v casts and fp32 rotary), and the default stack's
    count, which the Hugging Face steps are predicted with, is left as it was."""
    import torch.nn as nn

    from calibration.validate.predicting import VALIDATE_STACK
    from simulator.model.graphs import graph
    from simulator.strategy.stacks import get_stack

    spec = get_model("tinyllama-1.1b").model_copy(update={"n_layers": 2})
    model = build_model(spec, "sdpa", device="meta")
    block = model.blocks[0]
    assert isinstance(block.ln1, nn.RMSNorm)
    assert block.attn.qkv.out_features == spec.hidden + 2 * spec.kv_dim
    assert block.mlp.up.out_features == 2 * spec.ffn_hidden
    assert (VALIDATE_STACK["rmsnorm"], VALIDATE_STACK["projections"], VALIDATE_STACK["rotary_tables"]) == (
        "fused", "fused", "half")

    def moved(stack) -> float:
        g = graph(spec, 2048, np.array([8.0]), "bf16", "sdpa", False, stack)
        return sum(float(np.sum(op.bytes_fwd)) + float(np.sum(op.bytes_bwd))
                   for op in g.blocks[0].ops if op.kind == "elementwise")

    hf = get_stack(None)
    loop = hf.model_copy(update=VALIDATE_STACK)
    assert moved(loop) < 0.8 * moved(hf)
    assert moved(hf.model_copy(update={"rmsnorm": "eager", "projections": "per-family",
                                       "rotary_tables": "fp32"})) == moved(hf)
