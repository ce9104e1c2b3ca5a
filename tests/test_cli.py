"""The `simulate` command end to end: output, JSON object, exit codes, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.engine.setup import setup
from simulator.frontends.cli import main

JSON_KEYS = {"model", "hardware", "strategy", "feasible", "reasons", "step_time_s", "breakdown_s",
             "tokens_per_s", "mfu", "hfu", "memory_gib", "days", "days_at_peak"}


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_summary(capsys):
    code, out, err = run(["--gpus", "8x3090", "--model", "pythia-1b"], capsys)
    assert code == 0, err
    for text in ("Pythia-1B", "1.01 B parameters", "RTX 3090", "Fastest feasible", "MFU", "HFU",
                 "memory/GPU", "days", "floor at 100% of peak"):
        assert text in out


def test_a_profile_without_validation_says_it_has_no_interval(capsys, tmp_path):
    path = Path(__file__).parent.parent / "calibration" / "profiles" / "cpu-amd-epyc-avx512.json"
    prof = json.loads(path.read_text())
    args = ["--gpus", "1xlocal", "--model", "gpt2", "--tokens", "100000000", "--profile"]
    code, out, err = run([*args, str(path)], capsys)
    assert code == 0, err
    assert "80% interval" in out and "no 80% interval" not in out
    prof["validation"] = None  # as `calibrate` writes it, before `validate --update-profile`
    (tmp_path / "p.json").write_text(json.dumps(prof))
    code, out, err = run([*args, str(tmp_path / "p.json")], capsys)
    assert code == 0, err
    assert "no 80% interval" in " ".join(out.split()) and "update-profile" in out


def test_json_object(capsys):
    code, out, _ = run(["--gpus", "8x3090", "--model", "pythia-1b", "--json", "--top", "3"], capsys)
    assert code == 0
    d = json.loads(out)
    assert JSON_KEYS <= set(d)
    assert d["model"]["params"] == 1011781632
    assert {"precision", "attention", "compile", "checkpointing", "sharding", "offload", "micro_batch",
            "grad_accum"} <= set(d["strategy"])
    assert {"weights", "gradients", "optimizer", "activations", "total", "capacity"} <= set(d["memory_gib"])
    assert len(d["top"]) == 3
    assert d["top"][0]["step_time_s"] <= d["top"][1]["step_time_s"] <= d["top"][2]["step_time_s"]


def test_pinned_knobs_are_respected(capsys):
    code, out, _ = run(["--gpus", "4xa100", "--model", "pythia-410m", "--json", "--sharding", "zero2",
                        "--checkpointing", "full", "--no-compile", "--attention", "eager", "--micro-batch", "7"], capsys)
    s = json.loads(out)["strategy"]
    assert (s["sharding"], s["checkpointing"], s["compile"], s["attention"], s["micro_batch"]) == (
        "zero2", "full", False, "eager", 7)
    assert s["grad_accum"] == 37  # 256 per GPU / 7 -> 37 micro-batches, the last one smaller


def test_nothing_fits_exit_1_with_numbers(capsys):
    code, out, _ = run(["--gpus", "3090", "--model", "llama-2-13b", "--sharding", "ddp", "--json"], capsys)
    assert code == 1
    d = json.loads(out)
    assert not d["feasible"]
    assert any("GiB" in r and "RTX 3090" in r for r in d["reasons"])
    assert d["suggestions"]


@pytest.mark.parametrize("args, needle", [
    (["--gpus", "8x3009", "--model", "pythia-1b"], "did you mean"),
    (["--gpus", "8x", "--model", "pythia-1b"], "8x"),
    (["--gpus", "0x3090", "--model", "pythia-1b"], "0"),
    (["--gpus", "8x3090", "--model", "pythia-1c"], "pythia-1c"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--micro-batch", "0"], "--micro-batch"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--tokens", "-5"], "--tokens"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--sharding", "zero9"], "zero9"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--precision", "fp64"], "fp64"),
    (["--gpus", "8x3090", "--model", "/nonexistent/config.json"], "config.json"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--micro-batch", "2000"], "per-GPU batch"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--inter-node", "-1"], "--inter-node"),
    (["--gpus", "8x3090", "--model", "pythia-1b", "--sharding", "ddp", "--offload", "all"], "--offload"),
    (["--gpus", "1xlocal", "--model", "pythia-1b"], "--profile"),
    (["--gpus", "8x3090"], "--model"),
])
def test_usage_errors_one_line_exit_2(args, needle, capsys):
    code, out, err = run(args, capsys)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_bad_config_files(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = run(["--gpus", "8x3090", "--model", str(bad)], capsys)
    assert code == 2 and "JSON" in err
    bad.write_text(json.dumps({"model_type": "t5"}))
    code, _, err = run(["--gpus", "8x3090", "--model", str(bad)], capsys)
    assert code == 2 and "gpt_neox" in err and "llama" in err


def test_console_script_in_subprocess():
    r = subprocess.run([sys.executable, "-m", "simulator.frontends.cli", "--gpus", "8x3090", "--model", "pythia-160m", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["feasible"]


def test_validate_published(capsys):
    code = main(["validate-published", "--json"])
    out, _ = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and d["n"] >= 60 and 0 < d["mape_pct"] < 1000  # every simulable bundled dev run
    assert {c["profile"] for c in d["cross_validated"]} >= {"h100-sxm-fitted", "a100-80gb-sxm-fitted"}


def test_validate_published_bad_file(tmp_path, capsys):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    assert main(["validate-published", str(f)]) == 2
    err = capsys.readouterr().err
    assert "lacks column" in err or "not a runs file" in err  # the runs loader names what is missing

def _profile_dict():
    from simulator.hardware.catalog import default_profile

    return default_profile("rtx3090").model_dump(mode="json")


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("gemm"), "gemm"),
    (lambda d: d.update(schema_version=99), "schema_version"),
    (lambda d: d["gemm"]["bf16"].update(e_max=float("nan")), "e_max"),
    (lambda d: d.update(memory_bw_eff=1.7), "memory_bw_eff"),
    (lambda d: d["device"].update(gpu_id="h100-sxm"), "gpu_id"),
])
def test_malformed_profile_names_file_and_field(tmp_path, capsys, mutate, needle):
    d = _profile_dict()
    mutate(d)
    f = tmp_path / "bad-profile.json"
    f.write_text(json.dumps(d))  # json writes NaN literally, as a broken calibration would
    code, _, err = run(["--gpus", "8x3090", "--model", "pythia-1b", "--profile", str(f)], capsys)
    assert code == 2
    assert "bad-profile.json" in err or "h100" in err
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_profile_not_json(tmp_path, capsys):
    f = tmp_path / "p.json"
    f.write_text("{oops")
    code, _, err = run(["--gpus", "8x3090", "--model", "pythia-1b", "--profile", str(f)], capsys)
    assert code == 2 and "p.json" in err and "JSON" in err


def test_calibrated_profile_drives_a_catalog_gpu(tmp_path, capsys):
    d = _profile_dict()
    for p in ("bf16", "fp16"):
        d["gemm"][p]["e_max"] = 0.4  # a slower measured card
    f = tmp_path / "slow.json"
    f.write_text(json.dumps(d))
    _, out, _ = run(["--gpus", "8x3090", "--model", "pythia-160m", "--json"], capsys)
    _, out_slow, _ = run(["--gpus", "8x3090", "--model", "pythia-160m", "--json", "--profile", str(f)], capsys)
    assert json.loads(out_slow)["days"] > json.loads(out)["days"]


def test_calibrated_local_collectives_drive_the_intra_node_link(tmp_path, capsys):
    d = _profile_dict()
    d["collectives"] = {"local": {"alpha_us": 50.0, "busbw_gbs": 0.5, "source": "test: a slow measured link"}}
    f = tmp_path / "slowlink.json"
    f.write_text(json.dumps(d))
    args = ["--gpus", "8x3090", "--model", "pythia-1b", "--json", "--sharding", "zero3", "--micro-batch", "4"]
    _, out, _ = run(args, capsys)
    _, slow, _ = run(args + ["--profile", str(f)], capsys)
    assert json.loads(slow)["breakdown_s"]["exposed_comm"] > 5 * json.loads(out)["breakdown_s"]["exposed_comm"]


def test_unknown_subcommand(capsys):
    code, _, err = run(["compair", "--model", "pythia-1b"], capsys)
    assert code == 2 and "compare" in err and "did you mean" in err


def test_internal_error_is_one_line_exit_3(monkeypatch, capsys):
    from simulator.answer import api

    def boom(*a, **k):
        raise RuntimeError("simulated bug\nsecond line")

    monkeypatch.setattr(api, "answer", boom)
    monkeypatch.delenv("SIMULATOR_DEBUG", raising=False)
    code, _, err = run(["--gpus", "8x3090", "--model", "pythia-1b"], capsys)
    assert code == 3
    assert "RuntimeError: simulated bug" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra", [[], ["--top", "3"], ["--json"]])
def test_closed_pipe_exits_0_quietly(extra):
    """``simulate ... | head -1`` (here a reader that has already gone): rich's table output ends
    with exit 0 like --json does, not rich's own exit 1 ("nothing fits" for us)."""
    cmd = " ".join([sys.executable, "-m", "simulator.frontends.cli", "--gpus", "8x3090", "--model", "pythia-160m", *extra])
    proc = subprocess.run(["bash", "-c", f"{cmd} | true; exit ${{PIPESTATUS[0]}}"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""


def test_top_lists_distinct_strategies(capsys):
    """--top N: no two listed plans differ only in micro-batch and accumulation (the app's list)."""
    code, out, _ = run(["--gpus", "8x3090", "--model", "pythia-1b", "--json", "--top", "6"], capsys)
    assert code == 0
    keys = [tuple((k, v) for k, v in sorted(t["strategy"].items()) if k not in ("micro_batch", "grad_accum", "dp"))
            for t in json.loads(out)["top"]]
    assert len(keys) == 6 and len(set(keys)) == 6


def test_output_piped_into_a_reader_that_stops_is_not_an_error():
    """``simulate ... --json | head -c 100``: the closed pipe ends quietly, not as an internal error."""
    proc = subprocess.run(f"{sys.executable} -m simulator.frontends.cli --gpus 8x3090 --model pythia-160m --json | head -c 100",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


def test_distinct_plans_keep_layouts_and_collapse_micro_batches():
    """SearchResult.distinct (used by --top and the app): exactly one plan per strategy apart from
    micro-batch and accumulation, the fastest one; tensor/pipeline layouts stay apart."""
    from simulator.answer import api

    res = api.run_search("llama-2-7b", "2x8xa100-80gb")
    step = res.table.step_time

    def key(i):
        d = res.table.strategy(int(i)).model_dump()
        return tuple(v for k, v in d.items() if k not in ("micro_batch", "grad_accum", "dp"))

    fastest: dict = {}
    for i in res.order:
        fastest.setdefault(key(i), step[i])
    got = res.distinct()
    assert sorted(key(i) for i in got) == sorted(fastest)
    assert all(step[i] == fastest[key(i)] for i in got)
    assert len({(k[-4], k[-3]) for k in fastest}) > 1  # several (tp, pp) layouts feasible and listed


def test_search_time_excludes_loading(monkeypatch):
    """"searched in N ms" times the search, not reading the catalog, profile and presets."""
    import time

    from simulator.answer import api

    real = setup

    def slow_setup(*args, **kw):
        time.sleep(0.5)  # a cold catalog/profile/preset load
        return real(*args, **kw)

    monkeypatch.setattr(api, "setup", slow_setup)
    assert api.answer("pythia-160m", "8x3090").plan.search_ms < 400


def test_help_usage_line_names_every_subcommand(capsys):
    # the first lines a newcomer reads list the subcommands, not only the main form's flags
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert usage.startswith("usage: simulate --model MODEL --gpus GPUS")
    from simulator.frontends.cli import SUBCOMMANDS
    assert all(sub in usage for sub in SUBCOMMANDS)


def test_readme_grant_writers_commands_run_as_written(tmp_path, monkeypatch):
    # the README's "For grant writers" block, each command as printed there, in a fresh folder
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text.split("## For grant writers", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    cmds = [line.split(">")[0].split() for line in block.strip().splitlines()]
    assert [c[0] for c in cmds] == ["simulate"] * 3
    monkeypatch.chdir(tmp_path)
    for cmd in cmds:
        r = subprocess.run([sys.executable, "-m", "simulator.frontends.cli", *cmd[1:]], capture_output=True, text=True)
        assert r.returncode == 0, (cmd, r.stderr[-500:])
    assert (tmp_path / "budget" / "budget-pythia-1b.md").is_file() and (tmp_path / "options.csv").is_file()
