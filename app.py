"""The what-if explorer: ``streamlit run app.py``.

Every knob in the sidebar re-runs the package's search and the main area lays out the answer
(days, dollars, memory, step-time breakdown, top strategies, the catalog's days-versus-cost
frontier). No physics lives here: numbers come from ``simulator.api`` (and the cost, comparison
and budget modules when they are installed); this file only collects inputs, caches and draws.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from typing import Any

import pandas as pd
import streamlit as st

from simulator import api, hardware
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
SWEEP_COUNTS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8))  # (nodes, GPUs per node)
TOP_N = 10


# --------------------------------------------------------------------------- optional modules
def _optional(name: str):
    """A package module another engineer may not have landed yet (None if absent)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


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
    """``api.run_search`` for one input set; also the top plans and (if nothing fits) the fixes."""
    knobs = _knobs(knobs_json, profile_json)
    model = _model(model_key)
    res = api.run_search(model, gpus, **knobs)
    best = res.best
    best.search_ms = res.elapsed_ms
    if not best.feasible:
        best.suggestions = api.suggest_fixes(model, gpus, knobs, res)
    return res, best, res.plans(TOP_N)


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_sweep(model_key: str, recipe_json: str, prices_json: str) -> pd.DataFrame:
    """Fastest feasible plan of every catalog GPU and count, with days and dollars per row."""
    model = _model(model_key)
    recipe = json.loads(recipe_json)
    prices = json.loads(prices_json)
    compare = _optional("simulator.compare")
    if compare is not None and hasattr(compare, "sweep"):
        # HOOK: simulator.compare.sweep(model, **recipe, **prices) -> DataFrame with at least
        # gpus, days, cost_usd (and optionally pareto). Adapted here once the module lands.
        try:
            df = pd.DataFrame(compare.sweep(model, **recipe, **prices))
            if {"gpus", "days", "cost_usd"} <= set(df.columns):
                return _frontier(df)
        except TypeError:
            pass
    rows = []
    for g in hardware.list_gpus():
        for nodes, per in SWEEP_COUNTS:
            if per > g.max_gpus_per_node:
                continue
            text = f"{per}x{g.id}" if nodes == 1 else f"{nodes}x{per}x{g.id}"
            try:
                res = api.run_search(model, text, **recipe)
            except UsageError:
                continue
            if not res.order.size:
                continue
            p = res.best
            cost = plan_costs(p, prices)
            rows.append({"gpus": text, "gpu": g.short_name, "n_gpus": p.hardware["n_gpus"],
                         "days": p.days, "cost_usd": cost.get("headline"),
                         "cost_basis": cost.get("basis"), "mfu": p.mfu,
                         "strategy": p.strategy_line()})
    df = pd.DataFrame(rows, columns=["gpus", "gpu", "n_gpus", "days", "cost_usd", "cost_basis",
                                     "mfu", "strategy"])
    return _frontier(df)


def _frontier(df: pd.DataFrame) -> pd.DataFrame:
    """Mark rows no other row beats on both days and cost (ordering only, no physics)."""
    df = df.dropna(subset=["days", "cost_usd"]).reset_index(drop=True)
    if "pareto" in df.columns:
        return df
    best = math.inf
    pareto = [False] * len(df)
    for i in df.sort_values(["cost_usd", "days"]).index:
        if df.at[i, "days"] < best:
            pareto[i], best = True, df.at[i, "days"]
    df["pareto"] = pareto
    return df


# --------------------------------------------------------------------------- costs (hook)
def plan_costs(plan, prices: dict) -> dict:
    """Dollar figures of a plan: from ``plan.cost`` / ``simulator.costs`` when they exist.

    HOOK: the cost model (``simulator/costs.py``, ``Plan.cost``) is another engineer's work.
    Until it lands, the app shows GPU-hours and the catalog list price only (no dollar model
    of its own) and says so.
    """
    cost = getattr(plan, "cost", None)
    costs_mod = _optional("simulator.costs")
    if costs_mod is not None and hasattr(costs_mod, "plan_cost"):
        try:
            cost = costs_mod.plan_cost(plan, **prices)
        except TypeError:
            pass
    out: dict[str, Any] = {"basis": None, "headline": None, "items": {}}
    if isinstance(cost, dict) and cost:
        items = {k: v for k, v in cost.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out["items"] = items
        mode = prices.get("mode", "buy")
        for key in ((f"{mode}_usd", f"{mode}_run_usd", f"{mode}", "total_usd")):
            if key in items:
                out["headline"], out["basis"] = items[key], key
                break
        return out
    gpu_hours = plan.days * 24 * plan.hardware["n_gpus"]
    out["items"] = {"gpu_hours": gpu_hours}
    out["headline"], out["basis"] = gpu_hours, "gpu_hours"
    return out


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
        "height": 110,
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


def breakdown_frame(plan) -> pd.DataFrame:
    b = plan.breakdown_s
    rows = [("forward", b["forward"]), ("backward", b["backward"]), ("recompute", b["recompute"]),
            ("exposed comm", b["exposed_comm"]), ("optimizer", b["optimizer"]),
            ("offload", b["offload"])]
    return pd.DataFrame([{"part": k, "seconds": v} for k, v in rows])


def breakdown_chart(df: pd.DataFrame) -> dict:
    return {"height": 200, "mark": {"type": "bar"},
            "encoding": {"y": {"field": "part", "type": "nominal", "sort": None, "title": None},
                         "x": {"field": "seconds", "type": "quantitative", "title": "seconds per optimizer step"},
                         "color": {"field": "part", "type": "nominal", "legend": None},
                         "tooltip": [{"field": "part"}, {"field": "seconds", "format": ".3f"}]}}


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


def budget_markdown(plan, prices: dict) -> str | None:
    """HOOK: ``simulator.budget`` writes the Markdown budget when it exists."""
    budget = _optional("simulator.budget")
    if budget is None:
        return None
    for fn_name in ("budget_markdown", "write_budget", "render_budget", "markdown"):
        fn = getattr(budget, fn_name, None)
        if callable(fn):
            try:
                return fn(plan, **prices)
            except TypeError:
                return fn(plan)
    return None


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
        base_name = st.selectbox("Start from", names, index=names.index(DEFAULT_MODEL), key="custom_base")
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
    ids = list(gpus)
    gid = st.selectbox("GPU", ids, index=ids.index(DEFAULT_GPU), key="gpu",
                       format_func=lambda i: gpus[i].short_name)
    c1, c2 = st.columns(2)
    per = c1.number_input("GPUs per node", 1, 64, DEFAULT_PER_NODE, key="gpus_per_node")
    nodes = c2.number_input("Nodes", 1, 1024, 1, key="nodes")
    intra = {lk.id: lk for lk in hardware.list_links("intra")}
    intra_id = st.selectbox("Intra-node link", ["default"] + list(intra), key="intra_node",
                            format_func=lambda i: f"default ({gpus[gid].intra_node_link})" if i == "default"
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
    st.header("Prices")
    mode = st.radio("Hardware", ["buy", "rent"], key="price_mode", horizontal=True,
                    format_func=lambda m: {"buy": "Buy", "rent": "Rent (cloud)"}[m])
    kwh = st.number_input("Electricity, $/kWh", 0.0, 10.0, 0.15, step=0.01, key="usd_per_kwh")
    return {"mode": mode, "usd_per_kwh": float(kwh)}


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
def show_plan(plan, top: list, prices: dict) -> None:
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

    cost = plan_costs(plan, prices)
    items = cost["items"]
    iv = plan.interval_days
    c = st.columns(4)
    c[0].metric("Days", fmt_days(plan.days), help="optimizer steps × step time / 86,400")
    c[1].metric("80% interval (days)", f"{fmt_days(iv[0])}–{fmt_days(iv[1])}" if iv else "n/a",
                help=plan.interval_source or "this profile has no validation residuals")
    c[2].metric("Floor at 100% of peak", f"{fmt_days(plan.days_at_peak)} days",
                help="the same tokens at 100% of the dense peak: no real run is faster")
    c[3].metric("Step time", f"{plan.step_time_s:.2f} s")
    c = st.columns(4)
    if cost["basis"] == "gpu_hours":
        c[0].metric("GPU-hours", f"{items['gpu_hours']:,.0f}")
        price = hw.get("price_usd")
        c[1].metric("Catalog GPU price", fmt_money(price * hw["n_gpus"]) if price else "—",
                    help="list price × GPUs (catalog data); the cost model is not installed yet")
        c[2].metric("MFU", f"{plan.mfu:.0%}", help=plan.conventions)
        c[3].metric("Tokens/s", f"{plan.tokens_per_s:,.0f}")
        st.caption("Dollar figures (buy / rent / power) appear once `simulator.costs` is installed.")
    else:
        labels = {"buy": "Buy", "rent": "Rent", "power": "Power"}
        shown = 0
        for key, val in items.items():
            if shown >= 2:
                break
            lab = next((v for k, v in labels.items() if key.startswith(k)), None)
            if lab and key.endswith("usd"):
                c[shown].metric(lab, fmt_money(val))
                shown += 1
        c[2].metric("MFU", f"{plan.mfu:.0%}", help=plan.conventions)
        c[3].metric("Tokens/s", f"{plan.tokens_per_s:,.0f}")
        st.caption(" · ".join(f"{k}: {v:,.2f}" for k, v in items.items()))

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
        st.vega_lite_chart(breakdown_chart(breakdown_frame(plan)), width="stretch")
        st.caption(f"compute {plan.breakdown_s['compute']:.2f} s · HFU {plan.hfu:.0%}")

    st.subheader(f"Top {len(top)} strategies" if top else "Top strategies")
    if top:
        st.dataframe(top_table(top), hide_index=True, width="stretch")
    else:
        st.caption("no feasible strategy")


def show_sweep(model_key: str, recipe: dict, prices: dict, gpus: str, plan) -> pd.DataFrame | None:
    st.subheader("Days against cost, whole catalog")
    t0 = time.perf_counter()
    df = cached_sweep(model_key, json.dumps(recipe, sort_keys=True), json.dumps(prices, sort_keys=True))
    if df.empty:
        st.caption("nothing in the catalog fits this model and recipe")
        return df
    basis = df["cost_basis"].iloc[0] if "cost_basis" in df.columns else "cost_usd"
    x_title = "GPU-hours (cost model pending)" if basis == "gpu_hours" else f"cost, {prices['mode']} ($)"
    st.vega_lite_chart(pareto_chart(df, _canonical(gpus), x_title), width="stretch")
    front = df[df["pareto"]].sort_values("cost_usd")
    st.caption(f"{len(df)} catalog configurations (fastest feasible strategy each; built-in profiles); "
               f"Pareto frontier: {', '.join(front['gpus'])}; current choice: red diamond"
               + ("" if _canonical(gpus) in set(df["gpus"]) else " (not in the sweep)")
               + f" · {1e3 * (time.perf_counter() - t0):.0f} ms")
    return df


def _canonical(gpus: str) -> str:
    """Canonical form of a cluster text for matching the sweep ('8x3090' -> '8xrtx3090')."""
    try:
        cl = hardware.parse_cluster(gpus)
    except UsageError:
        return gpus
    return f"{cl.gpus_per_node}x{cl.gpu.id}" if cl.nodes == 1 else f"{cl.nodes}x{cl.gpus_per_node}x{cl.gpu.id}"


def show_downloads(plan, top: list, prices: dict) -> None:
    st.subheader("Downloads")
    c = st.columns(3)
    c[0].download_button("Plan (JSON)", json.dumps(plan.to_dict(), indent=2, default=str),
                         file_name="plan.json", mime="application/json", key="dl_json")
    c[1].download_button("Top strategies (CSV)", top_table(top).to_csv(index=False),
                         file_name="strategies.csv", mime="text/csv", key="dl_csv")
    md = budget_markdown(plan, prices)
    if md is None:
        c[2].download_button("Budget (Markdown)", "", file_name="budget.md", disabled=True, key="dl_md",
                             help="appears once simulator.budget is installed")
    else:
        c[2].download_button("Budget (Markdown)", md, file_name="budget.md", mime="text/markdown",
                             key="dl_md")


def main() -> None:
    st.set_page_config(page_title="Pre-training what-if explorer", layout="wide")
    t0 = time.perf_counter()
    with st.sidebar:
        model_key, model_err = sidebar_model()
        recipe = sidebar_recipe()
        gpus, hw_knobs = sidebar_hardware()
        pins = sidebar_strategy()
        prices = sidebar_prices()
        profile_json, profile_err = sidebar_profile()
    st.title("Pre-training what-if explorer")
    if model_err or profile_err:
        st.error(model_err or profile_err)
        return
    assert model_key is not None
    knobs = {**recipe, **hw_knobs, **pins}
    try:
        _res, plan, top = cached_search(model_key, gpus, json.dumps(knobs, sort_keys=True), profile_json)
    except UsageError as exc:
        st.error(str(exc))
        return
    st.session_state["last_plan"] = plan.to_dict()
    show_plan(plan, top, prices)
    sweep_box = st.container()  # laid out above the downloads, filled last (the slow part)
    show_downloads(plan, top, prices)
    with sweep_box:
        try:
            show_sweep(model_key, recipe, prices, gpus, plan)
        except UsageError as exc:
            st.error(f"catalog sweep: {exc}")
    st.caption(f"rendered in {1e3 * (time.perf_counter() - t0):.0f} ms")


main()
