"""Cost model: hand-computed purchase, amortization, rental and energy values; prices files; CLI."""

from __future__ import annotations

import json

import pytest

from simulator.answer import costs
from simulator.core.errors import UsageError
from simulator.frontends.cli import main
from simulator.hardware.catalog import Sourced


@pytest.fixture(scope="module")
def prices():
    return costs.default_prices()


def test_study_prices_and_sources(prices):
    assert prices.gpu_purchase_usd["a100-80gb-sxm"].value == 19000
    assert prices.gpu_purchase_usd["h100-sxm"].value == 30000
    assert prices.gpu_purchase_usd["rtx3090"].value == 1300
    assert prices.gpu_purchase_usd["rtx-a6000"].value == 4800
    assert {k: v.value for k, v in prices.base_machine_usd.items()} == {1: 1000, 2: 1500, 4: 7500, 8: 10500}
    assert prices.lifetime_years.value == 5
    for s in [*prices.gpu_purchase_usd.values(), *prices.base_machine_usd.values(), prices.lifetime_years,
              prices.electricity_usd_per_kwh, prices.pue]:
        assert s.source.strip()
    assert "assumed" in prices.pue.source and "Energy Information Administration" in prices.electricity_usd_per_kwh.source


def test_hardware_price_4xa100(prices):
    hp = costs.hardware_price(prices, "a100-80gb-sxm", 1, 4)
    assert hp["hardware_usd"] == 4 * 19000 + 7500
    assert hp["base_machine_usd"] == 7500


def test_base_machine_rounding_and_multinode(prices):
    assert costs.base_machine_price(prices, 3).value == 7500  # next larger machine
    hp = costs.hardware_price(prices, "h100-sxm", 2, 8)
    assert hp["hardware_usd"] == 16 * 30000 + 2 * 10500


def test_catalog_fallback_and_unknown_price(prices):
    assert costs.gpu_unit_price(prices, "rtx4090").value == 1599  # catalog price_usd
    assert costs.gpu_unit_price(prices, "a10") is None  # no price in catalog
    assert costs.hardware_price(prices, "a10", 1, 2)["hardware_usd"] is None


def test_cost_hand_computed(prices):
    days = 17.6
    c = costs.cost(prices, gpu_id="a100-80gb-sxm", nodes=1, gpus_per_node=4, days=days,
                   board_power_w=400.0, utilization=0.9)
    price = 4 * 19000 + 7500
    assert c["amortized_usd"] == pytest.approx(price * days / (5 * 365))
    hours = days * 24
    assert c["gpu_hours"] == pytest.approx(4 * hours)
    kwh = 0.4 * 4 * hours * 0.9 * prices.pue.value
    assert c["energy_kwh"] == pytest.approx(kwh)
    assert c["energy_usd"] == pytest.approx(kwh * prices.electricity_usd_per_kwh.value)
    assert c["rent_usd"] == pytest.approx(4 * hours * c["rent_usd_per_gpu_hr"])


def test_pure_functions():
    assert costs.amortized_share(83500, 17.6, 5) == pytest.approx(83500 * 17.6 / 1825)
    assert costs.energy_kwh(350, 2, 100, 0.5, 1.2) == pytest.approx(0.35 * 2 * 100 * 0.5 * 1.2)


def test_overrides(prices):
    p = costs.with_overrides(prices, price_per_gpu=1000, rent_per_gpu_hour=2, kwh_price=0.2, pue=1.0,
                             lifetime_years=3, utilization=0.5)
    c = costs.cost(p, gpu_id="rtx3090", nodes=1, gpus_per_node=2, days=10, board_power_w=350, utilization=1.0)
    assert c["hardware_usd"] == 2 * 1000 + 1500
    assert c["amortized_usd"] == pytest.approx(3500 * 10 / (3 * 365))
    assert c["rent_usd"] == pytest.approx(2 * 240 * 2)
    assert c["energy_kwh"] == pytest.approx(0.35 * 2 * 240 * 0.5 * 1.0)
    with pytest.raises(UsageError):
        costs.with_overrides(prices, utilization=1.5)


def test_local_device_prices_unknown(prices):
    c = costs.cost(prices, gpu_id="local", nodes=1, gpus_per_node=1, days=1, board_power_w=None, utilization=1)
    assert c["hardware_usd"] is None and c["rent_usd"] is None and c["energy_kwh"] is None
    p = costs.with_overrides(prices, price_per_gpu=999)
    c = costs.cost(p, gpu_id="local", nodes=1, gpus_per_node=2, days=1, board_power_w=300, utilization=1)
    assert c["hardware_usd"] == 2 * 999 and c["base_machine_usd"] is None


def test_prices_file(tmp_path, prices):
    f = tmp_path / "p.yaml"
    f.write_text("gpu_purchase_usd:\n  3090: 900\n  h100: {value: 25000, source: our quote}\n"
                 "electricity_usd_per_kwh: 0.05\n")
    p = costs.load_prices(f)
    assert p.gpu_purchase_usd["rtx3090"].value == 900 and "p.yaml" in p.gpu_purchase_usd["rtx3090"].source
    assert p.gpu_purchase_usd["h100-sxm"].source == "our quote"
    assert p.gpu_purchase_usd["rtx-a6000"].value == 4800  # merged, not replaced
    assert p.electricity_usd_per_kwh.value == 0.05
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_purchase_usd:\n  a1000: 5\n")
    with pytest.raises(UsageError, match="did you mean"):
        costs.load_prices(bad)
    bad.write_text("colour: red\n")
    with pytest.raises(UsageError, match="unknown field"):
        costs.load_prices(bad)
    with pytest.raises(UsageError, match="no such file"):
        costs.load_prices(tmp_path / "missing.yaml")


def test_format_line():
    c = {"hardware_usd": 83500, "amortized_usd": 1043.9, "lifetime_years": 5, "rent_usd": 4139.6,
         "energy_kwh": 1313.5, "energy_usd": 170.8}
    assert costs.format_line(c) == "buy $83,500 (run share $1,044 over 5 years) · rent $4,140 · power 1,314 kWh ($171)"


def test_simulate_json_has_cost(capsys):
    assert main(["--model", "pythia-160m", "--gpus", "4xa100", "--json", "--price-per-gpu", "10000"]) == 0
    d = json.loads(capsys.readouterr().out)
    c = d["cost"]
    assert c["hardware_usd"] == 4 * 10000 + 7500
    for k in ("amortized_usd", "rent_usd", "energy_usd", "energy_kwh", "gpu_hours"):
        assert c[k] > 0
    assert c["amortized_usd"] == pytest.approx(47500 * d["days"] / 1825)


def test_simulate_text_cost_line(capsys):
    assert main(["--model", "pythia-160m", "--gpus", "2x3090"]) == 0
    out = capsys.readouterr().out
    assert "cost" in out and "buy $4,100" in out and "over 5 years" in out and "kWh" in out


def test_cost_flag_errors(capsys):
    assert main(["--model", "pythia-160m", "--gpus", "1x3090", "--pue", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--pue" in err


def test_api_simulate_cost():
    from simulator.answer.api import simulate

    p = simulate("pythia-160m", "4xh100", prices=costs.with_overrides(costs.default_prices(), kwh_price=1.0))
    assert p.cost["electricity_usd_per_kwh"] == 1.0
    assert p.cost["hardware_usd"] == 4 * 30000 + 7500
    assert isinstance(Sourced, type)
