"""What the explorer's download buttons serve: the plan as JSON (with its cost and verdict), and
the Markdown budget justification over the priced catalog sweep with the plan on screen first."""

from __future__ import annotations

import json

from simulator.answer import costs
from simulator.frontends import budget

from .inputs import canonical_cluster
from .verdict import budget_check, plan_cost
from .words import strategy_words


def current_for_budget(plan, prices: costs.Prices) -> dict | None:
    """The plan on screen in the budget report's terms (None when it does not fit)."""
    c = plan_cost(plan, prices)
    if c is None:
        return None
    hw = plan.hardware
    energy = c.get("energy_usd") or 0.0
    return {"label": hw["description"], "cluster": canonical_cluster(f"{hw['nodes']}x{hw['gpus_per_node']}x{hw['gpu_id']}")
            if hw["gpu_id"] != "local" else "local",
            "strategy": strategy_words(plan), "days": plan.days,
            "days_high": plan.interval_days[1] if plan.interval_days else plan.days,
            "buy_usd": c["hardware_usd"] + energy if c.get("hardware_usd") is not None else None,
            "rent_usd": c.get("rent_usd")}


def plan_json(plan, prices: costs.Prices, mode: str, limits: dict) -> str:
    """The plan download: the plan, its cost, and its verdict against the budget and deadline."""
    d = plan.to_dict()
    d["cost"] = plan_cost(plan, prices)
    d["budget_check"] = budget_check(plan, prices, mode, limits)
    return json.dumps(d, indent=2, default=str, allow_nan=False)


def budget_markdown(options: list, mode: str, limits: dict, prices: costs.Prices, model_line: str,
                    current: dict | None) -> str | None:
    """The Markdown budget justification (``simulator.frontends.budget``) over the priced sweep
    ``options``, with the configuration on screen (``current``) reported first; None without options."""
    if not options:
        return None
    return budget.to_markdown(model_line=model_line, es=budget.entries(options, mode),
                              budget=limits["budget_usd"], deadline=limits["deadline_days"], mode=mode,
                              prices=prices, generator="the pre-training what-if explorer",
                              csv_file=False, current=current)
