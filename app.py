"""The what-if explorer: ``streamlit run app.py``.

Every knob in the sidebar re-runs the package's search and the main area lays out the answer
(days, dollars, memory, step-time breakdown, top strategies, the catalog's days-versus-cost
frontier). No physics lives here: numbers come from ``simulator.answer.api`` and the package's cost,
comparison and budget modules; this file only collects inputs, caches and draws.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
from typing import Any

import pandas as pd
import streamlit as st

from simulator.answer import api, costs
from simulator.answer.plan import NO_FIX, format_days
from simulator.core.errors import UsageError
from simulator.core.userfiles import parse_json
from simulator.core.vocab import PRECISIONS
from simulator.frontends import budget, compare
from simulator.hardware import catalog as hardware
from simulator.hardware.profile import Profile, parse_profile
from simulator.model.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from simulator.model.presets import get_model, list_models, model_from_dict
from simulator.model.recipes import default_recipe
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import ATTENTIONS, CHECKPOINTINGS, OFFLOADS, OPTIMIZERS, SHARDINGS

MAX_UPLOAD_MB = 1  # the upload widget's limit, in Streamlit's megabytes (MiB)
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 1024 * 1024  # uploads above it are refused before parsing
AUTO = "auto"
DEFAULT_MODEL, DEFAULT_GPU, DEFAULT_PER_NODE = "pythia-1b", "rtx3090", 8
TOP_N = 10
PRICE_OVERRIDES = ("price_per_gpu", "rent_per_gpu_hour", "kwh_price", "pue", "lifetime_years")


# --------------------------------------------------------------------------- uploads (data only)
def _read_upload(data: bytes, what: str) -> dict:
    """Bytes of an uploaded JSON file -> dict; UsageError for too large, not UTF-8 or not JSON."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise UsageError(f"{what} is {len(data) / 2**20:.1f} MB; the limit is {MAX_UPLOAD_MB} MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not a UTF-8 text file; expected JSON") from None
    obj = parse_json(text, what)
    if not isinstance(obj, dict):
        raise UsageError(f"{what}: expected a JSON object at the top level, got "
                         f"{type(obj).__name__}")
    return obj


def upload_name(file_name: str, cfg: dict) -> str:
    """What to call an uploaded model: the config's ``_name_or_path`` ('meta-llama/Llama-2-7b-hf'),
    else the file's name ('my-model.json' -> 'my-model'; a bare 'config.json' stays 'config.json'),
    never its ``model_type``."""
    ref = cfg.get("_name_or_path")
    if isinstance(ref, str) and ref.strip().strip("/"):
        return ref.strip().strip("/")
    base = file_name.rsplit("/", 1)[-1]
    stem = base.removesuffix(".json")
    return stem if stem and stem.lower() != "config" else f"uploaded {base or 'config.json'}"


def model_from_upload(name: str, data: bytes) -> ModelSpec:
    """An uploaded Hugging Face ``config.json`` -> ModelSpec (raises UsageError)."""
    cfg = _read_upload(data, f"model config {name!r}")
    return model_from_hf_config(cfg, name=upload_name(name, cfg))


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
    """``api.answer`` for one input set: the best plan (with fixes if nothing fits) and the top
    distinct plans (micro-batch variants of one plan collapsed, ties listed simplest first)."""
    ans = api.answer(_model(model_key), gpus, **_knobs(knobs_json, profile_json))
    top = ans.result.plans(TOP_N, distinct=True)
    return ans.result, ans.plan, top, top_table(top)


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_sweep(model_key: str, recipe_json: str) -> list:
    """Every catalog GPU × {1, 2, 4, 8} and 2 / 4 nodes of 8, each with its fastest feasible plan
    (``simulator.frontends.compare.sweep``). The expensive part of a render (~80 searches), so it is cached
    apart from the prices."""
    return compare.sweep(_model(model_key), multi_node=True, prices=default_prices(), **json.loads(recipe_json))


@st.cache_resource(max_entries=64, show_spinner=False)
def priced_sweep(model_key: str, recipe_json: str, prices_json: str) -> tuple[pd.DataFrame, list]:
    """The sweep priced with the sidebar's prices: (frame for the chart, compare.Options). Each
    point's dollars are what the budget is held against (``budget.entries``: purchase plus the
    run's electricity when buying, the rental bill when renting), so the chart, the verdict and the
    budget report agree."""
    mode = json.loads(prices_json)["mode"]
    prices = cached_prices(prices_json)
    options = [dataclasses.replace(o, cost=costs.plan_cost(o.plan, prices)) if o.feasible else o
               for o in cached_sweep(model_key, recipe_json)]
    es = [e for e in budget.entries(options, mode) if math.isfinite(e.cost_usd) and math.isfinite(e.days)]
    front = compare.pareto_front([(e.days, e.cost_usd) for e in es])
    rows = [{"cluster": e.option.cluster, "gpus": cluster_words(e.option.nodes, e.option.gpus_per_node, e.option.gpu),
             "gpu": e.option.gpu, "n_gpus": e.option.n_gpus, "days": e.days, "days_high": e.days_high,
             "cost_usd": e.cost_usd, "mfu": e.option.mfu, "strategy": e.option.strategy, "pareto": f}
            for e, f in zip(es, front, strict=True)]
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS), options


SWEEP_COLUMNS = ["cluster", "gpus", "gpu", "n_gpus", "days", "days_high", "cost_usd", "mfu", "strategy", "pareto"]


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


# --------------------------------------------------------------------------- words
#: Where each command-line flag lives in this app: package messages name flags; the app names
#: its own controls instead.
APP_CONTROLS = {
    "--host-memory": "“Host RAM per node” (Hardware)",
    "--price-per-gpu": "“$ per GPU” (Prices)",
    "--rent-per-gpu-hour": "“$ per GPU-hour” (Prices)",
    "--kwh-price": "“Electricity” (Prices)",
    "--pue": "“PUE” (Prices)",
    "--lifetime-years": "“Lifetime” (Prices)",
    "--tokens": "“Tokens” (Training length)",
    "--steps": "“Optimizer steps” (Training length)",
    "--global-batch": "“Global batch” (Training length)",
    "--seq-len": "“Sequence length” (Training length)",
    "--optimizer": "“Optimizer” (Training length)",
    "--micro-batch": "“Micro-batch” (Strategy)",
    "--precision": "“Precision” (Strategy)",
    "--attention": "“Attention” (Strategy)",
    "--checkpointing": "“Activation checkpointing” (Strategy)",
    "--sharding": "“Sharding” (Strategy)",
    "--offload": "“CPU offload” (Strategy)",
    "--compile": "“torch.compile” (Strategy)",
    "--intra-node": "“Intra-node link” (Hardware)",
    "--inter-node": "“Inter-node Gbit/s” (Hardware)",
    "--profile": "the efficiency profile",
    "--gpus": "the hardware",
    "--model": "the model",
}
_FLAG = re.compile(r"(?:(?:pass|set|use) )?(--[a-z][a-z-]*)(?: [A-Z][A-Z_]+\b)?")  # a flag and its FILE-like value
_COMMAND = re.compile(r"`([a-z][\w-]*)[^`]*`")  # `calibrate`, `validate --profile FILE ...`


def app_words(text: str) -> str:
    """A package message in the app's terms: flags become the sidebar controls that set them."""
    def sub(m: re.Match) -> str:
        flag = m.group(1)
        name = APP_CONTROLS.get(flag)
        if name is None:
            return m.group(0)
        return ("set " if m.group(0) != flag else "") + name
    text = _COMMAND.sub(lambda m: f"the {m.group(1)} command", _FLAG.sub(sub, str(text)))
    return _CLUSTER.sub(_cluster_words, text)


_CLUSTER = re.compile(r"'?\b(\d+)x(?:(\d+)x)?([a-z][a-z0-9-]*)\b'?")


def cluster_words(nodes: int, per_node: int, gpu: str) -> str:
    """'8 × RTX 3090 24 GB' on one node, '2 nodes × 8 × RTX 4090 24 GB' on several (as the
    package's hardware description starts)."""
    return f"{per_node} × {gpu}" if nodes == 1 else f"{nodes} nodes × {per_node} × {gpu}"


def _cluster_words(m: re.Match) -> str:
    """'2x8xh100-sxm' -> '2 nodes × 8 × H100 80 GB SXM'; '8xlocal' -> '8 × calibrated device'
    (left as is if not a catalog GPU)."""
    nodes, per = (int(m.group(1)), int(m.group(2))) if m.group(2) else (1, int(m.group(1)))
    if m.group(3) == "local":
        return cluster_words(nodes, per, "calibrated device")
    try:
        name = hardware.get_gpu(m.group(3)).short_name
    except UsageError:
        return m.group(0)
    return cluster_words(nodes, per, name)


_PATHY = re.compile(r"\s*(?:[^\s()]*/[^\s()]*|@?\b[0-9a-f]{7,40}\b|\b[\w.-]+\.(?:csv|py|yaml|json|md)\b|\bcommit\b)")


_REPO = re.compile(r"\b[\w-]+/([\w-]+(?:\.(?!(?:csv|py|yaml|yml|json|md)\b)\w+)?)\b(?![./\w])")  # owner/repo, not a file


def plain_source(text: str | None) -> str:
    """A source in a reader's words: file paths, file names and commit hashes dropped."""
    t = _REPO.sub(r"\1", str(text or ""))  # 'mosaicml/llm-foundry' -> 'llm-foundry'
    t = _PATHY.sub("", t)
    t = re.sub(r"\(\s*(?:[;,]|via|from)?\s*\)", "", t)
    t = re.sub(r"\(\s*[;,]\s*", "(", t)
    t = re.sub(r"\s*[;,]\s*\)", ")", t)
    t = re.sub(r"\s+([;,)])", r"\1", re.sub(r"\s{2,}", " ", t))
    return t.strip(" ;,:")


_IV = re.compile(r"from (\d+) validation residuals \(real runs (\d+% (?:slower|faster)) than predicted on "
                 r"average\): (.*)$")


def interval_words(plan) -> str:
    """Where the 80% range comes from, in plain words."""
    m = _IV.search(plan.interval_source or "")
    if not m:
        return ("This efficiency profile has no validation against real training runs, so there is no "
                "range: treat the estimate as optimistic.")
    n, bias, src = m.groups()
    src = re.sub(r",\s*\d+ runs.*$", "", plain_source(src.split(": ", 1)[-1]).split(";")[0])
    return (f"Where the range comes from: on {n} real training runs ({src}) the runs were on average "
            f"{bias} than this simulator estimated; 8 in 10 fell within the range shown.")


def microbatch_words(plan) -> str:
    """'12 micro-batches of 11 samples per GPU and step (the last one 7): 128 per GPU'."""
    st_, hw = plan.strategy, plan.hardware
    mb, ga = int(st_["micro_batch"]), int(st_["grad_accum"])
    per_gpu = -(-int(plan.recipe["global_batch"]) // int(hw["n_gpus"]))
    last = per_gpu - (ga - 1) * mb
    tail = f" (the last one {last})" if last != mb else ""
    return (f"{ga} micro-batch{'es' if ga > 1 else ''} of {mb} sample{'s' if mb > 1 else ''} per GPU and "
            f"step{tail}: {per_gpu} per GPU")


def strategy_words(plan) -> str:
    """The strategy line with the micro-batch spelled out."""
    line = plan.strategy_line()
    return re.sub(r"micro-batch \d+ × \d+ accumulation", microbatch_words(plan), line)


# --------------------------------------------------------------------------- formatting
def fmt_money(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"${x:,.0f}"


def _years(d: float) -> str:
    return f"{d / costs.DAYS_PER_YEAR:,.1f}"


def days_text(d: float) -> str:
    """'46.7 days'; from a year on with years beside: '584 days (1.6 years)'."""
    text = f"{format_days(d)} days"
    return text + (f" ({_years(d)} years)" if math.isfinite(d) and d >= costs.DAYS_PER_YEAR else "")


def range_text(lo: float, hi: float) -> str:
    """'36.9–65.3 days'; with years beside once the slow end passes a year."""
    text = f"{format_days(lo)}–{format_days(hi)} days"
    return text + (f" ({_years(lo)}–{_years(hi)} years)" if math.isfinite(hi) and hi >= costs.DAYS_PER_YEAR else "")


#: Top strategies: the answer first (days at the estimate and at the slow end), the long strategy
#: text last, so the columns a planner needs are in view without scrolling sideways.
TOP_COLUMNS = ["#", "days", "days, slow end", "MFU %", "memory GiB", "step s", "tokens/s", "strategy"]


def top_table(plans: list) -> pd.DataFrame:
    """Raw numbers (the CSV download); :func:`top_columns` formats them on screen."""
    return pd.DataFrame([{
        "#": i, "days": p.days, "days, slow end": p.interval_days[1] if p.interval_days else None,
        "MFU %": 100 * p.mfu, "memory GiB": p.memory_gib["total"], "step s": p.step_time_s,
        "tokens/s": p.tokens_per_s, "strategy": strategy_words(p),
    } for i, p in enumerate(plans, 1)], columns=TOP_COLUMNS)


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


#: One meaning for red in every chart and message: does not fit, or misses a limit. Limits the
#: plan is held against (usable memory, budget, deadline) are drawn in LIMIT; other colours never
#: come near red.
RED = "#d62728"
LIMIT = "#333333"
FITS_SHADE = "#2ca02c"  # the region within both budget and deadline, drawn faint
PART_COLOURS = ["#4c78a8", "#72b7b2", "#b279a2", "#f58518", "#eeca3b", "#9d755d"]  # memory / step-time parts


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
                                "title": f"GiB per GPU (usable {cap:.1f}: the dashed line)",
                                "scale": {"domain": [0, max(cap, m["total"]) * 1.05]}},
                          "color": {"field": "part", "type": "nominal", "sort": parts, "title": None,
                                    "scale": {"domain": parts, "range": PART_COLOURS}},
                          "order": {"field": "order"},
                          "tooltip": [{"field": "part"}, {"field": "GiB", "format": ",.2f"}]}},
            {"data": {"values": [{"cap": cap}]},
             "mark": {"type": "rule", "color": LIMIT, "strokeWidth": 3, "strokeDash": [6, 3]},
             "encoding": {"x": {"field": "cap", "type": "quantitative"}}},
        ],
    }


def constraint_rows(plan) -> list[dict]:
    """What the closest strategy needs against what there is: GPU memory per GPU and, when it
    offloads, host RAM per node (GiB); ``over`` marks the binding constraint(s)."""
    m = plan.memory_gib
    rows = [{"resource": "GPU memory per GPU", "need": m["total"], "have": m["capacity"]}]
    if m.get("host_offload_per_node") and m.get("host_capacity_per_node"):
        rows.append({"resource": "host RAM per node (offloaded states)", "need": m["host_offload_per_node"],
                     "have": m["host_capacity_per_node"]})
    for r in rows:
        r["over"] = r["need"] > r["have"]
        r["label"] = f"needs {r['need']:,.1f} GiB of {r['have']:,.1f}"
        r["end"] = max(r["need"], r["have"])  # where the words go: past the bar and the tick
    return rows


def constraint_chart(rows: list[dict]) -> dict:
    """One bar per resource (need, red where it is over), a tick at what there is."""
    hi = max(max(r["need"], r["have"]) for r in rows) * 1.25
    y = {"field": "resource", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 320}}
    return {
        "height": 60 * len(rows) + 40, "data": {"values": rows},
        "layer": [
            {"mark": {"type": "bar", "height": 22},
             "encoding": {"y": y, "x": {"field": "need", "type": "quantitative", "title": "GiB",
                                        "scale": {"domain": [0, hi]}},
                          "color": {"field": "over", "type": "nominal", "legend": None,
                                    "scale": {"domain": [True, False], "range": [RED, PART_COLOURS[0]]}},
                          "tooltip": [{"field": "resource"}, {"field": "need", "format": ",.1f"},
                                      {"field": "have", "format": ",.1f"}]}},
            {"mark": {"type": "tick", "color": LIMIT, "thickness": 3, "size": 34},
             "encoding": {"y": y, "x": {"field": "have", "type": "quantitative"}}},
            {"mark": {"type": "text", "align": "left", "dx": 6},
             "encoding": {"y": y, "x": {"field": "end", "type": "quantitative"}, "text": {"field": "label"}}},
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
    parts = [r["part"] for r in rows]
    return {"height": 200, "data": {"values": rows}, "mark": {"type": "bar"},
            "encoding": {"y": {"field": "part", "type": "nominal", "sort": None, "title": None},
                         "x": {"field": "seconds", "type": "quantitative", "title": "seconds per optimizer step"},
                         "color": {"field": "part", "type": "nominal", "legend": None,
                                   "scale": {"domain": parts, "range": PART_COLOURS[:len(parts)]}},
                         "tooltip": [{"field": "part"}, {"field": "seconds", "format": ",.3f"}]}}


#: One colour per catalog GPU, each at least 3:1 against the white page (WCAG's contrast for
#: graphics) and none near red, with a marker shape cycling through Vega-Lite's shapes, so no two
#: GPUs share both; markers get a dark outline.
GPU_COLOURS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#c2185b", "#5f6b00", "#00838f", "#e65100",
               "#3949ab", "#6d4c41", "#7b1fa2", "#2e7d32", "#0277bd", "#616161", "#ad1457", "#827717",
               "#4e342e", "#00695c", "#283593", "#6a1b9a"]
GPU_SHAPES = ["circle", "square", "diamond", "triangle-up", "triangle-down", "cross", "triangle-right",
              "triangle-left"]


@st.cache_data(max_entries=128, show_spinner=False)
def cached_pareto_chart(model_key: str, recipe_json: str, prices_json: str, current: str,
                        x_title: str, limits_json: str) -> dict:
    return pareto_chart(priced_sweep(model_key, recipe_json, prices_json)[0], current, x_title,
                        json.loads(limits_json))


#: A limit (budget, deadline) within this factor of the plotted range widens the axis to show it.
LIMIT_REACH = 10.0


def _log_domain(values: list[float], limit: float | None = None) -> list[float]:
    lo, hi = min(values), max(values)
    if limit is not None and lo / LIMIT_REACH <= limit <= hi * LIMIT_REACH:
        lo, hi = min(lo, limit), max(hi, limit)
    return [lo / 1.25, hi * 1.25]


def log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis over [lo, hi]: the powers of ten (1, 10, 100, 1000, ...), and
    2 and 5 times them where the range holds fewer than three powers of ten."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [10.0**k for k in range(k0, k1 + 1) if lo <= 10.0**k <= hi]
    if len(ticks) < 3:
        ticks = sorted(ticks + [m * 10.0**k for k in range(k0, k1 + 1) for m in (2, 5) if lo <= m * 10.0**k <= hi])
    return ticks


def pareto_chart(df: pd.DataFrame, current: str, x_title: str, limits: dict | None = None) -> dict:
    """Days against dollars on log axes, one colour and marker per GPU; the Pareto frontier dashed;
    the configuration on screen ringed, with a whisker to the slow end of its range; the budget
    and deadline as lines, the region within both shaded."""
    limits = limits or {}
    budget_usd, deadline = limits.get("budget_usd"), limits.get("deadline_days")
    values = df.assign(current=df["cluster"] == current).to_dict("records")
    gpus = [g.short_name for g in hardware.list_gpus()]
    gpus += sorted(set(df["gpu"]) - set(gpus))
    x_dom = _log_domain(df["cost_usd"].tolist(), budget_usd)
    y_dom = _log_domain(df["days"].tolist() + df["days_high"].tolist(), deadline)
    enc_x = {"field": "cost_usd", "type": "quantitative", "title": x_title,
             "scale": {"type": "log", "domain": x_dom, "nice": False},
             "axis": {"values": log_ticks(*x_dom), "format": "$~s"}}
    enc_y = {"field": "days", "type": "quantitative", "title": "days",
             "scale": {"type": "log", "domain": y_dom, "nice": False},
             "axis": {"values": log_ticks(*y_dom), "format": ",~g"}}
    tip = [{"field": "gpus", "title": "hardware"}, {"field": "days", "format": ",.1f"},
           {"field": "days_high", "format": ",.1f", "title": "days, slow end"},
           {"field": "cost_usd", "format": "$,.0f", "title": "dollars"}, {"field": "strategy"}]
    legend = {"orient": "bottom", "columns": 5, "symbolStrokeColor": LIMIT}  # every GPU in view, below
    colour = {"field": "gpu", "type": "nominal", "title": "GPU", "legend": legend,
              "scale": {"domain": gpus, "range": [GPU_COLOURS[i % len(GPU_COLOURS)] for i in range(len(gpus))]}}
    shape = {"field": "gpu", "type": "nominal", "title": "GPU", "legend": legend,
             "scale": {"domain": gpus, "range": [GPU_SHAPES[i % len(GPU_SHAPES)] for i in range(len(gpus))]}}
    layers: list[dict] = []
    if budget_usd and deadline:
        fits = {"x": max(x_dom[0], min(budget_usd, x_dom[1])), "y": max(y_dom[0], min(deadline, y_dom[1]))}
        layers.append({"data": {"values": [{**fits, "x0": x_dom[0], "y0": y_dom[0]}]},
                       "mark": {"type": "rect", "color": FITS_SHADE, "opacity": 0.08},
                       "encoding": {"x": {**enc_x, "field": "x0"}, "x2": {"field": "x"},
                                    "y": {**enc_y, "field": "y0"}, "y2": {"field": "y"}}})
    for value, enc, key, words in ((budget_usd, enc_x, "x", f"budget {fmt_money(budget_usd)}"),
                                   (deadline, enc_y, "y", f"deadline {format_days(deadline or 0)} days")):
        if value and enc["scale"]["domain"][0] <= value <= enc["scale"]["domain"][1]:
            layers.append({"data": {"values": [{"v": value, "words": words}]},
                           "mark": {"type": "rule", "color": LIMIT, "strokeDash": [6, 3], "strokeWidth": 1.5},
                           "encoding": {key: {**enc, "field": "v"}}})
            layers.append({"data": {"values": [{"v": value, "words": words}]},
                           "mark": {"type": "text", "color": LIMIT, "align": "left", "baseline": "bottom",
                                    "dx": 4, "dy": -4, **({"angle": 270} if key == "x" else {})},
                           "encoding": {key: {**enc, "field": "v"}, "text": {"field": "words"},
                                        **({"y": {"value": 0}} if key == "x" else {"x": {"value": 0}})}})
    layers += [
        {"data": {"values": values}, "mark": {"type": "point", "filled": True, "size": 110, "opacity": 0.95,
                                              "stroke": LIMIT, "strokeWidth": 0.8},
         "encoding": {"x": enc_x, "y": enc_y, "color": colour, "shape": shape, "tooltip": tip}},
        {"data": {"values": values}, "transform": [{"filter": "datum.pareto"}],
         "mark": {"type": "line", "point": False, "color": LIMIT, "strokeDash": [4, 3]},
         "encoding": {"x": {**enc_x, "sort": None}, "y": enc_y, "order": {"field": "cost_usd"}}},
        {"data": {"values": values}, "transform": [{"filter": "datum.current"}],
         "mark": {"type": "rule", "color": "black", "strokeWidth": 2},
         "encoding": {"x": enc_x, "y": enc_y, "y2": {"field": "days_high"}}},
        {"data": {"values": values}, "transform": [{"filter": "datum.current"}],
         "mark": {"type": "point", "shape": "circle", "size": 500, "filled": False, "color": "black",
                  "strokeWidth": 3},
         "encoding": {"x": enc_x, "y": enc_y, "tooltip": tip}},
    ]
    return {"height": 600, "layer": layers}  # the legend below shares it


def left_out(options: list, mode: str) -> pd.DataFrame:
    """Swept configurations not on the chart, and why (nothing fits, or no price in this mode)."""
    rows = []
    for o in options:
        hw = cluster_words(o.nodes, o.gpus_per_node, o.gpu)
        if not o.feasible:
            rows.append({"hardware": hw, "why": app_words(o.reason or "nothing fits")})
        elif o.cost_of(mode) is None:
            rows.append({"hardware": hw, "why": f"no {'purchase' if mode == 'buy' else 'rental'} price "
                         f"known for {o.gpu} (set {APP_CONTROLS['--price-per-gpu' if mode == 'buy' else '--rent-per-gpu-hour']})"})
    return pd.DataFrame(rows, columns=["hardware", "why"])


def current_entry(plan, prices_json: str) -> budget.Entry | None:
    """The plan on screen as the budget module's entry (bought or rented, as the sidebar says),
    so its verdict is the budget report's; None when it does not fit or has no price in this mode."""
    c = plan_cost(plan, prices_json)
    if c is None:
        return None
    hw = plan.hardware
    opt = compare.Option(hw["gpu_id"], hw["gpu"], hw["nodes"], hw["gpus_per_node"], True, days=plan.days,
                         days_at_peak=plan.days_at_peak, strategy=strategy_words(plan), mfu=plan.mfu, cost=c,
                         plan=plan)
    es = budget.entries([opt], json.loads(prices_json)["mode"])
    return es[0] if es else None


def budget_check(plan, prices_json: str, limits: dict) -> dict | None:
    """The plan against the budget and deadline (``budget.verdict``): verdict, why, and the days
    and dollars at the estimate and at the slow end of the 80% range; None without a price."""
    e = current_entry(plan, prices_json)
    if e is None:
        return None
    word, why = budget.verdict(e, limits["budget_usd"], limits["deadline_days"])
    d_hi, c_hi = e.pessimistic()
    return {"budget_usd": limits["budget_usd"], "deadline_days": limits["deadline_days"], "mode": e.mode,
            "verdict": word, "why": why, "days": e.days, "cost_usd": e.cost_usd, "days_slow_end": d_hi,
            "cost_usd_slow_end": c_hi}


def current_for_budget(plan, prices_json: str) -> dict | None:
    """The plan on screen in the budget report's terms (None when it does not fit)."""
    c = plan_cost(plan, prices_json)
    if c is None:
        return None
    hw = plan.hardware
    energy = c.get("energy_usd") or 0.0
    return {"label": hw["description"], "cluster": _canonical(f"{hw['nodes']}x{hw['gpus_per_node']}x{hw['gpu_id']}")
            if hw["gpu_id"] != "local" else "local",
            "strategy": strategy_words(plan), "days": plan.days,
            "days_high": plan.interval_days[1] if plan.interval_days else plan.days,
            "buy_usd": c["hardware_usd"] + energy if c.get("hardware_usd") is not None else None,
            "rent_usd": c.get("rent_usd")}


@st.cache_resource(max_entries=64, show_spinner=False)
def budget_markdown(model_key: str, recipe_json: str, prices_json: str, limits_json: str,
                    model_line: str, current_json: str) -> str | None:
    """The Markdown budget justification (``simulator.frontends.budget``) over the priced sweep, with the
    configuration on screen reported first."""
    _df, options = priced_sweep(model_key, recipe_json, prices_json)
    if not options:
        return None
    mode = json.loads(prices_json)["mode"]
    limits = json.loads(limits_json)
    return budget.to_markdown(model_line=model_line, es=budget.entries(options, mode),
                              budget=limits["budget_usd"], deadline=limits["deadline_days"], mode=mode,
                              prices=cached_prices(prices_json), generator="the pre-training what-if explorer",
                              csv_file=False, current=json.loads(current_json))


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
        base = default_recipe(get_model(base_preset))
        same_shape = "global_batch" not in rec and "seq_len" not in rec
        rec.setdefault("global_batch", base.global_batch)
        rec.setdefault("seq_len", base.seq_len)
        rec.setdefault("optimizer", base.optimizer)
        if "tokens" not in rec and "steps" not in rec:  # the preset's steps, or its tokens if reshaped
            if same_shape and rec["seq_len"] == base.seq_len:
                rec["steps"] = base.steps
            else:
                rec["tokens"] = int(base.tokens)
        st.caption(f"recipe of {get_model(base_preset).display_name}: {base.describe()}")
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


def check_profile_gpu(profile_json: str | None, gpus: str, any_gpu: bool) -> str | None:
    """The app's words for a profile that describes another device than the GPU chosen."""
    if profile_json is None or any_gpu or gpus.endswith("local"):
        return None
    prof = _profile(profile_json)
    try:
        hardware.check_profile_device(prof, hardware.parse_cluster(gpus).gpu, gpus)
    except UsageError:
        gid = prof.device.gpu_id
        g = hardware.get_gpu(gid).short_name if gid else None
        return (f"The profile {prof.name!r} measured {prof.device.name}"
                + (f" ({g})" if g else "") + ", not the GPU chosen above: choose "
                + (f"{g}" if g else "“calibrated device”") + " as the GPU, or tick “Use this profile for the "
                "GPU chosen above” under Efficiency profile.")
    return None


# --------------------------------------------------------------------------- main area
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

#: the verdict's words on screen, by ``budget.VERDICTS``
VERDICT_HEAD = {"fits": "Fits the budget and the deadline", "misses at the slow end": "Misses at the slow end",
                "misses": "Misses"}


def recipe_words(plan) -> str:
    """The training length and where it comes from, e.g. '1.38 T tokens (...), 20 tokens per
    parameter. Recipe: generic default (not a published recipe): ...'."""
    r, m = plan.recipe, plan.model
    per_param = f", {r['tokens'] / m['params']:,.0f} tokens per parameter" if m.get("params") else ""
    src = re.sub(r"^\((.*?)\)", r"\1", plain_source(r.get("source"))) or "no source recorded"
    return (f"Training length: {r['description']}{per_param}. Recipe: {src}. "
            "Set “Tokens” or “Optimizer steps” under Training length to match the run you plan.")


def show_verdict(plan, prices_json: str, limits: dict) -> None:
    """The plan against the budget and deadline: green fits, amber misses at the slow end, red misses."""
    chk = budget_check(plan, prices_json, limits)
    mode = json.loads(prices_json)["mode"]
    if chk is None:
        st.warning(f"No verdict against the budget: no {'purchase' if mode == 'buy' else 'rental'} price is "
                   f"known for this hardware (set {APP_CONTROLS['--price-per-gpu' if mode == 'buy' else '--rent-per-gpu-hour']}).")
        return
    what = "buy, with electricity" if mode == "buy" else "rent"
    est = f"{days_text(chk['days'])} and {fmt_money(chk['cost_usd'])} ({what}) at the estimate"
    slow = f"{days_text(chk['days_slow_end'])} and {fmt_money(chk['cost_usd_slow_end'])} at the slow end of the likely range"
    limits_line = (f"budget {fmt_money(chk['budget_usd'])}, deadline {format_days(chk['deadline_days'])} days")
    head = VERDICT_HEAD[chk["verdict"]]
    text = f"**{head}** ({limits_line}): {est}; {slow}."
    if chk["why"]:
        why = "; ".join(chk["why"])
        text += f" {why[0].upper()}{why[1:]}."
    {"fits": st.success, "misses at the slow end": st.warning, "misses": st.error}[chk["verdict"]](text)


def show_plan(plan, top: list, table: pd.DataFrame, prices_json: str, limits: dict) -> None:
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
    c_ = plan_cost(plan, prices_json)
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
    c = st.columns(4)
    conv = ("share of the GPUs' peak speed spent on the model's own arithmetic (MFU) or on all arithmetic "
            "executed, recomputation included (HFU)")
    c[0].metric("MFU", f"{plan.mfu:.0%}", help=conv)
    c[1].metric("HFU", f"{plan.hfu:.0%}", help=conv)
    c[2].metric("Throughput", f"{plan.tokens_per_s:,.0f} tokens/s")
    c[3].metric("GPU time", f"{plan.days * 24 * plan.hardware['n_gpus']:,.0f} GPU-hours")
    st.caption("cost: " + app_words(costs.format_line(c_)))

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
    if plan.suggestions:
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
    st.subheader("Days against cost, whole catalog")
    if not st.session_state.get("show_sweep", True):
        st.caption("catalog sweep off (sidebar)")
        return
    mode = json.loads(prices_json)["mode"]
    df, options = priced_sweep(model_key, recipe_json, prices_json)
    out = left_out(options, mode)
    if df.empty:
        st.caption("nothing in the catalog fits this model and recipe, or no prices are known")
    else:
        x_title = "purchase price + electricity, $ (buy)" if mode == "buy" else "rental bill, $ (rent)"
        cur = _canonical(gpus)
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


def _canonical(gpus: str) -> str:
    """Canonical form of a cluster text for matching the sweep ('8x3090' -> '8xrtx3090')."""
    try:
        cl = hardware.parse_cluster(gpus)
    except UsageError:
        return gpus
    return cl.text


def plan_json(plan, prices_json: str, limits: dict) -> str:
    """The plan download: the plan, its cost, and its verdict against the budget and deadline."""
    d = plan.to_dict()
    d["cost"] = plan_cost(plan, prices_json)
    d["budget_check"] = budget_check(plan, prices_json, limits)
    return json.dumps(d, indent=2, default=str, allow_nan=False)


def show_downloads(plan, table: pd.DataFrame, model_key: str, recipe_json: str, prices_json: str,
                   limits: dict) -> None:
    st.subheader("Downloads")
    c = st.columns(3)
    c[0].download_button("Plan (JSON)", plan_json(plan, prices_json, limits),
                         file_name="plan.json", mime="application/json", key="dl_json",
                         help="the plan, its cost and its verdict against your budget and deadline")
    c[1].download_button("Top strategies (CSV)", table.to_csv(index=False),
                         file_name="strategies.csv", mime="text/csv", key="dl_csv")
    md = None
    if st.session_state.get("show_sweep", True):
        md = budget_markdown(model_key, recipe_json, prices_json, json.dumps(limits, sort_keys=True),
                             f"{plan.model['name']}, {plan.recipe['description']}",
                             json.dumps(current_for_budget(plan, prices_json)))
    if md is None:
        c[2].download_button("Budget (Markdown)", "", file_name="budget.md", disabled=True, key="dl_md",
                             help="needs the catalog sweep (Budget and deadline in the sidebar) and at "
                                  "least one configuration in the catalog that fits")
    else:
        c[2].download_button("Budget (Markdown)", md, file_name="budget.md", mime="text/markdown",
                             key="dl_md", help=f"budget ${limits['budget_usd']:,.0f}, deadline "
                             f"{limits['deadline_days']:g} days, {json.loads(prices_json)['mode']}; the "
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
    if model_msg == "upload":
        st.info("Upload a Hugging Face config.json in the sidebar (Model) to simulate it.")
        return
    if model_msg or profile_err:
        st.error(app_words(model_msg or profile_err))
        return
    assert model_key is not None
    if gpus.endswith("local") and profile_json is None:
        st.error("A calibrated device needs its efficiency profile: measure it with the calibrate command, "
                 "then upload the file it writes under Efficiency profile (sidebar).")
        return
    mismatch = check_profile_gpu(profile_json, gpus, any_gpu)
    if mismatch:
        st.error(mismatch)
        return
    knobs = {**recipe, **hw_knobs, **pins}
    if profile_json is not None and any_gpu:
        knobs["profile_any_gpu"] = True
    try:
        _res, plan, top, table = cached_search(model_key, gpus, json.dumps(knobs, sort_keys=True), profile_json)
    except UsageError as exc:
        st.error(app_words(str(exc)))
        return
    prices_json = json.dumps(prices, sort_keys=True)
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
