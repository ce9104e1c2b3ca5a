"""A budget a grant planner can sign (issue 39): planned at the slow end of the interval, proposal-grade
sources, purchasable units, the multi-node hint, an explicit overhead, a run share capped at the price."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest

from simulator.answer import costs
from simulator.frontends import budget, compare
from simulator.frontends.cli import main
from simulator.hardware import catalog as hardware


def _entry(label, days, high, cost):
    plan = SimpleNamespace(interval_days=(days * 0.9, high))
    opt = compare.Option(label, label, 1, 2, True, days=days, days_high=high, plan=plan,
                         cost={"rent_usd": cost, "rent_usd_per_gpu_hr": 1.0, "gpu_hours": 48 * days,
                               "rent_source": "test"})
    return budget.Entry(opt, "rent", cost, days)


def test_recommendation_meets_the_deadline_at_the_slow_end():
    """Issue 39: the cheapest option (2 × RTX 6000 Ada, 73 days at its slow end against a 60-day
    deadline) was recommended, the safe one named only afterwards."""
    cheap = _entry("2 × RTX 6000 Ada", 52.2, 73.0, 1929)
    safe = _entry("4 × RTX 6000 Ada", 26.2, 38.8, 1936)
    es = [cheap, safe]
    assert budget.rank(es, 60000, 60, safe=True)[0] is safe
    assert budget.rank(es, 60000, 60)[0] is cheap  # --point-estimate
    md = budget.to_markdown(model_line="m", es=es, budget=60000, deadline=60, mode="rent",
                            prices=costs.default_prices())
    rec = md.split("## Recommendation")[1].split("##")[0]
    assert "4 × RTX 6000 Ada" in rec.split("\n\n")[1]  # the request names the safe option
    assert "2 × RTX 6000 Ada fits at its estimate" in rec and "misses the deadline" in rec
    md = budget.to_markdown(model_line="m", es=[cheap], budget=60000, deadline=60, mode="rent",
                            prices=costs.default_prices())
    assert "no option meets both limits at the slow end" in md and "fits at its estimate" in md


def test_price_sources_are_proposal_grade():
    prices = costs.default_prices()
    texts = [s.source for s in (*prices.gpu_purchase_usd.values(), *prices.base_machine_usd.values(),
                                prices.lifetime_years, prices.electricity_usd_per_kwh, prices.pue)]
    for g in hardware.list_gpus():
        texts += [s.source for s in (g.price_usd, g.cloud_usd_per_gpu_hr) if s is not None]
    for t in texts:
        for bad in ("not determined", "look swapped", "via data/", "command line", "academic-pretraining repo"):
            assert bad not in t, (bad, t)
    assert "arXiv:2410.23261" in prices.lifetime_years.source
    mine = costs.with_overrides(prices, kwh_price=0.2, pue=prices.pue.value)
    assert mine.electricity_usd_per_kwh.source == "set by you"
    assert mine.pue.source == prices.pue.source  # the default value, passed back: its own source


def test_sxm_boards_are_bought_in_4_or_8_gpu_systems():
    prices = costs.default_prices()
    for gpu in ("h100-sxm", "h200", "a100-80gb-sxm"):
        one = costs.hardware_price(prices, gpu, 1, 1)
        assert one["hardware_usd"] is None and "4 or 8" in one["purchase_note"]
        assert costs.hardware_price(prices, gpu, 1, 2)["hardware_usd"] is None
        assert costs.hardware_price(prices, gpu, 1, 4)["hardware_usd"] > 0
        assert costs.hardware_price(prices, gpu, 2, 8)["hardware_usd"] > 0
    assert costs.hardware_price(prices, "rtx4090", 1, 1)["hardware_usd"] > 0  # a card you can buy alone
    c = costs.cost(prices, gpu_id="h100-sxm", nodes=1, gpus_per_node=1, days=10, board_power_w=700, utilization=1)
    assert c["rent_usd"] > 0 and "sold only in systems of 4 or 8" in costs.format_line(c)


def test_no_deadline_at_any_price_suggests_multi_node():
    es = [_entry("8 × RTX 3090", 50, 60, 4000)]
    msg = " ".join(budget.what_would_fit(es, 1e6, 10, safe=True, multi_node=False))
    assert "at any price" in msg and "--multi-node" in msg
    assert "--multi-node" not in " ".join(budget.what_would_fit(es, 1e6, 10, safe=True, multi_node=True))


def test_budget_overhead(tmp_path, capsys):
    args = ["budget", "--model", "pythia-160m", "--gpu", "3090", "--counts", "1", "--mode", "rent",
            "--budget", "60k", "--deadline", "1y", "--out", str(tmp_path)]
    assert main(args) == 0
    base = list(csv.DictReader((tmp_path / "budget-pythia-160m.csv").open()))[0]
    assert "none included" in (tmp_path / "budget-pythia-160m.md").read_text()
    assert main([*args, "--overhead", "10%"]) == 0
    more = list(csv.DictReader((tmp_path / "budget-pythia-160m.csv").open()))[0]
    assert float(more["days"]) == pytest.approx(1.1 * float(base["days"]), rel=1e-3)
    assert "10% more wall time" in (tmp_path / "budget-pythia-160m.md").read_text()
    assert main([*args, "--overhead", "-5%"]) == 2
    assert "--overhead" in capsys.readouterr().err


def test_run_share_never_exceeds_the_purchase():
    """Issue 39: Qwen2.5-0.5B on 1 × H100 at 18T tokens showed a $41,729 share of a $31,000 machine."""
    prices = costs.default_prices()
    c = costs.cost(prices, gpu_id="rtx4090", nodes=1, gpus_per_node=1, days=3000, board_power_w=450, utilization=1)
    assert c["amortized_usd"] == c["hardware_usd"] and c["outlives_hardware"]
    assert "outlasts" in costs.format_line(c)
    short = costs.cost(prices, gpu_id="rtx4090", nodes=1, gpus_per_node=1, days=30, board_power_w=450, utilization=1)
    assert short["amortized_usd"] < short["hardware_usd"] and not short["outlives_hardware"]


def test_study_grid_keeps_the_study_pricing_of_single_sxm_boards():
    """The study priced 1 and 2 A100/H100 with a base machine; its reproduced grid does too."""
    from simulator.frontends import study

    (cell,) = study.grid(models=("pythia-160m",), gpus=("h100-sxm",), counts=(1,))
    assert cell.buy_usd == 30000 + 1000
