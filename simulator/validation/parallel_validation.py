"""`simulate validate-parallel`: predicted against measured for published tensor/pipeline runs.

Two sources, each row simulated with its recorded layout and strategy pinned:

* Korthikanti et al. 2022, Table 5 (``data/korthikanti2022.csv``): GPT 22B-1T on DGX A100,
  iteration time with full recomputation against sequence parallelism + selective recomputation;
* nanotron's scaling runs (``published_runs_more.csv`` rows with tp or pp above 1): Llama-style
  1.3B-80B, MFU. Their GPU is not stated beside the figure; the Ultra-Scale Playbook that
  published them trained on H100 80 GB nodes, assumed here (``NANOTRON_GPU``). MFU is compared in
  the 6 N + 12 L h s convention (``Plan.mfu_6nd``). The one run with tp = 16 spans two nodes
  (:func:`simulator.physics.parallel.tp_link`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..answer import runs
from ..answer.api import simulate
from ..core.errors import UsageError, UsageParser
from ..hardware.catalog import cluster_text

#: Assumption: the GPU of nanotron's published scaling runs (not stated in the figure).
NANOTRON_GPU = "h100-sxm"


def _cluster(n_gpus: int, gpu: str, per_node: int = 8) -> str:
    return cluster_text(n_gpus // per_node, per_node, gpu) if n_gpus > per_node else cluster_text(1, n_gpus, gpu)


def korthikanti_rows(profile=None) -> pd.DataFrame:
    """Predicted against measured iteration seconds for Korthikanti et al. 2022, Table 5
    (the runs of :func:`simulator.answer.runs.korthikanti_runs`, each with its layout pinned)."""
    out = []
    for _, r in runs.korthikanti_runs().iterrows():
        plan = simulate(r["spec"], r["gpus"], profile=profile, global_batch=int(r["global_batch"]),
                        seq_len=int(r["seq_len"]), steps=1, optimizer="adam", precision=r["precision"],
                        attention=r["attention"], compile=bool(r["compile"]), checkpointing=r["checkpointing"],
                        sharding=r["sharding"], offload="none", micro_batch=int(r["micro_batch"]), tp=int(r["tp"]),
                        pp=int(r["pp"]), vp=1, sequence_parallel=bool(r["sequence_parallel"]),
                        stack=runs.stack_preset(r["stack"]))
        out.append({"source": "Korthikanti et al. 2022, Table 5", "run": f"{r['model']} · {r['note']}",
                    "layout": f"TP {r['tp']} · PP {r['pp']} · {r['n_gpus']} A100", "metric": "iteration s",
                    "measured": float(r["global_batch"] * r["seq_len"] / r["measured_tok_s"]),
                    "predicted": plan.step_time_s, "feasible": plan.feasible})
    return pd.DataFrame(out)


def nanotron_rows() -> pd.DataFrame:
    """Predicted against measured MFU for nanotron's tensor/pipeline-parallel scaling runs."""
    more = pd.read_csv(runs.MORE_FILE)
    loaded = runs.load_runs(runs.MORE_FILE)
    out = []
    for i, row in more.iterrows():
        if "nanotron" not in str(row["source"]) or row["metric"] != "mfu_pct":
            continue
        run = loaded.iloc[i]
        tp, pp = int(run["tp"] or 1), int(run["pp"] or 1)
        if tp == 1 and pp == 1:
            continue
        n, gb = int(run["n_gpus"]), int(run["global_batch"])
        plan = simulate(run["spec"], _cluster(n, NANOTRON_GPU), global_batch=gb, seq_len=int(run["seq_len"]),
                        steps=1, optimizer="adamw", precision="bf16", attention="sdpa", compile=False,
                        sharding=run["sharding"], offload="none", micro_batch=int(run["micro_batch"]),
                        tp=tp, pp=pp, vp=1)
        dp = n // (tp * pp)
        out.append({"source": "nanotron scaling runs (GPU assumed H100)", "run": f"{run['model']} on {n}",
                    "layout": f"TP {tp} · PP {pp} · DP {dp}", "metric": "MFU %",
                    "measured": float(row["value_num"]), "predicted": 100.0 * plan.mfu_6nd,
                    "feasible": plan.feasible})
    return pd.DataFrame(out)


def validate() -> pd.DataFrame:
    """Every row of both sources with its signed error (predicted - measured) / measured, %.

    For times, a positive error means the prediction is slower than measured; for MFU, faster."""
    df = pd.concat([korthikanti_rows(), nanotron_rows()], ignore_index=True)
    df["error_pct"] = 100.0 * (df["predicted"] - df["measured"]) / df["measured"]
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per source: rows, mean absolute error %, mean signed error %, rows predicted infeasible."""
    g = df.groupby("source")
    return pd.DataFrame({"rows": g.size(), "mape": g["error_pct"].apply(lambda e: float(np.mean(np.abs(e)))),
                         "bias": g["error_pct"].mean(), "infeasible": g["feasible"].apply(lambda f: int((~f).sum()))})


def markdown(df: pd.DataFrame) -> str:
    lines = ["| source | run | layout | metric | measured | predicted | error |", "|---|---|---|---|---:|---:|---:|"]
    for _, r in df.iterrows():
        flag = "" if r["feasible"] else " (predicted infeasible)"
        lines.append(f"| {r['source']} | {r['run']} | {r['layout']} | {r['metric']} | {r['measured']:.2f} | "
                     f"{r['predicted']:.2f} | {r['error_pct']:+.1f}%{flag} |")
    s = summary(df)
    lines += ["", "| source | rows | MAPE | mean signed error | predicted infeasible |", "|---|---:|---:|---:|---:|"]
    for src, r in s.iterrows():
        lines.append(f"| {src} | {int(r['rows'])} | {r['mape']:.1f}% | {r['bias']:+.1f}% | {int(r['infeasible'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = UsageParser(prog="simulate validate-parallel",
                                 description="Predicted against measured for published tensor/pipeline-parallel runs "
                                             "(Korthikanti et al. 2022 Table 5; nanotron scaling runs)")
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    a = ap.parse_args(argv)
    df = validate()
    if not len(df) or not np.isfinite(df["error_pct"]).all():
        raise UsageError("validation produced no finite errors")
    print(markdown(df))
    if a.csv:
        from ..core.atomic import write_text_atomic

        write_text_atomic(a.csv, df.to_csv(index=False))
    return 0 if math.isfinite(float(summary(df)["mape"].max())) else 1
