"""Fit ``fp32_atomic_rate`` per GPU group on the families' published runs and store it with the
runs' predictions and held-out residuals in ``simulator/data/family_validation.json``::

    python -m calibration.family_fit

The runs are ``calibrate --from-runs`` runs (one GPU, their stated batch, sequence, stack, bf16,
AdamW, eager, no checkpointing) fitted by the same :class:`calibration.from_runs.Fitter` (bounded
least squares on log step-time residuals), with only ``fp32_atomic_rate`` free, one value per
GPU group (the chip: :data:`calibration.from_runs.FAMILIES`), every other profile figure the
default profile's. Cross-validation: leave one run out (the residuals of a GPU with a fitted
rate) and leave the GPU group out (the run predicted with the other group's rate: the residuals
of a GPU without data, which falls back to the lowest fitted rate).
"""

from __future__ import annotations

import datetime
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.from_runs import FAMILIES, PARAMS, Fitter, mape_of
from simulator.answer.family_runs import FamilyValidation, clear_cache
from simulator.answer.runs import COLUMNS, _row
from simulator.core.atomic import write_atomic
from simulator.hardware import catalog as hardware
from simulator.hardware.rates import AtomicFit, GroupRate, _path
from simulator.model.families import spec_from_dict
from simulator.validation import family_validation as fv

PARAM = "fp32_atomic_rate"
GROUP_OF = {g: fam for fam, (fitted, carried) in FAMILIES.items() for g in fitted + carried}


def runs_table(v: FamilyValidation) -> pd.DataFrame:
    """The family's published runs as a ``calibrate --from-runs`` table (:mod:`simulator.answer.runs`)."""
    spec = spec_from_dict(v.model)
    rows = []
    for r in v.runs:
        k = r.knobs()
        rows.append(_row(run=f"{v.source} {r.gpu} b{r.batch} s{r.seq_len}", source=v.source, stack=v.stack,
                         model=spec.name, spec=spec, seq_len=r.seq_len, gpu=r.gpu, gpus=f"1x{r.gpu}", n_gpus=1,
                         nodes=1, gpus_per_node=1, precision=k["precision"], sharding=k["sharding"],
                         checkpointing=k["checkpointing"], compile=k["compile"], attention="sdpa",  # ignored: no attention
                         micro_batch=r.batch, grad_accum=1, global_batch=r.batch,
                         measured_tok_s=r.measured_tokens_per_s, metric="throughput_tokens_per_s"))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def fit(v: FamilyValidation, log=print) -> tuple[AtomicFit, dict[str, np.ndarray]]:
    """The fitted rates and the residuals (in-sample, leave-one-run-out, leave-GPU-group-out)."""
    table = runs_table(v)
    fitter = Fitter(table, {g: hardware.default_profile(g) for g in table["gpu"].unique()}, GROUP_OF,
                    params=(PARAM,))
    f = fitter.fit(cross_validate=True)
    groups, run_group = fitter.groups, np.array(fitter.run_group)
    cross = np.zeros(len(table))
    for i, g in enumerate(groups):  # fit on the other group(s), predict this one with their rate
        keep, out = np.flatnonzero(run_group != g), np.flatnonzero(run_group == g)
        if keep.size == 0:
            cross[out] = np.nan
            continue
        xs = fitter._solve(keep, f.x)
        other = min(float(xs[j]) for j, gg in enumerate(groups) if gg != g)  # the fallback: lowest rate
        x = np.array(f.x)
        x[i] = other
        cross[out] = fitter.residuals(x, out)
    res = {"in_sample": f.residuals, "loo": f.loo, "cross_gpu": cross}
    lo, hi = PARAMS[PARAM][1], PARAMS[PARAM][2]
    vals = f.values
    out = AtomicFit(
        bounds=(lo, hi),
        groups={g: GroupRate(value=round(vals(g)[PARAM], 2), gpus=[k for k, gg in GROUP_OF.items() if gg == g],
                                runs=int((run_group == g).sum())) for g in groups},
        fallback=("ASSUMPTION: a GPU outside the fitted groups takes the lowest fitted rate (no sourced atomic "
                  "throughput per GPU in the catalog); its interval uses the leave-GPU-group-out residuals"),
        mape_in_sample=round(mape_of(res["in_sample"]), 2), mape_loo=round(mape_of(res["loo"]), 2),
        mape_cross_gpu=round(mape_of(cross[np.isfinite(cross)]), 2))
    log(f"{PARAM} (1e9/s, bounds [{lo:g}, {hi:g}]): " + ", ".join(f"{g} {r.value:g}" for g, r in out.groups.items()))
    log(f"MAPE in-sample {out.mape_in_sample}%, leave one run out {out.mape_loo}%, "
        f"leave GPU group out {out.mape_cross_gpu}%")
    return out, res


def rebuild(path: Path | None = None, log=print) -> dict:
    """Fit, then write the fit, the predictions and the residuals (atomically)."""
    path = path or _path()
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw.pop("atomic_fit", None)
    families = [FamilyValidation.model_validate(e) for e in raw["families"]]
    fits = {}
    for v in families:
        if v.family == "mamba":
            fits[v.family] = fit(v, log)
    (afit, res), = fits.values()
    raw["atomic_fit"] = afit.model_dump()
    text = json.dumps(raw, indent=1) + "\n"
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    clear_cache()
    out = []
    for v in families:
        runs = []
        r = fits.get(v.family, (None, None))[1]
        for i, run in enumerate(v.runs):
            pred = fv.predict(v, run)
            upd = {"predicted_tokens_per_s": pred}
            if r is None:  # nothing fitted on this family: its residuals are held out as they are
                lr = math.log(pred / run.measured_tokens_per_s)
                upd |= {"log_ratio": lr, "log_ratio_cross_gpu": lr, "log_ratio_in_sample": lr}
            else:
                upd |= {"log_ratio": round(float(r["loo"][i]), 6),
                        "log_ratio_cross_gpu": round(float(r["cross_gpu"][i]), 6),
                        "log_ratio_in_sample": round(float(r["in_sample"][i]), 6)}
            runs.append(run.model_copy(update=upd))
        out.append(v.model_copy(update={"runs": runs, "date": datetime.date.today().isoformat()}).model_dump())
    raw["families"] = out
    text = json.dumps(raw, indent=1) + "\n"
    write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    clear_cache()
    return raw


def main() -> None:
    raw = rebuild()
    for e in raw["families"]:
        v = FamilyValidation.model_validate(e)
        print(v.text())
        for r in v.runs:
            print(f"  {r.gpu} batch {r.batch} seq {r.seq_len}: measured {r.measured_tokens_per_s:,.0f}, predicted "
                  f"{r.predicted_tokens_per_s:,.0f} tok/s ({r.predicted_tokens_per_s / r.measured_tokens_per_s - 1:+.0%}); "
                  f"held out: one run {math.exp(r.log_ratio) - 1:+.0%}, GPU group {math.exp(r.log_ratio_cross_gpu) - 1:+.0%}")


if __name__ == "__main__":
    main()
