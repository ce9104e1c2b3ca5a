"""Comparing measured with predicted steps: one row per configuration (``CSV_FIELDS``), the
summary (MAPE per step, per pass and for peak memory; the residuals log(measured / predicted)),
the plain-text table, and leave-one-draw-out coverage across several measurements."""

from __future__ import annotations

import math
import statistics
from typing import Any

from simulator.answer.uncertainty import LEVEL, left_out_coverage

from .. import host_load
from .measuring import Measured
from .suite import Config

#: per-pass columns: name -> (measured, predicted) fields, all micro-batches of a step
COMPONENTS = {"fwd": ("measured_fwd_s", "predicted_fwd_s"), "bwd": ("measured_bwd_s", "predicted_bwd_s"),
              "rec": ("measured_rec_s", "predicted_rec_s"), "opt": ("measured_opt_s", "predicted_opt_s")}
CSV_FIELDS = (
    "id", "model", "params", "n_layers", "hidden", "seq_len", "micro_batch", "grad_accum", "world",
    "precision", "attention", "checkpointing", "compile", "status", "reason",
    "measured_step_s", "predicted_step_s", "error_pct", "log_ratio", "measured_min_s", "spread",
    "measured_fwd_s", "predicted_fwd_s", "measured_bwd_s", "predicted_bwd_s",
    "measured_rec_s", "predicted_rec_s", "measured_opt_s", "predicted_opt_s",
    "measured_mem_gib", "predicted_mem_gib", "mem_error_pct", "measured_reserved_gib", "predicted_reserved_gib",
    "compile_s", "steps", "warmup",
    "rounds", "device", "profile", "suite", "date", "torch", "loadavg_1min", "other_cores", "host_speed", "host_allocator",
)


def make_row(cfg: Config, m: Measured, pred: dict[str, Any], world: int, meta: dict[str, Any]) -> dict[str, Any]:
    """One result row (CSV_FIELDS); error_pct = 100 (predicted - measured) / measured, and
    mem_error_pct the same for the allocated peak memory."""
    p = pred.get("step")
    row: dict[str, Any] = {
        "id": cfg.id if world == 1 else f"{cfg.id}-w{world}", "model": cfg.model,
        "params": cfg.spec.n_params(), "n_layers": cfg.spec.n_layers, "hidden": cfg.spec.hidden,
        "seq_len": cfg.seq_len, "micro_batch": cfg.micro_batch, "grad_accum": cfg.grad_accum,
        "world": world, "precision": cfg.precision, "attention": cfg.attention,
        "checkpointing": cfg.checkpointing, "compile": cfg.compile, "status": m.status,
        "reason": "; ".join(x for x in (m.reason, pred.get("note", "")) if x),
        "measured_step_s": m.step_s, "predicted_step_s": p, "error_pct": None, "log_ratio": None,
        "measured_min_s": m.min_s, "spread": m.spread,
        "measured_fwd_s": m.fwd_s, "predicted_fwd_s": pred.get("fwd"),
        "measured_bwd_s": m.bwd_s, "predicted_bwd_s": pred.get("bwd"),
        "measured_rec_s": m.rec_s, "predicted_rec_s": pred.get("rec"),
        "measured_opt_s": m.opt_s, "predicted_opt_s": pred.get("opt"), "compile_s": m.compile_s,
        "measured_mem_gib": m.mem_gib, "predicted_mem_gib": pred.get("mem"), "mem_error_pct": None,
        "measured_reserved_gib": m.reserved_gib, "predicted_reserved_gib": pred.get("reserved"),
        **meta,
    }
    if m.step_s and p:
        row["error_pct"] = 100.0 * (p - m.step_s) / m.step_s
        row["log_ratio"] = math.log(m.step_s / p)
    if m.mem_gib and pred.get("mem"):
        row["mem_error_pct"] = 100.0 * (pred["mem"] - m.mem_gib) / m.mem_gib
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """n, MAPE (percent, of the median step), worst absolute error and log(measured/predicted)
    residuals over rows with both times; ``mape_min_pct`` is the same against the fastest timed
    step (a noise check); ``components`` the MAPE per pass (forward, backward, recomputation,
    optimizer) over rows where that pass takes measurable time; ``steady`` the n, MAPE and worst
    error over rows measured while the host ran at no less than ``host_load.SLOW_SHARE`` of its
    calibrated speed (where ``host_speed`` was measured)."""
    done = [r for r in rows if r.get("error_pct") is not None]
    mape = statistics.fmean(abs(r["error_pct"]) for r in done) if done else None
    comps = {}
    for name, (mk, pk) in COMPONENTS.items():
        errs = [100.0 * abs(r[pk] - r[mk]) / r[mk] for r in done
                if r.get(mk) and r.get(pk) is not None and r[mk] > 0.01 * r["measured_step_s"]]
        if errs:
            comps[name] = {"n": len(errs), "mape_pct": statistics.fmean(errs),
                           "signed_pct": statistics.fmean(
                               100.0 * (r[pk] - r[mk]) / r[mk] for r in done
                               if r.get(mk) and r.get(pk) is not None and r[mk] > 0.01 * r["measured_step_s"])}
    mins = [100.0 * abs(r["predicted_step_s"] - r["measured_min_s"]) / r["measured_min_s"]
            for r in done if r.get("measured_min_s")]
    speeds = [(r, as_number(r.get("host_speed"))) for r in done]
    steady = [abs(r["error_pct"]) for r, s in speeds if s is not None and s >= host_load.SLOW_SHARE]
    return {"n": len(done), "mape_pct": mape, "mape_min_pct": statistics.fmean(mins) if mins else None,
            "memory": summarize_memory(rows),
            "worst_pct": max((abs(r["error_pct"]) for r in done), default=None), "components": comps,
            "steady": ({"n": len(steady), "mape_pct": statistics.fmean(steady), "worst_pct": max(steady)}
                       if steady and any(s is not None for _, s in speeds) else None),
            "log_ratio_residuals": [r["log_ratio"] for r in done]}


def summarize_memory(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Peak allocated memory, predicted against measured, over rows with both: n, mean absolute
    and mean signed error (percent), the worst under-prediction (most negative error, percent) and
    how many rows are under-predicted by more than 5%; None without such rows (CPU runs)."""
    errs = [e for e in (as_number(r.get("mem_error_pct")) for r in rows) if e is not None]
    if not errs:
        return None
    return {"n": len(errs), "mape_pct": statistics.fmean(abs(e) for e in errs),
            "signed_pct": statistics.fmean(errs), "worst_under_pct": min(errs),
            "under_5pct": sum(e < -5.0 for e in errs)}


def as_number(v: Any) -> float | None:
    """A number from a row value (CSV rows hold strings), None if empty."""
    try:
        return None if v in (None, "") else float(v)
    except (TypeError, ValueError):
        return None


def _fmt(x: Any, scale: float = 1e3, nd: int = 1) -> str:
    return "—" if x is None else f"{x * scale:.{nd}f}"


def format_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """Plain-text table of predicted vs measured step time (ms), peak allocated memory (GiB, where
    measured) and the MAPEs."""
    w = max([len(r["id"]) for r in rows] + [6])
    lines = [f"{'config':<{w}}  {'pred ms':>9}  {'meas ms':>9}  {'err %':>7}   "
             f"{'fwd p/m':>15}  {'bwd p/m':>15}  {'rec p/m':>15}  {'opt p/m':>13}  {'spread':>6}  {'GiB p/m':>11}"]
    for r in rows:
        err = "—" if r["error_pct"] is None else f"{r['error_pct']:+.1f}"
        lines.append(
            f"{r['id']:<{w}}  {_fmt(r['predicted_step_s']):>9}  {_fmt(r['measured_step_s']):>9}  {err:>7}   "
            f"{_fmt(r['predicted_fwd_s']):>7}/{_fmt(r['measured_fwd_s']):<7}  "
            f"{_fmt(r['predicted_bwd_s']):>7}/{_fmt(r['measured_bwd_s']):<7}  "
            f"{_fmt(r['predicted_rec_s']):>7}/{_fmt(r['measured_rec_s']):<7}  "
            f"{_fmt(r['predicted_opt_s']):>6}/{_fmt(r['measured_opt_s']):<6}  {_fmt(r['spread'], 1, 2):>6}  "
            f"{_fmt(as_number(r.get('predicted_mem_gib')), 1):>5}/{_fmt(as_number(r.get('measured_mem_gib')), 1):<5}"
            + (f"  [{r['status']}: {r['reason']}]" if r["reason"] else ""))
    if summary["mape_pct"] is not None:
        lines.append(f"\nmean absolute percentage error over {summary['n']} configurations: "
                     f"{summary['mape_pct']:.1f}% (median step; against the fastest step: "
                     f"{summary['mape_min_pct']:.1f}%); worst {summary['worst_pct']:.1f}%")
        names = {"fwd": "forward", "bwd": "backward", "rec": "recompute", "opt": "optimizer"}
        for name, c in summary.get("components", {}).items():
            lines.append(f"  {names[name]:<10} MAPE {c['mape_pct']:5.1f}%  mean signed error "
                         f"{c['signed_pct']:+6.1f}%  ({c['n']} configurations)")
        mem = summary.get("memory")
        if mem:
            lines.append(f"  peak memory (allocated) MAPE {mem['mape_pct']:.1f}%  mean signed error "
                         f"{mem['signed_pct']:+.1f}%  worst under-prediction {mem['worst_under_pct']:+.1f}%  "
                         f"({mem['under_5pct']} of {mem['n']} configurations under by more than 5%)")
        st = summary.get("steady")
        if st:
            lines.append(f"  with the host at >= {host_load.SLOW_SHARE} of its calibrated speed (host_speed): "
                         f"{st['n']} of {summary['n']} configurations, MAPE {st['mape_pct']:.1f}%, "
                         f"worst {st['worst_pct']:.1f}%")
    else:
        lines.append("\nno configuration has both a prediction and a measurement")
    return "\n".join(lines)



def draw_coverage(draws: list[list[dict[str, Any]]], level: float = LEVEL) -> list[float | None]:
    """Per draw (the rows of one measurement of a suite), the share of its rows whose
    log(measured/predicted) lies inside the ``level`` interval built from the other draws' residuals
    (:func:`simulator.answer.uncertainty.left_out_coverage`): whether an interval from some draws of the
    host covers another as it claims; None for a draw without residuals or whose others have fewer
    than 3. Empty with fewer than two draws."""
    if len(draws) < 2:
        return []
    return left_out_coverage([[r["log_ratio"] for r in d if r.get("log_ratio") is not None] for d in draws], level)

