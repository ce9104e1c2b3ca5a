"""Human-readable rendering of plans (rich)."""

from __future__ import annotations

import rich.console
from rich.table import Table

from .plan import Plan, format_days


class Console(rich.console.Console):
    """A rich Console whose closed stdout (``simulate ... | head -1``) raises BrokenPipeError,
    which :func:`simulator.core.errors.run_cli` ends quietly with exit 0; rich's own handling exits
    with status 1, which here means "nothing fits"."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def render_plan(plan: Plan, console: Console, top: list[Plan] | None = None) -> None:
    """Print the summary of one-screen summary (README, *What you get*)."""
    m, r, hw = plan.model, plan.recipe, plan.hardware
    active = f" ({m['active_params'] / 1e9:.2f} B active)" if "active_params" in m else ""
    console.print(f"[bold]{m['name']}[/] · {m['params'] / 1e9:.2f} B parameters{active} · {r['description']}")
    console.print(f"{hw['description']} · profile: {plan.profile['name']} ({plan.profile['method']}, {plan.profile['date']})"
                  f" · stack: {plan.stack}")
    console.print()
    if plan.feasible:
        console.print(f"[bold green]Fastest feasible[/] of {plan.n_strategies:,} strategies"
                      + (f" (searched in {plan.search_ms:.0f} ms)" if plan.search_ms else ""))
    else:
        console.print(f"[bold red]Nothing fits[/] among {plan.n_strategies:,} strategies; the closest:")
    console.print(f"  {plan.strategy_line()}")
    b = plan.breakdown_s
    console.print(f"  step        {plan.step_time_s:.2f} s   compute {b['compute']:.2f} (fwd {b['forward']:.2f} · "
                  f"bwd {b['backward']:.2f} · recompute {b['recompute']:.2f}"
                  + (f"; {b['host_wait']:.2f} of it waiting for the host" if b.get("host_wait", 0.0) >= 0.005 else "")
                  + f") · exposed comm {b['exposed_comm']:.2f} · "
                  f"optimizer {b['optimizer']:.3f} · offload {b['offload']:.2f}"
                  + "".join(f" · {label} {b[k]:.2f}" for k, label in (("bubble", "pipeline bubble"),
                            ("tp_comm", "TP comm"), ("tp_comm_hidden", "TP comm hidden by async TP"),
                            ("pp_comm", "PP sends"), ("cp_comm", "ring attention sends"),
                            ("ep_comm", "expert all-to-all")) if b.get(k)))
    console.print(f"  throughput  {plan.tokens_per_s:,.0f} tokens/s · MFU {plan.mfu:.0%} · HFU {plan.hfu:.0%}")
    mg = plan.memory_gib
    console.print(f"  memory/GPU  {mg['total']:.1f} of {mg['capacity']:.1f} GiB reserved ({mg['allocated']:.1f} allocated)   "
                  f"weights {mg['weights']:.1f} · "
                  f"grads {mg['gradients']:.1f} · optimizer {mg['optimizer']:.1f} · activations "
                  f"{mg['activations']:.1f} · logits {mg['logits']:.1f} · other {mg['other']:.1f}"
                  + (f" · host {mg['host_offload_per_node']:.0f} of {mg.get('host_capacity_per_node', 0):.0f} GiB/node"
                     if mg.get("host_offload_per_node") else ""))
    if plan.memory_warning():
        console.print(f"  [yellow]warning:[/] {plan.memory_warning()}")
    if plan.feasible:  # a plan that does not fit does not run: no days, no interval
        iv = (f"  (80% interval {format_days(plan.interval_days[0])}–{format_days(plan.interval_days[1])})"
              if plan.interval_days else "")
        console.print(f"  days        [bold]{format_days(plan.days)}[/]{iv}        floor at 100% of peak: "
                      f"{format_days(plan.days_at_peak)} days")
    if plan.cost:
        from .costs import format_line

        console.print(f"  cost        {format_line(plan.cost)}")
    for reason in plan.reasons:
        console.print(f"  [red]why:[/] {reason}")
    for s in plan.suggestions:
        console.print(f"  [yellow]would fit:[/] {s}")
    for n in plan.notes:
        console.print(f"  [dim]note: {n}[/]")
    if plan.feasible and plan.interval_source:
        console.print(f"  [dim]{plan.interval_source}[/]")
    elif plan.feasible and not plan.interval_days:
        console.print("  [yellow]no 80% interval:[/] the profile holds no validation residuals (3 or more); "
                      "treat the estimate as optimistic, or measure real steps with `validate --profile FILE "
                      "--suite SUITE --update-profile`")
    if top:
        t = Table(title=f"Top {len(top)} strategies", show_lines=False)
        for col in ("#", "strategy", "step s", "tokens/s", "MFU", "mem GiB", "days"):
            t.add_column(col, justify="right" if col not in ("strategy",) else "left")
        for i, p in enumerate(top, 1):
            t.add_row(str(i), p.strategy_line(), f"{p.step_time_s:.2f}", f"{p.tokens_per_s:,.0f}",
                      f"{p.mfu:.0%}", f"{p.memory_gib['total']:.1f}", format_days(p.days))
        console.print(t)
