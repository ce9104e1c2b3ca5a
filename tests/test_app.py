"""The Streamlit explorer (app.py) driven through streamlit.testing.v1.AppTest.

Widgets are moved and the displayed numbers must move the right way. The catalog sweep (the
slow part, ~80 searches per model) is switched off except in the tests about it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
FIXTURES = ROOT / "tests" / "fixtures" / "hf_configs"


def _app(sweep: bool = False) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["show_sweep"] = sweep
    return at.run()


def _app_module():
    """app.py as a module (it is not part of the installed package)."""
    import importlib.util
    import sys

    if "app" not in sys.modules:
        spec = importlib.util.spec_from_file_location("app", APP)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["app"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["app"]


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _metric(at: AppTest, label: str) -> str:
    for m in at.metric:
        if m.label == label:
            return m.value
    raise AssertionError(f"no metric {label!r}; have {[m.label for m in at.metric]}")


def _number(text: str) -> float:
    """The leading number of a shown value ('1,234.5 days (3.4 years)' -> 1234.5)."""
    return float(re.match(r"[\d,.]+", text).group(0).replace(",", ""))


def _days(at: AppTest) -> float:
    return _number(_metric(at, "Days, estimate"))


def _errors(at: AppTest) -> str:
    """Error messages, the verdict against the budget and deadline left out (red when it misses)."""
    return " | ".join(e.value for e in at.error if not e.value.startswith("**Misses"))


def test_default_page_shows_headline_numbers():
    at = _app()
    _clean(at)
    assert not _errors(at), _errors(at)
    assert _days(at) > 0
    assert "days" in _metric(at, "Floor at 100% of peak")
    assert _metric(at, "Buy").startswith("$")
    assert _metric(at, "Rent").startswith("$")
    assert _metric(at, "Power").startswith("$")
    assert _metric(at, "MFU").endswith("%")
    plan = at.session_state["last_plan"]
    assert plan["feasible"] and plan["hardware"]["n_gpus"] == 8
    # floor at 100% of peak is below the estimate
    assert plan["days_at_peak"] <= plan["days"]
    assert any("micro-batch" in md.value for md in at.markdown)  # the chosen strategy
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) >= 1  # top strategies


def test_more_gpus_fewer_days():
    at = _app()
    at.number_input(key="gpus_per_node").set_value(2).run()
    _clean(at)
    two = _days(at)
    at.number_input(key="gpus_per_node").set_value(8).run()
    eight = _days(at)
    assert eight < two
    # and more nodes: fewer days again
    at.selectbox(key="gpu").set_value("a100-80gb-sxm").run()
    one_node = _days(at)
    at.number_input(key="nodes").set_value(2).run()
    _clean(at)
    assert not _errors(at), _errors(at)
    assert _days(at) < one_node
    assert at.session_state["last_plan"]["hardware"]["n_gpus"] == 16


def test_bigger_model_more_days_or_infeasible():
    at = _app()
    small = _days(at)
    at.selectbox(key="model").set_value("pythia-2.8b").run()
    _clean(at)
    plan = at.session_state["last_plan"]
    assert (not plan["feasible"]) or plan["days"] > small


def test_custom_dimensions_more_layers_more_days():
    at = _app()
    at.radio(key="model_source").set_value("Custom dimensions").run()
    _clean(at)
    base = _days(at)
    at.number_input(key="custom_layers").set_value(32).run()
    _clean(at)
    assert not _errors(at), _errors(at)
    assert _days(at) > base
    # an invalid combination is a message, not a traceback
    at.number_input(key="custom_heads").set_value(7).run()
    _clean(at)
    assert "divisible" in _errors(at)


def test_infeasible_choice_explains_why_and_what_fits():
    at = _app()
    at.selectbox(key="model").set_value("pythia-6.9b")
    at.number_input(key="gpus_per_node").set_value(1)
    at.radio(key="strategy_mode").set_value("Pin knobs").run()
    at.selectbox(key="pin_sharding").set_value("ddp").run()
    _clean(at)
    err = _errors(at)
    assert "Nothing fits" in err and "GiB" in err
    assert at.session_state["last_plan"]["feasible"] is False
    warn = " ".join(w.value for w in at.warning)
    assert "would fit" in warn.lower()
    assert at.session_state["last_plan"]["reasons"]


def test_pinning_changes_the_strategy():
    at = _app()
    auto_days = _days(at)
    at.radio(key="strategy_mode").set_value("Pin knobs").run()
    at.selectbox(key="pin_attention").set_value("eager")
    at.selectbox(key="pin_compile").set_value("not compiled").run()
    _clean(at)
    st = at.session_state["last_plan"]["strategy"]
    assert st["attention"] == "eager" and st["compile"] is False
    assert _days(at) >= auto_days  # the search's best is at least as fast as any pinned choice


def test_training_length_moves_days():
    at = _app()
    at.radio(key="length_mode").set_value("Tokens").run()
    at.text_input(key="tokens").input("100B").run()
    short = _days(at)
    at.text_input(key="tokens").input("200B").run()
    _clean(at)
    assert _days(at) == pytest.approx(2 * short, rel=0.02)
    at.text_input(key="tokens").input("lots").run()
    _clean(at)
    assert "Tokens" in _errors(at) and "--tokens" not in _errors(at)


def test_usage_error_is_one_line_message():
    at = _app()
    at.number_input(key="gpus_per_node").set_value(16).run()  # a 3090 node holds at most 8
    _clean(at)
    assert "exceeds" in _errors(at)
    at.number_input(key="gpus_per_node").set_value(8)
    at.selectbox(key="gpu").set_value("local").run()  # a calibrated device needs its profile
    _clean(at)
    assert "profile" in _errors(at)


BAD_UPLOADS = [
    ("config.json", b"this is not json", "not valid JSON"),
    ("config.json", b"\xff\xfe\x00binary", "UTF-8"),
    ("config.json", b"[1, 2, 3]", "JSON object"),
    ("config.json", json.dumps({"hidden_size": 10}).encode(), "model_type"),
    ("config.json", json.dumps({"model_type": "gpt_neox"}).encode(), "gpt_neox"),
    ("big.json", b" " * (1024 * 1024 + 1) + b"{}", "limit"),
]


def test_bad_model_upload_shows_error():
    at = _app()
    at.radio(key="model_source").set_value("Upload config.json").run()
    for name, data, expect in BAD_UPLOADS:
        at.file_uploader(key="model_upload").set_value((name, data, "application/json")).run()
        _clean(at)
        assert expect in _errors(at), (name, data[:20], _errors(at))
        assert not at.metric  # no stale numbers under an error


def test_good_model_upload_runs():
    at = _app()
    at.radio(key="model_source").set_value("Upload config.json").run()
    data = (FIXTURES / "gpt2.json").read_bytes()
    at.file_uploader(key="model_upload").set_value(("config.json", data, "application/json")).run()
    _clean(at)
    assert not _errors(at), _errors(at)
    assert _days(at) > 0
    assert at.session_state["last_plan"]["model"]["params"] > 100e6


def test_bad_profile_upload_shows_error():
    at = _app()
    at.radio(key="profile_source").set_value("Upload calibration profile").run()
    at.file_uploader(key="profile_upload").set_value(("p.json", b"{}", "application/json")).run()
    _clean(at)
    assert "profile" in _errors(at) and "malformed" in _errors(at)
    at.file_uploader(key="profile_upload").set_value(("p.json", b"{{", "application/json")).run()
    assert "not valid JSON" in _errors(at)


def test_prices_move_dollars():
    at = _app()
    buy = _metric(at, "Buy")
    at.number_input(key="price_per_gpu").set_value(10_000.0).run()
    _clean(at)
    assert _metric(at, "Buy") != buy
    power = float(_metric(at, "Power").strip("$").replace(",", ""))
    at.number_input(key="kwh_price").set_value(0.5).run()
    assert float(_metric(at, "Power").strip("$").replace(",", "")) > power


def test_catalog_sweep_pareto_and_budget():
    at = _app(sweep=True)
    _clean(at)
    assert not _errors(at), _errors(at)
    cap = " ".join(c.value for c in at.caption)
    assert "Pareto frontier" in cap and "Current choice: black ring" in cap
    md = at.download_button(key="dl_md")
    assert not md.proto.disabled
    # warm rerender after a widget change (sweep cached): report the median
    times = []
    for n in (4, 8, 4, 8, 4, 8):
        at.number_input(key="gpus_per_node").set_value(n)
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
    _clean(at)
    med = statistics.median(times[2:])
    print(f"warm re-render after a widget change: median {1e3 * med:.0f} ms")
    assert med < 1.5  # generous for loaded CI machines; ~150-250 ms measured on a 2-core box


def test_profile_upload_used_and_checked_against_gpu():
    at = _app()
    builtin = _days(at)
    data = json.loads((ROOT / "hardware_catalog" / "profiles" / "rtx3090.json").read_text())
    data["name"] = "my-3090"
    data["gemm"] = {k: {**v, "e_max": v["e_max"] * 0.5}
                    for k, v in data["gemm"].items()}
    at.radio(key="profile_source").set_value("Upload calibration profile").run()
    at.file_uploader(key="profile_upload").set_value(
        ("my-3090.json", json.dumps(data).encode(), "application/json")).run()
    _clean(at)
    assert not _errors(at), _errors(at)
    plan = at.session_state["last_plan"]
    assert plan["profile"]["name"] == "my-3090"
    assert plan["days"] > builtin  # half the GEMM efficiency: slower
    at.selectbox(key="gpu").set_value("a100-80gb-sxm").run()  # profile measured a 3090
    _clean(at)
    assert "not the GPU chosen" in _errors(at)


# ------------------------------------------------------------------ issue 13: an explorer to trust
def _texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [e.value for e in at.error]
    parts += [w.value for w in at.warning] + [i.value for i in at.info] + [s.value for s in at.success]
    parts += [str(m.proto.help) for m in at.metric]
    return "\n".join(parts)


def test_interval_is_as_prominent_as_the_estimate_and_explained():
    at = _app()
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["Days, likely range", "Days, estimate"]  # the range first, same size
    lo, hi = (_number(x) for x in _metric(at, "Days, likely range").split("–"))
    assert lo <= _days(at) < hi
    info = " ".join(i.value for i in at.info)
    assert "real training runs" in info and "slower" in info
    assert not any(tok in info for tok in (".csv", "@", "README"))


def test_intra_node_link_label_follows_the_gpu():
    at = _app()
    cap = " ".join(c.value for c in at.caption)
    assert "usual link for RTX 3090" in cap and "PCIe" in cap
    at.selectbox(key="gpu").set_value("h100-sxm").run()
    cap = " ".join(c.value for c in at.caption)
    assert "usual link for H100" in cap and ("NVSwitch" in cap or "NVLink" in cap)
    assert "PCIe 4.0" not in cap


def test_no_command_line_wording_in_the_app():
    at = _app()
    at.selectbox(key="model").set_value("llama-2-13b")
    at.number_input(key="gpus_per_node").set_value(1).run()  # needs more host RAM or GPUs
    _clean(at)
    assert at.session_state["last_plan"]["feasible"] is False
    text = _texts(at)
    assert "Host RAM per node" in text
    assert not re.search(r"(?<![\w-])--[a-z]", text), text
    assert not at.metric  # an infeasible plan shows no full-size numbers


def test_custom_dimensions_keep_the_presets_recipe():
    at = _app()
    tokens = at.session_state["last_plan"]["recipe"]["tokens"]
    at.radio(key="model_source").set_value("Custom dimensions").run()
    _clean(at)
    r = at.session_state["last_plan"]["recipe"]
    assert r["tokens"] == tokens and r["global_batch"] == 1024 and r["seq_len"] == 2049


def test_upload_prompt_is_not_an_error_and_the_upload_survives_switching():
    at = _app()
    at.radio(key="model_source").set_value("Upload config.json").run()
    _clean(at)
    assert not _errors(at) and "Upload" in " ".join(i.value for i in at.info)
    data = (FIXTURES / "gpt2.json").read_bytes()
    at.file_uploader(key="model_upload").set_value(("config.json", data, "application/json")).run()
    params = at.session_state["last_plan"]["model"]["params"]
    at.radio(key="model_source").set_value("Preset").run()
    assert at.session_state["last_plan"]["model"]["params"] != params
    at.radio(key="model_source").set_value("Upload config.json").run()
    _clean(at)
    assert not _errors(at), _errors(at)
    assert at.session_state["last_plan"]["model"]["params"] == params


def test_upload_limit_text_matches_the_widget():
    app = _app_module()

    at = _app()
    at.radio(key="model_source").set_value("Upload config.json").run()
    up = at.file_uploader(key="model_upload")
    assert f"{app.MAX_UPLOAD_MB} MB" in up.label
    assert app.MAX_UPLOAD_BYTES == app.MAX_UPLOAD_MB * 1024 * 1024


def test_micro_batch_label_states_the_last_partial_micro_batch():
    at = _app()
    st_ = at.session_state["last_plan"]["strategy"]
    per_gpu = 1024 // 8
    assert per_gpu % st_["micro_batch"]  # 128 per GPU in micro-batches of 6: the last one is smaller
    md = " ".join(m.value for m in at.markdown)
    last = per_gpu - (st_["grad_accum"] - 1) * st_["micro_batch"]
    assert f"the last one {last}" in md and f"{per_gpu} per GPU" in md


def test_top_strategies_collapse_micro_batch_variants():
    at = _app()
    rows = at.dataframe[0].value["strategy"].tolist()
    base = [re.sub(r"\d+ micro-batch.*", "", r) for r in rows]
    assert len(base) == len(set(base)) > 3


def test_how_to_read_and_plain_tooltips():
    at = _app()
    assert any("How to read" in e.label for e in at.expander)
    helps = " ".join(str(m.proto.help) for m in at.metric)
    assert not re.search(r"\.py|\.csv|\.yaml|@[0-9a-f]{7}|commit", helps), helps


def test_chart_has_a_colour_and_marker_per_gpu_and_fitted_axes():
    import pandas as pd

    app = _app_module()

    df = pd.DataFrame([{"cluster": f"1x{g.id}", "gpus": f"1 × {g.short_name}", "gpu": g.short_name, "n_gpus": 1,
                        "days": 10.0 * (i + 1), "days_high": 12.0 * (i + 1), "cost_usd": 1000.0 * (i + 1),
                        "mfu": 0.5, "strategy": "s", "pareto": False}
                       for i, g in enumerate(simulator_gpus())])
    spec = app.pareto_chart(df, "1xrtx3090", "x")
    enc = spec["layer"][0]["encoding"]
    colours, shapes = enc["color"]["scale"]["range"], enc["shape"]["scale"]["range"]
    assert len(set(colours[:len(df)])) == len(df)  # 13 GPUs, 13 colours
    assert len(set(zip(colours, shapes, strict=True))) == len(colours)
    lo, hi = enc["x"]["scale"]["domain"]
    assert lo < df["cost_usd"].min() and hi > df["cost_usd"].max() and hi / lo < 20 * 1.25 ** 2


def simulator_gpus():
    from simulator import hardware

    return hardware.list_gpus()


def test_left_out_lists_configurations_without_a_price():
    app = _app_module()
    from simulator import compare

    opts = compare.sweep("pythia-160m", ["3090"], counts=(1,))
    no_price = [dataclasses.replace(o, cost={**o.cost, "hardware_usd": None}) for o in opts]
    df = app.left_out(no_price, "buy")
    assert len(df) == 1 and "purchase price" in df["why"][0] and "--" not in df["why"][0]


def test_budget_report_from_the_app_reports_the_plan_on_screen():
    at = _app(sweep=True)
    _clean(at)
    assert not at.download_button(key="dl_md").proto.disabled
    report = _budget_text(at)
    assert "configuration on screen" in report and "8 × RTX 3090" in report
    assert "simulate budget" not in report and "in the CSV" not in report  # what the app does not offer
    assert "slow end" in report  # planned against the pessimistic end of the interval too


def _budget_text(at: AppTest) -> str:
    """The Markdown the budget button serves (rebuilt through the app's own function)."""
    app = _app_module()
    from simulator import api

    st_ = at.session_state
    prices = {"mode": st_["price_mode"], "kwh_price": st_["kwh_price"] or None, "price_per_gpu": None,
              "rent_per_gpu_hour": None, "pue": st_["pue"], "lifetime_years": st_["lifetime_years"]}
    plan_d = st_["last_plan"]
    plan = api.simulate("pythia-1b", "8x3090")
    pj = json.dumps(prices, sort_keys=True)
    return app.budget_markdown("preset:pythia-1b", json.dumps({}, sort_keys=True), pj,
                               json.dumps({"budget_usd": 60000.0, "deadline_days": 60.0}, sort_keys=True),
                               f"{plan_d['model']['name']}, {plan_d['recipe']['description']}",
                               json.dumps(app.current_for_budget(plan, pj)))
