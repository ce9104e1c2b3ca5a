"""A Plan: one strategy's answer (days, throughput, memory, breakdowns) as a documented object."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..core.errors import PhysicsError, UsageError
from ..strategy.knobs import Strategy

GIB = 1024**3
SECONDS_PER_DAY = 86400.0
#: A feasible plan using more than this fraction of the GPU's usable memory is flagged: the
#: allocator's fragmentation varies from run to run (the stack's modelled share is an average)
#: and can push such a plan over. Assumption: a 3% margin, about 2.4 GiB of an 80 GB card.
MEMORY_MARGIN = 0.03


def format_days(d: float) -> str:
    """Days as every front end shows them: one decimal below 100 ('12.3'), whole days from 100
    ('1,234'), '∞' when not finite."""
    if not math.isfinite(d):
        return "∞"
    return f"{d:,.1f}" if d < 100 else f"{d:,.0f}"


#: What an infeasible plan says when :func:`simulator.answer.api.suggest_fixes` finds no change that fits.
NO_FIX = ("no change found that fits: none of the changes tried (pinned memory settings left to the search, "
          "more host RAM, more GPUs of this card, a card with more memory) makes it fit; shrink the work per GPU "
          "instead (a shorter sequence, a smaller model)")


@dataclass
class Plan:
    """The answer for one strategy. Times in seconds, memory in GiB, throughput in tokens/s."""

    model: dict  # name, params
    recipe: dict  # tokens, steps, global_batch, seq_len, optimizer, precision, source
    hardware: dict  # description, gpu, n_gpus, nodes, gpus_per_node, links
    profile: dict  # name, method, date
    strategy: dict  # every knob + micro_batch, grad_accum
    feasible: bool
    reasons: list[str]
    step_time_s: float
    breakdown_s: dict[str, float]
    tokens_per_s: float
    mfu: float
    hfu: float
    memory_gib: dict[str, float]
    days: float
    days_at_peak: float
    mfu_6nd: float = float("nan")  # 6 N + 12 L h s convention (llm-foundry / PaLM)
    interval_days: tuple[float, float] | None = None
    interval_source: str | None = None
    suggestions: list[str] = field(default_factory=list)  # the ``text`` of each of ``fixes``, or NO_FIX
    fixes: list[dict] = field(default_factory=list)  # verified changes that fit (api.suggest_fixes)
    notes: list[str] = field(default_factory=list)
    n_strategies: int = 1
    search_ms: float | None = None
    cost: dict | None = None  # dollars, kWh, GPU-hours (simulator.answer.costs.plan_cost); None = not computed
    stack: str = "hf-trainer"  # the training software the plan assumes (simulator.strategy.stacks)
    conventions: str = ("mfu = tokens/s x the model's minimum FLOPs per token (3 x forward GEMMs + 3 x causal "
                        "attention) / (GPUs x dense peak of the precision); mfu_6nd uses 6 N + 12 L h s "
                        "(PaLM / llm-foundry), which counts every layer's whole s x s attention, so it can pass 100% for "
                        "sliding-window models at long sequences, whose kernels skip what lies outside the window; hfu counts FLOPs executed (recomputation, FlashAttention's "
                        "backward recompute, eager attention's masked half)")

    def to_dict(self) -> dict:
        """JSON-ready dict (the documented --json object); strict JSON: a figure that does not
        exist (MFU of a precision the GPU lacks in an infeasible plan) is null, never NaN."""
        d = dict(self.__dict__)
        d["interval_days"] = list(self.interval_days) if self.interval_days else None
        return _strict(d)

    def check_finite(self) -> None:
        """Raise UsageError if a headline figure (days, step time, throughput, interval, cost)
        is not a finite number: the inputs were beyond what the model can represent."""
        if not self.feasible:  # reference figures of a plan that does not fit are nulled in JSON
            return
        figures = {"days": self.days, "step time": self.step_time_s, "tokens/s": self.tokens_per_s,
                   "floor": self.days_at_peak, **{f"cost {k}": v for k, v in (self.cost or {}).items()}}
        for i, v in enumerate(self.interval_days or ()):
            figures[("interval low", "interval high")[i]] = v
        for name, v in figures.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise UsageError(f"the inputs give a {name} of {v} for {self.model['name']} on "
                                 f"{self.hardware['description']}: a count, price or profile value is "
                                 "beyond what the simulator can represent; check them")

    def check_physics(self) -> None:
        """Raise :class:`~simulator.core.errors.PhysicsError` if a feasible plan breaks physics: MFU or
        HFU above 1 (beyond float rounding), a negative time or memory component, or fewer days
        than the floor at 100% of the dense peak. The search must never return such a plan."""
        if not self.feasible:
            return
        tol = 1e-9
        broken = [f"{name} {v:.4g} > 1" for name, v in (("MFU", self.mfu), ("HFU", self.hfu)) if v > 1.0 + tol]
        broken += [f"{kind} {name} {v:.4g} < 0"
                   for kind, parts in (("time", self.breakdown_s), ("memory", self.memory_gib))
                   for name, v in parts.items() if v < 0.0]
        if self.step_time_s <= 0.0:
            broken.append(f"step time {self.step_time_s:.4g} s <= 0")
        if self.days < self.days_at_peak * (1.0 - tol):
            broken.append(f"{self.days:.4g} days < the floor of {self.days_at_peak:.4g}")
        if broken:
            raise PhysicsError(f"the plan for {self.model['name']} on {self.hardware['description']} "
                               f"({self.strategy_line()}) breaks physics: {'; '.join(broken)}; please "
                               "report this bug")

    def memory_warning(self) -> str | None:
        """A warning when a feasible plan uses more than ``1 - MEMORY_MARGIN`` of the usable
        GPU memory (GiB per GPU), else None."""
        m = self.memory_gib
        cap = m.get("capacity") or 0.0
        if not self.feasible or cap <= 0.0 or m["total"] < cap * (1.0 - MEMORY_MARGIN):
            return None
        return (f"at the memory limit: {m['total']:.1f} of {cap:.1f} GiB usable per GPU "
                f"({m['total'] / cap:.1%}), within {MEMORY_MARGIN:.0%} of it; memory fragmentation can "
                "push such a run out of memory, so leave room (a smaller micro-batch or more "
                "activation checkpointing)")

    def strategy_line(self) -> str:
        return Strategy(**self.strategy).describe()


def _strict(x):
    """Replace non-finite floats by None, recursively (json.dumps then never writes NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x
