"""The what-if explorer: ``streamlit run app.py``.

Every knob in the sidebar re-runs the package's search and the main area lays out the answer
(days, dollars, memory, step-time breakdown, top strategies, the catalog's days-versus-cost
frontier). No physics lives here, and no parsing, wording or chart data either: numbers come from
``simulator.answer.api`` (as for the ``simulate`` command) and the package's cost, comparison and
budget modules, everything else from :mod:`simulator.frontends.explorer`; this file only collects
inputs, caches and draws.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pandas as pd
import streamlit as st

from simulator.answer import costs
from simulator.answer.plan import NO_FIX
from simulator.core.errors import UsageError
from simulator.core.vocab import PRECISIONS
from simulator.frontends import compare
from simulator.frontends.explorer import downloads
from simulator.frontends.explorer.charts import (
    breakdown_chart,
    breakdown_rows,
    constraint_chart,
    constraint_rows,
    left_out,
    memory_chart,
    pareto_chart,
    sweep_frame,
    top_table,
)
from simulator.frontends.explorer.inputs import (
    MAX_UPLOAD_MB,
    canonical_cluster,
    custom_spec,
    model_from_key,
    model_from_upload,
    prices_from,
    profile_from_json,
    profile_from_upload,
    profile_gpu_mismatch,
    search,
    with_base_recipe,
)
from simulator.frontends.explorer.verdict import (
    budget_check,
    no_price_words,
    plan_cost,
    price_options,
    verdict_words,
)
from simulator.frontends.explorer.words import (
    app_words,
    days_text,
    fmt_money,
    interval_words,
    microbatch_words,
    plain_source,
    range_text,
    recipe_words,
)
from simulator.hardware import catalog as hardware
from simulator.hardware.profile import Profile
from simulator.model.hf_config import SUPPORTED_MODEL_TYPES
from simulator.model.presets import get_model, list_models
from simulator.model.recipes import default_recipe
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import ATTENTIONS, CHECKPOINTINGS, OFFLOADS, OPTIMIZERS, SHARDINGS

AUTO = "auto"
DEFAULT_MODEL, DEFAULT_GPU, DEFAULT_PER_NODE = "pythia-1b", "rtx3090", 8


# --------------------------------------------------------------------------- cached package calls
@st.cache_resource(max_entries=64, show_spinner=False)
def _profile(profile_json: str | None) -> Profile | None:
    return profile_from_json(profile_json)


def _knobs(knobs_json: str, profile_json: str | None) -> dict:
    knobs = json.loads(knobs_json)
    if profile_json is not None:
        knobs["profile"] = _profile(profile_json)
    return knobs


@st.cache_resource(max_entries=256, show_spinner=False)
def cached_search(model_key: str, gpus: str, knobs_json: str, profile_json: str | None):
    """The search for one input set (:func:`simulator.frontends.explorer.inputs.search`) and its
    Top strategies table."""
    result, plan, top = search(model_from_key(model_key), gpus, _knobs(knobs_json, profile_json))
    return result, plan, top, top_table(top)


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_sweep(model_key: str, recipe_json: str) -> list:
    """Every catalog GPU × {1, 2, 4, 8} and 2 / 4 nodes of 8, each with its fastest feasible plan
    (``simulator.frontends.compare.sweep``). The expensive part of a render (~80 searches), so it is cached
    apart from the prices."""
    return compare.sweep(model_from_key(model_key), multi_node=True, prices=default_prices(), **json.loads(recipe_json))


@st.cache_resource(max_entries=64, show_spinner=False)
def priced_sweep(model_key: str, recipe_json: str, prices_json: str) -> tuple[pd.DataFrame, list]:
    """The sweep priced with the sidebar's prices: (frame for the chart, compare.Options); each
    point's dollars are what the budget is held against, so the chart, the verdict and the budget
    report agree (:func:`simulator.frontends.explorer.charts.sweep_frame`)."""
    options = price_options(cached_sweep(model_key, recipe_json), cached_prices(prices_json))
    return sweep_frame(options, _mode(prices_json)), options


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_prices(prices_json: str) -> costs.Prices:
    """Built-in prices with the sidebar's overrides."""
    return prices_from(json.loads(prices_json), default_prices())


@st.cache_resource(show_spinner=False)
def default_prices() -> costs.Prices:
    return costs.default_prices()


def _mode(prices_json: str) -> str:
    """'buy' or 'rent': which dollars the sidebar holds against the budget."""
    return json.loads(prices_json)["mode"]


@st.cache_data(max_entries=128, show_spinner=False)
def cached_pareto_chart(model_key: str, recipe_json: str, prices_json: str, current: str,
                        x_title: str, limits_json: str) -> dict:
    return pareto_chart(priced_sweep(model_key, recipe_json, prices_json)[0], current, x_title,
                        json.loads(limits_json))


@st.cache_resource(max_entries=64, show_spinner=False)
def budget_markdown(model_key: str, recipe_json: str, prices_json: str, limits_json: str,
                    model_line: str, current_json: str) -> str | None:
    """The Markdown budget justification over the priced sweep, with the configuration on screen
    reported first (:func:`simulator.frontends.explorer.downloads.budget_markdown`)."""
    _df, options = priced_sweep(model_key, recipe_json, prices_json)
    return downloads.budget_markdown(options, _mode(prices_json), json.loads(limits_json),
                                     cached_prices(prices_json), model_line, json.loads(current_json))


# --------------------------------------------------------------------------- sidebar
def _opt_int(label: str, key: str, help: str, max_value: int = 10**9) -> int | None:
    v = st.number_input(label, min_value=0, max_value=max_value, value=0, step=1, key=key, help=help)
    return int(v) if v else None


#: the widget states the same limit as the app (older Streamlit releases lack the argument)
_UPLOAD_LIMIT = ({"max_upload_size": MAX_UPLOAD_MB}
                 if "max_upload_size" in inspect.signature(st.file_uploader).parameters else {})


def _kept_upload(widget_key: str, store_key: str, label: str, help: str):
    """A file uploader whose file survives the widget being hidden (switching source and back):
    the last upload is kept in the session until another replaces it or it is cleared."""
    up = st.file_uploader(label, type=["json"], key=widget_key, help=help, **_UPLOAD_LIMIT)
    if up is not None:
        st.session_state[store_key] = (up.name, up.getvalue())
        return up.name, up.getvalue()
    kept = st.session_state.get(store_key)
    if kept is not None:
        c1, c2 = st.columns([3, 1])
        c1.caption(f"using {kept[0]} (uploaded earlier)")
        if c2.button("clear", key=f"{store_key}_clear"):
            del st.session_state[store_key]
            st.rerun()
    return kept


def sidebar_model() -> tuple[str | None, str | None, str | None]:
    """-> (model key, message for the user, preset whose recipe applies)."""
    st.header("Model")
    names = list_models()
    source = st.radio("Source", ["Preset", "Custom dimensions", "Upload config.json"], key="model_source",
                      horizontal=False)
    if source == "Preset":
        name = st.selectbox("Preset", names, index=names.index(DEFAULT_MODEL), key="model")
        return f"preset:{name}", None, None
    if source == "Custom dimensions":
        bases = [n for n in names if isinstance(get_model(n), ModelSpec)]  # transformer dimensions below
        base_name = st.selectbox("Start from", bases, index=bases.index(DEFAULT_MODEL), key="custom_base",
                                 help="the preset whose dimensions and training recipe you start from")
        base = get_model(base_name)
        c1, c2 = st.columns(2)
        layers = c1.number_input("Layers", 1, 1024, base.n_layers, key="custom_layers")
        hidden = c2.number_input("Hidden size", 1, 131072, base.hidden, key="custom_hidden")
        heads = c1.number_input("Heads", 1, 1024, base.n_heads, key="custom_heads")
        ffn = c2.number_input("MLP width", 1, 524288, base.ffn_hidden, key="custom_ffn")
        vocab = c1.number_input("Vocabulary", 1, 1_000_000, base.vocab_size, key="custom_vocab")
        ctx = c2.number_input("Max positions", 1, 1_048_576, base.max_positions, key="custom_ctx")
        try:
            spec = custom_spec(base, layers, hidden, heads, ffn, vocab, ctx)
        except UsageError as exc:
            return None, str(exc), None
        return "spec:" + spec.model_dump_json(), None, base.name
    got = _kept_upload("model_upload", "kept_model_upload", f"Hugging Face config.json (up to {MAX_UPLOAD_MB} MB)",
                       "the config.json of a model on the Hugging Face Hub; the model_type values read: "
                       + ", ".join(SUPPORTED_MODEL_TYPES))
    if got is None:
        return None, "upload", None
    try:
        spec = model_from_upload(*got)
    except UsageError as exc:
        return None, str(exc), None
    return "spec:" + spec.model_dump_json(), None, None


def sidebar_recipe(base_preset: str | None) -> dict:
    """Training length and batch; a custom model keeps the recipe of the preset it starts from."""
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
    if base_preset is not None:  # custom dimensions: the recipe of the preset they start from
        rec = with_base_recipe(rec, base_preset)
        base = get_model(base_preset)
        st.caption(f"recipe of {base.display_name}: {default_recipe(base).describe()}")
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
                            format_func=lambda i: "the GPU's usual link" if i == "default" else intra[i].name,
                            help="how the GPUs in one node talk to each other")
    if intra_id == "default" and gid in gpus:
        st.caption(f"usual link for {gpus[gid].short_name}: {hardware.get_link(gpus[gid].intra_node_link).name}")
    inter = st.number_input("Inter-node Gbit/s per node (0 = catalog default)", 0.0, 1e5, 0.0,
                            step=100.0, key="inter_node", disabled=nodes == 1)
    host = st.number_input("Host RAM per node, GiB (0 = assumed)", 0.0, 1e5, 0.0, step=64.0,
                           key="host_memory", help="the CPU memory of each machine; it matters when "
                           "optimizer states or weights are offloaded to the CPU")
    knobs: dict[str, Any] = {}
    if intra_id != "default":
        knobs["intra_node"] = intra_id
    if inter and nodes > 1:
        knobs["inter_node"] = float(inter)
    if host:
        knobs["host_memory"] = float(host)
    text = hardware.cluster_text(int(nodes), int(per), gid)
    return text, knobs


def sidebar_strategy() -> dict:
    st.header("Strategy")
    mode = st.radio("Search", ["Automatic search", "Pin knobs"], key="strategy_mode", horizontal=True,
                    help="the search tries every combination; pinning fixes a setting you must use")
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
    mb = _opt_int("Micro-batch (0 = search)", "pin_micro_batch", "samples per GPU in one forward and "
                  "backward pass; the rest of the batch is reached by accumulation", 65536)
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
                          step=0.01, key="kwh_price", help=plain_source(base.electricity_usd_per_kwh.source))
    c1, c2 = st.columns(2)
    gpu = c1.number_input("$ per GPU (0 = catalog)", 0.0, 1e7, 0.0, step=500.0, key="price_per_gpu")
    rent = c2.number_input("$ per GPU-hour (0 = catalog)", 0.0, 1e3, 0.0, step=0.1, key="rent_per_gpu_hour")
    pue = c1.number_input("PUE", *costs.PUE_RANGE, base.pue.value, step=0.05, key="pue",
                          help="facility power over the computers' power (cooling etc.); "
                               + plain_source(base.pue.source))
    life = c2.number_input("Lifetime, years", 0.5, 20.0, base.lifetime_years.value, step=0.5,
                           key="lifetime_years", help="years over which a purchase is written off; "
                           + plain_source(base.lifetime_years.source))
    return {"mode": mode, "kwh_price": float(kwh) or None, "price_per_gpu": float(gpu) or None,
            "rent_per_gpu_hour": float(rent) or None, "pue": float(pue), "lifetime_years": float(life)}


def sidebar_limits() -> dict:
    st.header("Budget and deadline")
    budget_usd = st.number_input("Budget, $", 1.0, 1e9, 60_000.0, step=5_000.0, key="budget_usd", format="%.0f",
                                 help="buying: purchase price plus the run's electricity; renting: the "
                                      "rental bill (Prices below)")
    deadline = st.number_input("Deadline, days", 1.0, 36_500.0, 60.0, step=5.0, key="deadline_days", format="%.1f")
    st.checkbox("Sweep the whole catalog (days against cost)", True, key="show_sweep",
                help="about 80 searches the first time a model or recipe is shown; cached after")
    return {"budget_usd": float(budget_usd), "deadline_days": float(deadline)}


def sidebar_profile() -> tuple[str | None, str | None, bool]:
    """-> (profile JSON or None for built-in, error message, apply to any GPU)."""
    st.header("Efficiency profile")
    src = st.radio("Profile", ["Built-in (published)", "Upload calibration profile"], key="profile_source",
                   help="how fast each GPU runs each kind of work; built-in figures come from published "
                        "benchmarks, a calibration profile from measuring your own device")
    if src.startswith("Built-in"):
        return None, None, False
    got = _kept_upload("profile_upload", "kept_profile_upload",
                       f"Profile JSON written by calibrate (up to {MAX_UPLOAD_MB} MB)",
                       "measure your device with the calibrate command, then upload the file it writes")
    any_gpu = st.checkbox("Use this profile for the GPU chosen above even if it measured another device",
                          False, key="profile_any_gpu")
    if got is None:
        return None, None, any_gpu
    try:
        prof = profile_from_upload(*got)
    except UsageError as exc:
        return None, str(exc), any_gpu
    return prof.model_dump_json(), None, any_gpu


# --------------------------------------------------------------------------- main area
def top_columns() -> dict:
    """How the Top strategies table shows each column: thousands separators, one number of
    decimals per column, units in the header."""
    num = st.column_config.NumberColumn
    return {"#": num(format="%d", width="small"),
            "days": num(format="%,.1f", help="estimated days"),
            "days, slow end": num(format="%,.1f", help="the slow end of the likely range (days)"),
            "MFU %": num(format="%.1f"), "memory GiB": num(format="%,.1f", help="per GPU"),
            "step s": num(format="%,.2f", help="seconds per optimizer step"),
            "tokens/s": num(format="%,d"), "strategy": st.column_config.TextColumn(width="large")}


HOW_TO_READ = """
- **Verdict**: the plan against your budget and deadline (sidebar), at the estimate and at the slow
  end of the likely range: *fits*, *misses at the slow end* (plan for the slow end), or *misses*.
- **Days** is the estimated wall-clock time to pre-train with the fastest settings the search found
  for your hardware. The **likely range** next to it comes from comparing this simulator with real
  training runs: they were usually *slower* than estimated, so plan with the upper end too.
- **Floor** is the time at 100% of the GPUs' peak speed: no real run can be faster.
- **Dollars**: buying (GPUs plus machines), the share of that purchase this run uses up, renting in a
  cloud, and electricity. Change prices in the sidebar.
- **Memory per GPU** shows what fills each GPU; the dashed line is what the card can hold.
- **Step time** shows where each training step's seconds go.
- **Top strategies** lists other settings that nearly match, simplest first when they tie.
- **Days against cost** places every catalog GPU and count on one chart; the dashed line joins the
  options nothing else beats on both time and money; the shaded corner is within your budget and
  deadline.
- **Red** always means the same thing: it does not fit, or it misses the budget or the deadline.
"""


def show_verdict(plan, prices_json: str, limits: dict) -> None:
    """The plan against the budget and deadline: green fits, amber misses at the slow end, red misses."""
    mode = _mode(prices_json)
    chk = budget_check(plan, cached_prices(prices_json), mode, limits)
    if chk is None:
        st.warning(no_price_words(mode))
        return
    {"fits": st.success, "misses at the slow end": st.warning, "misses": st.error}[chk["verdict"]](
        verdict_words(chk, mode))


def show_plan(plan, top: list, table: pd.DataFrame, prices_json: str, limits: dict) -> None:
    """The answer: what was simulated; then why nothing fits, or the fastest plan's verdict, days,
    dollars, efficiency, strategy and charts."""
    m, hw = plan.model, plan.hardware
    st.markdown(f"**{m['name']}** · {m['params'] / 1e9:.2f} B parameters  \n"
                f"{hw['description']} · efficiency profile: {plan.profile['name']} ({plan.profile['method']}, "
                f"{plan.profile['date']})")
    st.caption(recipe_words(plan))
    if not plan.feasible:
        show_infeasible(plan)
        return
    st.success(f"Fastest feasible of {plan.n_strategies:,} strategies")
    show_verdict(plan, prices_json, limits)
    warning = plan.memory_warning()
    if warning:
        st.warning(app_words(warning[0].upper() + warning[1:]) + ".")
    c_ = plan_cost(plan, cached_prices(prices_json))
    show_days(plan)
    show_dollars(c_)
    show_efficiency(plan)
    st.caption("cost: " + app_words(costs.format_line(c_)))
    show_strategy(plan, top, table)


def show_days(plan) -> None:
    """Days: the likely range, the estimate, the floor at peak, the step time; where the range comes from."""
    iv = plan.interval_days
    c = st.columns(4)
    c[0].metric("Days, likely range", range_text(*iv) if iv else "no range",
                help="8 in 10 comparable real runs fell in this range (see below)")
    c[1].metric("Days, estimate", days_text(plan.days),
                help="optimizer steps × estimated step time; real runs were usually slower")
    c[2].metric("Floor at 100% of peak", days_text(plan.days_at_peak),
                help="the same tokens at the GPUs' full dense speed: no real run is faster")
    c[3].metric("Step time", f"{plan.step_time_s:,.2f} s", help="seconds per optimizer step")
    st.info(interval_words(plan))


def show_dollars(c_: dict) -> None:
    """Dollars (``costs.plan_cost``): buying, the run's share of the purchase, renting, power."""
    c = st.columns(4)
    c[0].metric("Buy", fmt_money(c_["hardware_usd"]),
                help=f"GPUs ({plain_source(c_['gpu_unit_source']) or 'no price'}) + machines "
                     f"({plain_source(c_['base_machine_source']) or 'none'})")
    c[1].metric("Run share of purchase", fmt_money(c_["amortized_usd"]),
                help=f"purchase × days / ({c_['lifetime_years']:g} years × 365): what this run uses up")
    c[2].metric("Rent", fmt_money(c_["rent_usd"]),
                help=f"{c_['gpu_hours']:,.0f} GPU-hours × {fmt_money(c_['rent_usd_per_gpu_hr'])} per hour "
                     f"({plain_source(c_['rent_source']) or 'no price'})")
    c[3].metric("Power", fmt_money(c_["energy_usd"]),
                help=(f"{c_['energy_kwh']:,.0f} kWh at ${c_['electricity_usd_per_kwh']:.3g}/kWh, "
                      f"PUE {c_['pue']:g}, GPUs busy {c_['utilization']:.0%} of the time")
                if c_["energy_kwh"] is not None else "the GPU's power draw is not known")


def show_efficiency(plan) -> None:
    """MFU, HFU, throughput and GPU-hours."""
    c = st.columns(4)
    conv = ("share of the GPUs' peak speed spent on the model's own arithmetic (MFU) or on all arithmetic "
            "executed, recomputation included (HFU)")
    c[0].metric("MFU", f"{plan.mfu:.0%}", help=conv)
    c[1].metric("HFU", f"{plan.hfu:.0%}", help=conv)
    c[2].metric("Throughput", f"{plan.tokens_per_s:,.0f} tokens/s")
    c[3].metric("GPU time", f"{plan.days * 24 * plan.hardware['n_gpus']:,.0f} GPU-hours")


def show_strategy(plan, top: list, table: pd.DataFrame) -> None:
    """The strategy line, its notes, the memory and step-time charts, and the Top strategies table."""
    st.subheader("Strategy")
    st.markdown(f"`{plan.strategy_line()}`  \n{microbatch_words(plan)}")
    for n in plan.notes:
        st.caption(f"note: {app_words(n)}")
    show_memory_and_time(plan)
    st.subheader(f"Top {len(top)} strategies" if top else "Top strategies")
    if top:
        st.caption("one row per strategy (its best micro-batch); near-ties listed simplest first")
        st.dataframe(table, hide_index=True, width="stretch", column_config=top_columns())
    else:
        st.caption("no feasible strategy")


def show_infeasible(plan) -> None:
    """Nothing fits: why, what would, and what binds the closest strategy (GPU memory, or the host
    RAM its offloaded states need), charted — no days, interval or dollars: it does not run."""
    st.error(f"Nothing fits among {plan.n_strategies:,} strategies. Why: "
             + "; ".join(app_words(x) for x in plan.reasons or ["no strategy is feasible"]))
    if plan.fixes:
        st.warning("What would fit (each checked by re-running the search with it):\n\n"
                   + "\n".join(f"- {app_words(s)}" for s in plan.suggestions))
    else:
        st.warning(app_words(NO_FIX[0].upper() + NO_FIX[1:]) + ".")
    rows = constraint_rows(plan)
    binding = [r for r in rows if r["over"]]
    st.subheader("What does not fit")
    st.vega_lite_chart(constraint_chart(rows), width="stretch")
    st.caption("Binding: " + ("; ".join(f"{r['resource']}, {r['label']} GiB" for r in binding)
                              if binding else "the strategy's limits (see Why above)")
               + f". Closest strategy (least memory): {plan.strategy_line()}. It does not run, so no days, "
               "range or dollars are given.")
    if rows[0]["over"]:
        st.vega_lite_chart(memory_chart(plan), width="stretch")
        st.caption("what fills each GPU in the closest strategy; the dashed line is what the card holds")


def show_memory_and_time(plan) -> None:
    """Memory per GPU and step time, side by side."""
    left, right = st.columns(2)
    with left:
        mg = plan.memory_gib
        st.subheader("Memory per GPU")
        st.vega_lite_chart(memory_chart(plan), width="stretch")
        st.caption(f"{mg['total']:,.1f} of {mg['capacity']:,.1f} GiB usable"
                   + (f" · host RAM {mg['host_offload_per_node']:,.0f} of "
                      f"{mg.get('host_capacity_per_node', 0):,.0f} GiB per node holds offloaded states"
                      if mg.get("host_offload_per_node") else ""))
    with right:
        st.subheader("Step time")
        st.vega_lite_chart(breakdown_chart(breakdown_rows(plan)), width="stretch")
        st.caption(f"{plan.step_time_s:,.2f} s per step: compute {plan.breakdown_s['compute']:,.2f} s over "
                   f"{microbatch_words(plan)}")


def show_sweep(model_key: str, recipe_json: str, prices_json: str, gpus: str, limits: dict) -> None:
    """Days against dollars over the catalog (cached), where the choice on screen is, and what is left out."""
    st.subheader("Days against cost, whole catalog")
    if not st.session_state.get("show_sweep", True):
        st.caption("catalog sweep off (sidebar)")
        return
    mode = _mode(prices_json)
    df, options = priced_sweep(model_key, recipe_json, prices_json)
    out = left_out(options, mode)
    if df.empty:
        st.caption("nothing in the catalog fits this model and recipe, or no prices are known")
    else:
        x_title = "purchase price + electricity, $ (buy)" if mode == "buy" else "rental bill, $ (rent)"
        cur = canonical_cluster(gpus)
        st.vega_lite_chart(cached_pareto_chart(model_key, recipe_json, prices_json, cur, x_title,
                                               json.dumps(limits, sort_keys=True)), width="stretch")
        front = df[df["pareto"]].sort_values("cost_usd")
        if cur in set(df["cluster"]):
            where = "Current choice: black ring, its line reaching the slow end of its range."
        elif cur in {o.cluster for o in options}:
            where = "The current choice is left out of the chart (see below)."
        else:
            where = ("The current choice is not in the sweep, which tries 1, 2, 4 and 8 GPUs in one node "
                     "and 2 or 4 nodes of the most a node holds.")
        st.caption(f"{len(df)} catalog configurations, each with its fastest strategy (built-in profiles, "
                   f"prices above, this recipe, no pins). Pareto frontier ({mode}): "
                   f"{', '.join(front['gpus'])}. {where} Dashed lines: your budget and deadline; the "
                   "shaded corner meets both at the estimate.")
    if len(out):
        with st.expander(f"Left out of the chart: {len(out)} configurations"):
            st.dataframe(out, hide_index=True, width="stretch")


def show_downloads(plan, table: pd.DataFrame, model_key: str, recipe_json: str, prices_json: str,
                   limits: dict) -> None:
    """The plan (JSON), the Top strategies (CSV) and the budget justification (Markdown)."""
    st.subheader("Downloads")
    prices, mode = cached_prices(prices_json), _mode(prices_json)
    c = st.columns(3)
    c[0].download_button("Plan (JSON)", downloads.plan_json(plan, prices, mode, limits),
                         file_name="plan.json", mime="application/json", key="dl_json",
                         help="the plan, its cost and its verdict against your budget and deadline")
    c[1].download_button("Top strategies (CSV)", table.to_csv(index=False),
                         file_name="strategies.csv", mime="text/csv", key="dl_csv")
    md = None
    if st.session_state.get("show_sweep", True):
        md = budget_markdown(model_key, recipe_json, prices_json, json.dumps(limits, sort_keys=True),
                             f"{plan.model['name']}, {plan.recipe['description']}",
                             json.dumps(downloads.current_for_budget(plan, prices)))
    if md is None:
        c[2].download_button("Budget (Markdown)", "", file_name="budget.md", disabled=True, key="dl_md",
                             help="needs the catalog sweep (Budget and deadline in the sidebar) and at "
                                  "least one configuration in the catalog that fits")
    else:
        c[2].download_button("Budget (Markdown)", md, file_name="budget.md", mime="text/markdown",
                             key="dl_md", help=f"budget ${limits['budget_usd']:,.0f}, deadline "
                             f"{limits['deadline_days']:g} days, {mode}; the "
                             "configuration on screen first, then the cheapest catalog options")


def main() -> None:
    st.set_page_config(page_title="Pre-training what-if explorer", layout="wide")
    try:
        render()
    except UsageError as exc:
        st.error(app_words(str(exc)))
    except Exception as exc:  # a bug, not bad input: say so in one line rather than a traceback
        st.error(f"internal error ({type(exc).__name__}: {exc}); please report it with the inputs above")


def render() -> None:
    """The sidebar's inputs, then the answer (or what is missing to give one)."""
    with st.sidebar:
        model_key, model_msg, base_preset = sidebar_model()
        recipe = sidebar_recipe(base_preset)
        gpus, hw_knobs = sidebar_hardware()
        limits = sidebar_limits()
        pins = sidebar_strategy()
        prices = sidebar_prices()
        profile_json, profile_err, any_gpu = sidebar_profile()
    st.title("Pre-training what-if explorer")
    with st.expander("How to read this"):
        st.markdown(HOW_TO_READ)
    if not inputs_ready(model_msg or profile_err, gpus, profile_json, any_gpu):
        return
    assert model_key is not None
    knobs = {**recipe, **hw_knobs, **pins}
    if profile_json is not None and any_gpu:
        knobs["profile_any_gpu"] = True
    show_answer(model_key, gpus, knobs, profile_json, recipe, json.dumps(prices, sort_keys=True), limits)


def inputs_ready(problem: str | None, gpus: str, profile_json: str | None, any_gpu: bool) -> bool:
    """Say what the sidebar still lacks (an upload, a calibrated device's profile) or what is wrong
    in it (``problem``, a profile of another GPU); True when the search can run."""
    if problem == "upload":
        st.info("Upload a Hugging Face config.json in the sidebar (Model) to simulate it.")
        return False
    if problem:
        st.error(app_words(problem))
        return False
    if gpus.endswith("local") and profile_json is None:
        st.error("A calibrated device needs its efficiency profile: measure it with the calibrate command, "
                 "then upload the file it writes under Efficiency profile (sidebar).")
        return False
    mismatch = profile_gpu_mismatch(_profile(profile_json), gpus, any_gpu)
    if mismatch:
        st.error(mismatch)
        return False
    return True


def show_answer(model_key: str, gpus: str, knobs: dict, profile_json: str | None, recipe: dict,
                prices_json: str, limits: dict) -> None:
    """The search's plan on screen; for a plan that fits, then the catalog sweep and the downloads."""
    try:
        _res, plan, top, table = cached_search(model_key, gpus, json.dumps(knobs, sort_keys=True), profile_json)
    except UsageError as exc:
        st.error(app_words(str(exc)))
        return
    st.session_state["last_plan"] = plan.to_dict()
    try:
        show_plan(plan, top, table, prices_json, limits)
    except UsageError as exc:
        st.error(app_words(str(exc)))
        return
    if not plan.feasible:
        return
    # the headline above is already on screen; the catalog sweep (the slow part when cold) follows
    recipe_json = json.dumps(recipe, sort_keys=True)
    try:
        show_sweep(model_key, recipe_json, prices_json, gpus, limits)
        show_downloads(plan, table, model_key, recipe_json, prices_json, limits)
    except UsageError as exc:
        st.error(f"catalog sweep: {app_words(str(exc))}")


if __name__ == "__main__":
    main()
