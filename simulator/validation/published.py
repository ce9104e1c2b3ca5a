"""`simulate validate-published FILE`: predict published end-to-end runs with their exact strategy.

Rows are read by :mod:`simulator.answer.runs` (data/validation_dev.csv, the MosaicML llm-foundry H100
BF16 table; data/published_runs_more.csv; or a ``calibrate --from-runs`` CSV): model, seq_len,
GPUs/nodes, sharding, activation checkpointing, micro-batch, accumulation and the measured tokens/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..answer import runs
from ..answer.api import simulate
from ..core.errors import UsageError, UsageParser
from ..hardware import catalog as hardware


def load_rows(path: str | Path) -> pd.DataFrame:
    """Read a runs CSV (any layout :func:`simulator.answer.runs.load_runs` knows) into the normalized table."""
    return runs.load_runs(path)


def simulate_run(run, profile=None):
    """Simulate one normalized run (a row of :func:`simulator.answer.runs.load_runs`) with its exact strategy
    (:func:`simulator.answer.runs.run_knobs`)."""
    return simulate(run["spec"], run["gpus"], profile=profile, **runs.run_knobs(run))


def check_measured_mfu(run, plan) -> None:
    """Refuse a run whose measured tokens/s would need more than 100% of its GPUs' dense peak
    (model FLOPs, a true lower bound on the work: :func:`simulator.model.graphs.model_flops_per_token`):
    a typo in the throughput, the GPU count or the model, never a measurement to predict."""
    if not plan.tokens_per_s > 0:
        return
    mfu = plan.mfu * float(run["measured_tok_s"]) / plan.tokens_per_s
    if mfu > 1.0:
        raise UsageError(f"{run['run']}: measured {float(run['measured_tok_s']):,.0f} tokens/s of {run['model']} on "
                         f"{run['gpus']} is {mfu:.0%} of the GPUs' dense {run['precision']} peak (model FLOPs "
                         "utilization above 100% is impossible); check the throughput, the GPUs and the model")


def predict_row(run) -> dict:
    """Predict one normalized run with its exact strategy; returns predicted/measured tokens/s.
    A measured throughput above the GPUs' peak is refused (:func:`check_measured_mfu`)."""
    plan = simulate_run(run)
    check_measured_mfu(run, plan)
    measured = float(run["measured_tok_s"])
    flops = plan.mfu_6nd * measured / plan.tokens_per_s if plan.tokens_per_s > 0 else None
    return {"run": run["run"], "source": run["source"], "stack": run["stack"], "model": run["model"],
            "seq_len": int(run["seq_len"]), "gpu": run["gpu"], "gpus": run["gpus"], "micro_batch": int(run["micro_batch"]),
            "grad_accum": plan.strategy["grad_accum"], "act_ckpt": run["checkpointing"] != "none",
            "checkpointing": run["checkpointing"], "predicted_tok_s": plan.tokens_per_s,
            "measured_tok_s": measured, "error_pct": 100.0 * (plan.tokens_per_s - measured) / measured,
            "predicted_mfu": plan.mfu_6nd, "measured_mfu": flops,
            "feasible": plan.feasible, "profile": plan.profile["name"]}


def validate(path: str | Path | None = None) -> pd.DataFrame:
    """Predict every simulable row (default: the bundled dev runs); a DataFrame with the error per row."""
    table = runs.default_runs() if path is None else load_rows(path)
    return pd.DataFrame([predict_row(r) for _, r in runs.simulable(table).iterrows()])


def summary(res: pd.DataFrame) -> dict:
    """MAPE (overall and per source) and the log(measured/predicted step time) residuals."""
    ratio = res["predicted_tok_s"] / res["measured_tok_s"]  # = measured time / predicted time
    src = res["source"].map(runs.source_key)
    per = {k: {"n": int(len(g)), "mape": float(np.mean(np.abs(g["error_pct"]))),
               "signed": float(np.mean(g["error_pct"]))} for k, g in res.groupby(src)}
    return {"n": int(len(res)), "mape": float(np.mean(np.abs(res["error_pct"]))), "per_source": per,
            "log_ratio_residuals": [float(x) for x in np.log(ratio)]}


DEFAULT_FILE = runs.DEV_FILE
REBUILD_COMMAND = runs.REBUILD_COMMAND


def cross_validated(res: pd.DataFrame) -> list[dict]:
    """Per default profile used by ``res``: the fit's stored in-sample, leave-one-run-out and
    leave-one-source-out MAPE and the held-out coverage of its 80% interval."""
    out = []
    for gpu in sorted(set(res["gpu"])):
        prof = hardware.default_profile(hardware.parse_cluster(gpu).gpu)
        f = prof.fit
        if f is None:
            continue
        out.append({"profile": prof.name, "runs": f.n_runs, "sources": f.sources, "mape_in_sample": f.mape_in_sample,
                    "mape_loo": f.mape_loo, "mape_loso": f.mape_loso, "coverage80_heldout": f.coverage80_heldout})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = UsageParser(prog="simulate validate-published",
            description="Predict published runs with their exact strategy (default: the bundled dev runs, "
                        "data/validation_dev.csv, data/published_runs_more.csv and data/korthikanti2022.csv).")
    ap.add_argument("file", nargs="?", default=None,
                    help="CSV of runs (layouts: docs/calibrate_from_runs.md; default: the bundled dev runs)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = validate(a.file)
    if res.empty:
        raise UsageError(f"{a.file!r}: no run can be simulated (see the 'excluded' reasons of simulator.answer.runs)")
    s = summary(res)
    cv = cross_validated(res)
    if a.json:
        print(json.dumps({"rows": res.to_dict(orient="records"), "mape_pct": s["mape"], "n": s["n"],
                          "per_source": s["per_source"], "cross_validated": cv}, indent=2, allow_nan=False))
        return 0
    with pd.option_context("display.max_rows", 500, "display.width", 160):
        cols = ["model", "seq_len", "gpus", "micro_batch", "grad_accum", "checkpointing", "predicted_tok_s",
                "measured_tok_s", "error_pct", "predicted_mfu", "measured_mfu"]
        print(res[cols].to_string(index=False, float_format=lambda x: f"{x:,.3f}" if abs(x) < 10 else f"{x:,.0f}"))
    print(f"\nin-sample mean absolute percentage error over {s['n']} runs: {s['mape']:.1f}%  "
          f"(mean signed error {res['error_pct'].mean():+.1f}%)")
    for src, m in s["per_source"].items():
        print(f"  {src}: {m['mape']:.1f}% over {m['n']} runs (signed {m['signed']:+.1f}%)")
    for c in cv:
        print(f"{c['profile']}: fitted on {c['runs']} runs; MAPE in-sample {c['mape_in_sample']:.1f}%, "
              f"leave-one-run-out {c['mape_loo']}%, leave-one-source-out {c['mape_loso']}%; "
              f"80% interval covers {c['coverage80_heldout']} of held-out runs")
    if cv:
        print(f"(cross-validated figures are stored by `{REBUILD_COMMAND}`; re-run it after changing the physics)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
