"""`simulate study-grid`: the study's central table ("$100K or 100 Days", Khandelwal et al. 2024)
reproduced with our model.

Every model the study benchmarked (all nine) x RTX 3090 / A6000 / A100 / H100
x {1, 2, 4, 8} GPUs: our days (fastest feasible strategy), the study's naive baseline (eager
attention, no compile, no TF32, plain DDP, no checkpointing/offload, the recipe's precision and
the largest power-of-two micro-batch that fits), the floor at 100% of dense peak, dollars (the
study's prices and amortization), and the study's published cells where we have them.
Writes study_grid.csv, study_grid.md and study_grid.png into --out.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..answer.api import run_search
from ..answer.costs import Prices, add_cost_args, default_prices, plan_cost, prices_from_args, usd
from ..answer.plan import SECONDS_PER_DAY
from ..core.atomic import write_atomic, write_text_atomic
from ..core.errors import UsageError
from ..hardware import catalog as hardware
from ..model.resolve import resolve_model
from . import compare
from .args import ArgParser

MODELS = ("pythia-160m", "pythia-410m", "pythia-1b", "pythia-2.8b", "pythia-6.9b", "roberta-large",
          "mamba-2.8b", "convnext-xlarge-22k", "vit-large-16-in21k")
GPUS = ("rtx3090", "rtx-a6000", "a100-80gb-sxm", "h100-sxm")
COUNTS = (1, 2, 4, 8)
NAIVE_PINS = {"attention": "eager", "compile": False, "checkpointing": "none", "sharding": "ddp", "offload": "none",
              "tp": 1, "pp": 1}


@dataclass
class Cell:
    model: str
    model_name: str
    gpu_id: str
    gpu: str
    n_gpus: int
    feasible: bool
    reason: str = ""
    days: float | None = None
    days_at_peak: float | None = None
    mfu: float | None = None
    naive_days: float | None = None
    naive_micro_batch: int | None = None
    naive_reason: str = ""
    buy_usd: float | None = None
    amortized_usd: float | None = None
    rent_usd: float | None = None
    strategy: str = ""
    published_days: float | None = None
    published_source: str = ""

    @property
    def published_pct_of_peak(self) -> float | None:
        """Fraction of dense peak the published time implies: floor / published (>1 = impossible)."""
        if self.published_days and self.days_at_peak:
            return self.days_at_peak / self.published_days
        return None


def published() -> dict[tuple[str, str, int], tuple[float, str]]:
    """The study's published cells we hold (``simulator/data/study_published.csv``)."""
    text = resources.files("simulator").joinpath("data/study_published.csv").read_text(encoding="utf-8")
    return {(r["model"], r["gpu_id"], int(r["n_gpus"])): (float(r["days"]), r["source"])
            for r in csv.DictReader(io.StringIO(text))}


def naive(model: str, gpus: str, precision: str) -> tuple[float | None, int | None, str]:
    """The study's naive baseline: (days, micro-batch, reason if infeasible)."""
    res = run_search(model, gpus, precision=precision, **NAIVE_PINS)
    tab = res.table
    mb = tab.micro_batch.astype(int)
    ok = np.isfinite(tab.rank_key) & ((mb & (mb - 1)) == 0)
    idx = np.nonzero(ok)[0]
    if not idx.size:
        return None, None, "; ".join(res.best.reasons) or "no power-of-two micro-batch fits"
    i = int(idx[np.argmax(mb[idx])])
    return float(res.setup.recipe.steps * tab.step_time[i] / SECONDS_PER_DAY), int(mb[i]), ""


def cell(model: str, gpu_id: str, n: int, prices: Prices, pub: dict) -> Cell:
    g = hardware.get_gpu(gpu_id)
    text = f"{n}x{gpu_id}"
    p_days, p_src = pub.get((model, gpu_id, n), (None, ""))
    res = run_search(model, text, tp=1, pp=1)  # the study searched data-parallel strategies only
    plan = res.best
    c = Cell(model, plan.model["name"], gpu_id, g.short_name, n, plan.feasible, days_at_peak=plan.days_at_peak,
             published_days=p_days, published_source=p_src)
    if plan.feasible:
        cost = plan_cost(plan, prices)
        c.days, c.mfu, c.strategy = plan.days, plan.mfu, compare.short_strategy(plan.strategy)
        c.buy_usd, c.amortized_usd, c.rent_usd = cost["hardware_usd"], cost["amortized_usd"], cost["rent_usd"]
    else:
        c.reason = "; ".join(plan.reasons) or "no strategy fits"
    c.naive_days, c.naive_micro_batch, c.naive_reason = naive(model, text, plan.recipe["precision"])
    return c


def grid(models=MODELS, gpus=GPUS, counts=COUNTS, prices: Prices | None = None, progress: bool = False) -> list[Cell]:
    # the study priced any count of its GPUs with a base machine (1 or 2 SXM A100/H100 included),
    # so its grid does not apply the purchase units of real systems (prices.yaml purchase_units)
    prices = (prices or default_prices()).model_copy(update={"purchase_units": {}})
    pub = published()
    cells = [(m, g, n) for m in models for g in gpus for n in counts]
    return compare.sweep_cells(cells, lambda x: cell(x[0], x[1], x[2], prices, pub),
                               description="study grid", progress=progress)


# --- writers ---------------------------------------------------------------------------------

def to_csv(cells: list[Cell]) -> str:
    buf = io.StringIO()
    rows = [{**asdict(c), "published_pct_of_peak": c.published_pct_of_peak} for c in cells]
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["model"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _d(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


#: Above this fraction of dense peak a published end-to-end time is implausible: real large-model
#: training reaches roughly 35-65% MFU on A100/H100 (docs/architecture.md, known traps; the llm-foundry H100
#: table in data/validation_dev.csv tops out at 46%).
PLAUSIBLE_MFU = 0.65


def _verdict(pct: float | None) -> str:
    if not pct:
        return ""
    if pct > 1:
        return " (physically impossible)"
    if pct > PLAUSIBLE_MFU:
        return f" (implausible: above the {PLAUSIBLE_MFU:.0%} that real training reaches)"
    return ""


def comparison_lines(cells: list[Cell]) -> list[str]:
    out = []
    for c in cells:
        if c.published_days is None:
            continue
        pct = c.published_pct_of_peak
        out.append(f"{c.model_name} on {c.n_gpus} × {c.gpu}: study {_d(c.published_days)} days; ours "
                   f"{_d(c.days)} (naive baseline {_d(c.naive_days)}); floor at 100% of peak {_d(c.days_at_peak)} days "
                   f"— the published time implies {pct:.0%} of dense peak"
                   + _verdict(pct))
    return out


def to_markdown(cells: list[Cell], prices: Prices) -> str:
    L = ["# The study's grid, reproduced", "",
         "Generated by `simulate study-grid` (do not edit by hand). The study: \"$100K or 100 Days: Trade-offs "
         "when Pre-Training with Academic Resources\" (Khandelwal et al., 2024).", "",
         "- **days**: our estimate for the fastest feasible strategy found by the search "
         "(all micro-batches, not only powers of two); **naive**: the study's naive baseline "
         "(eager attention, no compile, no TF32, plain DDP, no checkpointing or offload, the recipe's "
         "precision, largest power-of-two micro-batch that fits); **floor**: days at 100% of dense peak "
         "(`plan.days_at_peak`) — no real run can be faster.",
         f"- **buy**: the study's prices (GPUs + base machine); **run share**: buy × days / "
         f"({prices.lifetime_years.value:g} × 365), the study's amortization; **rent**: GPU-hours × "
         "catalog on-demand price.",
         "- **study**: the study's published days where we hold them; `—` = not held here, not necessarily "
         "absent from the paper.", ""]
    lines = comparison_lines(cells)
    if lines:
        L += ["## Published cells against the floor", ""] + [f"- {x}" for x in lines] + [""]
    for m in dict.fromkeys(c.model for c in cells):
        sub = [c for c in cells if c.model == m]
        L += [f"## {sub[0].model_name}", "",
              "| GPUs | days | naive | floor | study | buy | run share | rent | strategy / why not |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in sub:
            why = c.strategy if c.feasible else f"infeasible: {c.reason}"
            naive_txt = _d(c.naive_days) if c.naive_days is not None else "infeasible"
            L.append(f"| {c.n_gpus} × {c.gpu} | {_d(c.days) if c.feasible else '**infeasible**'} | {naive_txt} | "
                     f"{_d(c.days_at_peak)} | {_d(c.published_days)} | {usd(c.buy_usd)} | {usd(c.amortized_usd)} | "
                     f"{usd(c.rent_usd)} | {why.replace('|', '/')} |")
        L.append("")
    return "\n".join(L)


def plot(cells: list[Cell], path) -> None:
    """Days against GPU count, one panel per model: ours, naive, floor, published."""
    plt = compare._pyplot()
    models = list(dict.fromkeys(c.model for c in cells))
    cols = min(4, len(models))
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    gpus = list(dict.fromkeys(c.gpu_id for c in cells))
    for ax, m in zip(axes.ravel(), models, strict=False):
        sub = [c for c in cells if c.model == m]
        for k, g in enumerate(gpus):
            s = sorted((c for c in sub if c.gpu_id == g), key=lambda c: c.n_gpus)
            col = cmap(k % 10)
            f = [c for c in s if c.days is not None]
            ax.plot([c.n_gpus for c in f], [c.days for c in f], "o-", color=col, ms=3, lw=1.2, label=s[0].gpu)
            ax.plot([c.n_gpus for c in s], [c.days_at_peak for c in s], ":", color=col, lw=1)
            nv = [c for c in s if c.naive_days is not None]
            ax.plot([c.n_gpus for c in nv], [c.naive_days for c in nv], "x", color=col, ms=4)
            pb = [c for c in s if c.published_days is not None]
            ax.plot([c.n_gpus for c in pb], [c.published_days for c in pb], "*", color=col, ms=10, mec="k", mew=0.5)
        ax.set_title(sub[0].model_name, fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({c.n_gpus for c in sub}))
        ax.set_xticklabels([str(x) for x in sorted({c.n_gpus for c in sub})])
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(models):]:
        ax.axis("off")
    axes[0][0].set_ylabel("days")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower right", fontsize=7, title="line: ours · dotted: floor · x: naive · ★: study",
               title_fontsize=7)
    fig.tight_layout()
    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    finally:
        plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="simulate study-grid", description="Reproduce the study's central table with our model; "
                "writes study_grid.csv, study_grid.md and study_grid.png into --out.")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--models", help=f"comma-separated subset (default: {','.join(MODELS)})")
    p.add_argument("--gpus", help=f"comma-separated subset (default: {','.join(GPUS)})")
    p.add_argument("--counts", type=compare._counts, default=COUNTS, help="GPU counts (default 1,2,4,8)")
    p.add_argument("--no-plot", action="store_true", help="skip the figure")
    add_cost_args(p)
    return p


def _names(text: str | None, flag: str, default: tuple[str, ...] | list[str]) -> list[str]:
    """The comma-separated names of ``flag`` (``default`` when the flag is not given); an empty
    list (``--models ""``) is a UsageError, never the whole default grid."""
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{flag} {text!r} names nothing; give comma-separated names, or leave {flag} out for "
                         f"the study's {','.join(default)}")
    return names


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    models = _names(a.models, "--models", MODELS)
    for m in models:
        resolve_model(m)  # unknown -> did-you-mean
    gpus = [hardware.get_gpu(g).id for g in _names(a.gpus, "--gpus", GPUS)]
    prices = prices_from_args(a)
    if not a.no_plot:
        compare._pyplot()
    cells = grid(models, gpus, a.counts, prices, progress=True)
    out = Path(a.out)
    written = [write_text_atomic(out / "study_grid.csv", to_csv(cells)),
               write_text_atomic(out / "study_grid.md", to_markdown(cells, prices))]
    if not a.no_plot:
        plot(cells, out / "study_grid.png")
        written.append(out / "study_grid.png")
    for line in comparison_lines(cells):
        print(line)
    n_inf = sum(not c.feasible for c in cells)
    print(f"{len(cells)} cells ({n_inf} infeasible); wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
