"""`simulate compare`: every catalog GPU x {1, 2, 4, 8} (and multi-node when asked), each with
its fastest feasible strategy; days, GPU-hours and dollars; the Pareto frontier of days
against cost; CSV and plot export.

Exit status: 0 = at least one feasible option, 1 = none, 2 = usage error.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from dataclasses import dataclass, field

from rich.table import Table

from ..answer.api import run_search
from ..answer.costs import Prices, add_cost_args, default_prices, plan_cost, prices_from_args, usd
from ..answer.plan import format_days
from ..answer.report import Console
from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import UsageError
from ..engine.setup import resolve_model_input
from ..hardware import catalog as hardware
from ..model.recipes import make_recipe
from ..strategy.knobs import check_pins
from .args import ArgParser, add_recipe_args, recipe_knobs

COUNTS = (1, 2, 4, 8)
MULTI_NODE = (2, 4)  # nodes of gpus_per_node = the GPU's max (8) when --multi-node
BASES = ("buy", "amortized", "rent")
_BASIS_KEY = {"buy": "hardware_usd", "amortized": "amortized_usd", "rent": "rent_usd"}
#: show a progress bar once a sweep is projected to take longer than this (seconds)
PROGRESS_AFTER_S = 1.0


@dataclass
class Option:
    """One cluster of the sweep with its fastest feasible strategy (or why none fits)."""

    gpu_id: str
    gpu: str  # short name
    nodes: int
    gpus_per_node: int
    feasible: bool
    reason: str | None = None
    days: float | None = None
    days_low: float | None = None  # the 80% interval (None: the profile has no validation residuals)
    days_high: float | None = None
    days_at_peak: float | None = None
    strategy: str | None = None
    strategy_dict: dict | None = None
    mfu: float | None = None
    cost: dict | None = None
    pareto: bool = False
    plan: object = field(default=None, repr=False)

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def cluster(self) -> str:
        """--gpus text for this option, e.g. '4xa100-80gb-sxm' or '2x8xh100-sxm'."""
        return hardware.cluster_text(self.nodes, self.gpus_per_node, self.gpu_id)

    @property
    def label(self) -> str:
        """e.g. '4 × A100 80 GB SXM' or '2 × 8 × H100 80 GB SXM'."""
        head = f"{self.gpus_per_node} ×" if self.nodes == 1 else f"{self.nodes} × {self.gpus_per_node} ×"
        return f"{head} {self.gpu}"

    def cost_of(self, basis: str, safe: bool = False) -> float | None:
        """Dollars on ``basis`` ('buy', 'amortized', 'rent'); None if unknown or infeasible.
        ``safe``: at the slow end of the 80% interval (the run share and rent grow with the days;
        the purchase does not)."""
        if not self.feasible or not self.cost:
            return None
        c = self.cost.get(_BASIS_KEY[basis])
        if c is None or not safe or basis == "buy":
            return c
        return c * self.slow_days / self.days

    @property
    def slow_days(self) -> float | None:
        """The slow end of the 80% interval, or the estimate where there is none."""
        return self.days_high if self.days_high is not None else self.days

    def row(self) -> dict:
        """Flat dict for CSV/JSON."""
        c = self.cost or {}
        return {"gpu_id": self.gpu_id, "gpu": self.gpu, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "n_gpus": self.n_gpus, "cluster": self.cluster, "feasible": self.feasible,
                "reason": self.reason or "", "days": self.days, "days_low": self.days_low,
                "days_high": self.days_high, "days_at_peak": self.days_at_peak,
                "gpu_hours": c.get("gpu_hours"), "buy_usd": c.get("hardware_usd"),
                "amortized_usd": c.get("amortized_usd"), "rent_usd": c.get("rent_usd"),
                "energy_kwh": c.get("energy_kwh"), "energy_usd": c.get("energy_usd"),
                "gpu_unit_usd": c.get("gpu_unit_usd"), "gpu_unit_source": c.get("gpu_unit_source"),
                "rent_usd_per_gpu_hr": c.get("rent_usd_per_gpu_hr"), "rent_source": c.get("rent_source"),
                "mfu": self.mfu, "strategy": self.strategy or "", "pareto": self.pareto}


def pareto_front(points: list[tuple[float, float] | None]) -> list[bool]:
    """Which points are on the Pareto frontier of (days, cost), both minimized.

    A point is on the frontier when no other point is at least as good in both and strictly
    better in one. ``None`` entries (infeasible, unknown cost) are never on it.
    """
    out = []
    for i, p in enumerate(points):
        if p is None or not all(math.isfinite(v) for v in p):
            out.append(False)
            continue
        d, c = p
        dominated = any(q is not None and j != i and q[0] <= d and q[1] <= c and (q[0] < d or q[1] < c)
                        for j, q in enumerate(points))
        out.append(not dominated)
    return out


def mark_pareto(options: list[Option], basis: str, safe: bool = False) -> None:
    """Set ``option.pareto`` for days against cost on ``basis``; ``safe``: days and cost at the
    slow end of each option's 80% interval, so that an option whose estimate rests on best-case
    microbenchmarks does not take the frontier on its optimistic point alone."""
    pts = [((o.slow_days if safe else o.days), o.cost_of(basis, safe))
           if o.feasible and o.cost_of(basis) is not None else None for o in options]
    for o, f in zip(options, pareto_front(pts), strict=True):
        o.pareto = f


def resolve_gpus(names: list[str] | None) -> list[hardware.GPUSpec]:
    """Catalog GPUs named (ids or aliases; unknown -> did-you-mean), or all of them."""
    if not names:
        return list(hardware.list_gpus())
    out = []
    for n in names:
        g = hardware.get_gpu(n.strip())
        if g.id not in [x.id for x in out]:
            out.append(g)
    return out


def split_nodes(n: int, max_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``n`` GPUs: one node if they fit in one, else the fewest
    equal nodes that hold them (16 GPUs of an 8-GPU node -> 2 x 8; 12 -> 2 x 6)."""
    k = max(1, -(-n // max_per_node))
    while n % k:
        k += 1
    return k, n // k


def clusters(gpus: list[hardware.GPUSpec], counts=COUNTS, multi_node: bool = False) -> list[tuple[str, int, int]]:
    """(gpu id, nodes, gpus per node) for every option of the sweep; a count beyond what one
    node holds becomes several equal nodes (:func:`split_nodes`)."""
    out: list[tuple[str, int, int]] = []
    for g in gpus:
        cells = [(g.id, *split_nodes(n, g.max_gpus_per_node)) for n in counts]
        if multi_node:
            cells += [(g.id, nodes, g.max_gpus_per_node) for nodes in MULTI_NODE]
        out += [c for c in dict.fromkeys(cells) if c not in out]
    return out


def evaluate_option(model, gpu_id: str, nodes: int, per: int, prices: Prices, knobs: dict) -> Option:
    """Fastest feasible strategy of one cluster (catching per-cell usage errors as reasons)."""
    g = hardware.get_gpu(gpu_id)
    text = hardware.cluster_text(nodes, per, gpu_id)
    try:
        res = run_search(model, text, **knobs)
    except UsageError as exc:
        return Option(gpu_id, g.short_name, nodes, per, False, reason=str(exc))
    plan = res.best
    if not plan.feasible:
        return Option(gpu_id, g.short_name, nodes, per, False,
                      reason="; ".join(plan.reasons) or "no strategy fits", plan=plan,
                      days_at_peak=plan.days_at_peak)
    lo, hi = plan.interval_days or (None, None)
    return Option(gpu_id, g.short_name, nodes, per, True, days=plan.days, days_low=lo, days_high=hi,
                  days_at_peak=plan.days_at_peak,
                  strategy=plan.strategy_line(), strategy_dict=plan.strategy, mfu=plan.mfu,
                  cost=plan_cost(plan, prices), plan=plan)


def sweep_cells(cells: list, fn, *, description: str = "sweeping", progress: bool = True,
                console: Console | None = None) -> list:
    """Apply ``fn`` to each cell; a rich progress bar appears once the sweep is projected to
    take longer than :data:`PROGRESS_AFTER_S` (and stderr is a terminal)."""
    console = console or Console(stderr=True)
    out, bar, task = [], None, None
    t0 = time.perf_counter()
    try:
        for i, cell in enumerate(cells):
            out.append(fn(cell))
            if bar is None and progress and console.is_terminal:
                el = time.perf_counter() - t0
                if el > PROGRESS_AFTER_S or el / (i + 1) * len(cells) > PROGRESS_AFTER_S:
                    from rich.progress import Progress

                    bar = Progress(console=console, transient=True)
                    bar.start()
                    task = bar.add_task(description, total=len(cells), completed=i + 1)
            elif bar is not None:
                bar.update(task, completed=i + 1)
    finally:
        if bar is not None:
            bar.stop()
    return out


def _checked_model(model, knobs: dict):
    """Resolve the model and check the recipe and pinned knobs once, so that bad input is one
    usage error rather than the same error in every cell."""
    spec = resolve_model_input(model)
    make_recipe(spec, **{k: knobs[k] for k in ("tokens", "steps", "global_batch", "seq_len", "optimizer")
                         if k in knobs})
    check_pins(knobs)
    return spec


def sweep(model, gpus: list[str] | None = None, counts=COUNTS, multi_node: bool = False,
          prices: Prices | None = None, basis: str = "buy", progress: bool = False, safe: bool = False,
          **knobs) -> list[Option]:
    """Evaluate every (GPU, count) option; Pareto-marked on ``basis`` (``safe``: at the slow end of
    the 80% interval); fastest feasible first."""
    if basis not in BASES:
        raise UsageError(f"--basis must be one of {', '.join(BASES)}, got {basis!r}")
    prices = prices or default_prices()
    model = _checked_model(model, knobs)
    cells = clusters(resolve_gpus(gpus), counts, multi_node)
    opts = sweep_cells(cells, lambda c: evaluate_option(model, c[0], c[1], c[2], prices, knobs),
                       description="comparing clusters", progress=progress)
    mark_pareto(opts, basis, safe)
    return sorted(opts, key=lambda o: (not o.feasible, o.days if o.days is not None else math.inf,
                                       o.cost_of(basis) or math.inf))


# --- outputs ---------------------------------------------------------------------------------

CSV_FIELDS = list(Option("x", "x", 1, 1, False).row())


def to_csv(options: list[Option]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for o in options:
        w.writerow({k: ("" if v is None else v) for k, v in o.row().items()})
    return buf.getvalue()


def write_csv(options: list[Option], path) -> None:
    write_text_atomic(path, to_csv(options))


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'pretrain-simulator[plots]'") from None
    return plt


def plot(options: list[Option], path, basis: str = "buy", title: str | None = None, safe: bool = False) -> None:
    """Days against cost on log axes, coloured by GPU, sized by GPU count, the 80% interval as
    error bars, frontier drawn (``safe``: through the slow ends)."""
    from pathlib import Path


    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise UsageError(f"--plot {str(path)!r}: use a .png or .svg file name")
    plt = _pyplot()
    pts = [o for o in options if o.feasible and o.cost_of(basis)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    gpus = list(dict.fromkeys(o.gpu for o in pts))
    cmap = plt.get_cmap("tab20")
    for k, g in enumerate(gpus):
        sub = [o for o in pts if o.gpu == g]
        ax.scatter([o.cost_of(basis) for o in sub], [o.days for o in sub], s=[25 * o.n_gpus ** 0.8 + 10 for o in sub],
                   color=cmap(k % 20), alpha=0.8, edgecolors="k", linewidths=0.4, label=g)
        bars = [o for o in sub if o.days_low is not None]
        if bars:
            ax.errorbar([o.cost_of(basis) for o in bars], [o.days for o in bars],
                        yerr=[[o.days - o.days_low for o in bars], [o.days_high - o.days for o in bars]],
                        fmt="none", ecolor=cmap(k % 20), elinewidth=1, capsize=2, alpha=0.7)
    front = sorted((o for o in pts if o.pareto), key=lambda o: o.cost_of(basis, safe))
    if front:
        ys = [o.slow_days if safe else o.days for o in front]
        ax.plot([o.cost_of(basis, safe) for o in front], ys, "k--", lw=1,
                label="Pareto frontier" + (" (slow ends)" if safe else ""))
        for o, y in zip(front, ys, strict=True):
            ax.annotate(f"{o.n_gpus}×{o.gpu_id}",
                        (o.cost_of(basis, safe), y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel({"buy": "hardware price (USD)", "amortized": "amortized run cost (USD)",
                   "rent": "rental cost (USD)"}[basis])
    ax.set_ylabel("days (bars: 80% interval)")
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:  # no feasible option: nothing to label
        ax.legend(fontsize=7, loc="best", markerscale=0.6)
    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=130))
    finally:
        plt.close(fig)


def render(options: list[Option], console: Console, basis: str, title: str, safe: bool = False) -> None:
    from rich import box

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for col in ("", "GPUs", "days", "80% range", "floor", "GPU-h", "buy", "amort.", "rent", "power",
                "strategy / why not"):
        last = col == "strategy / why not"
        t.add_column(col, justify="left" if col in ("GPUs", "strategy / why not") else "right",
                     no_wrap=not last, min_width=24 if last else None)
    for o in options:
        gpus = f"{o.n_gpus}×{o.gpu_id}" if o.nodes == 1 else f"{o.nodes}×{o.gpus_per_node}×{o.gpu_id}"
        if o.feasible:
            c = o.cost or {}
            rng = f"{_days(o.days_low)}–{_days(o.days_high)}" if o.days_low is not None else "none"
            t.add_row("★" if o.pareto else "", gpus, _days(o.days), rng, _days(o.days_at_peak),
                      f"{c.get('gpu_hours', 0):,.0f}", usd(c.get("hardware_usd")), usd(c.get("amortized_usd")),
                      usd(c.get("rent_usd")), usd(c.get("energy_usd")), short_strategy(o.strategy_dict))
        else:
            t.add_row("", f"[dim]{gpus}[/]", "—", "", _days(o.days_at_peak), "", "", "", "", "",
                      f"[red]infeasible:[/] {o.reason}")
    console.print(t)
    console.print(f"★ = Pareto frontier of days against {basis} cost (nothing else is both faster and cheaper"
                  + (", at the slow end of each 80% range" if safe else
                     "; --safe compares the slow ends of the 80% ranges instead") + "). "
                  "80% range: 8 in 10 comparable real runs fell within it; GPUs without published training "
                  "runs have wider ranges. floor = days at 100% of dense peak.")


def short_strategy(st: dict | None) -> str:
    """Compact strategy, e.g. 'bf16 sdpa compiled zero1 mb 26×10' (full text in CSV/JSON)."""
    if not st:
        return ""
    parts = [st["precision"], st["attention"], "compiled" if st["compile"] else "eager-mode", st["sharding"]]
    if st.get("checkpointing", "none") != "none":
        parts.append(f"ckpt-{st['checkpointing']}")
    if st.get("offload", "none") != "none":
        parts.append(f"offload-{st['offload']}")
    parts.append(f"mb {st['micro_batch']}×{st['grad_accum']}")
    return " ".join(parts)


def _days(d: float | None) -> str:
    return "—" if d is None else format_days(d)


def _counts(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--counts must be a comma-separated list of integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"--counts must be positive integers, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="simulate compare", description="Every catalog GPU x {1, 2, 4, 8}, each with its fastest "
                "feasible strategy: days, GPU-hours, dollars, and the Pareto frontier of days against cost.")
    p.add_argument("--model", required=True, help="preset (e.g. pythia-1b) or a Hugging Face config.json")
    p.add_argument("--gpu", action="append", metavar="GPU[,GPU]", help="only these GPUs (ids or aliases)")
    p.add_argument("--counts", type=_counts, default=COUNTS, help="GPU counts to try (default 1,2,4,8); a count beyond one node is split into equal nodes")
    p.add_argument("--multi-node", action="store_true", help="also 2 and 4 nodes of 8 GPUs")
    p.add_argument("--basis", choices=BASES, default="buy", help="cost for the Pareto frontier and plot (default buy)")
    p.add_argument("--safe", action="store_true",
                   help="Pareto frontier at the slow end of each option's 80%% interval (days and the cost "
                        "that grows with them) instead of the estimate")
    add_recipe_args(p)
    add_cost_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--plot", metavar="FILE", help="days against cost, PNG or SVG (needs matplotlib)")
    o.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    o.add_argument("--json", action="store_true", help="print the options as JSON")
    return p


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    names = [n for g in (a.gpu or []) for n in g.split(",") if n.strip()]
    prices = prices_from_args(a)
    if a.plot:
        from pathlib import Path

        if Path(a.plot).suffix.lower() not in (".png", ".svg"):
            raise UsageError(f"--plot {a.plot!r}: use a .png or .svg file name")
        _pyplot()
    t0 = time.perf_counter()
    opts = sweep(a.model, names or None, a.counts, a.multi_node, prices, a.basis,
                 progress=not a.json, safe=a.safe, **recipe_knobs(a))
    elapsed = time.perf_counter() - t0
    first = next((o.plan for o in opts if o.plan is not None), None)
    head = (f"{first.model['name']} · {first.recipe['description']}" if first else str(a.model))
    if a.csv:
        write_csv(opts, a.csv)
    if a.plot:
        plot(opts, a.plot, a.basis, title=f"{head}: days against {a.basis} cost", safe=a.safe)
    if a.json:
        from ..answer.plan import _strict

        print(json.dumps(_strict({"model": head, "basis": a.basis, "safe": a.safe,
                                  "options": [o.row() for o in opts]}),
                         indent=2, allow_nan=False))
    else:
        con = Console()
        if not con.is_terminal:  # files and pipes: wide enough for one line per option
            con = Console(width=max(con.width, 160))
        render(opts, con, a.basis, f"{head} — {len(opts)} options in {elapsed:.1f} s", a.safe)
        for f, what in ((a.csv, "CSV"), (a.plot, "plot")):
            if f:
                con.print(f"wrote {what}: {f}")
    return 0 if any(o.feasible for o in opts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
