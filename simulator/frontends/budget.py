"""`simulate budget`: which hardware to buy or rent within a budget and a deadline, ranked, with
a budget justification (Markdown + CSV) ready to paste into a proposal.

Cost of an option: **buy** = purchase price (GPUs + base machines) + electricity for the run;
**rent** = GPU-hours x on-demand price (power included). Options meeting both limits at the slow
end of their 80% interval are ranked cheapest first (ties: fastest); ``--point-estimate`` ranks at
the estimate instead. Exit status: 0 = something fits, 1 = nothing fits (the report says what
budget or deadline would), 2 = usage error.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import re
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from ..answer.costs import Prices, add_cost_args, assumptions, default_prices, prices_from_args, usd
from ..answer.report import Console
from ..core.atomic import write_text_atomic
from ..core.errors import UsageError
from . import compare
from .args import ArgParser, add_recipe_args, fraction_arg, recipe_knobs

MODES = ("buy", "rent", "both")
SLOWER = 0.8  # sensitivity: throughput 20% lower -> days / 0.8
PRICIER = 1.2  # sensitivity: prices 20% higher


@dataclass
class Entry:
    """One way to run: an option of the sweep bought or rented."""

    option: compare.Option
    mode: str  # "buy" | "rent"
    cost_usd: float
    days: float

    @property
    def label(self) -> str:
        return f"{self.mode} {self.option.label}"

    def fits(self, budget: float, deadline: float) -> bool:
        return self.cost_usd <= budget and self.days <= deadline

    @property
    def days_high(self) -> float:
        """The slow end of the plan's 80% interval (days), or the point estimate without one."""
        plan = self.option.plan
        iv = getattr(plan, "interval_days", None) if plan is not None else None
        return float(iv[1]) if iv else self.days

    def pessimistic(self) -> tuple[float, float]:
        """(days, cost) at the slow end of the 80% interval (rent and energy grow with the days)."""
        return self.scaled(throughput=self.days / self.days_high if self.days_high > 0 else 1.0)

    def fits_pessimistic(self, budget: float, deadline: float) -> bool:
        return _fits(self.pessimistic(), budget, deadline)

    def at(self, safe: bool) -> tuple[float, float]:
        """(days, cost) at the slow end of the 80% interval (``safe``) or at the estimate."""
        return self.pessimistic() if safe else (self.days, self.cost_usd)

    def scaled(self, throughput: float = 1.0, prices: float = 1.0) -> tuple[float, float]:
        """(days, cost) if throughput and all prices are scaled by these factors."""
        c = self.option.cost
        days = self.days / throughput
        if self.mode == "rent":
            return days, self.cost_usd / throughput * prices
        energy = (c.get("energy_usd") or 0.0) / throughput
        return days, (c["hardware_usd"] + energy) * prices


def entries(options: list[compare.Option], mode: str) -> list[Entry]:
    """Buy and/or rent entries of the feasible options whose price is known."""
    out = []
    for o in options:
        if not o.feasible or not o.cost:
            continue
        c = o.cost
        if mode in ("buy", "both") and c.get("hardware_usd") is not None:
            out.append(Entry(o, "buy", c["hardware_usd"] + (c.get("energy_usd") or 0.0), o.days))
        if mode in ("rent", "both") and c.get("rent_usd") is not None:
            out.append(Entry(o, "rent", c["rent_usd"], o.days))
    return out


def rank(es: list[Entry], budget: float, deadline: float, safe: bool = False) -> list[Entry]:
    """Entries meeting both limits, cheapest first (ties: fastest); ``safe``: at the slow end of
    their 80% interval (days, and the cost that grows with them)."""
    return sorted((e for e in es if _fits(e.at(safe), budget, deadline)), key=lambda e: (e.at(safe)[1], e.at(safe)[0]))


def risky(es: list[Entry], budget: float, deadline: float) -> list[Entry]:
    """Entries within both limits at the estimate but not at the slow end, cheapest first."""
    return [e for e in rank(es, budget, deadline) if not e.fits_pessimistic(budget, deadline)]


def risky_line(e: Entry, budget: float, deadline: float) -> str:
    """'X fits at its estimate (N days, $C) but at the slow end ... misses the deadline'."""
    d, c = e.pessimistic()
    verdict = "misses the deadline" if d > deadline else "exceeds the budget"
    return (f"{e.label} fits at its estimate ({_d(e.days)} days, {usd(e.cost_usd)}) but at the slow end of "
            f"its 80% interval takes {_d(d)} days and costs {usd(c)}: it {verdict}")


def what_would_fit(es: list[Entry], budget: float, deadline: float, safe: bool = False,
                   multi_node: bool = True) -> list[str]:
    """When nothing fits: the budget that would (at this deadline) and the deadline that would
    (at this budget); or, if no option is fast enough at any price, the fastest one (and, when
    only single machines were tried, that ``--multi-node`` tries more). ``safe``: at the slow end
    of each option's 80% interval."""
    more = ("" if multi_node else
            "; only single machines were tried: rerun with --multi-node for 2 and 4 machines of 8 GPUs")
    out = []
    if not es:
        return ["no option is feasible with a known price; try other GPUs" +
                (more or " or more GPUs (--counts)")]
    at = {id(e): e.at(safe) for e in es}
    where = " at the slow end of its 80% interval" if safe else ""
    fast = [e for e in es if at[id(e)][0] <= deadline]
    if fast:
        e = min(fast, key=lambda e: (at[id(e)][1], at[id(e)][0]))
        out.append(f"a budget of {usd(math.ceil(at[id(e)][1]))} would meet the {_d(deadline)}-day deadline"
                   f"{where}: {e.label}, {_d(at[id(e)][0])} days")
    else:
        e = min(es, key=lambda e: (at[id(e)][0], at[id(e)][1]))
        out.append(f"no option meets the {_d(deadline)}-day deadline{where} at any price; the fastest is "
                   f"{e.label}: a deadline of {math.ceil(at[id(e)][0])} days and a budget of "
                   f"{usd(math.ceil(at[id(e)][1]))}{more}")
    cheap = [e for e in es if at[id(e)][1] <= budget]
    if cheap:
        e = min(cheap, key=lambda e: (at[id(e)][0], at[id(e)][1]))
        out.append(f"a deadline of {math.ceil(at[id(e)][0])} days would fit the {usd(budget)} budget{where}: "
                   f"{e.label}, {usd(at[id(e)][1])}")
    else:
        e = min(es, key=lambda e: (at[id(e)][1], at[id(e)][0]))
        out.append(f"no option fits the {usd(budget)} budget at any deadline; the cheapest is {e.label}: "
                   f"a budget of {usd(math.ceil(at[id(e)][1]))} and a deadline of {math.ceil(at[id(e)][0])} days")
    return out


def sensitivity(es: list[Entry], best: Entry | None, budget: float, deadline: float) -> list[str]:
    """What if throughput is 20% lower, or prices 20% higher."""
    out = []
    for name, kw in (("throughput 20% lower", {"throughput": SLOWER}), ("prices 20% higher", {"prices": PRICIER})):
        n_fit = sum(1 for e in es if _fits(e.scaled(**kw), budget, deadline))
        if best is not None:
            d, c = best.scaled(**kw)
            verdict = "still within both limits" if _fits((d, c), budget, deadline) else (
                "misses the deadline" if d > deadline else "exceeds the budget")
            out.append(f"If {name}: the recommended option takes {_d(d)} days and costs {usd(c)} — {verdict}; "
                       f"{n_fit} of {len(es)} options would still fit.")
        else:
            out.append(f"If {name}: {n_fit} of {len(es)} options would fit.")
    return out


def _fits(dc: tuple[float, float], budget: float, deadline: float) -> bool:
    return dc[0] <= deadline and dc[1] <= budget


def _d(x: float) -> str:
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


# --- writers ---------------------------------------------------------------------------------

def to_csv(es: list[Entry], budget: float, deadline: float, safe: bool = True) -> str:
    """Every option, the ranked ones first (``safe``: ranked at the slow end of the interval)."""
    buf = io.StringIO()
    fields = ["rank", "mode", "cluster", "gpu", "n_gpus", "fits", "fits_slow_end", "days", "days_slow_end",
              "cost_usd", "cost_slow_end_usd", "buy_usd", "gpu_unit_usd",
              "gpu_unit_source", "base_machine_usd", "base_machine_source", "amortized_usd", "rent_usd",
              "rent_usd_per_gpu_hr", "rent_source", "gpu_hours", "energy_kwh", "energy_usd", "strategy"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    ranked = rank(es, budget, deadline, safe)
    order = ranked + sorted((e for e in es if e not in ranked), key=lambda e: (e.cost_usd, e.days))
    for i, e in enumerate(order, 1):
        c, o = e.option.cost, e.option
        sd, sc = e.pessimistic()
        w.writerow({"rank": i if e in ranked else "", "mode": e.mode, "cluster": o.cluster, "gpu": o.gpu,
                    "n_gpus": o.n_gpus, "fits": e.fits(budget, deadline),
                    "fits_slow_end": e.fits_pessimistic(budget, deadline), "days": f"{e.days:.2f}",
                    "days_slow_end": f"{sd:.2f}", "cost_usd": f"{e.cost_usd:.0f}", "cost_slow_end_usd": f"{sc:.0f}",
                    "buy_usd": _n(c.get("hardware_usd")),
                    "gpu_unit_usd": _n(c.get("gpu_unit_usd")), "gpu_unit_source": c.get("gpu_unit_source") or "",
                    "base_machine_usd": _n(c.get("base_machine_usd")),
                    "base_machine_source": c.get("base_machine_source") or "",
                    "amortized_usd": _n(c.get("amortized_usd")), "rent_usd": _n(c.get("rent_usd")),
                    "rent_usd_per_gpu_hr": _n(c.get("rent_usd_per_gpu_hr"), 2), "rent_source": c.get("rent_source") or "",
                    "gpu_hours": _n(c.get("gpu_hours")), "energy_kwh": _n(c.get("energy_kwh")),
                    "energy_usd": _n(c.get("energy_usd")), "strategy": o.strategy or ""})
    return buf.getvalue()


def _n(x, digits: int = 0) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _md(s: str) -> str:
    return str(s).replace("|", "\\|")


def pessimistic_line(e: Entry, budget: float, deadline: float) -> str:
    """How the option fares at the slow end of its 80% interval."""
    d, c = e.pessimistic()
    if e.days_high == e.days:
        return "No validation interval is available for this estimate."
    verdict = ("still within both limits" if _fits((d, c), budget, deadline) else
               "misses the deadline" if d > deadline else "exceeds the budget")
    return (f"At the slow end of the 80% interval (real runs in validation were often slower than "
            f"estimated) it takes **{_d(d)} days** and costs **{usd(c)}** — {verdict}.")


#: The verdicts of :func:`verdict`, best first.
VERDICTS = ("fits", "misses at the slow end", "misses")


def limits_missed(dc: tuple[float, float], budget: float, deadline: float) -> list[str]:
    """Which limits ``(days, cost)`` misses, in words (empty when it meets both)."""
    d, c = dc
    out = [f"{_d(d)} days is past the {_d(deadline)}-day deadline"] if d > deadline else []
    return out + ([f"{usd(c)} is over the {usd(budget)} budget"] if c > budget else [])


def verdict(e: Entry, budget: float, deadline: float) -> tuple[str, list[str]]:
    """An option against the limits: ``("fits", [])`` when it meets both at the estimate and at the
    slow end of its 80% interval; ``("misses at the slow end", why)`` when it meets them at the
    estimate only; ``("misses", why)`` when it misses at the estimate (``why``: :func:`limits_missed`)."""
    at_estimate = limits_missed((e.days, e.cost_usd), budget, deadline)
    if at_estimate:
        return VERDICTS[2], at_estimate
    at_slow_end = limits_missed(e.pessimistic(), budget, deadline)
    return (VERDICTS[1], at_slow_end) if at_slow_end else (VERDICTS[0], [])


def to_markdown(*, model_line: str, es: list[Entry], budget: float, deadline: float, mode: str,
                prices: Prices, top: int = 10, generator: str = "`simulate budget`",
                csv_file: bool = True, current: dict | None = None, safe: bool = True,
                overhead: float = 0.0, multi_node: bool = True) -> str:
    """The budget justification: request, recommendation, options, unit prices with sources,
    days/GPU-hours/energy, assumptions, sensitivity (or, if nothing fits, what would).

    ``safe`` (default): recommend the cheapest option within both limits at the slow end of its
    80% interval, and name the cheaper ones that fit only at their estimate; else at the estimate.
    ``overhead``: the wall-time fraction beyond training steps already in the days (stated).
    ``multi_node``: whether multi-machine options were tried (else "what would fit" says how).
    ``generator`` names what produced it; ``csv_file``: a CSV with every option accompanies it;
    ``current``: the configuration the user is looking at (``label``, ``days``, ``days_high``,
    ``buy_usd``, ``rent_usd``, ``strategy``), reported first and compared with the recommendation."""
    ranked = rank(es, budget, deadline, safe)
    best = ranked[0] if ranked else None
    where = " at the slow end of their 80% interval" if safe else ""
    L = [f"# Compute budget justification: {model_line}", "",
         f"*Generated {date.today().isoformat()} by {generator} (analytical pre-training simulator). "
         f"Limits: budget {usd(budget)}, deadline {_d(deadline)} days, mode: {mode}; options are ranked "
         + ("at the slow end of their 80% interval." if safe else "at their estimate.") + "*", ""]
    if current is not None:
        L += _current_section(current, best, budget, deadline, mode)
    unsafe = risky(es, budget, deadline) if safe else []
    if best is None:
        L += ["## Result: no option meets both limits" + (" at the slow end of its 80% interval" if safe else ""), ""]
        L += [f"- {risky_line(e, budget, deadline)}" for e in unsafe[:3]]
        L += [f"- {s}" for s in what_would_fit(es, budget, deadline, safe, multi_node)]
        L.append("")
    else:
        c, o = best.option.cost, best.option
        sd, sc = best.pessimistic()
        L += ["## Recommendation", ""]
        if best.mode == "buy":
            energy = sc - c["hardware_usd"] if safe else c.get("energy_usd")
            kwh = (c["energy_kwh"] * sd / best.days if safe else c["energy_kwh"]) if c.get("energy_kwh") else None
            L.append(f"We request **{usd(c['hardware_usd'])}** to purchase **{o.label}** "
                     f"({o.n_gpus} × {usd(c['gpu_unit_usd'])} per GPU + {usd(c['base_machine_usd'])} base "
                     f"machine{'s' if o.nodes > 1 else ''}), plus about {usd(energy)} of electricity"
                     + (f" ({kwh:,.0f} kWh)" if kwh is not None else "") + ". "
                     + _days_sentence(best, safe) + f" ({c['gpu_hours']:,.0f} GPU-hours at the estimate). "
                     + _share_sentence(c, best.days))
        else:
            hours = c["gpu_hours"] * (sd / best.days if safe else 1.0)
            L.append(f"We request **{usd(sc if safe else best.cost_usd)}** to rent **{o.label}** on demand: "
                     f"{hours:,.0f} GPU-hours at ${c['rent_usd_per_gpu_hr']:.2f} per GPU-hour. "
                     + _days_sentence(best, safe) + ".")
        L += ["", pessimistic_line(best, budget, deadline)]
        if safe:
            cheaper = [e for e in unsafe if e.cost_usd < best.cost_usd]
            if cheaper:
                L += ["", "Cheaper options that meet both limits only at their estimate, not at the slow end "
                      "(not recommended):"]
                L += [f"- {risky_line(e, budget, deadline)}" for e in cheaper[:3]]
        else:
            safe_ones = [e for e in ranked if e.fits_pessimistic(budget, deadline)]
            if not best.fits_pessimistic(budget, deadline):
                L += ["", (f"Planning against the slow end instead: **{safe_ones[0].label}** "
                           f"({_d(safe_ones[0].days_high)} days, {usd(safe_ones[0].pessimistic()[1])}) stays "
                           "within both limits." if safe_ones else
                           "No option stays within both limits at the slow end of its interval.")]
        L += ["", f"Training configuration: {o.strategy}.", ""]
        L += [f"## Options within {usd(budget)} and {_d(deadline)} days{where} ({len(ranked)} of {len(es)}), "
              "cheapest first", "",
              "| # | mode | hardware | days | days, slow end | GPU-hours | cost | cost, slow end | energy kWh | amortized (run share) |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for i, e in enumerate(ranked[:top], 1):
            cc = e.option.cost
            ph = e.pessimistic()
            L.append(f"| {i} | {e.mode} | {_md(e.option.label)} | {_d(e.days)} | {_d(ph[0])} | {cc['gpu_hours']:,.0f} | "
                     f"{usd(e.cost_usd)} | {usd(ph[1])} | "
                     f"{'' if e.mode == 'rent' or cc.get('energy_kwh') is None else format(cc['energy_kwh'], ',.0f')} | "
                     f"{usd(cc.get('amortized_usd')) if e.mode == 'buy' else ''} |")
        if len(ranked) > top:
            L.append(f"\n({len(ranked) - top} more {'in the CSV' if csv_file else 'not listed'}.)")
        L.append("")
    shown = ranked[:top] if ranked else sorted(es, key=lambda e: (e.cost_usd, e.days))[:3]
    L += ["## Unit prices and sources", "", "| item | price | source |", "|---|---:|---|"]
    seen = set()
    for e in shown:
        c = e.option.cost
        if e.mode == "buy":
            for item, val, src in ((f"{e.option.gpu} (per GPU)", c["gpu_unit_usd"], c["gpu_unit_source"]),
                                   (f"base machine, {e.option.gpus_per_node} GPUs (x{e.option.nodes})",
                                    c["base_machine_usd"], c["base_machine_source"])):
                if (item, val) not in seen:
                    seen.add((item, val))
                    L.append(f"| {_md(item)} | {usd(val)} | {_md(src)} |")
        else:
            item = f"{e.option.gpu}, per GPU-hour (rental)"
            if (item, c["rent_usd_per_gpu_hr"]) not in seen:
                seen.add((item, c["rent_usd_per_gpu_hr"]))
                L.append(f"| {_md(item)} | ${c['rent_usd_per_gpu_hr']:.2f} | {_md(c['rent_source'])} |")
    L.append(f"| electricity per kWh | ${prices.electricity_usd_per_kwh.value:.3g} | "
             f"{_md(prices.electricity_usd_per_kwh.source)} |")
    L += ["", "## Assumptions", ""]
    L += [f"- workload: {model_line}"]
    L += ["- days are the simulator's estimate for the fastest feasible training configuration "
          "(analytical model of compute, memory and communication); the slow end is the top of the 80% "
          "interval from the profile's validation against published training runs"]
    L += [f"- {overhead_line(overhead)}"]
    L += [f"- {a}" for a in assumptions(prices)]
    L += ["- buy cost = purchase price + electricity for the run; rent cost = GPU-hours x on-demand price"]
    L += ["", "## Sensitivity", ""]
    L += [f"- {s}" for s in sensitivity(es, best, budget, deadline)]
    L.append("")
    return "\n".join(L)


def overhead_line(overhead: float, flag: bool = False) -> str:
    """The wall-time overhead in the days, in words (the default 0 says what it leaves out);
    ``flag``: name the command-line option (the terminal, not the proposal)."""
    if overhead > 0:
        return (f"overhead: the days include {overhead:.0%} more wall time than the training steps for data "
                "loading, evaluation, checkpointing and restarts (set by you)")
    return ("overhead: none included (the default); data loading, evaluation, checkpointing and restarts "
            "after failures add wall time beyond the training steps"
            + ("; --overhead 0.1 adds 10%" if flag else ""))


def _days_sentence(e: Entry, safe: bool) -> str:
    """'Pre-training is estimated to take N days (at most M at the slow end of its 80% interval).'"""
    if safe and e.days_high > e.days:
        return (f"Pre-training is estimated to take **{_d(e.days)} days**, and we plan for **{_d(e.days_high)} "
                "days**, the slow end of its 80% interval")
    return f"Pre-training is estimated to take **{_d(e.days)} days**"


def _share_sentence(c: dict, days: float) -> str:
    """The run's share of the purchase, or that the run outlasts the hardware's lifetime."""
    if c.get("outlives_hardware"):
        return (f"The run outlasts the hardware's {c['lifetime_years']:g}-year lifetime, so it uses up the "
                f"whole purchase ({usd(c['amortized_usd'])}).")
    return (f"Over a {c['lifetime_years']:g}-year lifetime this run accounts for {usd(c['amortized_usd'])} of "
            "the hardware; the machine remains available for further work.")


def _current_section(cur: dict, best: Entry | None, budget: float, deadline: float, mode: str) -> list[str]:
    """The configuration on screen, and why the recommendation differs from it (if it does)."""
    modes = ("buy", "rent") if mode == "both" else (mode,)
    L = ["## The configuration on screen", "",
         f"**{cur['label']}** ({cur['strategy']}): **{_d(cur['days'])} days** "
         f"(slow end of the 80% interval: {_d(cur['days_high'])} days)."]
    for m in modes:
        c = cur.get(f"{m}_usd")
        if c is None:
            L.append(f"- {m}: no price known for this hardware")
            continue
        ok = c <= budget and cur["days"] <= deadline
        slow = cur["days_high"] <= deadline and c * (cur["days_high"] / cur["days"] if m == "rent" else 1) <= budget
        L.append(f"- {m}: {usd(c)} — {'within' if ok else 'outside'} both limits at the estimate, "
                 f"{'within' if slow else 'outside'} them at the slow end")
    if best is None:
        L.append("")
    elif best.option.cluster == cur.get("cluster") and best.mode in modes:
        L += ["", "It is also the recommendation below.", ""]
    else:
        L += ["", "The recommendation below is the cheapest catalog option meeting both limits (each "
              "catalog option with its fastest strategy and the built-in efficiency profiles); it "
              "differs from the configuration on screen.", ""]
    return L


# --- command line ------------------------------------------------------------------------------

_MONEY = re.compile(r"^\$?\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*([kKmM]?)$")
_DAYS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(d|day|days|w|wk|week|weeks|y|yr|year|years)?$", re.IGNORECASE)


def parse_money(text: str) -> float:
    """'60000', '60k', '$60,000', '1.2M' -> dollars."""
    m = _MONEY.match(str(text).strip())
    if not m:
        raise UsageError(f"--budget must be an amount in dollars such as 60000, 60k or $1.2M; got {text!r}")
    v = float(m.group(1).replace(",", "")) * {"": 1, "k": 1e3, "m": 1e6}[m.group(2).lower()]
    if v <= 0:
        raise UsageError(f"--budget must be positive, got {text!r}")
    return v


def parse_days(text: str) -> float:
    """'60d', '60', '8w', '1y' -> days."""
    m = _DAYS.match(str(text).strip())
    if not m:
        raise UsageError(f"--deadline must be a duration such as 60d, 8w or 1y; got {text!r}")
    unit = (m.group(2) or "d").lower()[0]
    v = float(m.group(1)) * {"d": 1, "w": 7, "y": 365}[unit]
    if v <= 0:
        raise UsageError(f"--deadline must be positive, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="simulate budget", description="Hardware to buy or rent within a budget and deadline, "
                "ranked, with a Markdown/CSV budget justification.")
    p.add_argument("--model", required=True, help="preset (e.g. pythia-1b) or a Hugging Face config.json")
    p.add_argument("--budget", required=True, help="dollars, e.g. 60000, 60k, $1.2M")
    p.add_argument("--deadline", required=True, help="wall-clock limit, e.g. 60d, 8w, 1y")
    p.add_argument("--mode", choices=MODES, default="both", help="buy, rent or both (default both)")
    p.add_argument("--gpu", action="append", metavar="GPU[,GPU]", help="only these GPUs (ids or aliases)")
    p.add_argument("--counts", type=compare._counts, default=compare.COUNTS, help="GPU counts to try (default 1,2,4,8); a count beyond one node is split into equal nodes")
    p.add_argument("--multi-node", action="store_true", help="also 2 and 4 nodes of 8 GPUs")
    p.add_argument("--overhead", type=fraction_arg("--overhead"), default=0.0,
                   help="extra wall-clock time beyond training steps (data loading, evaluation, checkpoints, "
                        "restarts), e.g. 0.1 or 10%%; default 0 (none included)")
    p.add_argument("--point-estimate", action="store_true",
                   help="rank and recommend at the estimate (default: at the slow end of each option's 80%% "
                        "interval, so the recommendation still meets the limits if the run is as slow as "
                        "comparable real runs were)")
    add_recipe_args(p)
    add_cost_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--out", default=".", metavar="DIR", help="folder for budget-<model>.md and .csv (default .)")
    o.add_argument("--top", type=int, default=10, help="options listed (default 10)")
    return p


def run_budget(model, budget: float, deadline: float, mode: str = "both", prices: Prices | None = None,
               gpus=None, counts=compare.COUNTS, multi_node: bool = False, progress: bool = False,
               safe: bool = True, **knobs):
    """Sweep, then (entries, ranked, model_line); ``safe``: ranked at the slow end of the 80%
    interval; ``knobs`` may hold ``overhead`` (a fraction of wall time, in every option's days)."""
    prices = prices or default_prices()
    opts = compare.sweep(model, gpus, counts, multi_node, prices, "buy", progress=progress, **knobs)
    es = entries(opts, mode)
    first = next((o.plan for o in opts if o.plan is not None), None)
    line = f"{first.model['name']}, {first.recipe['description']}" if first else str(model)
    return es, rank(es, budget, deadline, safe), line


def main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    budget, deadline = parse_money(a.budget), parse_days(a.deadline)
    if a.top <= 0:
        raise UsageError(f"--top must be a positive integer, got {a.top}")
    prices = prices_from_args(a)
    names = [n for g in (a.gpu or []) for n in g.split(",") if n.strip()]
    safe = not a.point_estimate
    knobs = {**recipe_knobs(a), **({"overhead": a.overhead} if a.overhead else {})}
    es, ranked, line = run_budget(a.model, budget, deadline, a.mode, prices, names or None, a.counts,
                                  a.multi_node, progress=True, safe=safe, **knobs)
    md = to_markdown(model_line=line, es=es, budget=budget, deadline=deadline, mode=a.mode, prices=prices, top=a.top,
                     safe=safe, overhead=a.overhead, multi_node=a.multi_node)

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(a.model)).stem if str(a.model).endswith(".json") else str(a.model))
    md_path = write_text_atomic(Path(a.out) / f"budget-{stem}.md", md)
    csv_path = write_text_atomic(Path(a.out) / f"budget-{stem}.csv", to_csv(es, budget, deadline, safe))
    con = Console()
    con.print(f"[bold]{line}[/] · budget {usd(budget)} · deadline {_d(deadline)} days · mode {a.mode}")
    con.print(f"  [dim]{overhead_line(a.overhead, flag=True)}[/]")
    where = " at the slow end of their 80% interval" if safe else ""
    unsafe = risky(es, budget, deadline) if safe else []
    if ranked:
        con.print(f"{len(ranked)} of {len(es)} options meet both limits{where}, cheapest first:")
        for i, e in enumerate(ranked[:a.top], 1):
            con.print(f"  {i:>2}. {e.label:<34} {_d(e.days):>7} days  {usd(e.cost_usd):>10}   slow end "
                      f"{_d(e.days_high):>7} days  {usd(e.pessimistic()[1]):>10}")
        con.print("  " + pessimistic_line(ranked[0], budget, deadline).replace("**", ""))
        for e in [e for e in unsafe if e.cost_usd < ranked[0].cost_usd][:3]:
            con.print(f"  [yellow]cheaper but not safe:[/] {risky_line(e, budget, deadline)}")
        for s in sensitivity(es, ranked[0], budget, deadline):
            con.print(f"  [dim]{s}[/]")
    else:
        con.print(f"[bold red]No option meets both limits{where.replace('their', 'its')}.[/]")
        for e in unsafe[:3]:
            con.print(f"  [yellow]only at its estimate:[/] {risky_line(e, budget, deadline)}")
        for s in what_would_fit(es, budget, deadline, safe, a.multi_node):
            con.print(f"  [yellow]would fit:[/] {s}")
    con.print(f"wrote {md_path} and {csv_path}")
    return 0 if ranked else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
