"""compare (sweep, Pareto), budget (ranking, what would fit, writers) and study-grid."""

from __future__ import annotations

import csv
import json

import pytest

from simulator.core.errors import UsageError
from simulator.frontends import budget, compare
from simulator.frontends.cli import main


def test_pareto_front_synthetic():
    pts = [(10, 100), (5, 200), (20, 50), (12, 120), (5, 250), None, (20, 50), (30, 60)]
    assert compare.pareto_front(pts) == [True, True, True, False, False, False, True, False]


def test_pareto_front_empty_and_single():
    assert compare.pareto_front([]) == []
    assert compare.pareto_front([(1, 1)]) == [True]


@pytest.fixture(scope="module")
def opts():
    return compare.sweep("pythia-1b", ["3090", "h100"], counts=(1, 2, 4))


def test_sweep_marks_infeasible_and_frontier(opts):
    assert len(opts) == 6
    feas = [o for o in opts if o.feasible]
    assert feas and all(o.days > 0 and (o.cost["hardware_usd"] or 0) >= 0 for o in feas)
    assert all((o.cost["hardware_usd"] or 0) > 0 or o.cost["purchase_note"] for o in feas)
    days = [o.days for o in feas]
    assert days == sorted(days)
    front = [o for o in opts if o.pareto]
    assert front
    for f in front:  # nothing strictly better in both
        assert not any(o.days < f.days and (o.cost_of("buy") or 1e18) < f.cost_of("buy") for o in feas)


def test_sweep_unknown_gpu_did_you_mean():
    with pytest.raises(UsageError, match="did you mean"):
        compare.sweep("pythia-160m", ["a1000"])


def test_compare_cli_writes_csv_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    c, p, s = tmp_path / "c.csv", tmp_path / "c.png", tmp_path / "c.svg"
    rc = main(["compare", "--model", "pythia-160m", "--gpu", "3090,a100", "--counts", "1,2",
               "--csv", str(c), "--plot", str(p)])
    assert rc == 0
    rows = list(csv.DictReader(c.open()))
    assert len(rows) == 4 and {"days", "buy_usd", "amortized_usd", "rent_usd", "pareto", "reason"} <= set(rows[0])
    assert p.read_bytes()[:4] == b"\x89PNG"
    assert main(["compare", "--model", "pythia-160m", "--gpu", "h100", "--counts", "1", "--plot", str(s)]) == 0
    assert b"<svg" in s.read_bytes()[:500]
    assert "Pareto" in capsys.readouterr().out


def test_compare_cli_json_and_errors(capsys):
    assert main(["compare", "--model", "pythia-160m", "--gpu", "h100", "--counts", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["options"][0]["feasible"] is True
    assert main(["compare", "--model", "pythia-160m", "--gpu", "a1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "did you mean" in err and "\n" not in err
    assert main(["compare", "--model", "pythia-160m", "--plot", "x.jpg"]) == 2
    assert main(["compare", "--model", "pythia-160m", "--counts", "0"]) == 2
    # nothing fits: 6.9B on one RTX 3090 (states exceed GPU and default host RAM)
    assert main(["compare", "--model", "pythia-6.9b", "--gpu", "3090", "--counts", "1"]) == 1
    assert "infeasible" in capsys.readouterr().out


def test_parse_money_and_days():
    assert budget.parse_money("60000") == 60000
    assert budget.parse_money("$60,000") == 60000
    assert budget.parse_money("60k") == 60000
    assert budget.parse_money("1.2M") == 1.2e6
    assert budget.parse_days("60d") == 60 and budget.parse_days("8w") == 56 and budget.parse_days("1y") == 365
    for bad in ("abc", "-5", "0"):
        with pytest.raises(UsageError):
            budget.parse_money(bad)
    with pytest.raises(UsageError):
        budget.parse_days("soon")


def test_budget_ranking_and_sensitivity(opts):
    es = budget.entries(opts, "both")
    assert {e.mode for e in es} == {"buy", "rent"}
    ranked = budget.rank(es, 60000, 60)
    assert ranked and all(e.cost_usd <= 60000 and e.days <= 60 for e in ranked)
    assert [e.cost_usd for e in ranked] == sorted(e.cost_usd for e in ranked)
    buy = next(e for e in es if e.mode == "buy")
    d, c = buy.scaled(throughput=0.8)
    assert d == pytest.approx(buy.days / 0.8)
    assert c == pytest.approx(buy.option.cost["hardware_usd"] + buy.option.cost["energy_usd"] / 0.8)
    assert buy.scaled(prices=1.2)[1] == pytest.approx(buy.cost_usd * 1.2)
    lines = budget.sensitivity(es, ranked[0], 60000, 60)
    assert len(lines) == 2 and "20% lower" in lines[0] and "20% higher" in lines[1]


def test_budget_nothing_fits_says_what_would(opts):
    es = budget.entries(opts, "buy")
    assert budget.rank(es, 100, 1) == []
    msgs = budget.what_would_fit(es, 100, 1)
    assert any("budget of $" in m for m in msgs) and any("deadline of" in m for m in msgs)
    fast = min(es, key=lambda e: e.days)
    msgs = budget.what_would_fit(es, 1e9, fast.days * 2)
    assert any("a budget of" in m and "would meet" in m for m in msgs)


def test_budget_cli(tmp_path, capsys):
    args = ["budget", "--model", "pythia-160m", "--gpu", "3090,h100", "--counts", "1,2", "--out", str(tmp_path)]
    assert main(args + ["--budget", "60k", "--deadline", "60d"]) == 0
    md = (tmp_path / "budget-pythia-160m.md").read_text()
    for needle in ("Recommendation", "Unit prices and sources", "Assumptions", "Sensitivity", "GPU-hours",
                   "Khandelwal et al. 2024"):
        assert needle in md
    rows = list(csv.DictReader((tmp_path / "budget-pythia-160m.csv").open()))
    assert rows and rows[0]["rank"] == "1"
    assert main(args + ["--budget", "100", "--deadline", "1d", "--mode", "buy"]) == 1
    out = capsys.readouterr().out
    assert "would fit" in out
    md = (tmp_path / "budget-pythia-160m.md").read_text()
    assert "no option meets both limits" in md
    assert main(args + ["--budget", "lots", "--deadline", "1d"]) == 2
    assert main(args + ["--budget", "1k", "--deadline", "1d", "--mode", "lease"]) == 2


def test_study_grid_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc = main(["study-grid", "--out", str(tmp_path), "--models", "pythia-1b", "--gpus", "3090,a100",
               "--counts", "2,4"])
    assert rc == 0
    for f in ("study_grid.csv", "study_grid.md", "study_grid.png"):
        assert (tmp_path / f).stat().st_size > 0
    md = (tmp_path / "study_grid.md").read_text()
    assert "17.6" in md and "108" in md and "floor" in md
    rows = list(csv.DictReader((tmp_path / "study_grid.csv").open()))
    a100 = next(r for r in rows if r["gpu_id"] == "a100-80gb-sxm" and r["n_gpus"] == "4")
    assert float(a100["published_days"]) == 17.6 and float(a100["days"]) >= float(a100["days_at_peak"])
    assert float(a100["naive_days"]) >= float(a100["days"])
    assert main(["study-grid", "--out", str(tmp_path), "--models", "pythia-1c"]) == 2


def test_compare_bad_model_is_one_usage_error(capsys):
    from simulator.frontends.cli import main

    assert main(["compare", "--model", "pythia-1c"]) == 2
    err = capsys.readouterr().err
    assert "pythia-1c" in err and len(err.strip().splitlines()) == 1


def _opt(gpu, days, lo, hi, buy, rent):
    o = compare.Option(gpu, gpu, 1, 1, True, days=days, days_low=lo, days_high=hi)
    o.cost = {"hardware_usd": buy, "amortized_usd": buy * days / 1825, "rent_usd": rent, "gpu_hours": 24 * days}
    return o


def test_safe_pareto_compares_the_slow_ends():
    """A best-case microbenchmark profile (fast estimate, wide range) takes the frontier on its
    estimate, but not at the slow end (issue 39: RTX 4090 / RTX 6000 Ada / L40S beside fitted
    A100/H100)."""
    optimistic, fitted = _opt("rtx4090", 10, 9, 20, 1000, 100), _opt("h100-sxm", 12, 11, 13, 1000, 120)
    compare.mark_pareto([optimistic, fitted], "buy")
    assert (optimistic.pareto, fitted.pareto) == (True, False)
    compare.mark_pareto([optimistic, fitted], "buy", safe=True)
    assert (optimistic.pareto, fitted.pareto) == (False, True)
    assert optimistic.cost_of("rent", safe=True) == pytest.approx(200)  # rent grows with the days
    assert optimistic.cost_of("buy", safe=True) == 1000  # the purchase does not


def test_compare_shows_the_interval(opts, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    feas = [o for o in opts if o.feasible]
    assert all(o.days_low <= o.days <= o.days_high for o in feas)
    rows = list(csv.DictReader(compare.to_csv(opts).splitlines()))
    assert {"days_low", "days_high"} <= set(rows[0])
    import matplotlib.axes

    calls = []
    orig = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda self, *a, **k: calls.append(a) or orig(self, *a, **k))
    compare.plot(opts, tmp_path / "p.png")
    assert sum(len(a[0]) for a in calls) == len([o for o in feas if o.cost_of("buy")])  # one per point
    assert main(["compare", "--model", "pythia-160m", "--gpu", "3090,h100", "--counts", "1", "--safe"]) == 0
    out = capsys.readouterr().out
    assert "80% range" in out and "slow end" in out


def test_study_cells_in_the_readme_and_docs_are_current():
    """The README's 'Against the study's published cells' table and docs/study_grid.md's published-cell
    lines read what study-grid computes now (a physics change that moves them must regenerate both:
    `simulate study-grid --out docs`)."""
    from pathlib import Path

    from simulator.frontends import study

    cells = study.grid(["pythia-1b"], ["rtx3090", "a100-80gb-sxm", "h100-sxm"], (2, 4))
    lines = study.comparison_lines(cells)
    root = Path(__file__).resolve().parents[1]
    docs = (root / "docs" / "study_grid.md").read_text()
    readme = (root / "README.md").read_text()
    assert len(lines) == 3 and all(f"- {line}" in docs for line in lines)
    for c in (c for c in cells if c.published_days is not None):
        naive = "does not fit (plain DDP)" if c.naive_days is None else f"{study._d(c.naive_days)} days"
        assert f"| {study._d(c.days)} days | {naive} | {study._d(c.days_at_peak)} days |" in readme, c
