"""Issue 13's hostile inputs and lost files: every bad input is one line and exit 2 (a
ValueError in the API), nothing non-finite is printed, files keep their modes, and the
"what would fit" suggestions hold when applied."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest

import simulator
from simulator.core.atomic import write_text_atomic
from simulator.core.errors import UsageError
from simulator.frontends import compare
from simulator.frontends.cli import main


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_usage(code, err, needle):
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


LONG = "a" * 300


@pytest.fixture
def bad_configs(tmp_path):
    base = {"model_type": "gpt_neox", "hidden_size": 512, "num_attention_heads": 8,
            "intermediate_size": 2048, "vocab_size": 50000, "max_position_embeddings": 2048}
    text = json.dumps({**base, "num_hidden_layers": 4})
    (tmp_path / "inf.json").write_text(text.replace('"num_hidden_layers": 4', '"num_hidden_layers": Infinity'))
    (tmp_path / "big.json").write_text(text.replace('"num_hidden_layers": 4', '"num_hidden_layers": 1e400'))
    return tmp_path


@pytest.mark.parametrize("extra, needle", [
    (["--tokens", "1e400"], "--tokens"),
    (["--steps", "1e400"], "--steps"),
    (["--global-batch", "1e20"], "--global-batch"),
    (["--tokens", "1e308"], "--tokens"),
    (["--tokens", "1e99999999999"], "--tokens"),
    (["--gpus", "2x2x2x3090"], "more than two counts"),
    (["--gpus", "2x8xlocal"], "Nxlocal"),
    (["--model", "/dev/null"], "not a regular file"),
    (["--model", "/"], "without a config.json"),
    (["--overhead", "-10%"], "-10%"),
    (["--profile", "/dev/zero"], "not a regular file"),
    (["--profile", f"/tmp/{LONG}.json"], "too long"),
    (["--prices", f"/tmp/{LONG}.yaml"], "too long"),
    (["--model", f"/tmp/{LONG}.json"], "too long"),
    (["--pue", "0.5"], "at least 1"),
])
def test_bad_input_is_one_line_exit_2(extra, needle, capsys):
    args = {"--model": "pythia-1b", "--gpus": "8x3090"}
    rest = []
    i = 0
    while i < len(extra):
        if extra[i] in args:
            args[extra[i]] = extra[i + 1]
        else:
            rest += extra[i:i + 2]
        i += 2
    code, _, err = run([x for kv in args.items() for x in kv] + rest, capsys)
    _one_line_usage(code, err, needle)


@pytest.mark.parametrize("name", ["inf.json", "big.json"])
def test_config_with_infinite_layers_is_usage_error(bad_configs, name, capsys):
    code, _, err = run(["--model", str(bad_configs / name), "--gpus", "1x3090"], capsys)
    _one_line_usage(code, err, "num_hidden_layers")


def test_prices_file_pue_below_one(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("pue: 0.3\n")
    code, _, err = run(["--model", "pythia-1b", "--gpus", "8x3090", "--prices", str(f)], capsys)
    _one_line_usage(code, err, "PUE")


def test_huge_prices_are_rejected_not_printed_as_infinity(capsys):
    code, out, err = run(["--model", "pythia-1b", "--gpus", "8x3090", "--json", "--price-per-gpu", "1e308"], capsys)
    _one_line_usage(code, err, "not a finite number")
    assert "Infinity" not in out


def test_nan_residuals_in_a_profile_are_rejected(tmp_path, capsys):
    from simulator.hardware.catalog import default_profile

    d = default_profile("rtx3090").model_dump(mode="json")
    d["validation"]["log_ratio_residuals"][0] = float("nan")
    f = tmp_path / "nan.json"
    f.write_text(json.dumps(d))
    code, out, err = run(["--model", "pythia-1b", "--gpus", "8x3090", "--json", "--profile", str(f)], capsys)
    _one_line_usage(code, err, "log_ratio_residuals")
    assert "NaN" not in out


def test_json_of_an_infeasible_plan_is_strict(capsys):
    # fp16 pinned on a V100 fits nothing for a 13B model: every figure printed must be strict JSON
    code, out, _ = run(["--model", "llama-2-13b", "--gpus", "1x3090", "--sharding", "ddp", "--json"], capsys)
    assert code == 1
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


@pytest.mark.parametrize("kw, needle", [
    ({"tokens": 10**400}, "tokens"),
    ({"profile": 123}, "profile"),
    ({"steps": float("inf")}, "steps"),
])
def test_api_bad_input_is_a_value_error(kw, needle):
    with pytest.raises(ValueError, match=needle) as ei:
        simulator.simulate("pythia-1b", "8x3090", **kw)
    assert isinstance(ei.value, UsageError)


@pytest.mark.parametrize("top", [-1, 0, "5", 2.5, True])
def test_search_top_must_be_positive_int(top):
    with pytest.raises(UsageError, match="top"):
        simulator.search("pythia-1b", "8x3090", top=top)


def test_search_top_none_and_positive():
    assert len(simulator.search("pythia-160m", "2x3090", top=3)) == 3
    assert len(simulator.search("pythia-160m", "2x3090", top=None)) > 3


def test_api_model_of_wrong_type():
    with pytest.raises(UsageError, match="model"):
        simulator.simulate(42, "8x3090")


# ------------------------------------------------------------------ profile drives its own device
def test_cpu_profile_is_refused_for_a_catalog_gpu(capsys):
    prof = os.path.join(os.path.dirname(__file__), "..", "calibration", "profiles", "cpu-amd-epyc.json")
    code, _, err = run(["--model", "pythia-1b", "--gpus", "8x3090", "--profile", prof], capsys)
    _one_line_usage(code, err, "--profile-any-gpu")
    assert "AMD EPYC" in err and "Nxlocal" in err
    code, out, err = run(["--model", "pythia-14m", "--gpus", "1x3090", "--profile", prof, "--profile-any-gpu",
                          "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["profile"]["name"].startswith("cpu-amd-epyc")


def test_another_catalog_gpus_profile_is_refused():
    from simulator.hardware.catalog import default_profile

    with pytest.raises(UsageError, match="h100-sxm"):
        simulator.simulate("pythia-1b", "8x3090", profile=default_profile("h100-sxm"))
    p = simulator.simulate("pythia-1b", "8x3090", profile=default_profile("h100-sxm"), profile_any_gpu=True)
    assert p.feasible


# ------------------------------------------------------------------ suggestions hold when applied
@pytest.mark.parametrize("model, gpus, pins", [
    ("llama-2-7b", "1x3090", {"sharding": "ddp", "offload": "none"}),
    ("llama-2-13b", "1x3090", {"sharding": "ddp"}),
    ("llama-2-7b", "2x3090", {"offload": "none", "checkpointing": "none"}),
    ("llama-2-13b", "1x3090", {}),
    ("mpt-70b", "1xh100", {}),  # a GPU id with an 'x' in it
])
def test_every_suggestion_fits_when_applied(model, gpus, pins):
    plan = simulator.simulate(model, gpus, **pins)
    assert not plan.feasible and plan.fixes
    assert plan.suggestions == [f["text"] for f in plan.fixes]
    for f in plan.fixes:
        kept = {k: v for k, v in pins.items() if k not in f["unpin"]}
        again = simulator.simulate(model, f["gpus"], **kept, **f["knobs"])
        assert again.feasible, f["text"]
        assert again.strategy_line() == f["strategy"]
        # a fix that releases pins says so; one that keeps them must fit with every pin
        assert bool(f["unpin"]) == ("unpin" in f["text"])
        for k, v in kept.items():
            assert again.strategy[k] == v


def test_pinned_suggestions_prefer_keeping_the_pins():
    # DDP with no offload fits a 7B model on one H200: the larger card is found with the pins kept
    plan = simulator.simulate("llama-2-7b", "1x3090", sharding="ddp", offload="none")
    card = [f for f in plan.fixes if f["kind"] == "larger_card"]
    assert card and not card[0]["unpin"]


# ------------------------------------------------------------------ compare/budget counts
def test_compare_counts_beyond_one_node_are_multi_node(capsys):
    code, out, err = run(["compare", "--model", "pythia-160m", "--gpu", "3090", "--counts", "16", "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["options"]
    assert [(r["nodes"], r["gpus_per_node"]) for r in rows] == [(2, 8)]
    assert compare.split_nodes(12, 8) == (2, 6) and compare.split_nodes(4, 8) == (1, 4)


def test_budget_counts_beyond_one_node(tmp_path, capsys):
    code, out, err = run(["budget", "--model", "pythia-160m", "--gpu", "3090", "--counts", "16", "--budget",
                          "1M", "--deadline", "1y", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "2 × 8 × RTX 3090" in out


# ------------------------------------------------------------------ files keep the user's modes
def test_atomic_write_keeps_umask_and_existing_mode(tmp_path):
    old = os.umask(0o022)
    try:
        p = write_text_atomic(tmp_path / "new.csv", "x\n")
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        os.umask(0o077)
        q = tmp_path / "existing.md"
        q.write_text("old")
        os.chmod(q, 0o664)
        write_text_atomic(q, "new")
        assert stat.S_IMODE(q.stat().st_mode) == 0o664 and q.read_text() == "new"
    finally:
        os.umask(old)


def test_compare_csv_through_a_symlink_updates_its_target(tmp_path, capsys):
    """A symlinked output stays a link and its target gets the rows (atomically, in the
    target's folder, keeping the target's mode); it used to become a regular file."""
    real = tmp_path / "shared" / "table.csv"
    real.parent.mkdir()
    real.write_text("old\n")
    os.chmod(real, 0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    code, _, err = run(["compare", "--model", "pythia-160m", "--gpu", "3090", "--counts", "1",
                        "--csv", str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "days" in real.read_text().splitlines()[0].split(",")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in real.parent.iterdir()) == ["table.csv"]  # no temp file left


def _as_another_user(fn) -> int:
    """Run ``fn()`` in a child process as an unprivileged user (uid/gid 65534 when the tests run
    as root, who may write any file; else as this user) and return its exit status: 0 when
    ``fn`` returned, 2 on a UsageError, 3 on any other exception."""
    pid = os.fork()
    if pid == 0:  # child
        code = 3
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            fn()
            code = 0
        except UsageError:
            code = 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def shared_folder():
    """A world-writable folder (no sticky bit), as a shared project folder may be."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="shared-", dir="/tmp")
    os.chmod(d, 0o777)
    yield Path(d)
    shutil.rmtree(d)


def test_atomic_write_refuses_a_file_the_user_cannot_write(shared_folder):
    """Renaming over a file needs only the folder's write permission: another user's 0444 file
    in a world-writable folder was replaced. Refused now, as open(path, "w") refuses it."""
    theirs = shared_folder / "results.csv"
    theirs.write_text("their results\n")
    os.chmod(theirs, 0o444)
    assert _as_another_user(lambda: write_text_atomic(theirs, "mine\n")) == 2
    assert theirs.read_text() == "their results\n" and stat.S_IMODE(theirs.stat().st_mode) == 0o444
    assert sorted(p.name for p in shared_folder.iterdir()) == ["results.csv"]
    # a file of their own that they may write is replaced, keeping its mode
    os.chmod(theirs, 0o666)
    assert _as_another_user(lambda: write_text_atomic(theirs, "mine\n")) == 0
    assert theirs.read_text() == "mine\n" and stat.S_IMODE(theirs.stat().st_mode) == 0o666


def test_validate_update_profile_checks_writability_first(tmp_path, monkeypatch, capsys):
    from calibration import validate
    from simulator.hardware.catalog import default_profile
    from simulator.hardware.profile import save_profile

    prof = tmp_path / "p.json"
    save_profile(default_profile("rtx3090"), prof)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode == os.W_OK else real_access(p, mode))
    monkeypatch.setattr(validate.cli, "measure", lambda *a, **k: pytest.fail("the suite ran before the check"))
    code = validate.main(["--profile", str(prof), "--update-profile"])
    err = capsys.readouterr().err
    _one_line_usage(code, err, "not writable")


def test_no_result_is_non_finite():
    p = simulator.simulate("pythia-1b", "8x3090", tokens="1e17")
    assert all(math.isfinite(v) for v in (p.days, p.step_time_s, *p.interval_days))


def test_a_budget_below_one_step_says_it_was_rounded_up():
    """Whole optimizer steps: a token budget smaller than a step, or a global batch larger than the
    budget, trains one step of it, and the plan says how many more tokens that is; a budget that
    whole steps meet within 1% (Pythia's 300 B) says nothing."""
    from simulator.answer.api import simulate

    tiny = simulate("pythia-1b", "8x3090", tokens="1")
    assert tiny.recipe["steps"] == 1 and any(n.startswith("1 token rounds up to whole steps") for n in tiny.notes)
    huge = simulate("pythia-1b", "8x3090", global_batch=10**12)
    assert any("round up to whole steps" in n and "300 B" in n for n in huge.notes)
    assert not any("round up" in n for n in simulate("pythia-1b", "8x3090").notes)
    assert not any("round up" in n for n in simulate("pythia-1b", "8x3090", steps=1).notes)


def test_nothing_found_that_fits_is_said_in_the_api_and_json_too():
    """An infeasible plan always says what would fit; where no change tried fits (DeepSeek-V3 on one
    RTX 3090) its suggestions hold that finding, so the JSON and the app say it as the terminal does."""
    from simulator.answer.plan import NO_FIX

    plan = simulator.simulate("deepseek-v3", "1x3090")
    assert not plan.feasible and plan.reasons and not plan.fixes and plan.suggestions == [NO_FIX]
