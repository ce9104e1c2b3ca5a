"""A Plan: one strategy's answer (days, throughput, memory, breakdowns) as a documented object."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3
SECONDS_PER_DAY = 86400.0


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
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    n_strategies: int = 1
    search_ms: float | None = None
    cost: dict | None = None  # dollars, kWh, GPU-hours (simulator.costs.plan_cost); None = not computed
    stack: str = "hf-trainer"  # the training software the plan assumes (simulator.stacks)
    conventions: str = ("mfu = tokens/s x the model's minimum FLOPs per token (3 x forward GEMMs + 3 x causal "
                        "attention) / (GPUs x dense peak of the precision); mfu_6nd uses 6 N + 12 L h s "
                        "(PaLM / llm-foundry); hfu counts FLOPs executed (recomputation, FlashAttention's "
                        "backward recompute, eager attention's masked half)")

    def to_dict(self) -> dict:
        """JSON-ready dict (the documented --json object)."""
        d = dict(self.__dict__)
        d["interval_days"] = list(self.interval_days) if self.interval_days else None
        return d

    def strategy_line(self) -> str:
        from .strategy import Strategy

        return Strategy(**self.strategy).describe()
