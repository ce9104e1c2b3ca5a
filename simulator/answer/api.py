"""The public Python API: ``simulate`` (one plan) and ``search`` (all feasible, ranked).

The CLI, the Streamlit app and the notebooks all come through here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..core.errors import UsageError
from ..engine.estimate import Table
from ..engine.parallel_search import evaluate_layouts, explain_layout
from ..engine.setup import (
    LAYOUT_KEYS,
    Setup,
    batch_fits,
    knob_space,
    layout_space,
    setup,
    split_knobs,
)
from ..hardware import catalog as hardware
from ..hardware.device import GIB
from ..model import graphs
from ..model.graphs import model_flops_per_token, palm_flops_per_token
from ..physics import memory
from ..strategy.knobs import OFFLOADS, SHARDINGS
from . import uncertainty
from .costs import Prices, plan_cost
from .family_runs import interval
from .plan import NO_FIX, SECONDS_PER_DAY, Plan

#: Step times within this relative difference are a tie when listing distinct plans (far below the
#: model's accuracy; the simpler plan is listed first).
TIE = 0.005


def _check_top(top, lowest: int) -> None:
    if top is None and lowest == 1:
        return
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < lowest:
        raise UsageError(f"top must be {'a positive' if lowest else 'a non-negative'} integer"
                         f"{' or None (all)' if lowest else ''}, got {top!r}")


def _gib(x: float) -> float:
    return float(x) / GIB


def _plan(s: Setup, tab: Table, i: int, notes: list[str], n_evaluated: int) -> Plan:
    model, recipe, pb = s.model, s.recipe, s.problem
    st = tab.strategy(i)
    step = float(tab.step_time[i])
    tokens_step = recipe.global_batch * recipe.seq_len
    tps = tokens_step / step
    peak = pb.device.gemm_peak(st.precision) or float("nan")
    n = pb.n_gpus
    mfu = graphs.mfu(tps, model, recipe.seq_len, n, peak)
    mfu_6nd = tps * palm_flops_per_token(model, recipe.seq_len) / (n * peak)
    # executed FLOPs: the busiest GPU's per-step FLOPs, times GPUs, over the step time
    hfu = float(tab.hw_flops[i]) / step / peak
    days = recipe.steps * step / SECONDS_PER_DAY * (1.0 + s.overhead)
    days_at_peak = recipe.tokens * model_flops_per_token(model, recipe.seq_len) / (n * peak) / SECONDS_PER_DAY
    mem = {k: _gib(getattr(tab, "mem_" + k)[i])
           for k in ("weights", "gradients", "optimizer", "activations", "logits", "other")}
    mem["total"] = _gib(tab.mem_total[i])
    # the peak of allocated tensors (torch.cuda.max_memory_allocated); "total" adds what the caching
    # allocator reserves beyond them (the stack's fragmentation share of activations and
    # loss_fragmentation share of logits, inside "other") and is the number feasibility checks
    # (the least device memory the step runs in)
    mem["allocated"] = _gib(tab.mem_total[i] - memory.allocator_reserve(tab.mem_activations[i], tab.mem_logits[i],
                                                                        pb.stack))
    mem["capacity"] = _gib(pb.device.usable_memory)
    mem["host_offload_per_node"] = _gib(tab.host_need[i])
    mem["host_capacity_per_node"] = _gib(pb.host_memory)  # host RAM per node (offload's limit)
    reasons = _reasons(s, tab, i)
    prof = s.profile
    residuals = uncertainty.for_profile(prof, pb.stack, s.hardware["gpu"])
    iv, family_text = interval(days, residuals, model.family, prof.device.gpu_id)
    min_days = days_at_peak * (1.0 + s.overhead)  # the floor, with the same overhead as the estimate
    if iv is not None:
        lo = max(iv[0], uncertainty.plausible_low(days, min_days))
        iv = (lo, max(iv[1], lo))
    warning = uncertainty.mfu_warning(float(mfu), days, min_days)
    host_note = uncertainty.host_bound_note(float(tab.host_idle[i]), step, days) if tab.feasible[i] else None
    if iv is not None and host_note:  # the regime our own validation finds slower than predicted
        iv = (iv[0], max(iv[1], days * uncertainty.HOST_BOUND_SLOW_P90))
    plan = Plan(
        model={"name": model.display_name, "params": int(model.n_params()), "family": model.family,
               **({"active_params": int(model.n_active_params())} if hasattr(model, "n_active_params") else {})},
        recipe={"tokens": int(recipe.tokens), "steps": int(recipe.steps), "global_batch": recipe.global_batch,
                "seq_len": recipe.seq_len, "optimizer": recipe.optimizer, "precision": recipe.precision,
                "source": recipe.source, "description": recipe.describe()},
        hardware=s.hardware,
        profile={"name": prof.name, "method": prof.provenance.method, "date": prof.provenance.date},
        strategy=st.model_dump(),
        feasible=bool(tab.feasible[i]),
        reasons=reasons,
        step_time_s=step,
        breakdown_s={"compute": float(tab.compute[i]), "forward": float(tab.forward[i]),
                     "backward": float(tab.backward[i]), "recompute": float(tab.recompute[i]),
                     "exposed_comm": float(tab.exposed_comm[i]), "optimizer": float(tab.optimizer[i]),
                     "offload": float(tab.offload_time[i]), "bubble": float(tab.bubble[i]),
                     "tp_comm": float(tab.tp_comm[i]), "tp_comm_hidden": float(tab.tp_comm_hidden[i]),
                     "pp_comm": float(tab.pp_comm[i]), "cp_comm": float(tab.cp_comm[i]),
                     "host_wait": float(tab.host_idle[i]),
                     **({"ep_comm": float(tab.ep_comm[i])} if hasattr(model, "n_experts") else {})},
        tokens_per_s=tps, mfu=float(mfu), mfu_6nd=float(mfu_6nd), hfu=float(hfu), memory_gib=mem, days=float(days),
        days_at_peak=float(days_at_peak), interval_days=iv,
        interval_source=_interval_source(residuals, family_text, iv, days, min_days, bool(host_note)) if iv else None,
        notes=s.notes + notes + [w for w in (warning, host_note) if w], n_strategies=n_evaluated, stack=pb.stack.name,
    )
    plan.check_physics()
    return plan


def _interval_source(residuals, family_text: str | None, iv, days: float, min_days: float,
                     host_bound: bool = False) -> str:
    """Where the 80% interval came from, in plain words: the residuals that match the user's
    situation (:func:`simulator.answer.uncertainty.for_profile`), widened to include the family's own
    published runs where it has any (:mod:`simulator.validation.family_validation`), and its low end held at
    the best MFU published runs reached where the residuals alone would go lower; for a host-bound plan
    (``host_bound``) its high end at least :data:`simulator.answer.uncertainty.HOST_BOUND_SLOW_P90` x the estimate."""
    prof = (f"{residuals.n} validation residuals (real runs {_bias(residuals)} than predicted on "
            f"average): {residuals.words}") if residuals is not None and residuals.n else None
    text = (f"80% interval from {prof}" if family_text is None else
            f"80% interval widened to include {family_text}" + (f"; and {prof}" if prof else ""))
    if iv is not None and iv[0] <= uncertainty.plausible_low(days, min_days) * (1 + 1e-9):
        text += (f"; its low end is held at the best MFU any published run reached "
                 f"({uncertainty.MFU_CEILING:.0%}), or at the estimate where that is lower")
    if host_bound:
        text += (f"; its high end at least {uncertainty.HOST_BOUND_SLOW_P90:.2f}x the estimate, the 90th percentile of "
                 "measured over predicted time of host-bound small-model runs (docs/small_model_runs.md)")
    return text


def _bias(v) -> str:
    """'23% slower' / '5% faster': the mean of exp(log measured/predicted time) - 1."""
    m = float(np.mean(np.exp(v.log_ratio_residuals))) - 1.0
    return f"{abs(m):.0%} {'slower' if m >= 0 else 'faster'}"


def _reasons(s: Setup, tab: Table, i: int) -> list[str]:
    out = []
    st = tab.strategy(i)
    cap = _gib(s.problem.device.usable_memory)
    label = s.hardware["gpu"]
    if s.problem.device.gemm_peak(st.precision) is None:
        out.append(f"{label} does not support {st.precision}")
    if not tab.valid[i]:
        out.append(f"--offload {st.offload} does not work with --sharding {st.sharding}")
    if not tab.fits[i]:
        states = _gib(tab.mem_weights[i] + tab.mem_gradients[i] + tab.mem_optimizer[i])
        tot = _gib(tab.mem_total[i])
        if states > cap:
            out.append(f"weights + gradients + optimizer states need {states:.1f} GiB per GPU; "
                       f"one {label} has {cap:.1f} GiB usable")
        else:
            out.append(f"needs {tot:.1f} GiB per GPU (states {states:.1f} + activations "
                       f"{_gib(tab.mem_activations[i]):.1f} + logits {_gib(tab.mem_logits[i]):.1f} + other "
                       f"{_gib(tab.mem_other[i]):.1f}); one {label} has {cap:.1f} GiB usable")
    if not tab.host_ok[i]:
        out.append(f"offloaded states need {_gib(tab.host_need[i]):.0f} GiB of host RAM per node; "
                   f"assumed {_gib(s.problem.host_memory):.0f} GiB (set --host-memory)")
    return out


#: Table columns that make two strategies different plans (all but micro-batch and accumulation;
#: ``pack`` is precision, attention, compile and checkpointing together).
_DISTINCT_COLUMNS = ("pack", "sharding", "offload", "tp", "pp", "vp", "sp")


@dataclass
class SearchResult:
    """All evaluated strategies of one search; ``plans`` are the best first."""

    setup: Setup
    table: Table
    order: np.ndarray  # indices of feasible strategies, fastest first
    n_evaluated: int
    elapsed_ms: float  # the search alone: after the model, catalog, profile and stack are loaded
    notes: list[str]

    def plans(self, top: int | None = None, distinct: bool = False) -> list[Plan]:
        """The ``top`` fastest plans (all if None). ``distinct``: one plan per strategy apart from
        the micro-batch and accumulation (the fastest micro-batch of each; see :meth:`distinct`)."""
        idx = self.distinct() if distinct else self.order
        idx = idx if top is None else idx[:top]
        return [_plan(self.setup, self.table, int(i), self.notes, self.n_evaluated) for i in idx]

    def distinct(self) -> np.ndarray:
        """Indices of the feasible strategies that differ in more than micro-batch and gradient
        accumulation (precision, attention, compile, checkpointing, sharding, offload, layout): the
        fastest micro-batch of each. Ordered by step time, and plans whose step times tie within
        :data:`TIE` simplest first (SDPA before eager attention, compiled before not, then less
        checkpointing, offload, sharding and model parallelism). What ``--top`` and the app list."""
        if not self.order.size:
            return self.order
        keys = np.stack([getattr(self.table, k)[self.order] for k in _DISTINCT_COLUMNS], axis=1)
        _, first = np.unique(keys, axis=0, return_index=True)  # first in order = fastest micro-batch
        kept = self.order[np.sort(first)]
        step = self.table.step_time

        def simplicity(i):
            st = self.table.strategy(int(i))
            return (math.floor(math.log(step[i]) / math.log1p(TIE)), st.attention != "sdpa", not st.compile,
                    st.checkpointing != "none", OFFLOADS.index(st.offload), SHARDINGS.index(st.sharding),
                    st.tp * st.pp, st.vp, step[i])

        return np.array(sorted(kept, key=simplicity), dtype=kept.dtype)

    @property
    def best(self) -> Plan:
        """Fastest feasible plan; if none fits, the least-memory valid one (feasible=False)."""
        if self.order.size:
            return _plan(self.setup, self.table, int(self.order[0]), self.notes, self.n_evaluated)
        tab = self.table
        key = np.where(tab.valid, tab.mem_total, np.inf)
        if not np.isfinite(key).any():
            key = tab.mem_total
        p = _plan(self.setup, self.table, int(np.argmin(key)), self.notes, self.n_evaluated)
        pb = self.setup.problem
        st = p.strategy

        states = sum(v for k, v in memory.model_states(
            float(pb.model.n_params()), 0.0, st["precision"], "zero3" if pb.n_gpus > 1 else "ddp", "none",
            pb.optimizer, pb.n_gpus).items() if k != "host")
        if states > pb.device.usable_memory:
            p.reasons.insert(0, f"weights + gradients + optimizer states need {_gib(states):.1f} GiB per GPU even "
                             f"fully sharded over {pb.n_gpus} GPU(s) without offload; one {self.setup.hardware['gpu']} "
                             f"has {_gib(pb.device.usable_memory):.1f} GiB usable")
        return p


def run_search(model, gpus, **knobs) -> SearchResult:
    """Evaluate every strategy allowed by the pinned knobs; see :func:`search`."""
    sk, pins = split_knobs(knobs)
    s = setup(model, gpus, **sk)
    t0 = time.perf_counter()  # reading the catalog, profile and presets (cached per process) is not searching
    lay = {k: pins.pop(k) for k in LAYOUT_KEYS if k in pins}
    space, notes = knob_space(s, pins)
    pars = batch_fits(s, layout_space(s, lay, space), pins.get("micro_batch"))
    tab, n_layouts = evaluate_layouts(s.problem, space, pars, async_tp=lay.get("async_tp"))
    key = tab.rank_key
    feas = np.nonzero(np.isfinite(key))[0]
    order = feas[np.argsort(key[feas], kind="stable")]
    if len(pars) > 1:
        notes = notes + [explain_layout(tab, order, len(pars), n_layouts, s.problem.n_gpus)]
    return SearchResult(s, tab, order, len(tab), (time.perf_counter() - t0) * 1e3, notes)


def search(model, gpus, top: int | None = None, **knobs) -> list[Plan]:
    """All feasible strategies (knobs left free are searched), fastest first.

    ``model``: preset name, path to a Hugging Face config.json, or a ModelSpec.
    ``gpus``: '8x3090', '2x8xa100-80gb', '1xlocal' (with ``profile``).
    Knobs: precision, attention, compile, checkpointing, sharding, offload, micro_batch (pins;
    checkpointing: none, selective, op, full or every:K);
    tokens, steps, global_batch, seq_len, optimizer (recipe); profile, intra_node, inter_node,
    host_memory (hardware); overhead (fraction of wall-clock time beyond training steps); stack
    (the training software, simulator.strategy.stacks: hf-trainer, llm-foundry, torchtitan; not searched).
    """
    _check_top(top, 1)
    return run_search(model, gpus, **knobs).plans(top)


@dataclass
class Answer:
    """What the front ends show: the best plan (priced, or with fixes), its search, the top plans."""

    plan: Plan
    result: SearchResult
    top: list[Plan]


def answer(model, gpus, prices=None, top: int = 0, **knobs) -> Answer:
    """Search, then finish the best plan: price it if it fits, else suggest what would fit;
    ``top`` > 0 also returns (and prices) the ``top`` fastest plans. One path for the CLI, the
    app and :func:`simulate`."""
    _check_top(top, 0)
    if prices is not None and not isinstance(prices, Prices):
        raise UsageError(f"prices must be a simulator.answer.costs.Prices (simulator.answer.costs.load_prices(path) reads a "
                         f"prices file) or None for the built-in prices; got {prices!r}")
    res = run_search(model, gpus, **knobs)
    plan = res.best
    plan.search_ms = res.elapsed_ms
    if plan.feasible:
        plan.cost = plan_cost(plan, prices)
    else:
        plan.fixes = suggest_fixes(model, gpus, knobs, res)
        plan.suggestions = [f["text"] for f in plan.fixes] or [NO_FIX]
    plans = res.plans(top, distinct=True) if top else []
    for p in plans:
        p.cost = plan_cost(p, prices)
    for p in (plan, *plans):
        p.check_finite()
    return Answer(plan, res, plans)


def simulate(model, gpus, prices=None, **knobs) -> Plan:
    """The fastest feasible plan (or, if nothing fits, the closest one with reasons and fixes).

    ``prices``: a :class:`simulator.answer.costs.Prices` (default: the built-in prices) for
    ``plan.cost``, which is set for feasible plans.
    """
    return answer(model, gpus, prices=prices, **knobs).plan


_MEMORY_KEYS = ("sharding", "offload", "checkpointing", "micro_batch")


def _names(keys) -> str:
    return ", ".join(k.replace("_", "-") for k in keys)


def suggest_fixes(model, gpus, knobs: dict, res: SearchResult) -> list[dict]:
    """Smallest changes that would fit, each verified by re-running the search with it applied.

    Tried in order: leaving the pinned memory knobs (sharding, offload, checkpointing,
    micro-batch) to the search; more host RAM; more GPUs of the same card; a larger card. A
    hardware change is first tried with every pin kept; only if that fails is it tried with the
    memory pins released, and then the fix says so (``unpin``). Returns dicts with ``kind``,
    ``gpus`` (cluster text), ``knobs`` (changed settings), ``unpin`` (pins the fix releases),
    ``strategy``, ``days`` and ``text``.
    """
    out: list[dict] = []
    sk, pins = split_knobs(knobs)
    hw = res.setup.hardware
    memory_pins = [k for k in _MEMORY_KEYS if k in pins]
    kept = {k: v for k, v in pins.items() if k not in _MEMORY_KEYS}
    needs = f" — only with {_names(memory_pins)} unpinned (left to the search)"

    def fix(kind, gpus_text, changed, unpin, plan, what):
        out.append({"kind": kind, "gpus": gpus_text, "knobs": changed, "unpin": list(unpin),
                    "strategy": plan.strategy_line(), "days": float(plan.days),
                    "text": what + (needs if unpin else "")})

    def attempt(candidates, setup_knobs):
        """(cluster text, best plan, pins released) of the first candidate that fits with every
        pin kept; failing that, the first that fits with the memory pins released; else None."""
        for p, unpin in ((pins, []), (kept, memory_pins)) if memory_pins else ((pins, []),):
            for text in candidates:
                try:
                    r = run_search(model, text, **setup_knobs, **p)
                except UsageError:
                    continue
                if r.order.size:
                    return text, r.best, unpin
        return None

    def simpler() -> bool:  # releasing the pins alone fits: no hardware change needs to as well
        return any(f["kind"] == "unpin" for f in out)

    unpinned = None
    if memory_pins:
        unpinned = run_search(model, gpus, **sk, **kept)
        if unpinned.order.size:
            b = unpinned.best
            fix("unpin", str(gpus), {}, memory_pins, b,
                f"unpin {_names(memory_pins)} (leave them to the search): {b.strategy_line()} fits "
                f"({b.memory_gib['total']:.1f} GiB per GPU)")
            out[-1]["text"] = out[-1]["text"].removesuffix(needs)
    # more host RAM: a plan whose GPU memory fits but whose offloaded states exceed the host RAM
    for cand, unpin in ((res.best, []), (unpinned.best if unpinned is not None else None, memory_pins)):
        if cand is None or out:
            continue
        mg = cand.memory_gib
        need = mg.get("host_offload_per_node", 0.0)
        if mg["total"] <= mg["capacity"] and need > _gib(res.setup.problem.host_memory):
            gib = math.ceil(need * 1.1)
            got = attempt([str(gpus)], {**sk, "host_memory": float(gib)})
            if got and (got[2] == [] or unpin):
                fix("host_memory", str(gpus), {"host_memory": float(gib)}, got[2], got[1],
                    f"more host RAM: {gib} GiB per node lets {got[1].strategy_line()} fit")
    if hw["gpu_id"] == "local":
        return out
    gid = hw["gpu_id"]
    same = {k: v for k, v in sk.items() if k != "intra_node"}
    other = {k: v for k, v in sk.items() if k not in ("profile", "profile_any_gpu", "intra_node")}
    sizes = [(n, p) for n, p in ((1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)) if n * p > hw["n_gpus"]]
    got = attempt([hardware.cluster_text(n, p, gid) for n, p in sizes], same)
    if got and not (got[2] and simpler()):
        fix("more_gpus", got[0], {}, got[2], got[1],
            f"more GPUs: {got[0]} fits ({got[1].strategy_line()}; {got[1].days:,.0f} days)")
    cur = hardware.get_gpu(gid)
    bigger = sorted((g for g in hardware.list_gpus() if g.usable_memory_gib.value > cur.usable_memory_gib.value),
                    key=lambda g: g.usable_memory_gib.value)
    shape = "" if hw["nodes"] == 1 else f"{hw['nodes']}x"
    cards = {f"{shape}{hw['gpus_per_node'] if shape else hw['n_gpus']}x{g.id}": g for g in bigger}
    got = attempt(list(cards), other)
    if got and not (got[2] and simpler()):
        g = cards[got[0]]
        fix("larger_card", got[0], {}, got[2], got[1],
            f"a larger card: {got[0]} ({g.usable_memory_gib.value:.1f} GiB usable) fits "
            f"({got[1].strategy_line()}; {got[1].days:,.0f} days)")
    return out
