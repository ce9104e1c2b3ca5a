"""Issue 38, groups C and D: bad input is one line naming the bad value and exit 2 (a UsageError
in the API) — never an internal error, a non-finite figure, a NumPy warning or a silently absurd
answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.core.errors import UsageError
from simulator.frontends.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
RUNS_HEADER = ("model,gpus,seq_len,global_batch,micro_batch,precision,sharding,checkpointing,compile,"
               "attention,tokens_per_s,source\n")
RUN = "pythia-1b,8xa100-80gb-sxm,2048,256,8,bf16,fsdp-full,none,false,sdpa,{tok},wandb/run-17\n"


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_usage(code, err, needle):
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def _config(tmp_path, name="c.json", **changes):
    data = json.loads((FIXTURES / "SmolLM2-135M.json").read_text())
    data.update(changes)
    f = tmp_path / name
    f.write_text(json.dumps(data))
    return f


# --- runs CSVs (validate-published, calibrate --from-runs) ------------------------------------

@pytest.mark.parametrize("row, needle", [
    (RUN.format(tok="inf"), "got inf"),
    (RUN.format(tok="nan"), "tokens_per_s"),
    (RUN.format(tok="-5"), "got -5"),
    (RUN.format(tok="0"), "got 0"),
    ("pythia-1b,8xa100-80gb-sxm,2048\n", "3 fields, but the header has 12"),
    (RUN.format(tok="152000").rstrip() + ",extra,more\n", "14 fields"),
    (RUN.format(tok="1500000"), "above 100% is impossible"),  # 352% of dense peak
])
def test_validate_published_refuses_bad_runs(tmp_path, row, needle, capsys):
    f = tmp_path / "runs.csv"
    f.write_text(RUNS_HEADER + row)
    for extra in ([], ["--json"]):
        code, out, err = run(["validate-published", str(f), *extra], capsys)
        one_line_usage(code, err, needle)
        assert "line 2" in err or "runs.csv:2" in err, err
        assert "inf" not in out.lower() and "nan" not in out.lower()


def test_validate_published_json_is_strict_and_warning_free(tmp_path, capsys):
    import warnings

    f = tmp_path / "runs.csv"
    f.write_text(RUNS_HEADER + RUN.format(tok="152000"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, out, err = run(["validate-published", str(f), "--json"], capsys)
    assert code == 0, err
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_from_runs_refuses_infinite_throughput(tmp_path, capsys):
    from calibration.cli import main as calibrate

    f = tmp_path / "runs.csv"
    f.write_text(RUNS_HEADER + RUN.format(tok="inf"))
    code = calibrate(["--from-runs", str(f), "--no-cv"])
    _, err = capsys.readouterr()
    one_line_usage(code, err, "tokens_per_s")


# --- config and profile files --------------------------------------------------------------

def test_zero_heads_in_a_config(tmp_path, capsys):
    code, _, err = run(["--model", str(_config(tmp_path, num_attention_heads=0)), "--gpus", "8xa100-80gb-sxm"], capsys)
    one_line_usage(code, err, "'num_attention_heads' must be a positive integer, got 0")


@pytest.mark.parametrize("flag", ["--model", "--profile", "--prices"])
def test_deeply_nested_json(tmp_path, flag, capsys):
    f = tmp_path / "deep.json"
    f.write_text("[" * 100_000)
    args = {"--model": "pythia-160m", "--gpus": "8xa100-80gb-sxm", flag: str(f)}
    code, _, err = run([x for kv in args.items() for x in kv], capsys)
    one_line_usage(code, err, "too deeply")


def test_app_upload_of_zero_heads_and_deep_nesting():
    from simulator.frontends.explorer import inputs as app

    bad = json.dumps({**json.loads((FIXTURES / "SmolLM2-135M.json").read_text()), "num_attention_heads": 0})
    with pytest.raises(UsageError, match="num_attention_heads"):
        app.model_from_upload("config.json", bad.encode())
    with pytest.raises(UsageError, match="too deeply"):
        app.model_from_upload("config.json", b"[" * 100_000)
    with pytest.raises(UsageError, match="too deeply"):
        app.profile_from_upload("p.json", b"{\"a\":" * 100_000)


@pytest.mark.parametrize("time_s", [float("nan"), -1.0, float("inf"), "fast"])
@pytest.mark.parametrize("mode", ["--refit", "--resume"])
def test_damaged_measurements_are_refused(tmp_path, time_s, mode, capsys):
    from calibration.cli import main as calibrate

    src = Path(__file__).parents[1] / "calibration" / "profiles" / "cpu-intel-xeon.measurements.json"
    data = json.loads(src.read_text())
    key = next(iter(data["results"]))
    data["results"][key]["time_s"] = time_s
    (tmp_path / "p.measurements.json").write_text(json.dumps(data))
    (tmp_path / "p.json").write_text("{}")
    code = calibrate([mode, "--quick", "--out", str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    # --resume first warns about the host (allocator, load): the error is the last line
    last = err.strip().splitlines()[-1]
    one_line_usage(code, last, f"{key!r}: time_s must be a positive, finite number")
    assert "Traceback" not in err


def test_validate_refuses_a_suite_model_larger_than_memory(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from calibration import device
    from calibration import validate as V

    suite = tmp_path / "s.json"
    suite.write_text(json.dumps({"name": "unit", "warmup": 1, "steps": 1, "configs": [
        {"model": "pythia-14m", "seq_len": 32, "micro_batch": 1}]}))
    monkeypatch.setattr(device, "_meminfo_gib", lambda: (0.01, 0.01))  # a 10 MiB host
    # the RAM check, on any host: the profile is an EPYC's, whatever CPU runs the test
    monkeypatch.setattr("calibration.validate.cli.check_device", lambda *a, **k: None)
    prof = Path(__file__).parents[1] / "calibration" / "profiles" / "cpu-amd-epyc.json"
    code = V.main(["--profile", str(prof), "--suite", str(suite), "--device", "cpu", "--json"])
    _, err = capsys.readouterr()
    one_line_usage(code, err.strip().splitlines()[-1], "this host's RAM has 0.0 GiB")
    assert "pythia-14m" in err and "Traceback" not in err


def test_ascii_terminal_gets_ascii_stand_ins(monkeypatch):
    import io
    import sys

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--model", "pythia-160m", "--gpus", "8xa100-80gb-sxm"]) == 0
    out.flush()
    text = raw.getvalue().decode("ascii")
    assert "Pythia-160M | 0.16 B parameters" in text and "8 x A100" in text and "days" in text


# --- the API -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, needle", [
    ({"prices": "cheap"}, "prices must be a simulator.answer.costs.Prices"),
    ({"sequence_parallel": "yes"}, "sequence_parallel must be True, False or None"),
    ({"async_tp": "yes"}, "async_tp must be True, False or None"),
    ({"compile": 1}, "compile must be True, False or None"),
    ({"profile_any_gpu": "yes"}, "profile_any_gpu must be True, False or None"),
])
def test_api_refuses_malformed_knobs(kw, needle):
    import simulator

    with pytest.raises(UsageError, match=needle):
        simulator.simulate("pythia-160m", "8xa100-80gb-sxm", **kw)


def test_get_model_of_none_is_a_usage_error():
    from simulator.model.presets import get_model

    with pytest.raises(UsageError, match="model must be a preset name"):
        get_model(None)


def test_numpy_integers_are_integers():
    import numpy as np

    import simulator

    plan = simulator.simulate("pythia-160m", "8xa100-80gb-sxm", global_batch=np.int64(64), steps=np.int64(10),
                              seq_len=np.int64(2048),  # sequence parallelism needs tokens tp divides
                              micro_batch=np.int64(4), tp=np.int32(2), sequence_parallel=np.bool_(True))
    assert plan.recipe["global_batch"] == 64 and plan.recipe["steps"] == 10
    assert plan.strategy["micro_batch"] == 4 and plan.strategy["tp"] == 2 and plan.strategy["sequence_parallel"] is True


# --- group D: absurd values refused, messages that blame the right thing ---------------------

@pytest.mark.parametrize("extra, needle", [
    (["--pue", "1e300"], "at most 3"),
    (["--pue", "3.5"], "at most 3"),
    (["--pue", "0.5"], "at least 1"),
    (["--seq-len", "2K"], "plain number such as 2048"),
    (["--seq-len", "4k"], "plain number such as 4096"),
    (["--tokens", "-inf"], "'-inf'"),
    (["--steps", "-NaN"], "'-NaN'"),
])
def test_absurd_flags_are_one_line_exit_2(extra, needle, capsys):
    code, _, err = run(["--model", "pythia-160m", "--gpus", "8xa100-80gb-sxm", *extra], capsys)
    one_line_usage(code, err, needle)


def test_pue_of_a_prices_file_has_a_physical_range(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("pue: 7\n")
    code, _, err = run(["--model", "pythia-160m", "--gpus", "8xa100-80gb-sxm", "--prices", str(f)], capsys)
    one_line_usage(code, err, "at most 3")


def test_a_huge_config_blames_its_sizes_not_the_recipe_flags(tmp_path, capsys):
    cfg = _config(tmp_path, hidden_size=576 * 10**9)  # divisible by its 9 heads
    code, _, err = run(["--model", str(cfg), "--gpus", "8xa100-80gb-sxm"], capsys)
    one_line_usage(code, err, "hidden size 576,000,000,000")
    assert "hidden_size" in err and "--tokens" not in err and "--steps" not in err


@pytest.mark.parametrize("models", ["", " , "])
def test_study_grid_refuses_an_empty_model_list(tmp_path, models, monkeypatch, capsys):
    from simulator.frontends import study

    monkeypatch.setattr(study, "grid", lambda *a, **k: pytest.fail("ran the whole grid"))
    code, _, err = run(["study-grid", "--out", str(tmp_path), "--models", models, "--no-plot"], capsys)
    one_line_usage(code, err, "names nothing")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("steps", ["1000000000", "0"])
def test_validate_caps_its_steps(steps, monkeypatch, capsys):
    from calibration import validate as V

    monkeypatch.setattr(V.cli, "measure", lambda *a, **k: pytest.fail("measured a config"))

    prof = Path(__file__).parents[1] / "calibration" / "profiles" / "cpu-amd-epyc.json"
    code = V.main(["--profile", str(prof), "--steps", steps, "--device", "cpu"])
    _, err = capsys.readouterr()
    one_line_usage(code, err.strip().splitlines()[-1], "--steps must be from 1 to 1000")


def test_nothing_fits_and_no_change_found_says_so(capsys):
    code, out, _ = run(["--model", "pythia-160m", "--gpus", "8xa100-80gb-sxm", "--seq-len", "1e9"], capsys)
    assert code == 1
    assert "would fit: no change found that fits" in " ".join(out.split())


def test_zero_layer_spec_blames_n_layers():
    import simulator
    from simulator.model.presets import get_model

    spec = get_model("pythia-160m").model_copy(update={"n_layers": 0})
    with pytest.raises(UsageError, match="n_layers"):
        simulator.simulate(spec, "8xa100-80gb-sxm")


def test_a_custom_convnext_config_gets_its_familys_recipe(tmp_path):
    from simulator.model.presets import get_model
    from simulator.model.recipes import default_recipe
    from simulator.model.resolve import resolve_model

    data = json.loads((FIXTURES / "convnext-xlarge-224-22k.json").read_text())
    data.pop("_name_or_path")
    data.update(depths=[2, 2, 6, 2], hidden_sizes=[64, 128, 256, 512])
    f = tmp_path / "convnext-tiny-custom.json"
    f.write_text(json.dumps(data))
    got, preset = default_recipe(resolve_model(str(f))), default_recipe(get_model("convnext-xlarge-22k"))
    assert (got.global_batch, got.steps, got.seq_len) == (preset.global_batch, preset.steps, 1) == (4096, 311940, 1)


def test_list_models_exists_as_the_docs_say(capsys):
    from simulator.model.presets import list_models

    assert "simulate --list-models" in (Path(__file__).parents[1] / "docs" / "calibrate_from_runs.md").read_text()
    with pytest.raises(SystemExit) as ei:
        main(["--list-models"])
    out, _ = capsys.readouterr()
    assert ei.value.code == 0 and out.split() == list_models()
