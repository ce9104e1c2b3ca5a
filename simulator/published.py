"""`simulate validate-published FILE`: predict published end-to-end runs with their exact strategy.

Rows are read by :mod:`simulator.runs` (data/validation_dev.csv, the MosaicML llm-foundry H100
BF16 table; data/published_runs_more.csv; or a ``calibrate --from-runs`` CSV): model, seq_len,
GPUs/nodes, sharding, activation checkpointing, micro-batch, accumulation and the measured tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import runs
from .errors import UsageError


def load_rows(path: str | Path) -> pd.DataFrame:
    """Read a runs CSV (any layout :func:`simulator.runs.load_runs` knows) into the normalized table."""
    return runs.load_runs(path)


def stack_preset(name) -> str:
    """The stack preset (simulator.stacks) for a run's stack name; the default (hf-trainer, plain
    PyTorch with autocast) where no preset claims it."""
    from .stacks import default_stack, for_published

    try:
        return for_published(str(name)).name
    except UsageError:
        return default_stack().name


def simulate_run(run, profile=None):
    """Simulate one normalized run (a row of :func:`simulator.runs.load_runs`) with its exact strategy."""
    from .api import simulate

    return simulate(run["spec"], run["gpus"], profile=profile, global_batch=int(run["global_batch"]),
                    seq_len=int(run["seq_len"]), steps=1, optimizer="adamw", precision=run["precision"],
                    sharding=run["sharding"], attention=run["attention"], compile=bool(run["compile"]),
                    checkpointing=run["checkpointing"], offload="none", micro_batch=int(run["micro_batch"]),
                    stack=stack_preset(run["stack"]))


def predict_row(run) -> dict:
    """Predict one normalized run with its exact strategy; returns predicted/measured tokens/s."""
    plan = simulate_run(run)
    measured = float(run["measured_tok_s"])
    flops = plan.mfu_6nd * measured / plan.tokens_per_s if plan.tokens_per_s > 0 else math.nan
    return {"run": run["run"], "source": run["source"], "stack": run["stack"], "model": run["model"],
            "seq_len": int(run["seq_len"]), "gpus": run["gpus"], "micro_batch": int(run["micro_batch"]),
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
    """MAPE and the log(measured/predicted step time) residuals used for intervals."""
    ratio = res["predicted_tok_s"] / res["measured_tok_s"]  # = measured time / predicted time
    return {"n": int(len(res)), "mape": float(np.mean(np.abs(res["error_pct"]))),
            "log_ratio_residuals": [float(x) for x in np.log(ratio)]}


DEFAULT_FILE = Path(__file__).parent / "data" / "validation_dev.csv"
INTERVAL_SOURCE = ("simulate validate-published {name}: MosaicML llm-foundry H100 80GB BF16 table "
                   "(scripts/train/benchmarking/README.md @8c8dd48f72), {n} runs, exact strategies; "
                   "applied to every default profile (no published end-to-end rows for other GPUs)")


def write_intervals(s: dict, name: str) -> int:
    """Write the validation summary into every catalog default profile (atomically); returns count."""
    from importlib.resources import as_file

    from . import hardware
    from .profile import ValidationSummary, save_profile

    count = 0
    for gpu in hardware.list_gpus():
        prof = hardware.default_profile(gpu)
        with as_file(hardware.default_profile_path(gpu)) as f:
            summary_ = ValidationSummary(source=INTERVAL_SOURCE.format(name=name, n=s["n"]), n=s["n"],
                                         mape=round(s["mape"], 2),
                                         log_ratio_residuals=[round(x, 4) for x in s["log_ratio_residuals"]])
            save_profile(prof.model_copy(update={"validation": summary_}), f)
            count += 1
    hardware.clear_cache()
    return count


def main(argv: list[str] | None = None) -> int:
    class _P(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(message)

    ap = _P(prog="simulate validate-published",
            description="Predict published runs (CSV like data/validation_dev.csv) with their exact strategy.")
    ap.add_argument("file", nargs="?", default=None,
                    help="CSV of published runs (default: the bundled llm-foundry H100 table)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-intervals", action="store_true",
                    help="store the residuals as the validation summary of every catalog default profile "
                         "(their 80%% intervals); point estimates are unchanged")
    a = ap.parse_args(argv)
    path = a.file or DEFAULT_FILE
    res = validate(path)
    s = summary(res)
    if a.write_intervals:
        n = write_intervals(s, Path(path).name)
        print(f"wrote validation residuals ({s['n']} rows, MAPE {s['mape']:.1f}%) into {n} default profiles")
    if a.json:
        print(json.dumps({"rows": res.to_dict(orient="records"), "mape_pct": s["mape"], "n": s["n"]}, indent=2))
        return 0
    with pd.option_context("display.max_rows", 500, "display.width", 160):
        cols = ["model", "seq_len", "gpus", "micro_batch", "grad_accum", "act_ckpt", "predicted_tok_s",
                "measured_tok_s", "error_pct", "predicted_mfu", "measured_mfu"]
        print(res[cols].to_string(index=False, float_format=lambda x: f"{x:,.3f}" if abs(x) < 10 else f"{x:,.0f}"))
    print(f"\nmean absolute percentage error over {s['n']} rows: {s['mape']:.1f}%  "
          f"(mean signed error {res['error_pct'].mean():+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
