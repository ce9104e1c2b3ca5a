"""``calibrate --from-runs FILE``: fit a few physically named profile parameters to end-to-end runs.

Many teams have no time for microbenchmarks but do have the tokens/s of past runs in their logs.
This fits, with ``scipy.optimize.least_squares`` on log(step time) residuals, a handful of bounded
parameters that scale a starting (microbenchmark) profile; nothing is ever fitted per run:

- ``tensor_sustained``: fraction of the microbenchmark GEMM ``e_max`` that tensor cores sustain in
  training (clocks under sustained power, shapes the benchmark did not cover); one per GPU group;
- ``attention_scale``: fused-attention efficiency relative to the FlashAttention benchmark;
- ``memory_bw_scale``: bandwidth-bound kernels (norms, activations, optimizer) relative to the copy
  benchmark;
- ``layer_overhead_us``: host time per layer and pass the GPU waits for (module dispatch, hooks);
- ``collective_busbw_eff``: bus bandwidth collectives reach in training, of the link benchmark;
- ``collective_overlap``: fraction of concurrent compute a collective hides behind;
- ``collective_hop_latency_us``: latency per extra ring step across nodes.

Reports in-sample, leave-one-run-out (LOO) and leave-one-source-out (LOSO) cross-validated MAPE;
the profile written stores the fit's provenance (runs, sources, parameters with bounds) and the
held-out residuals, so ``simulate``'s 80% interval follows (:mod:`simulator.answer.uncertainty`).
The CSV format is documented in docs/calibrate_from_runs.md; the loader is :mod:`simulator.answer.runs`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.answer import runs
from simulator.answer.uncertainty import LEVEL, left_out_coverage
from simulator.core.errors import UsageError
from simulator.engine import setup as setup_mod
from simulator.engine.setup import LAYOUT_KEYS, knob_space, layout_space, split_knobs
from simulator.hardware import catalog as hardware
from simulator.hardware.device import device_from_spec
from simulator.hardware.profile import (
    FitParameter,
    Profile,
    Provenance,
    RunsFit,
    ValidationSummary,
    comm_params,
    load_profile,
)
from simulator.model.graphs import mfu

#: name -> (start, lower, upper, meaning). Starts are the microbenchmark model (factors 1, no
#: overhead, full overlap); bounds keep every value physical (no efficiency above 1, see _apply).
PARAMS: dict[str, tuple[float, float, float, str]] = {
    "tensor_sustained": (1.0, 0.5, 1.0, "fraction of the microbenchmark GEMM e_max sustained in training "
                                        "(applied to the half-precision bf16/fp16/fp8 GEMMs the runs train in; "
                                        "tf32 and fp32 keep their microbenchmark rates)"),
    "attention_scale": (1.0, 0.3, 1.1, "half-precision fused-attention (flash) efficiency relative to the "
                                       "FlashAttention benchmark profile (up to 10% above: its values are read "
                                       "off charts and its shape carried across GPUs; capped at peak); the fp32 "
                                       "kernel and attention measured on the device itself keep their rates"),
    "memory_bw_scale": (1.0, 0.5, 1.1, "bandwidth-bound kernels relative to the copy benchmark (capped at 1)"),
    "layer_overhead_us": (1.0, 0.0, 400.0, "host time per transformer layer and pass (fwd, bwd, recompute) "
                                           "the GPU waits for, microseconds"),
    "collective_busbw_eff": (1.0, 0.3, 1.0, "bus bandwidth of collectives in training, fraction of the link's "
                                            "nccl-tests figure"),
    "collective_overlap": (1.0, 0.0, 1.0, "fraction of concurrent compute a collective hides behind"),
    "collective_hop_latency_us": (1.0, 0.0, 50.0, "latency per extra ring step across nodes, microseconds"),
    "fp32_atomic_rate": (500.0, 10.0, 2000.0, "sustained fp32 atomicAdds into global memory, 1e9 per second "
                                             "(mamba-ssm's scan backward into dB and dC; simulator.validation.family_validation)"),
}
#: fitted unless --params says otherwise: memory_bw_scale and layer_overhead_us stay available but are
#: not identifiable on the bundled dev runs (the fit leaves the first at 1 and drives the second
#: to its bound, compensating other terms), so the defaults leave them out
DEFAULT_PARAMS = ("tensor_sustained", "attention_scale", "collective_busbw_eff", "collective_overlap",
                  "collective_hop_latency_us")
#: one value per GPU group (a property of the chip: clocks under sustained power); the others
#: describe the software stack and the fabric's use and are shared by every run of a fit.
#: attention_scale is shared: it is relative to each GPU's own FlashAttention benchmark profile, so
#: what remains is how training calls the kernel (causal mask, layouts, dropout), and per group it is
#: not identifiable on the A100 runs (sequences 1-2k, attention 9-24% of a step): fitted per group
#: it went to its upper bound 1.1 on the 11 small-model runs and to 0.48 once the GEMM-bound
#: Korthikanti runs joined, trading against tensor_sustained; shared, leave-one-source-out MAPE of
#: the default rebuild fell from 27.2% to 16.5% at the same in-sample error (6.8%).
GROUPED = ("tensor_sustained", "fp32_atomic_rate")
#: GEMM precisions ``tensor_sustained`` scales: those of the half-precision tensor path the dev runs train in
#: (all bf16). A fit to them says nothing about tf32 or fp32 rates, which keep their microbenchmark values
#: (scaled with bf16's, the catalog H200 predicted tf32/fp32 steps 1.6-2.6x too slow; shared/data/h200)
SUSTAINED_PRECISIONS = ("bf16", "fp16", "fp8")
MICROBENCHMARK_DIR = "microbenchmark"
CV_NFEV = 4  # function evaluations per cross-validation refit (warm start from the full fit)  # hardware_catalog/microbenchmark/<gpu>.json: the starting points


def apply(base: Profile, values: dict[str, float]) -> Profile:
    """``base`` with the named parameters applied (factors scale; absolute values replace)."""
    upd: dict = {}
    k = values.get("tensor_sustained")
    if k is not None:
        for field in ("gemm", "gemm_bwd", "gemm_wgrad"):  # backward layouts too, where calibrated apart
            upd[field] = {p: g.model_copy(update={"e_max": min(1.0, g.e_max * k)}) if p in SUSTAINED_PRECISIONS
                          else g for p, g in getattr(base, field).items()}
    k = values.get("attention_scale")
    if k is not None and base.attention.basis == "published":  # a device measurement needs no chart correction
        a = base.attention  # the runs train in half precision: the fp32 kernel keeps its rates (as tf32/fp32 GEMMs)
        upd["attention"] = a.model_copy(update={f: min(1.0, getattr(a, f) * k) for f in ("flash_fwd", "flash_bwd")})
    k = values.get("memory_bw_scale")
    if k is not None:
        upd["memory_bw_eff"] = min(1.0, base.memory_bw_eff * k)
        upd["optimizer_bw_eff"] = {n: min(1.0, v * k) for n, v in base.optimizer_bw_eff.items()}
        upd["bw_eff_ops"] = {n: min(1.0, v * k) for n, v in base.bw_eff_ops.items()}
    for name in ("layer_overhead_us", "collective_busbw_eff", "collective_overlap", "collective_hop_latency_us",
                 "fp32_atomic_rate"):
        if name in values:
            upd[name] = float(values[name])
    return base.model_copy(update=upd)


@dataclass
class _RunModel:
    """One run, resolved once: re-evaluated in a few milliseconds for any profile."""

    run: pd.Series
    gpu: object  # catalog GPUSpec
    setup: object  # simulator.engine.setup.Setup
    space: object  # simulator.engine.estimate.Space, every knob pinned
    measured_s: float  # step time
    layout: object = None  # simulator.strategy.layout.Parallelism when tp or pp > 1 (pinned), else None

    def step_time(self, prof: Profile, device=None) -> float:
        """Seconds per step under ``prof`` (``device``: ``prof`` on this run's GPU, when the caller
        already built it)."""
        from simulator.engine.estimate import evaluate
        from simulator.engine.parallel_search import evaluate_layout

        pb = self.setup.problem
        dev = device if device is not None else device_from_spec(self.gpu, prof)
        pb = replace(pb, device=dev, fabric=replace(pb.fabric, **comm_params(prof)))
        if self.layout is None:
            return float(evaluate(pb, self.space).step_time[0])
        return float(evaluate_layout(pb, self.space, self.layout, [self.layout.vp])[0].step_time[0])


def _resolve(run: pd.Series, prof: Profile) -> _RunModel:
    """The run under its exact strategy (:func:`simulator.answer.runs.run_knobs`, as ``validate-published``
    simulates it), resolved once."""

    setup_knobs, pins = split_knobs(runs.run_knobs(run))
    lay = {k: pins.pop(k) for k in LAYOUT_KEYS if k in pins}
    st = setup_mod.setup(run["spec"], run["gpus"], profile=prof, **setup_knobs)
    space, _ = knob_space(st, pins)
    layout = None
    if lay["tp"] > 1 or lay["pp"] > 1:  # tensor/pipeline parallel: the run's one layout, as the layout search evaluates it
        (layout,) = layout_space(st, lay, space)
    measured = int(run["global_batch"]) * int(run["seq_len"]) / float(run["measured_tok_s"])
    return _RunModel(run, hardware.parse_cluster(run["gpus"]).gpu, st, space, measured, layout)


@dataclass
class Fit:
    """Result of one fit: values per parameter (grouped ones per group), residuals, errors."""

    params: tuple[str, ...]
    groups: list[str]
    x: np.ndarray
    residuals: np.ndarray  # log(measured / predicted step time), in-sample
    loo: np.ndarray | None = None  # held-out residuals, one per run
    loso: np.ndarray | None = None

    def values(self, group: str) -> dict[str, float]:
        return _unpack(self.params, self.groups, self.x)[group]


def _layout(params, groups) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for p in params:
        out += [(p, g) for g in groups] if p in GROUPED else [(p, None)]
    return out


def _unpack(params, groups, x) -> dict[str, dict[str, float]]:
    vals: dict[str, dict[str, float]] = {g: {} for g in groups}
    for (p, g), v in zip(_layout(params, groups), x, strict=True):
        for gg in ([g] if g is not None else groups):
            vals[gg][p] = float(v)
    return vals


def mape_of(log_res: np.ndarray) -> float:
    """Mean absolute percentage error of throughput from log(measured/predicted time) residuals."""
    return float(np.mean(np.abs(np.exp(np.asarray(log_res)) - 1.0)) * 100.0)


class Fitter:
    """Runs (normalized table) with their base profiles, fitted jointly: one ``tensor_sustained`` per
    GPU group, every other parameter shared (it describes the software stack, not the chip)."""

    def __init__(self, table: pd.DataFrame, bases: dict[str, Profile], group_of: dict[str, str] | None = None,
                 params: tuple[str, ...] = DEFAULT_PARAMS):
        unknown = [p for p in params if p not in PARAMS]
        if unknown:
            raise UsageError(f"unknown fit parameter(s) {', '.join(unknown)}; valid: {', '.join(PARAMS)}")
        self.table = table.reset_index(drop=True)
        self.params = tuple(params)
        self.group_of = group_of or {}
        self.bases = bases
        self.run_group = [self.group_of.get(g, g) for g in self.table["gpu"]]
        self.groups = sorted(set(self.run_group))
        self.run_gpu = list(self.table["gpu"])
        self.models = [_resolve(r, bases[r["gpu"]]) for _, r in self.table.iterrows()]
        self._memo: dict[tuple, float] = {}  # (run, its group's values) -> step time
        self.measured = np.array([m.measured_s for m in self.models])
        self.sources = np.array([runs.source_key(s) for s in self.table["source"]])
        lay = _layout(self.params, self.groups)
        self.x0 = np.array([PARAMS[p][0] for p, _ in lay])
        self.lb = np.array([PARAMS[p][1] for p, _ in lay])
        self.ub = np.array([PARAMS[p][2] for p, _ in lay])

    def predict(self, x: np.ndarray, idx=None) -> np.ndarray:
        """Predicted step times (s) of the runs ``idx`` (default all) under parameters ``x``. Each
        GPU's profile and device are built once per parameter vector; a run whose own group's
        values were already evaluated (a finite-difference step of another group's parameter, a
        refit starting where another did) is not simulated again."""
        vals = _unpack(self.params, self.groups, x)
        idx = range(len(self.models)) if idx is None else idx
        built: dict[tuple[str, str], tuple[Profile, object]] = {}
        out = []
        for i in idx:
            gpu, group = self.run_gpu[i], self.run_group[i]
            key = (i, tuple(vals[group].values()))
            if key not in self._memo:
                if (gpu, group) not in built:
                    prof = apply(self.bases[gpu], vals[group])
                    built[gpu, group] = prof, device_from_spec(self.models[i].gpu, prof)
                self._memo[key] = self.models[i].step_time(*built[gpu, group])
            out.append(self._memo[key])
        return np.array(out)

    def residuals(self, x: np.ndarray, idx=None) -> np.ndarray:
        idx = np.arange(len(self.models)) if idx is None else np.asarray(idx)
        return np.log(self.measured[idx] / self.predict(x, idx))

    def _solve(self, idx, x_start, max_nfev: int = 60) -> np.ndarray:
        sol = least_squares(lambda x: self.residuals(x, idx), np.clip(x_start, self.lb, self.ub),
                            bounds=(self.lb, self.ub), x_scale=np.maximum(self.ub - self.lb, 1e-3) / 10,
                            diff_step=1e-3, max_nfev=max_nfev)
        return sol.x

    def fit(self, cross_validate: bool = True, starts: tuple[np.ndarray, ...] = ()) -> Fit:
        """The fit of all runs: least squares from the microbenchmark start and from each of
        ``starts`` (e.g. the stored fit), the lowest cost kept; leave-one-run-out refits start from
        it, leave-one-source-out refits from the microbenchmark start (they never see the fit of
        the source they leave out)."""
        n = len(self.models)
        all_idx = np.arange(n)
        x = min((self._solve(all_idx, s) for s in (self.x0, *starts)),
                key=lambda xs: float(np.sum(self.residuals(xs) ** 2)))
        f = Fit(self.params, self.groups, x, self.residuals(x))
        if cross_validate and n >= 3:
            # refits start from the full fit (a few steps away from their optimum)
            f.loo = np.array([self.residuals(self._solve(np.delete(all_idx, i), x, CV_NFEV), [i])[0]
                              for i in all_idx])
            f.loso = np.zeros(n)
            for s in np.unique(self.sources):
                out = all_idx[self.sources == s]
                keep = all_idx[self.sources != s]
                xs = self._solve(keep, self.x0) if keep.size else self.x0
                f.loso[out] = self.residuals(xs, out)
        return f

    def heldout_coverage(self, held: np.ndarray, level: float = LEVEL) -> float | None:
        """Share of runs whose held-out residual falls inside the interval built from the other
        runs' held-out residuals (the interval a user would have got before running it;
        :func:`simulator.answer.uncertainty.left_out_coverage` with one run per group); None with fewer
        than 4 runs."""
        inside = [c for c in left_out_coverage([[x] for x in held], level) if c is not None]
        return float(np.mean(inside)) if inside else None


def fit_provenance(fitter: Fitter, f: Fit, group: str, base_name: str, idx: np.ndarray,
                   coverage: float | None, command: str) -> RunsFit:
    vals = f.values(group)
    srcs = pd.Series(fitter.sources[idx]).value_counts().to_dict()
    return RunsFit(
        method=command, date=_dt.date.today().isoformat(), n_runs=int(len(idx)),
        sources={str(k): int(v) for k, v in srcs.items()},
        runs=[str(r) for r in fitter.table["run"].iloc[idx]], base_profile=base_name,
        parameters={p: FitParameter(value=round(vals[p], 4), lower=PARAMS[p][1], upper=PARAMS[p][2],
                                    start=PARAMS[p][0], meaning=PARAMS[p][3]) for p in f.params},
        mape_in_sample=round(mape_of(f.residuals[idx]), 2),
        mape_loo=None if f.loo is None else round(mape_of(f.loo[idx]), 2),
        mape_loso=None if f.loso is None else round(mape_of(f.loso[idx]), 2),
        coverage80_heldout=None if coverage is None else round(coverage, 3))


def fitted_profile(base: Profile, fitter: Fitter, f: Fit, group: str, idx: np.ndarray, command: str,
                   name: str | None = None) -> Profile:
    """``base`` with the group's fitted values, provenance and held-out residuals of its runs."""
    held = f.loo if f.loo is not None else f.residuals
    cov = fitter.heldout_coverage(held[idx]) if len(idx) >= 5 else None
    prov = fit_provenance(fitter, f, group, base.name, idx, cov, command)
    srcs = ", ".join(f"{k} ({v})" for k, v in prov.sources.items())
    kind = "leave-one-run-out" if f.loo is not None else "in-sample"
    val = ValidationSummary(
        source=f"{command}: {kind} residuals of {len(idx)} end-to-end runs ({srcs})", n=int(len(idx)),
        mape=prov.mape_in_sample, mape_cv=prov.mape_loo, log_ratio_residuals=[round(float(r), 4) for r in held[idx]])
    prof = apply(base, f.values(group))
    e2e = (f"fitted end to end by {command} on {len(idx)} runs ({srcs}); see 'fit' for values, bounds "
           "and cross-validated errors")
    provenance = prof.provenance.model_copy(update={"sources": [*prof.provenance.sources, e2e]})
    return prof.model_copy(update={"name": name or base.name.replace("-published", "") + "-fitted",
                                   "fit": prov, "validation": val, "end_to_end_source": e2e,
                                   "provenance": provenance})


def at_bounds(f: Fit, rel: float = 1e-3) -> list[str]:
    """The fitted parameters within ``rel`` of their range's width from a bound, e.g.
    ``'tensor_sustained[all] 1 (upper bound)'``: the runs push them past their physical range or
    do not constrain them."""
    out = []
    for (p, g), v in zip(_layout(f.params, f.groups), f.x, strict=True):
        lo, hi = PARAMS[p][1], PARAMS[p][2]
        side = "lower" if v <= lo + rel * (hi - lo) else "upper" if v >= hi - rel * (hi - lo) else None
        if side:
            out.append(f"{f'{p}[{g}]' if g else p} {v:.4g} ({side} bound)")
    return out


def check_physical(table: pd.DataFrame, base: Profile) -> None:
    """UsageError naming the first run whose tokens/s would take more model FLOP/s than its GPUs'
    dense peak at its precision (:func:`simulator.model.graphs.mfu` above 1): a typo or a per-GPU /
    per-sequence figure, which the fit would chase to every parameter's bound."""
    for _, r in table.iterrows():
        gpu = hardware.parse_cluster(r["gpus"]).gpu
        peak = device_from_spec(gpu, base).gemm_peak(str(r["precision"]))
        if not peak:
            continue
        u = mfu(float(r["measured_tok_s"]), r["spec"], int(r["seq_len"]), int(r["n_gpus"]), peak)
        if not u <= 1.0:
            raise UsageError(f"run {r['run']}: {float(r['measured_tok_s']):.4g} tokens/s on {r['gpus']} would be "
                             f"{100 * u:.3g}% of the GPUs' dense {r['precision']} peak in model FLOPs (MFU); no run "
                             "exceeds 100%: tokens_per_s is the whole job's tokens per second (check it, the GPU "
                             "count and the precision)")


def own_provenance(base: Profile, e2e: str, runs_file: str, command: str) -> tuple[str, Provenance]:
    """Name and provenance of a profile fitted to the user's runs: fitted today, from ``runs_file``,
    starting from ``base`` (whose name, method, date and sources it cites)."""
    today = _dt.date.today().isoformat()
    name = f"{base.device.gpu_id or base.name} (fitted to {Path(runs_file).name} {today})"
    start = f"starting point: {base.name} ({base.provenance.method}, {base.provenance.date})"
    return name, Provenance(method="fitted", date=today, command=command,
                            sources=[f"{e2e} in {runs_file}", start, *base.provenance.sources])


def report(fitter: Fitter, f: Fit) -> str:
    """Plain-text summary: parameters, errors overall and per source."""
    lines = [f"start (microbenchmark profiles): MAPE {mape_of(fitter.residuals(fitter.x0)):.1f}% over "
             f"{len(f.residuals)} runs", "parameters (value, bounds):"]
    for (p, g), v in zip(_layout(f.params, f.groups), f.x, strict=True):
        lab = f"{p}[{g}]" if g else p
        lines.append(f"  {lab:34s} {v:9.4f}   [{PARAMS[p][1]:g}, {PARAMS[p][2]:g}]")
    lines.append(f"MAPE over {len(f.residuals)} runs: in-sample {mape_of(f.residuals):.1f}%"
                 + (f", leave-one-run-out {mape_of(f.loo):.1f}%" if f.loo is not None else "")
                 + (f", leave-one-source-out {mape_of(f.loso):.1f}%" if f.loso is not None else ""))
    cover = None if f.loo is None else fitter.heldout_coverage(f.loo)
    if cover is not None:
        lines.append(f"{100 * LEVEL:.0f}% interval coverage of held-out runs (LOO): {cover:.0%}")
    group = np.array(fitter.run_group)
    for s, m in [(s, fitter.sources == s) for s in np.unique(fitter.sources)] + \
            [(f"GPU group {g}", group == g) for g in fitter.groups]:
        row = f"  {s:28s} n={m.sum():3d}  in-sample {mape_of(f.residuals[m]):5.1f}%"
        if f.loo is not None:
            row += f"  LOO {mape_of(f.loo[m]):5.1f}%  LOSO {mape_of(f.loso[m]):5.1f}%"
        lines.append(row)
    return "\n".join(lines)


def microbenchmark_profile(gpu_id: str) -> Profile:
    """The published-microbenchmark profile of a catalog GPU: the starting point of every fit
    (read once per process; each call returns its own copy)."""
    return _read_microbenchmark(gpu_id).model_copy(deep=True)


@functools.cache
def _read_microbenchmark(gpu_id: str) -> Profile:
    from importlib.resources import as_file, files

    ref = files("hardware_catalog").joinpath(MICROBENCHMARK_DIR, f"{gpu_id}.json")
    if not ref.is_file():
        raise UsageError(f"no microbenchmark profile for GPU {gpu_id!r} (hardware_catalog/{MICROBENCHMARK_DIR}/)")
    with as_file(ref) as f:
        return load_profile(f)


def _base_for(arg: str) -> Profile:
    """--base-profile: a profile file, or a catalog GPU (its microbenchmark profile)."""
    p = Path(arg)
    if p.suffix == ".json" or p.exists():
        return load_profile(p)
    return microbenchmark_profile(hardware.parse_cluster(arg).gpu.id)


def main(runs_file: str, base_arg: str, out: Path | None, params: str | None, cv: bool, out_fn) -> int:
    """The ``calibrate --from-runs`` command (argument checking in calibration.cli)."""
    from simulator.hardware.profile import save_profile

    table = runs.load_runs(runs_file)
    excluded = table[table["excluded"] != ""]
    table = runs.simulable(table)
    if table.empty:
        raise UsageError(f"{runs_file!r}: no run can be simulated"
                         + (f" (first reason: {excluded['excluded'].iloc[0]})" if len(excluded) else ""))
    base = _base_for(base_arg)
    gid = base.device.gpu_id
    other = table[table["gpu"] != gid]
    if len(other):
        raise UsageError(
            f"--base-profile {base.name!r} describes {base.device.name!r}"
            + (f" (catalog GPU {gid})" if gid else ", no catalog GPU")
            + f", but {len(other)} of {len(table)} runs ran on {', '.join(sorted(set(other['gpu'])))} (e.g. "
            f"{other['run'].iloc[0]}): a fitted profile describes one device; fit each GPU's runs apart, with "
            "--base-profile that GPU (its catalog id or a profile of it)")
    check_physical(table, base)
    chosen = tuple(p.strip() for p in params.split(",")) if params else DEFAULT_PARAMS
    fitter = Fitter(table, {gid: base}, group_of={gid: "all"}, params=chosen)
    f = fitter.fit(cross_validate=cv)
    out_fn(f"{len(table)} runs used, {len(excluded)} skipped"
           + (f" (e.g. {excluded['run'].iloc[0]}: {excluded['excluded'].iloc[0]})" if len(excluded) else ""))
    out_fn(report(fitter, f))
    bound = at_bounds(f)
    if bound:
        print(f"calibrate: warning: {len(bound)} of {len(f.x)} fitted parameters sit at a bound: {', '.join(bound)}; "
              "the runs push them past their physical range or do not constrain them, so the others compensate "
              "(check the runs, or fit fewer --params)", file=sys.stderr)
    if out is not None:
        cmd = f"calibrate --from-runs {Path(runs_file).name}"
        prof = fitted_profile(base, fitter, f, "all", np.arange(len(table)), cmd)
        name, prov = own_provenance(base, prof.end_to_end_source, runs_file, cmd)
        save_profile(prof.model_copy(update={"name": name, "provenance": prov}), out)
        out_fn(f"wrote {out} ({name})")
    return 0 if all(math.isfinite(v) for v in f.x) else 1


#: GPU groups of the default rebuild: GPUs with end-to-end runs (fitted jointly, one tensor
#: factor per group) and GPUs of the same chip that carry the group's fit over
FAMILIES = {
    "a100": (("a100-40gb-sxm", "a100-80gb-sxm"), ("a100-80gb-pcie",)),
    "h100": (("h100-sxm",), ("h100-pcie", "h200")),
}
#: interval spread multipliers: a carried-over fit (same chip, other board/memory), and a GPU with
#: no end-to-end data at all (microbenchmark profile, residuals of runs from other sources and GPUs).
#: ASSUMPTION: judgement, to be replaced by the GPU's own runs.
CARRY_WIDEN, NO_DATA_WIDEN = 1.25, 1.5
def _catalog_profile_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "hardware_catalog" / "profiles"


def _stored_start(fitter: Fitter, profile_dir: Path) -> tuple[np.ndarray, ...]:
    """The fitted values the profiles in ``profile_dir`` hold, as a start for ``fitter`` (a second
    start beside the microbenchmark one: a change of physics can move the optimum the solver
    reaches from there to a worse local one); none where a fitted GPU's profile or value is missing."""
    from simulator.hardware.profile import load_profile

    lay = _layout(fitter.params, fitter.groups)
    vals: dict[tuple[str, str | None], float] = {}
    for fam, (fitted_gpus, _) in FAMILIES.items():
        path = profile_dir / f"{fitted_gpus[0]}.json"
        fit = load_profile(path).fit if path.exists() else None
        if fit is None or fam not in fitter.groups:
            return ()
        for p, g in lay:
            if g in (fam, None) and p in fit.parameters:
                vals[p, g] = fit.parameters[p].value
    return (np.array([vals[k] for k in lay]),) if all(k in vals for k in lay) else ()


def rebuild_defaults(out_dir: Path | None = None, cv: bool = True, log=print) -> dict[str, Profile]:
    """Refit the default A100/H100/H200 profiles from the bundled dev runs, starting from the
    microbenchmark profiles; give every other catalog GPU the widened held-out residuals."""
    from simulator.hardware.profile import save_profile

    out_dir = out_dir or _catalog_profile_dir()
    group_of = {g: fam for fam, (gs, _) in FAMILIES.items() for g in gs}
    table = runs.simulable(runs.default_runs())
    table = table[table["gpu"].isin(group_of)].reset_index(drop=True)
    fitter = Fitter(table, {g: microbenchmark_profile(g) for g in table["gpu"].unique()}, group_of)
    f = fitter.fit(cross_validate=cv, starts=_stored_start(fitter, _catalog_profile_dir()))
    log(report(fitter, f))
    group = np.array(fitter.run_group)
    out: dict[str, Profile] = {}
    for fam, (fitted_gpus, carried) in FAMILIES.items():
        idx = np.flatnonzero(group == fam)
        for g in fitted_gpus + carried:
            prof = fitted_profile(microbenchmark_profile(g), fitter, f, fam, idx, runs.REBUILD_COMMAND, name=f"{g}-fitted")
            if g in carried:
                note = (f"no end-to-end runs on {g}: the {fam.upper()} group's fitted factors (same chip) are "
                        f"applied to its microbenchmark profile; interval spread x{CARRY_WIDEN}")
                prof = prof.model_copy(update={
                    "fit": prof.fit.model_copy(update={"carried_over": note}),
                    "validation": prof.validation.model_copy(update={"widen": CARRY_WIDEN,
                                                                     "source": note + "; " + prof.validation.source})})
            out[g] = prof
    held = f.loso if f.loso is not None else f.residuals
    srcs = ", ".join(f"{k} ({v})" for k, v in pd.Series(fitter.sources).value_counts().items())
    for g in (spec.id for spec in hardware.list_gpus()):
        if g in out:
            continue
        base = microbenchmark_profile(g)
        note = (f"no end-to-end runs on {g}: microbenchmark profile kept as is (fitted factors of A100/H100 do not "
                f"carry over to another chip); interval from the leave-one-source-out residuals of all "
                f"{len(held)} dev runs ({srcs}), spread x{NO_DATA_WIDEN}")
        out[g] = base.model_copy(update={"validation": ValidationSummary(
            source=f"{runs.REBUILD_COMMAND}: {note}", n=int(len(held)), mape=round(mape_of(f.residuals), 2),
            mape_cv=round(mape_of(held), 2), log_ratio_residuals=[round(float(r), 4) for r in held],
            widen=NO_DATA_WIDEN)})
    for g, prof in out.items():
        save_profile(prof, out_dir / f"{g}.json")
    hardware.clear_cache()
    return out


def _cli(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m calibration.from_runs",
                                 description="Maintenance: refit the catalog's default profiles from the dev runs.")
    ap.add_argument("command", choices=["rebuild-defaults"])
    ap.add_argument("--no-cv", action="store_true", help="skip the cross-validation (fast; intervals in-sample)")
    a = ap.parse_args(argv)
    rebuild_defaults(cv=not a.no_cv)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_cli())
