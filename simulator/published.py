"""`simulate validate-published FILE`: predict published end-to-end runs with their exact strategy.

Rows follow simulator/data/validation_dev.csv (MosaicML llm-foundry H100 BF16 table): model
size, seq_len, GPUs/nodes, sharding, activation checkpointing, micro-batch, accumulation and the
measured tokens/s. Nothing is fitted to these rows: they check the physics.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import UsageError

_GPU = {"h100_80gb": "h100-sxm", "a100_80gb": "a100-80gb-sxm", "a100_40gb": "a100-40gb-sxm"}
_SHARD = {"FULL_SHARD": "fsdp-full", "SHARD_GRAD_OP": "fsdp-grad-op", "NO_SHARD": "ddp"}
_PREC = {"amp_bf16": "bf16", "amp_fp16": "fp16", "fp32": "fp32"}
REQUIRED = ("model", "seq_len", "gpu", "n_gpus", "n_nodes", "gpus_per_node", "precision", "sharding",
            "act_ckpt", "micro_batch", "grad_accum", "global_batch", "throughput_tok_s")


def load_rows(path: str | Path) -> pd.DataFrame:
    """Read and check a published-runs CSV; UsageError names the file and the problem."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except FileNotFoundError:
        raise UsageError(f"cannot read {str(p)!r}: no such file") from None
    except Exception as exc:  # pandas raises several parser errors
        raise UsageError(f"cannot parse {str(p)!r} as CSV: {exc}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UsageError(f"{str(p)!r} lacks column(s) {', '.join(missing)}; required: {', '.join(REQUIRED)}")
    return df


def predict_row(row) -> dict:
    """Predict one published row with its exact strategy; returns predicted/measured tokens/s."""
    from .api import simulate
    from .models import get_model

    gpu = _GPU.get(str(row["gpu"]), str(row["gpu"]))
    spec = get_model(f"mpt-{row['model']}").with_max_positions(int(row["seq_len"]))
    gpus = (f"{int(row['n_nodes'])}x{int(row['gpus_per_node'])}x{gpu}" if int(row["n_nodes"]) > 1
            else f"{int(row['n_gpus'])}x{gpu}")
    ckpt = str(row["act_ckpt"]).strip().lower() in ("true", "1", "yes")
    plan = simulate(spec, gpus, global_batch=int(row["global_batch"]), seq_len=int(row["seq_len"]), steps=1,
                    optimizer="adamw", precision=_PREC.get(str(row["precision"]), "bf16"),
                    sharding=_SHARD.get(str(row["sharding"]), "fsdp-full"), attention="sdpa", compile=False,
                    checkpointing="full" if ckpt else "none", offload="none",
                    micro_batch=int(row["micro_batch"]))
    measured = float(row["throughput_tok_s"])
    return {"model": f"mpt-{row['model']}", "seq_len": int(row["seq_len"]), "gpus": gpus,
            "micro_batch": int(row["micro_batch"]), "grad_accum": plan.strategy["grad_accum"],
            "act_ckpt": ckpt, "predicted_tok_s": plan.tokens_per_s, "measured_tok_s": measured,
            "error_pct": 100.0 * (plan.tokens_per_s - measured) / measured,
            "predicted_mfu": plan.mfu_6nd, "measured_mfu": float(row.get("mfu_pct", math.nan)) / 100.0,
            "feasible": plan.feasible, "profile": plan.profile["name"]}


def validate(path: str | Path) -> pd.DataFrame:
    """Predict every row; a DataFrame with the error per row."""
    df = load_rows(path)
    return pd.DataFrame([predict_row(r) for _, r in df.iterrows()])


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
