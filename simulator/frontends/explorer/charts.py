"""The data behind the explorer's charts and tables: Vega-Lite specifications (memory per GPU,
what does not fit, step time, days against dollars over the catalog), the colours they share,
the Top strategies table and the configurations left out of the catalog chart. Days, dollars,
GiB and seconds as the plans give them; nothing is drawn here."""

from __future__ import annotations

import math

import pandas as pd

from simulator.answer.plan import format_days
from simulator.frontends import budget, compare
from simulator.hardware import catalog as hardware

from .words import APP_CONTROLS, app_words, cluster_words, fmt_money, strategy_words

#: One meaning for red in every chart and message: does not fit, or misses a limit. Limits the
#: plan is held against (usable memory, budget, deadline) are drawn in LIMIT; other colours never
#: come near red.
RED = "#d62728"
LIMIT = "#333333"
FITS_SHADE = "#2ca02c"  # the region within both budget and deadline, drawn faint
PART_COLOURS = ["#4c78a8", "#72b7b2", "#b279a2", "#f58518", "#eeca3b", "#9d755d"]  # memory / step-time parts


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


SWEEP_COLUMNS = ["cluster", "gpus", "gpu", "n_gpus", "days", "days_high", "cost_usd", "mfu", "strategy", "pareto"]


def sweep_frame(options: list, mode: str) -> pd.DataFrame:
    """The priced sweep (``compare.Option`` list) as the catalog chart's frame: each point's days
    and the dollars the budget is held against (``budget.entries``: purchase plus the run's
    electricity when buying, the rental bill when renting) and whether it is on the Pareto frontier."""
    es = [e for e in budget.entries(options, mode) if math.isfinite(e.cost_usd) and math.isfinite(e.days)]
    front = compare.pareto_front([(e.days, e.cost_usd) for e in es])
    rows = [{"cluster": e.option.cluster, "gpus": cluster_words(e.option.nodes, e.option.gpus_per_node, e.option.gpu),
             "gpu": e.option.gpu, "n_gpus": e.option.n_gpus, "days": e.days, "days_high": e.days_high,
             "cost_usd": e.cost_usd, "mfu": e.option.mfu, "strategy": e.option.strategy, "pareto": f}
            for e, f in zip(es, front, strict=True)]
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def memory_chart(plan) -> dict:
    """What fills each GPU (GiB per part, stacked) against its usable memory (a dashed line)."""
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
    """Seconds per optimizer step by part (:func:`breakdown_rows`), one bar each."""
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
