"""The plan on screen in dollars and against the budget and deadline: its cost with the
sidebar's prices, the catalog sweep priced the same way, and the verdict (``budget.verdict``:
fits, misses at the slow end, misses) in the app's words. Dollars and days throughout."""

from __future__ import annotations

import dataclasses

from simulator.answer import costs
from simulator.answer.plan import format_days
from simulator.frontends import budget, compare

from .words import APP_CONTROLS, days_text, fmt_money, strategy_words

#: the verdict's words on screen, by ``budget.VERDICTS``
VERDICT_HEAD = {"fits": "Fits the budget and the deadline", "misses at the slow end": "Misses at the slow end",
                "misses": "Misses"}


def plan_cost(plan, prices: costs.Prices) -> dict | None:
    """``costs.plan_cost`` for a feasible plan (cheap; the plan itself is not mutated); None when
    it does not fit."""
    if not plan.feasible:
        return None
    return costs.plan_cost(plan, prices)


def price_options(options: list, prices: costs.Prices) -> list:
    """The sweep's options (``compare.Option``) with each feasible one's cost at ``prices``."""
    return [dataclasses.replace(o, cost=costs.plan_cost(o.plan, prices)) if o.feasible else o for o in options]


def current_entry(plan, prices: costs.Prices, mode: str) -> budget.Entry | None:
    """The plan on screen as the budget module's entry (bought or rented, ``mode``), so its
    verdict is the budget report's; None when it does not fit or has no price in this mode."""
    c = plan_cost(plan, prices)
    if c is None:
        return None
    hw = plan.hardware
    opt = compare.Option(hw["gpu_id"], hw["gpu"], hw["nodes"], hw["gpus_per_node"], True, days=plan.days,
                         days_at_peak=plan.days_at_peak, strategy=strategy_words(plan), mfu=plan.mfu, cost=c,
                         plan=plan)
    es = budget.entries([opt], mode)
    return es[0] if es else None


def budget_check(plan, prices: costs.Prices, mode: str, limits: dict) -> dict | None:
    """The plan against the budget and deadline (``budget.verdict``): verdict, why, and the days
    and dollars at the estimate and at the slow end of the 80% range; None without a price."""
    e = current_entry(plan, prices, mode)
    if e is None:
        return None
    word, why = budget.verdict(e, limits["budget_usd"], limits["deadline_days"])
    d_hi, c_hi = e.pessimistic()
    return {"budget_usd": limits["budget_usd"], "deadline_days": limits["deadline_days"], "mode": e.mode,
            "verdict": word, "why": why, "days": e.days, "cost_usd": e.cost_usd, "days_slow_end": d_hi,
            "cost_usd_slow_end": c_hi}


def no_price_words(mode: str) -> str:
    """Why there is no verdict: no purchase (``mode`` 'buy') or rental price for the hardware."""
    return (f"No verdict against the budget: no {'purchase' if mode == 'buy' else 'rental'} price is "
            f"known for this hardware (set {APP_CONTROLS['--price-per-gpu' if mode == 'buy' else '--rent-per-gpu-hour']}).")


def verdict_words(chk: dict, mode: str) -> str:
    """The verdict of :func:`budget_check` in Markdown: its head, the limits, the days and dollars
    at the estimate and at the slow end of the likely range, and why."""
    what = "buy, with electricity" if mode == "buy" else "rent"
    est = f"{days_text(chk['days'])} and {fmt_money(chk['cost_usd'])} ({what}) at the estimate"
    slow = f"{days_text(chk['days_slow_end'])} and {fmt_money(chk['cost_usd_slow_end'])} at the slow end of the likely range"
    limits_line = (f"budget {fmt_money(chk['budget_usd'])}, deadline {format_days(chk['deadline_days'])} days")
    head = VERDICT_HEAD[chk["verdict"]]
    text = f"**{head}** ({limits_line}): {est}; {slow}."
    if chk["why"]:
        why = "; ".join(chk["why"])
        text += f" {why[0].upper()}{why[1:]}."
    return text
