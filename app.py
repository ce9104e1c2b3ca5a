"""The what-if explorer: ``streamlit run app.py``.

Every knob in the sidebar re-runs the package's search and the main area lays out the answer
(days, dollars, memory, step-time breakdown, top strategies, the catalog's days-versus-cost
frontier). No physics lives here: numbers come from ``simulator.api`` and the package's cost,
comparison and budget modules; this file only collects inputs, caches and draws.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import pandas as pd
import streamlit as st

from simulator import api, budget, compare, costs, hardware
from simulator.errors import UsageError
from simulator.hf_config import model_from_hf_config
from simulator.models import ModelSpec, get_model, list_models, model_from_dict
from simulator.profile import Profile, parse_profile
from simulator.strategy import (
    ATTENTIONS,
    CHECKPOINTINGS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    SHARDINGS,
)

MAX_UPLOAD_BYTES = 1_000_000  # uploads above 1 MB are refused before parsing
AUTO = "auto"
DEFAULT_MODEL, DEFAULT_GPU, DEFAULT_PER_NODE = "pythia-1b", "rtx3090", 8
TOP_N = 10
PRICE_OVERRIDES = ("price_per_gpu", "rent_per_gpu_hour", "kwh_price", "pue", "lifetime_years")


# --------------------------------------------------------------------------- uploads (data only)
def _read_upload(data: bytes, what: str) -> dict:
    """Bytes of an uploaded JSON file -> dict; UsageError for too large, not UTF-8 or not JSON."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise UsageError(f"{what} is {len(data) / 1e6:.1f} MB; the limit is "
                         f"{MAX_UPLOAD_BYTES / 1e6:.0f} MB")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not a UTF-8 text file; expected JSON") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{what}: expected a JSON object at the top level, got "
                         f"{type(obj).__name__}")
    return obj


def model_from_upload(name: str, data: bytes) -> ModelSpec:
    """An uploaded Hugging Face ``config.json`` -> ModelSpec (raises UsageError)."""
    cfg = _read_upload(data, f"model config {name!r}")
    stem = name.rsplit("/", 1)[-1].removesuffix(".json")
    default = cfg.get("_name_or_path") if isinstance(cfg.get("_name_or_path"), str) else None
    return model_from_hf_config(cfg, name=default or (stem if stem != "config" else None))


def profile_from_upload(name: str, data: bytes) -> Profile:
    """An uploaded calibration profile JSON -> Profile (raises UsageError)."""
    return parse_profile(_read_upload(data, f"profile {name!r}"), origin=name)


# --------------------------------------------------------------------------- cached package calls
def _model(model_key: str) -> ModelSpec:
    """``preset:<name>`` or ``spec:<ModelSpec JSON>`` -> ModelSpec (keys keep caches hashable)."""
    kind, _, rest = model_key.partition(":")
    return get_model(rest) if kind == "preset" else model_from_dict(json.loads(rest))


@st.cache_resource(max_entries=64, show_spinner=False)
def _profile(profile_json: str | None) -> Profile | None:
    return None if profile_json is None else parse_profile(json.loads(profile_json), origin="upload")


def _knobs(knobs_json: str, profile_json: str | None) -> dict:
    knobs = json.loads(knobs_json)
    if profile_json is not None:
        knobs["profile"] = _profile(profile_json)
    return knobs


@st.cache_resource(max_entries=256, show_spinner=False)
def cached_search(model_key: str, gpus: str, knobs_json: str, profile_json: str | None):
    """``api.answer`` for one input set: the best plan (with fixes if nothing fits), the top plans."""
    ans = api.answer(_model(model_key), gpus, top=TOP_N, **_knobs(knobs_json, profile_json))
    return ans.result, ans.plan, ans.top, top_table(ans.top)


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_sweep(model_key: str, recipe_json: str) -> list:
    """Every catalog GPU × {1, 2, 4, 8} and 2 / 4 nodes of 8, each with its fastest feasible plan
    (``simulator.compare.sweep``). The expensive part of a render (~80 searches), so it is cached
    apart from the prices."""
    return compare.sweep(_model(model_key), multi_node=True, prices=default_prices(), **json.loads(recipe_json))


@st.cache_resource(max_entries=64, show_spinner=False)
def priced_sweep(model_key: str, recipe_json: str, prices_json: str) -> tuple[pd.DataFrame, list]:
    """The sweep priced with the sidebar's prices: (frame for the chart, compare.Options)."""
    mode = json.loads(prices_json)["mode"]
    prices = cached_prices(prices_json)
    options = [dataclasses.replace(o, cost=costs.plan_cost(o.plan, prices)) if o.feasible else o
               for o in cached_sweep(model_key, recipe_json)]
    compare.mark_pareto(options, mode)
    rows = [{"gpus": o.cluster, "gpu": o.gpu, "n_gpus": o.n_gpus, "days": o.days,
             "cost_usd": o.cost_of(mode), "mfu": o.mfu, "strategy": o.strategy, "pareto": o.pareto}
            for o in options if o.feasible]
    df = pd.DataFrame(rows, columns=["gpus", "gpu", "n_gpus", "days", "cost_usd", "mfu", "strategy", "pareto"])
    return df.dropna(subset=["days", "cost_usd"]).reset_index(drop=True), options


# --------------------------------------------------------------------------- costs
@st.cache_resource(max_entries=64, show_spinner=False)
def cached_prices(prices_json: str) -> costs.Prices:
    """Built-in prices with the sidebar's overrides (``costs.with_overrides``)."""
    over = {k: v for k, v in json.loads(prices_json).items() if k in PRICE_OVERRIDES and v is not None}
    return costs.with_overrides(default_prices(), **over)


@st.cache_resource(show_spinner=False)
def default_prices() -> costs.Prices:
    return costs.default_prices()


def plan_cost(plan, prices_json: str) -> dict | None:
    """``costs.plan_cost`` for a feasible plan (cheap; the cached plan itself is not mutated)."""
    if not plan.feasible:
        return None
    return costs.plan_cost(plan, cached_prices(prices_json))


def headline_cost(c: dict | None, mode: str) -> float | None:
    """The dollar figure the sweep plots: purchase price (buy) or rental bill (rent)."""
    if not c:
        return None
    return c.get("hardware_usd") if mode == "buy" else c.get("rent_usd")


# --------------------------------------------------------------------------- formatting
def fmt_days(d: float) -> str:
    if not math.isfinite(d):
        return "∞"
    return f"{d:,.1f}" if d < 100 else f"{d:,.0f}"


def fmt_money(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"${x:,.0f}"


def top_table(plans: list) -> pd.DataFrame:
    return pd.DataFrame([{
        "#": i, "strategy": p.strategy_line(), "step s": round(p.step_time_s, 3),
        "tokens/s": round(p.tokens_per_s), "MFU %": round(100 * p.mfu, 1),
        "memory GiB": round(p.memory_gib["total"], 2), "days": round(p.days, 2),
    } for i, p in enumerate(plans, 1)])


def memory_chart(plan) -> dict:
    m = plan.memory_gib
    parts = ["weights", "gradients", "optimizer", "activations", "logits", "other"]
    data = [{"part": k, "GiB": round(m[k], 3), "order": i, "row": "per GPU"} for i, k in enumerate(parts)]
    cap = m["capacity"]
    return {
        "height": 150,
        "layer": [
            {"data": {"values": data}, "mark": {"type": "bar"},
             "encoding": {"y": {"field": "row", "type": "nominal", "title": None},
                          "x": {"field": "GiB", "type": "quantitative", "stack": "zero",
                                "title": f"GiB per GPU (usable {cap:.1f})",
                                "scale": {"domain": [0, max(cap, m["total"]) * 1.05]}},
                          "color": {"field": "part", "type": "nominal", "sort": parts,
                                    "title": None},
                          "order": {"field": "order"},
                          "tooltip": [{"field": "part"}, {"field": "GiB", "format": ".2f"}]}},
            {"data": {"values": [{"cap": cap}]}, "mark": {"type": "rule", "color": "red",
                                                          "strokeWidth": 3},
             "encoding": {"x": {"field": "cap", "type": "quantitative"}}},
        ],
    }


def breakdown_rows(plan) -> list[dict]:
    """The plan's step-time breakdown (seconds per optimizer step) as chart rows."""
    b = plan.breakdown_s
    rows = [("forward", b["forward"]), ("backward", b["backward"]), ("recompute", b["recompute"]),
            ("exposed comm", b["exposed_comm"]), ("optimizer", b["optimizer"]),
            ("offload", b["offload"])]
    return [{"part": k, "seconds": v} for k, v in rows]


def breakdown_chart(rows: list[dict]) -> dict:
    return {"height": 200, "data": {"values": rows}, "mark": {"type": "bar"},
            "encoding": {"y": {"field": "part", "type": "nominal", "sort": None, "title": None},
                         "x": {"field": "seconds", "type": "quantitative", "title": "seconds per optimizer step"},
                         "color": {"field": "part", "type": "nominal", "legend": None},
                         "tooltip": [{"field": "part"}, {"field": "seconds", "format": ".3f"}]}}


@st.cache_data(max_entries=128, show_spinner=False)
def cached_pareto_chart(model_key: str, recipe_json: str, prices_json: str, current: str,
                        x_title: str) -> dict:
    return pareto_chart(priced_sweep(model_key, recipe_json, prices_json)[0], current, x_title)


def pareto_chart(df: pd.DataFrame, current: str, x_title: str) -> dict:
    values = df.assign(current=df["gpus"] == current).to_dict("records")
    enc_x = {"field": "cost_usd", "type": "quantitative", "scale": {"type": "log"}, "title": x_title}
    enc_y = {"field": "days", "type": "quantitative", "scale": {"type": "log"}, "title": "days"}
    tip = [{"field": "gpus"}, {"field": "days", "format": ",.1f"}, {"field": "cost_usd", "format": ",.0f"},
           {"field": "strategy"}]
    return {
        "height": 380, "data": {"values": values},
        "layer": [
            {"mark": {"type": "point", "filled": True, "size": 60, "opacity": 0.7},
             "encoding": {"x": enc_x, "y": enc_y, "color": {"field": "gpu", "type": "nominal", "title": "GPU"},
                          "tooltip": tip}},
            {"transform": [{"filter": "datum.pareto"}], "mark": {"type": "line", "point": False, "color": "black",
                                                                 "strokeDash": [4, 3]},
             "encoding": {"x": {**enc_x, "sort": None}, "y": enc_y, "order": {"field": "cost_usd"}}},
            {"transform": [{"filter": "datum.current"}],
             "mark": {"type": "point", "shape": "diamond", "size": 400, "filled": False, "color": "red",
                      "strokeWidth": 3},
             "encoding": {"x": enc_x, "y": enc_y, "tooltip": tip}},
        ],
    }


@st.cache_resource(max_entries=64, show_spinner=False)
def budget_markdown(model_key: str, recipe_json: str, prices_json: str, limits_json: str,
                    model_line: str) -> str | None:
    """The Markdown budget justification (``simulator.budget``) over the priced sweep."""
    _df, options = priced_sweep(model_key, recipe_json, prices_json)
    if not options:
        return None
    mode = json.loads(prices_json)["mode"]
    limits = json.loads(limits_json)
    return budget.to_markdown(model_line=model_line, es=budget.entries(options, mode),
                              budget=limits["budget_usd"], deadline=limits["deadline_days"], mode=mode,
                              prices=cached_prices(prices_json))


# --------------------------------------------------------------------------- sidebar
def _opt_int(label: str, key: str, help: str, max_value: int = 10**9) -> int | None:
    v = st.number_input(label, min_value=0, max_value=max_value, value=0, step=1, key=key, help=help)
    return int(v) if v else None


def sidebar_model() -> tuple[str | None, str | None]:
    """-> (model key, error message)."""
    st.header("Model")
    names = list_models()
    source = st.radio("Source", ["Preset", "Custom dimensions", "Upload config.json"], key="model_source",
                      horizontal=False)
    if source == "Preset":
        name = st.selectbox("Preset", names, index=names.index(DEFAULT_MODEL), key="model")
        return f"preset:{name}", None
    if source == "Custom dimensions":
        bases = [n for n in names if isinstance(get_model(n), ModelSpec)]  # transformer dimensions below
        base_name = st.selectbox("Start from", bases, index=bases.index(DEFAULT_MODEL), key="custom_base")
        base = get_model(base_name)
        c1, c2 = st.columns(2)
        layers = c1.number_input("Layers", 1, 1024, base.n_layers, key="custom_layers")
        hidden = c2.number_input("Hidden size", 1, 131072, base.hidden, key="custom_hidden")
        heads = c1.number_input("Heads", 1, 1024, base.n_heads, key="custom_heads")
        ffn = c2.number_input("MLP width", 1, 524288, base.ffn_hidden, key="custom_ffn")
        vocab = c1.number_input("Vocabulary", 1, 1_000_000, base.vocab_size, key="custom_vocab")
        ctx = c2.number_input("Max positions", 1, 1_048_576, base.max_positions, key="custom_ctx")
        data = base.model_dump()
        data.update(name=f"custom-{base.name}", display=f"Custom ({base.display_name})", hf_id=None,
                    n_layers=int(layers), hidden=int(hidden), n_heads=int(heads), ffn_hidden=int(ffn),
                    vocab_size=int(vocab), max_positions=int(ctx),
                    default_seq_len=min(base.default_seq_len, int(ctx)),
                    source=f"custom dimensions starting from {base.name}")
        if data.get("n_kv_heads") and int(heads) % data["n_kv_heads"]:
            data["n_kv_heads"] = None
        try:
            spec = model_from_dict(data)
        except UsageError as exc:
            return None, str(exc)
        return "spec:" + spec.model_dump_json(), None
    up = st.file_uploader("Hugging Face config.json (≤ 1 MB)", type=["json"], key="model_upload")
    if up is None:
        return None, "upload a Hugging Face config.json to simulate it"
    try:
        spec = model_from_upload(up.name, up.getvalue())
    except UsageError as exc:
        return None, str(exc)
    return "spec:" + spec.model_dump_json(), None


def sidebar_recipe() -> dict:
    st.header("Training length and batch")
    mode = st.radio("Length", ["Recipe default", "Tokens", "Steps"], key="length_mode", horizontal=True)
    rec: dict[str, Any] = {}
    if mode == "Tokens":
        rec["tokens"] = st.text_input("Tokens", "300B", key="tokens", help="e.g. 300B, 2.5e11")
    elif mode == "Steps":
        rec["steps"] = st.text_input("Optimizer steps", "143000", key="steps")
    gb = _opt_int("Global batch (sequences; 0 = recipe)", "global_batch", "sequences per optimizer step")
    sl = _opt_int("Sequence length (0 = recipe)", "seq_len", "tokens per sequence")
    opt = st.selectbox("Optimizer", ["recipe"] + list(OPTIMIZERS), key="optimizer")
    if gb:
        rec["global_batch"] = gb
    if sl:
        rec["seq_len"] = sl
    if opt != "recipe":
        rec["optimizer"] = opt
    return rec


def sidebar_hardware() -> tuple[str, dict]:
    st.header("Hardware")
    gpus = {g.id: g for g in hardware.list_gpus()}
    ids = [*gpus, "local"]
    gid = st.selectbox("GPU", ids, index=ids.index(DEFAULT_GPU), key="gpu",
                       format_func=lambda i: gpus[i].short_name if i in gpus else
                       "calibrated device (upload its profile below)")
    c1, c2 = st.columns(2)
    per = c1.number_input("GPUs per node", 1, 64, DEFAULT_PER_NODE, key="gpus_per_node")
    nodes = c2.number_input("Nodes", 1, 1024, 1, key="nodes")
    intra = {lk.id: lk for lk in hardware.list_links("intra")}
    intra_id = st.selectbox("Intra-node link", ["default"] + list(intra), key="intra_node",
                            format_func=lambda i: (f"default ({gpus[gid].intra_node_link})" if gid in gpus else "default")
                            if i == "default"
                            else intra[i].name)
    inter = st.number_input("Inter-node Gbit/s per node (0 = catalog default)", 0.0, 1e5, 0.0,
                            step=100.0, key="inter_node", disabled=nodes == 1)
    host = st.number_input("Host RAM per node, GiB (0 = assumed)", 0.0, 1e5, 0.0, step=64.0,
                           key="host_memory", help="checked when offloading")
    knobs: dict[str, Any] = {}
    if intra_id != "default":
        knobs["intra_node"] = intra_id
    if inter and nodes > 1:
        knobs["inter_node"] = float(inter)
    if host:
        knobs["host_memory"] = float(host)
    text = f"{int(per)}x{gid}" if nodes == 1 else f"{int(nodes)}x{int(per)}x{gid}"
    return text, knobs


def sidebar_strategy() -> dict:
    st.header("Strategy")
    mode = st.radio("Search", ["Automatic search", "Pin knobs"], key="strategy_mode", horizontal=True)
    if mode == "Automatic search":
        return {}
    pins: dict[str, Any] = {}
    for key, label, choices in (("precision", "Precision", PRECISIONS), ("attention", "Attention", ATTENTIONS),
                                ("checkpointing", "Activation checkpointing", CHECKPOINTINGS),
                                ("sharding", "Sharding", SHARDINGS), ("offload", "CPU offload", OFFLOADS)):
        v = st.selectbox(label, [AUTO] + list(choices), key=f"pin_{key}")
        if v != AUTO:
            pins[key] = v
    comp = st.selectbox("torch.compile", [AUTO, "compiled", "not compiled"], key="pin_compile")
    if comp != AUTO:
        pins["compile"] = comp == "compiled"
    mb = _opt_int("Micro-batch (0 = search)", "pin_micro_batch", "samples per GPU per forward pass", 65536)
    if mb:
        pins["micro_batch"] = mb
    return pins


def sidebar_prices() -> dict:
    """-> the overrides of ``costs.with_overrides`` (None = built-in price) plus ``mode``."""
    st.header("Prices")
    base = default_prices()
    mode = st.radio("Hardware", ["buy", "rent"], key="price_mode", horizontal=True,
                    format_func=lambda m: {"buy": "Buy", "rent": "Rent (cloud)"}[m],
                    help="which dollar figure the catalog chart plots")
    kwh = st.number_input("Electricity, $/kWh", 0.0, 10.0, base.electricity_usd_per_kwh.value,
                          step=0.01, key="kwh_price", help=base.electricity_usd_per_kwh.source)
    c1, c2 = st.columns(2)
    gpu = c1.number_input("$ per GPU (0 = catalog)", 0.0, 1e7, 0.0, step=500.0, key="price_per_gpu")
    rent = c2.number_input("$ per GPU-hour (0 = catalog)", 0.0, 1e3, 0.0, step=0.1, key="rent_per_gpu_hour")
    pue = c1.number_input("PUE", 1.0, 5.0, base.pue.value, step=0.05, key="pue", help=base.pue.source)
    life = c2.number_input("Lifetime, years", 0.5, 20.0, base.lifetime_years.value, step=0.5,
                           key="lifetime_years", help=base.lifetime_years.source)
    return {"mode": mode, "kwh_price": float(kwh) or None, "price_per_gpu": float(gpu) or None,
            "rent_per_gpu_hour": float(rent) or None, "pue": float(pue), "lifetime_years": float(life)}


def sidebar_limits() -> dict:
    st.header("Budget report")
    st.checkbox("Sweep the whole catalog (days against cost)", True, key="show_sweep",
                help="about 80 searches the first time a model or recipe is shown; cached after")
    c1, c2 = st.columns(2)
    budget_usd = c1.number_input("Budget, $", 1.0, 1e9, 60_000.0, step=5_000.0, key="budget_usd")
    deadline = c2.number_input("Deadline, days", 1.0, 36_500.0, 60.0, step=5.0, key="deadline_days")
    return {"budget_usd": float(budget_usd), "deadline_days": float(deadline)}


def sidebar_profile() -> tuple[str | None, str | None]:
    """-> (profile JSON or None for built-in, error message)."""
    st.header("Efficiency profile")
    src = st.radio("Profile", ["Built-in (published)", "Upload calibration profile"], key="profile_source")
    if src.startswith("Built-in"):
        return None, None
    up = st.file_uploader("Profile JSON from `calibrate` (≤ 1 MB)", type=["json"], key="profile_upload")
    if up is None:
        return None, None
    try:
        prof = profile_from_upload(up.name, up.getvalue())
    except UsageError as exc:
        return None, str(exc)
    return prof.model_dump_json(), None


# --------------------------------------------------------------------------- main area
def show_plan(plan, top: list, table: pd.DataFrame, prices_json: str) -> None:
    m, r, hw = plan.model, plan.recipe, plan.hardware
    st.markdown(f"**{m['name']}** · {m['params'] / 1e9:.2f} B parameters · {r['description']}  \n"
                f"{hw['description']} · profile: {plan.profile['name']} ({plan.profile['method']}, "
                f"{plan.profile['date']})")
    if plan.feasible:
        st.success(f"Fastest feasible of {plan.n_strategies:,} strategies"
                   + (f" (searched in {plan.search_ms:.0f} ms)" if plan.search_ms else ""))
    else:
        st.error(f"Nothing fits among {plan.n_strategies:,} strategies. Why: "
                 + "; ".join(plan.reasons or ["no strategy is feasible"]))
        if plan.suggestions:
            st.warning("What would fit:\n\n" + "\n".join(f"- {s}" for s in plan.suggestions))
        else:
            st.warning("No nearby change fits; try a smaller model, more or larger GPUs, or offload.")
        st.caption("The closest (least-memory) strategy is shown below for reference.")

    c_ = plan_cost(plan, prices_json)
    iv = plan.interval_days
    c = st.columns(4)
    c[0].metric("Days", fmt_days(plan.days), help="optimizer steps × step time / 86,400")
    c[1].metric("80% interval (days)", f"{fmt_days(iv[0])}–{fmt_days(iv[1])}" if iv else "n/a",
                help=plan.interval_source or "this profile has no validation residuals")
    c[2].metric("Floor at 100% of peak", f"{fmt_days(plan.days_at_peak)} days",
                help="the same tokens at 100% of the dense peak: no real run is faster")
    c[3].metric("Step time", f"{plan.step_time_s:.2f} s")
    c = st.columns(4)
    if c_ is None:
        for col, label in zip(c, ("Buy", "Run share", "Rent", "Power"), strict=True):
            col.metric(label, "—", help="no cost: nothing fits")
    else:
        c[0].metric("Buy", fmt_money(c_["hardware_usd"]),
                    help=f"GPUs ({c_['gpu_unit_source'] or 'no price'}) + base machine "
                         f"({c_['base_machine_source'] or 'none'})")
        c[1].metric("Run share of purchase", fmt_money(c_["amortized_usd"]),
                    help=f"purchase × days / ({c_['lifetime_years']:g} × 365)")
        c[2].metric("Rent", fmt_money(c_["rent_usd"]),
                    help=f"{c_['gpu_hours']:,.0f} GPU-hours × {fmt_money(c_['rent_usd_per_gpu_hr'])}/h "
                         f"({c_['rent_source'] or 'no price'})")
        c[3].metric("Power", fmt_money(c_["energy_usd"]),
                    help=(f"{c_['energy_kwh']:,.0f} kWh at ${c_['electricity_usd_per_kwh']:.3g}/kWh, "
                          f"PUE {c_['pue']:g}, utilization {c_['utilization']:.0%}")
                    if c_["energy_kwh"] is not None else "unknown board power")
    c = st.columns(4)
    c[0].metric("MFU", f"{plan.mfu:.0%}", help=plan.conventions)
    c[1].metric("HFU", f"{plan.hfu:.0%}", help=plan.conventions)
    c[2].metric("Tokens/s", f"{plan.tokens_per_s:,.0f}")
    c[3].metric("GPU-hours", f"{plan.days * 24 * plan.hardware['n_gpus']:,.0f}")
    if c_ is not None:
        st.caption("cost: " + costs.format_line(c_))

    st.subheader("Strategy")
    st.markdown(f"`{plan.strategy_line()}`")
    for n in plan.notes:
        st.caption(f"note: {n}")

    left, right = st.columns(2)
    with left:
        mg = plan.memory_gib
        st.subheader("Memory per GPU")
        st.vega_lite_chart(memory_chart(plan), width="stretch")
        st.caption(f"{mg['total']:.1f} of {mg['capacity']:.1f} GiB usable"
                   + (f" · host {mg['host_offload_per_node']:.0f} GiB/node offloaded"
                      if mg.get("host_offload_per_node") else ""))
    with right:
        st.subheader("Step time")
        st.vega_lite_chart(breakdown_chart(breakdown_rows(plan)), width="stretch")
        st.caption(f"{plan.step_time_s:.2f} s per step: compute {plan.breakdown_s['compute']:.2f} s "
                   f"({plan.strategy['grad_accum']} × micro-batch {plan.strategy['micro_batch']})")

    st.subheader(f"Top {len(top)} strategies" if top else "Top strategies")
    if top:
        st.dataframe(table, hide_index=True, width="stretch")
    else:
        st.caption("no feasible strategy")


def show_sweep(model_key: str, recipe_json: str, prices_json: str, gpus: str) -> None:
    st.subheader("Days against cost, whole catalog")
    if not st.session_state.get("show_sweep", True):
        st.caption("catalog sweep off (sidebar)")
        return
    t0 = time.perf_counter()
    mode = json.loads(prices_json)["mode"]
    df, _options = priced_sweep(model_key, recipe_json, prices_json)
    if df.empty:
        st.caption("nothing in the catalog fits this model and recipe (or no prices are known)")
        return
    x_title = "purchase price, $ (buy)" if mode == "buy" else "rental bill, $ (rent)"
    cur = _canonical(gpus)
    st.vega_lite_chart(cached_pareto_chart(model_key, recipe_json, prices_json, cur, x_title),
                       width="stretch")
    front = df[df["pareto"]].sort_values("cost_usd")
    st.caption(f"{len(df)} feasible catalog configurations, each with its fastest strategy (built-in "
               f"profiles and prices above, this recipe, no pins). Pareto frontier ({mode}): "
               f"{', '.join(front['gpus'])}. "
               + ("Current choice: red diamond." if cur in set(df["gpus"]) else
                  "The current choice is not among the swept configurations.")
               + f" ({1e3 * (time.perf_counter() - t0):.0f} ms)")


def _canonical(gpus: str) -> str:
    """Canonical form of a cluster text for matching the sweep ('8x3090' -> '8xrtx3090')."""
    try:
        cl = hardware.parse_cluster(gpus)
    except UsageError:
        return gpus
    return f"{cl.gpus_per_node}x{cl.gpu.id}" if cl.nodes == 1 else f"{cl.nodes}x{cl.gpus_per_node}x{cl.gpu.id}"


def show_downloads(plan, table: pd.DataFrame, model_key: str, recipe_json: str, prices_json: str,
                   limits: dict) -> None:
    st.subheader("Downloads")
    d = plan.to_dict()
    d["cost"] = plan_cost(plan, prices_json)
    c = st.columns(3)
    c[0].download_button("Plan (JSON)", json.dumps(d, indent=2, default=str),
                         file_name="plan.json", mime="application/json", key="dl_json")
    c[1].download_button("Top strategies (CSV)", table.to_csv(index=False),
                         file_name="strategies.csv", mime="text/csv", key="dl_csv")
    md = None
    if st.session_state.get("show_sweep", True):
        md = budget_markdown(model_key, recipe_json, prices_json, json.dumps(limits, sort_keys=True),
                             f"{plan.model['name']}, {plan.recipe['description']}")
    if md is None:
        c[2].download_button("Budget (Markdown)", "", file_name="budget.md", disabled=True, key="dl_md",
                             help="needs the catalog sweep (sidebar), simulator.budget and at least "
                                  "one feasible catalog option")
    else:
        c[2].download_button("Budget (Markdown)", md, file_name="budget.md", mime="text/markdown",
                             key="dl_md", help=f"budget ${limits['budget_usd']:,.0f}, deadline "
                             f"{limits['deadline_days']:g} days, {json.loads(prices_json)['mode']}")


def main() -> None:
    st.set_page_config(page_title="Pre-training what-if explorer", layout="wide")
    try:
        render()
    except UsageError as exc:
        st.error(str(exc))
    except Exception as exc:  # a bug, not bad input: say so in one line rather than a traceback
        st.error(f"internal error ({type(exc).__name__}: {exc}); please report it with the inputs above")


def render() -> None:
    t0 = time.perf_counter()
    with st.sidebar:
        model_key, model_err = sidebar_model()
        recipe = sidebar_recipe()
        gpus, hw_knobs = sidebar_hardware()
        pins = sidebar_strategy()
        prices = sidebar_prices()
        limits = sidebar_limits()
        profile_json, profile_err = sidebar_profile()
    st.title("Pre-training what-if explorer")
    if model_err or profile_err:
        st.error(model_err or profile_err)
        return
    assert model_key is not None
    knobs = {**recipe, **hw_knobs, **pins}
    try:
        _res, plan, top, table = cached_search(model_key, gpus, json.dumps(knobs, sort_keys=True), profile_json)
    except UsageError as exc:
        st.error(str(exc))
        return
    prices_json = json.dumps(prices, sort_keys=True)
    st.session_state["last_plan"] = plan.to_dict()
    try:
        show_plan(plan, top, table, prices_json)
    except UsageError as exc:
        st.error(str(exc))
        return
    # the headline above is already on screen; the catalog sweep (the slow part when cold) follows
    recipe_json = json.dumps(recipe, sort_keys=True)
    try:
        show_sweep(model_key, recipe_json, prices_json, gpus)
        show_downloads(plan, table, model_key, recipe_json, prices_json, limits)
    except UsageError as exc:
        st.error(f"catalog sweep: {exc}")
    st.caption(f"rendered in {1e3 * (time.perf_counter() - t0):.0f} ms")


if __name__ == "__main__":
    main()
