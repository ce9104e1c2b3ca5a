"""The `simulate` command end to end: output, JSON object, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

from simulator.cli import main

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
    (["--gpus", "8x3090", "--model", "pythia-1b", "--micro-batch", "1000"], "per-GPU batch"),
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
    r = subprocess.run([sys.executable, "-m", "simulator.cli", "--gpus", "8x3090", "--model", "pythia-160m", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["feasible"]


def test_validate_published(capsys):
    code = main(["validate-published", "--json"])
    out, _ = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and d["n"] == 52 and 0 < d["mape_pct"] < 1000


def test_validate_published_bad_file(tmp_path, capsys):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    assert main(["validate-published", str(f)]) == 2
    assert "lacks column" in capsys.readouterr().err
