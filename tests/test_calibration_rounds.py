"""Benches timed in rounds: each round a whole pass apart, the median round kept, every round
stored; resume continues the missing rounds; the spread over rounds is reported and drawn again
by the fit's bootstrap."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")

from calibration import cli  # noqa: E402
from calibration.benches.base import Bench, RunContext, Settings  # noqa: E402
from calibration.build import _resample  # noqa: E402
from calibration.device import detect  # noqa: E402
from calibration.runner import ROUND_GROUPS, run_benches, schedule  # noqa: E402
from calibration.store import (  # noqa: E402
    MeasurementStore,
    measurements_path,
    merge_rounds,
    round_spread,
    rounds_of,
)


def _rec(t: float, **extra) -> dict:
    return {"status": "ok", "time_s": t, "stat": "median", **extra}


def test_merge_keeps_the_median_round_whole_and_every_round():
    rounds = [_rec(3.0, layouts_s={"a": 3.1}), _rec(1.0, layouts_s={"a": 0.9}), _rec(2.0, layouts_s={"a": 2.2})]
    med = merge_rounds(rounds)
    assert med["time_s"] == 2.0 and med["layouts_s"] == {"a": 2.2}  # one consistent round, not a mix
    assert [r["time_s"] for r in med["rounds"]] == [3.0, 1.0, 2.0] and rounds_of(med) == 3
    assert all("rounds" not in r for r in med["rounds"])
    # merging a merged record with one more round flattens, never nests
    again = merge_rounds([*med["rounds"], _rec(10.0)])
    assert rounds_of(again) == 4 and again["time_s"] == 2.0  # lower median of 1, 2, 3, 10
    assert merge_rounds([_rec(5.0)]) == _rec(5.0)


def test_a_slow_spell_in_one_round_does_not_move_the_kept_time():
    spell = [_rec(1.0), _rec(1.02), _rec(1.9)]  # the host ran at half speed during the third round
    assert merge_rounds(spell)["time_s"] == 1.02


def test_store_adds_rounds_and_a_failed_round_loses_nothing(tmp_path):
    store = MeasurementStore.create(tmp_path / "m.json", {"kind": "cpu", "name": "x"}, {})
    store.add_round("gemm/a", _rec(2.0))
    assert not store.done("gemm/a", rounds=2) and store.done("gemm/a", rounds=1)
    store.add_round("gemm/a", {"status": "error", "reason": "boom"})
    assert store.results["gemm/a"]["time_s"] == 2.0 and rounds_of(store.results["gemm/a"]) == 1
    store.add_round("gemm/a", _rec(1.0))
    store.add_round("gemm/a", _rec(4.0))
    on_disk = json.loads((tmp_path / "m.json").read_text())["results"]["gemm/a"]
    assert on_disk["time_s"] == 2.0 and rounds_of(on_disk) == 3 and store.done("gemm/a", rounds=3)
    store.add_round("gemm/u", {"status": "unsupported", "reason": "no bf16"})
    assert store.done("gemm/u", rounds=3)  # nothing to repeat


def _benches(calls: list[str]) -> list[Bench]:
    def bench(key: str, group: str, t: float) -> Bench:
        def run(ctx):
            calls.append(key)
            return _rec(t)
        return Bench(key, group, {}, run, 0.01)
    assert "gemm" in ROUND_GROUPS and "launch" not in ROUND_GROUPS
    return [bench("launch/x", "launch", 1e-6), bench("gemm/a", "gemm", 0.5), bench("gemm/b", "gemm", 0.7)]


def _ctx(rounds: int) -> RunContext:
    return RunContext(detect("cpu"), Settings("tiny", 0.01, 1.0, False, 2, rounds=rounds))


def test_rounds_run_a_whole_pass_apart(tmp_path):
    calls: list[str] = []
    store = MeasurementStore.create(tmp_path / "m.json", {"kind": "cpu", "name": "x"}, {})
    summary = run_benches(_benches(calls), _ctx(3), store, None, resume=False)
    assert calls == ["launch/x", "gemm/a", "gemm/b", "gemm/a", "gemm/b", "gemm/a", "gemm/b"]
    assert summary.measured == 3 and summary.repeated == 4
    assert rounds_of(store.results["gemm/a"]) == 3 and "rounds" not in store.results["launch/x"]


def test_resume_runs_only_the_missing_rounds(tmp_path):
    calls: list[str] = []
    store = MeasurementStore.create(tmp_path / "m.json", {"kind": "cpu", "name": "x"}, {})
    benches = _benches(calls)
    store.add_round("launch/x", _rec(1e-6))
    store.add_round("gemm/a", _rec(0.5))
    store.add_round("gemm/a", _rec(0.5))  # killed in the second round, after gemm/a
    store.add_round("gemm/b", _rec(0.7))
    todo = schedule(benches, store, 3, resume=True)
    assert [(b.key, r) for b, r in todo] == [("gemm/b", 1), ("gemm/a", 2), ("gemm/b", 2)]
    summary = run_benches(benches, _ctx(3), store, None, resume=True)
    assert calls == ["gemm/b", "gemm/a", "gemm/b"] and summary.resumed == 3 and summary.measured == 0
    assert all(store.done(k, rounds=3) for k in ("gemm/a", "gemm/b"))
    assert [(b.key, r) for b, r in schedule(benches, store, 1, resume=False)] == \
        [("launch/x", 0), ("gemm/a", 0), ("gemm/b", 0)]


def test_round_spread_line_and_bootstrap_over_rounds():
    results = {"gemm/a": merge_rounds([_rec(1.0), _rec(1.1), _rec(2.0)]),
               "gemm/b": merge_rounds([_rec(1.0), _rec(1.05), _rec(1.02)]), "launch/x": _rec(1e-6)}
    line = round_spread(results)
    assert "2 benchmarks timed 3 times" in line and "largest x2.00 (gemm/a)" in line and "1 beyond x1.2" in line
    assert round_spread({"launch/x": _rec(1.0)}) is None
    seen = {_resample(results, np.random.default_rng(s))["gemm/a"]["time_s"] for s in range(40)}
    assert seen == {1.0, 1.1, 2.0}  # the median of rounds drawn with replacement takes each value


def test_tiny_cli_run_in_rounds_resumes_and_reports(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["--tiny", "--no-progress", "--out", str(out), "--only", "launch,gemm/fp32/*", "--rounds", "2"]
    assert cli.main(argv) == 0
    stdout = capsys.readouterr().out
    res = json.loads(measurements_path(out).read_text())["results"]
    gemms = [k for k, r in res.items() if k.startswith("gemm/") and r["status"] == "ok"]
    assert gemms and all(rounds_of(res[k]) == 2 for k in gemms)
    assert all("rounds" not in r for k, r in res.items() if k.startswith("launch/"))
    assert f"{len(gemms)} repeated rounds" in stdout and "rounds: " in stdout
    # a third round on resume adds one round to each GEMM and measures nothing else
    assert cli.main([*argv[:-1], "3", "--resume"]) == 0
    res3 = json.loads(measurements_path(out).read_text())["results"]
    assert all(rounds_of(res3[k]) == 3 for k in gemms)
    assert {k: r["measured_at"] for k, r in res3.items() if k.startswith("launch/")} == \
        {k: r["measured_at"] for k, r in res.items() if k.startswith("launch/")}


@pytest.mark.parametrize("bad", ["0", "10"])
def test_rounds_out_of_range_is_a_usage_error(bad, tmp_path, capsys):
    assert cli.main(["--tiny", "--no-progress", "--out", str(tmp_path / "a.json"), "--rounds", bad]) == 2
    err = capsys.readouterr().err
    assert "--rounds" in err and len(err.strip().splitlines()) == 1


def test_validate_rounds_split_steps_and_take_the_median_round():
    from calibration.validate import Measured, merge_measured, round_steps

    assert round_steps(3, 3) == [1, 1, 1] and round_steps(5, 3) == [2, 2, 1] and round_steps(2, 3) == [1, 1, 1]
    ms = [Measured("ok", "", t, t / 3, t / 2, 0.0, t / 6, None, t, 1.0, [t]) for t in (1.0, 1.5, 0.9)]
    m = merge_measured(ms)
    assert m.step_s == 1.0 and m.rounds == 3 and m.min_s == 0.9 and abs(m.spread - 1.5 / 0.9) < 1e-12
    assert merge_measured([*ms, Measured("error", "boom")]).status == "error"


def test_later_rounds_of_an_unsupported_bench_are_neither_run_nor_counted_in_the_eta(tmp_path, monkeypatch):
    import calibration.runner as runner

    totals: list[float] = []

    class Recorder:  # stands in for rich's Progress: keeps the total each update promises
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def add_task(self, _desc, total):
            totals.append(total)
            return 0

        def update(self, _task, total=None, **_):
            if total is not None:
                totals.append(total)

    monkeypatch.setattr(runner, "Progress", Recorder)
    clock = [0.0]  # each bench takes exactly its guessed time, so the ETA's rescaling is 1
    monkeypatch.setattr(runner, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    calls: list[str] = []

    def bench(key: str, est_s: float, status: str) -> Bench:
        def run(ctx):
            calls.append(key)
            clock[0] += est_s
            return _rec(1.0) if status == "ok" else {"status": status, "reason": "no bf16"}
        return Bench(key, "gemm", {}, run, est_s)

    benches = [bench("gemm/u", 5.0, "unsupported"), bench("gemm/a", 1.0, "ok")]
    store = MeasurementStore.create(tmp_path / "m.json", {"kind": "cpu", "name": "x"}, {})
    run_benches(benches, _ctx(3), store, None, resume=False)
    assert calls == ["gemm/u", "gemm/a", "gemm/a", "gemm/a"]
    # before anything ran all 3 + 3 rounds are promised; once gemm/u's first round is unsupported
    # its two later rounds (5 s each) leave the estimate, which then stays exact
    assert totals[0] == pytest.approx(18.0) and totals[1:] == pytest.approx([8.0, 8.0, 8.0, 8.0])
