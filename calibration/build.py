"""Turn raw measurements into a validated :class:`simulator.hardware.profile.Profile`.

:func:`build_profile` runs the fitting steps in order, each a ``*_section`` function of the
measurements and what earlier steps fitted that returns its :class:`Part` of the profile: launch
overhead, then device bandwidth and ``memory_bw_eff``, then peaks, then GEMM and attention
efficiencies (whose models include the launch and memory terms), then fresh pages, op classes,
optimizer, host and collective figures, and last the dispatch overhead of training passes.

Peaks: for a catalog GPU the datasheet dense peaks and bandwidth are used. Otherwise
(CPU, or a GPU the catalog lacks) the peak of a precision is the *best measured*
throughput of any GEMM or fused-attention kernel in that precision, and the memory
bandwidth is the best measured copy bandwidth (read + write bytes / time), so the best
kernel has efficiency ~1 by construction. This is stated in the profile's sources.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simulator.core.errors import UsageError
from simulator.hardware.profile import (
    ACTIVATION_CLASSES,
    MISALIGNED_MAX,
    SCHEMA_VERSION,
    FreshMemory,
    Profile,
    parse_profile,
)
from simulator.physics.fresh_memory import fresh_time, logits_fresh_bytes

from . import fit as F
from .benches.attention import BWD_FLOPS_FACTOR, attention_precision
from .benches.bandwidth import OPS
from .benches.gemm import SYSFS_CACHE, WALK_SHAPES
from .benches.optimizer import layer_shapes
from .collectives import bus_bytes
from .device import BYTES_PER_EL, DeviceContext, catalog_peaks, provenance_fields
from .store import merge_rounds

BIG_BYTES = 1 << 26  # memory_bw_eff is fitted on ops moving >= 64 MiB when there are such
PLACEHOLDER = "NOT MEASURED in this run (placeholder value)"


@dataclass
class Built:
    """The profile plus the fit details and warnings for the report and measurements file."""

    profile: Profile
    fits: dict[str, dict] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _ok(results: dict[str, dict], prefix: str) -> list[tuple[str, dict]]:
    return [(k, r) for k, r in results.items() if k.startswith(prefix) and r.get("status") == "ok"]


def _raw(fit: F.Fit, name: str) -> str:
    raw = fit.params.get(f"raw_{name}")
    return f" (fitted {raw:.2f}, capped at 1)" if raw else ""


def _fmt(x: float) -> str:
    return f"{x:.3g}"


@dataclass
class Part:
    """One fitting step's share of the profile: ``fields`` by their :class:`Profile` name, the fit
    details for the measurements file (``fits``) and ``warnings``, each in the order fitted."""

    fields: dict[str, Any] = field(default_factory=dict)
    fits: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Launch(Part):
    """:func:`launch_section`'s part and the overheads (s) later fits' time models include."""

    eager_s: float
    compiled_s: float


@dataclass(kw_only=True)
class Bandwidth(Part):
    """:func:`bandwidth_section`'s part and what later fits take from it: the device bandwidth
    (GB/s), where it comes from, and the copy kernel's efficiency (None where not measured)."""

    gbs: float
    gbs_source: str
    copy_eff: float | None


def grouped_section(dev: DeviceContext, results: dict[str, dict], tag: str) -> Part:
    """``grouped_gemm_m_half``: per precision, the rows per group at which a grouped GEMM takes
    twice one GEMM of all its rows (``grouped_gemm/`` benches, :mod:`calibration.benches.grouped_gemm`)."""
    fits: dict[str, Any] = {}
    m_half: dict[str, float] = {}
    notes: list[str] = []
    for prec in dev.precisions:
        pts = [r for _, r in _ok(results, f"grouped_gemm/{prec}/")]
        if pts:
            f_g = F.fit_grouped([r["rows"] for r in pts], [r["time_s"] for r in pts], [r["dense_s"] for r in pts])
            fits[f"grouped_gemm_m_half/{prec}"] = f_g.as_dict()
            m_half[prec] = f_g.params["m_half"]
            impls = ", ".join(sorted({r.get("impl", "?") for r in pts}))
            notes.append(f"{prec} {m_half[prec]:.3g} rows ({f_g.n} shapes of {min(r['rows'] for r in pts):g}-"
                         f"{max(r['rows'] for r in pts):g} rows per group, {impls}, rms log {f_g.rms_log:.2f})")
    source = (f"{tag}: grouped GEMMs of a few groups against one torch.mm of all their rows, time ratio fitted as "
              "1 + m_half / rows: " + "; ".join(notes)) if notes else None
    return Part({"grouped_gemm_m_half": m_half, "grouped_gemm_m_half_source": source}, fits)


@dataclass(kw_only=True)
class Peaks(Part):
    """:func:`peaks_section`'s part: the dense peak (TFLOPS) of each precision and its source."""

    tflops: dict[str, float]
    sources: dict[str, str]


@dataclass(kw_only=True)
class Fresh(Part):
    """:func:`fresh_section`'s part and the fitted fresh-memory rate (None: no first-touch cost)."""

    memory: FreshMemory | None


def build_profile(dev: DeviceContext, results: dict[str, dict], command: str,
                  name: str | None = None, extra_sources: list[str] | None = None,
                  host_allocator: str | None = None) -> Built:
    """Fit every section of the profile from ``results`` (key -> record), measured with
    ``host_allocator`` (:mod:`calibration.host_alloc`; CPU): the ``*_section`` steps below in
    turn, each taking what the earlier ones fitted (launch overhead and bandwidth enter every
    later time model), then the training passes' dispatch overhead, which predicts with the
    profile the others make."""
    date = provenance_fields(dev, command)["date"][:10]
    tag = f"calibration {date} on {dev.name}"
    gpu_id, cat_peaks, cat_bw, cat_src = catalog_peaks(dev)
    launch = launch_section(results, tag)
    bw = bandwidth_section(results, tag, cat_bw, cat_src, launch)
    peaks = peaks_section(dev, results, cat_peaks, cat_src)
    gemm = gemm_sections(dev, results, tag, peaks, bw, launch.eager_s)
    misaligned = misaligned_section(dev, results, tag)
    grouped = grouped_section(dev, results, tag)
    attention = attention_section(dev, results, tag, peaks.tflops, gemm.fields["gemm"], launch.eager_s)
    fresh = fresh_section(results, tag, bw.gbs)
    ops = op_class_section(results, tag, bw, launch.eager_s, fresh.memory)
    optimizer = optimizer_section(results, tag, bw.gbs, launch.eager_s, fresh.memory)
    host = host_section(dev, results, tag)
    cpu_adam = cpu_adam_section(dev, results, tag)
    collectives = collectives_section(results, tag)
    device = device_section(dev, command, name or f"{dev.slug} (calibrated {date})", gpu_id, peaks, bw,
                            extra_sources, host_allocator)
    data, fits, warn = _merged([launch, bw, peaks, gemm, misaligned, grouped, attention, fresh, ops, optimizer, host,
                                cpu_adam, collectives, device, at_bound_warning(ops.fields["bw_eff_ops"])])
    profile = parse_profile(data, origin="calibration")
    dispatch = dispatch_section(results, profile, data["launch_source"])
    if dispatch.fields:
        data.update(dispatch.fields)
        fits.update(dispatch.fits)
        profile = parse_profile(data, origin="calibration")
    return Built(profile, fits, warn)


def _merged(parts: list[Part]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The profile's fields (``fit_warnings`` among them), the fit details and the warnings of
    ``parts``, in their order; ValueError where a fitted value is not finite."""
    data: dict[str, Any] = {}
    fits: dict[str, Any] = {}
    warn: list[str] = []
    for part in parts:
        data.update(part.fields)
        fits.update(part.fits)
        warn += part.warnings
    data["fit_warnings"] = warn
    for key, val in data.items():
        if isinstance(val, float) and not math.isfinite(val):
            raise ValueError(f"non-finite fitted value for {key}")
    return data, fits, warn


def launch_section(results: dict[str, dict], tag: str) -> Launch:
    """Launch overhead (s): eager, the median per-op time of tiny ops (``launch/eager/`` benches,
    100-op loops); compiled, the fastest fused 8-op ``torch.compile`` call (``compiled/launch/``),
    or the eager value where that did not run."""
    warn = []
    launch = [r["time_s"] for _, r in _ok(results, "launch/eager/")]
    if launch:
        launch_s = statistics.median(launch)
        launch_src = f"{tag}: median of {len(launch)} tiny eager ops (100-op loops)"
    else:
        launch_s, launch_src = 5e-6, f"launch: {PLACEHOLDER}"
        warn.append("eager launch overhead not measured; using 5 us")
    comp = _ok(results, "compiled/launch/")
    if comp:
        comp_s = min(r["time_s"] for _, r in comp)
        launch_src += f"; compiled: one fused 8-op torch.compile call, {comp_s * 1e6:.1f} us"
    else:
        why = next((r.get("reason", "") for k, r in results.items() if k.startswith("compiled/launch/")), "")
        comp_s = launch_s
        launch_src += (f"; compiled: torch.compile unavailable ({why[:120]}), set to eager value"
                       if why else f"; compiled: {PLACEHOLDER}, set to eager value")
        warn.append("compiled launch overhead not measured; set equal to eager")
    return Launch(fields={"launch_overhead_us": launch_s * 1e6, "compiled_launch_overhead_us": comp_s * 1e6,
                          "launch_source": launch_src},
                  fits={"launch": {"launch_s": launch_s, "compiled_launch_s": comp_s, "n": len(launch)}},
                  warnings=warn, eager_s=launch_s, compiled_s=comp_s)


def bandwidth_section(results: dict[str, dict], tag: str, cat_bw: float | None, cat_src: str | None,
                      launch: Launch) -> Bandwidth:
    """Device memory bandwidth (GB/s: the catalog's, else the best ``bandwidth/copy/`` bench's read +
    write bytes / time) and ``memory_bw_eff``, the eager ``bandwidth/`` benches (those moving >= 64
    MiB where there are three) fitted to memory_bound_time, overall and per op (the copy's is the
    GEMM operands'); the ``compiled/bandwidth/`` benches' efficiencies go to the fit details only."""
    warn = []
    fits: dict[str, Any] = {}
    bw_recs = _ok(results, "bandwidth/")
    copies = [r for k, r in bw_recs if k.startswith("bandwidth/copy/")]
    if cat_bw:
        bw_gbs, bw_src = cat_bw, cat_src
    elif copies:
        bw_gbs = max(r["bytes"] / r["time_s"] for r in copies) / 1e9
        bw_src = "best measured copy bandwidth (read+write bytes / time)"
    else:
        bw_gbs, bw_src = 10.0, PLACEHOLDER
        warn.append("memory bandwidth not measured; using 10 GB/s")
    big = [(k, r) for k, r in bw_recs if r["bytes"] >= BIG_BYTES]
    if len(big) >= 3:  # fit on traffic well beyond caches when there is enough of it
        bw_recs = big
    if bw_recs:
        f_bw = F.fit_bandwidth([r["bytes"] for _, r in bw_recs], [r["time_s"] for _, r in bw_recs],
                               bw_gbs * 1e9, launch.eager_s, [r.get("kernels", 1) for _, r in bw_recs])
        bw_eff = f_bw.params["bw_eff"]
        fits["memory_bw_eff"] = f_bw.as_dict()
        per_op = {}
        for op in sorted({k.split("/")[1] for k, _ in bw_recs}):
            pts = [r for k, r in bw_recs if k.split("/")[1] == op]
            per_op[op] = F.fit_bandwidth([r["bytes"] for r in pts], [r["time_s"] for r in pts],
                                         bw_gbs * 1e9, launch.eager_s,
                                         [r.get("kernels", 1) for r in pts]).params["bw_eff"]
        fits["memory_bw_eff_per_op"] = per_op
        copy_eff = per_op.get("copy")  # GEMM operands stream as a copy does
        ops = ", ".join(f"{op} {_fmt(e)}" for op, e in per_op.items())
        bw_eff_src = (f"{tag}: {f_bw.n} eager bandwidth-bound ops (>= 64 MiB moved where measured) fitted to memory_bound_time, "
                      f"rms log err {f_bw.rms_log:.2f}; per op: {ops}; bandwidth {bw_gbs:.1f} GB/s = {bw_src}")
    else:
        bw_eff, bw_eff_src = 0.8, f"memory_bw_eff: {PLACEHOLDER}"
        copy_eff = None
        warn.append("bandwidth-bound ops not measured; memory_bw_eff = 0.8")
    comp_bw = {}
    for key, rec in _ok(results, "compiled/bandwidth/"):
        pts = rec.get("points", [])
        if pts:
            comp_bw[key.split("/")[2]] = F.fit_bandwidth(
                [p["bytes"] for p in pts], [p["time_s"] for p in pts], bw_gbs * 1e9,
                launch.compiled_s).params["bw_eff"]
    if comp_bw:  # informational: the profile has one memory_bw_eff (eager)
        fits["compiled_memory_bw_eff_per_op"] = comp_bw
    return Bandwidth(fields={"memory_bw_eff": bw_eff, "memory_bw_eff_source": bw_eff_src}, fits=fits,
                     warnings=warn, gbs=bw_gbs, gbs_source=bw_src, copy_eff=copy_eff)


def peaks_section(dev: DeviceContext, results: dict[str, dict], cat_peaks: dict[str, float],
                  cat_src: str | None) -> Peaks:
    """Dense peak (TFLOPS) per precision: the catalog's, else the best throughput of any ``gemm/``
    (fastest layout) or fused ``attention/`` bench in that precision."""
    warn = []
    peaks: dict[str, float] = dict(cat_peaks)
    peak_src: dict[str, str] = {k: cat_src or "catalog" for k in cat_peaks}
    for prec in dev.precisions:
        if prec in cat_peaks:
            peaks[prec], peak_src[prec] = cat_peaks[prec], cat_src or "catalog"
            continue
        rates = [r["flops"] / min([r["time_s"], *_layouts(r).values()])
                 for _, r in _ok(results, f"gemm/{prec}/")]
        rates += [r["flops"] / r["time_s"] for k, r in _ok(results, "attention/")
                  if k.split("/")[3] == prec and k.split("/")[1] != "math"]
        if rates:
            peaks[prec] = max(rates) / 1e12
            peak_src[prec] = "measured maximum over GEMM and fused-attention kernels"
    if "fp32" not in peaks:
        peaks["fp32"], peak_src["fp32"] = 0.1, PLACEHOLDER
        warn.append("no fp32 GEMM measured; fp32 peak is a placeholder")
    return Peaks(warnings=warn, tflops=peaks, sources=peak_src)


def gemm_sections(dev: DeviceContext, results: dict[str, dict], tag: str, peaks: Peaks, bw: Bandwidth,
                  launch_s: float) -> Part:
    """GEMM efficiency per precision and layout from the ``gemm/`` benches, fitted to gemm_time:
    forward F.linear (x @ W^T, ``gemm``), input gradient (g @ W, torch.mm NN, ``gemm_bwd``) and weight
    gradient (g^T @ x, first operand transposed, ``gemm_wgrad``), each with its own dependence on the
    (k x n) operand's size where the data show one; records not split by layout fit ``gemm`` only.
    The strided-walk probes inform the input-gradient layout only, which takes the strided-walk
    model (:func:`_strided_walk`) where that fits better."""
    warn = []
    fits: dict[str, Any] = {}
    gemm_bw_eff = bw.fields["memory_bw_eff"] if bw.copy_eff is None else bw.copy_eff
    gemm: dict[str, dict] = {}
    gemm_bwd: dict[str, dict] = {}
    gemm_wgrad: dict[str, dict] = {}
    layouts = {"linear_nt": (gemm, "gemm", "forward layout F.linear (x @ W^T)"),
               "mm_nn": (gemm_bwd, "gemm_bwd", "input-gradient layout torch.mm NN (g @ W)"),
               "mm_tn": (gemm_wgrad, "gemm_wgrad", "weight-gradient layout torch.mm TN (g^T @ x)")}
    walk_probes = {f"{m}x{n}x{k}" for shapes_ in WALK_SHAPES.values() for m, n, k in shapes_}
    for prec in dev.precisions:
        all_pts = _ok(results, f"gemm/{prec}/")
        if not all_pts or prec not in peaks.tflops:
            continue
        peak = peaks.tflops[prec]
        split = all(_layouts(r) for _, r in all_pts)
        for lay, (dest, sec, what) in layouts.items():
            if not split and lay != "linear_nt":
                continue
            # the strided-walk probes inform the input-gradient layout only (the others run blocked kernels)
            pts = all_pts if lay == "mm_nn" else [(k, r) for k, r in all_pts if k.rsplit("/", 1)[1] not in walk_probes]
            if not pts:
                continue
            shp = [[r_p(k, d) for k, _ in pts] for d in "mnk"]
            ts = [_layouts(r)[lay] if split else r["time_s"] for _, r in pts]
            m_, n_, k_ = (np.asarray(v, dtype=float) for v in shp)
            # the weight-sized matrix each layout streams: the (k x n) operand, or the (m x n) output of g^T @ x
            streamed = (m_ if lay == "mm_tn" else k_) * n_ * BYTES_PER_EL[prec]
            f_g = F.fit_gemm(*shp, ts, peak * 1e12, BYTES_PER_EL[prec], bw.gbs * 1e9, gemm_bw_eff, launch_s,
                             operand_bytes=streamed if split else None)
            fits[f"{sec}/{prec}"] = f_g.as_dict()
            if "e_max" in f_g.clipped:
                warn.append(_e_max_warning(sec, prec, f_g.params["e_max_cap"], peak, max(
                    2.0 * a * b * c / t_ for a, b, c, t_ in zip(*shp, ts, strict=True))))
            oh = f_g.params.get("operand_half_bytes")
            dims = {d: f_g.params[d] for d in ("m_half", "n_half", "k_half", "k_power") if d in f_g.params}
            dest[prec] = {"e_max": f_g.params["e_max"], "x_half": f_g.params["x_half"], **dims,
                          "operand_half_mib": None if oh is None else oh / 2**20,
                          "operand_floor": f_g.params.get("operand_floor", 0.0),
                          "source": (f"{tag}: {f_g.n} GEMMs ({what if split else 'mean of the three layouts'}) "
                                     f"fitted to gemm_time, rms log err {f_g.rms_log:.2f}"
                                     + (f", per-dimension efficiency m/(m + {dims['m_half']:.3g}) x n/(n + "
                                        f"{dims['n_half']:.3g}) x k^p/(k^p + {dims['k_half']:.3g}^p), p = "
                                        f"{dims['k_power']:.2f}" if dims else "")
                                     + (f", efficiency x {f_g.params['operand_floor']:.3g} + (1 - that) / (1 + "
                                        f"S / {oh / 2**20:.3g} MiB) for a (k x n) operand of S bytes" if oh else "")
                                     + (f"; peak {peak:.4g} TFLOPS = {peaks.sources[prec]}" if lay == "linear_nt"
                                        else ""))}
            caches = [r.get("cache") for _, r in pts]
            if lay == "mm_nn" and split and caches[0] and all(c == caches[0] for c in caches):
                _strided_walk(fits, dest, prec, f_g, tag, shp, ts, peak * 1e12, bw.gbs * 1e9, gemm_bw_eff,
                              launch_s, caches[0])
    if "fp32" not in gemm:
        gemm["fp32"] = {"e_max": 0.5, "x_half": 100.0, "source": f"gemm fp32: {PLACEHOLDER}"}
    return Part({"gemm": gemm, "gemm_bwd": gemm_bwd, "gemm_wgrad": gemm_wgrad}, fits, warn)


def misaligned_section(dev: DeviceContext, results: dict[str, dict], tag: str) -> Part:
    """``gemm_misaligned`` and ``gemm_misaligned_bwd``: per precision, the geometric-mean time ratio
    per FLOP of GEMMs with n + 1 output columns against the aligned n (``gemm_align/`` benches,
    :mod:`calibration.benches.gemm_align`), forward layout and the two backward layouts (timed on a
    GPU; records without a layout are forward)."""
    fits: dict[str, Any] = {}
    out: dict[str, dict[str, float]] = {"gemm_misaligned": {}, "gemm_misaligned_bwd": {}}
    notes: list[str] = []
    for prec in dev.precisions:
        pts = [r for _, r in _ok(results, f"gemm_align/{prec}/")]
        for key, layouts in (("gemm_misaligned", ("fwd",)), ("gemm_misaligned_bwd", ("dgrad", "wgrad"))):
            sel = [r for r in pts if r.get("layout", "fwd") in layouts]
            if sel:
                f_m = F.fit_ratio([r["time_s"] * r["aligned_flops"] / r["flops"] for r in sel],
                                  [r["aligned_s"] for r in sel], hi=MISALIGNED_MAX)
                fits[f"{key}/{prec}"] = f_m.as_dict()
                out[key][prec] = f_m.params["ratio"]
                notes.append(f"{prec} {'/'.join(layouts)} x{f_m.params['ratio']:.3g} ({f_m.n} pairs, rms log "
                             f"{f_m.rms_log:.2f})")
    what = ("torch.mm(x, W^T) with n + 1 output columns against n (a multiple of 64, not a power of two), outputs "
            "of 16-24 MiB" if dev.kind == "cpu" else
            "the forward (x @ W^T), input-gradient (g @ W) and weight-gradient (g^T @ x) GEMMs of a linear layer "
            "of n + 1 outputs against n (LM-head shapes, n = 50304)")
    source = f"{tag}: {what}: " + "; ".join(notes) if notes else None
    return Part({**out, "gemm_misaligned_source": source}, fits)


def attention_section(dev: DeviceContext, results: dict[str, dict], tag: str, peaks: dict[str, float],
                      gemm: dict[str, dict], launch_s: float) -> Part:
    """Attention efficiencies from the ``attention/`` (SDPA) benches, forward and backward fitted
    jointly: flash in the mixed-precision dtype against its peak (on a CPU, fp32 against fp32's),
    mem_efficient in fp32 against the fp32 peak, as :mod:`simulator.physics.compute` applies them;
    the main backend's fit also gives the head-size and sequence halves. A field no bench measured
    copies its sibling backend's, else takes ``gemm``'s efficiency at thickness 21."""
    warn = []
    fits: dict[str, Any] = {}
    aprec = attention_precision(dev.precisions)
    attn: dict[str, float] = {}
    attn_notes: list[str] = []

    halves: tuple[float, float] | None = None

    def _attn(backend: str, prec: str, field_: str, shape: bool = False) -> None:
        nonlocal halves
        peak = peaks.get(prec)
        if peak is None:
            return
        recs = [(k.split("/")[2], r) for k, r in _ok(results, f"attention/{backend}/")
                if k.split("/")[3] == prec]
        if not recs:
            return
        p = [r["params"] if "params" in r else {} for _, r in recs]
        f_a = F.fit_attention_shape([r.get("flops_fwd", r["flops"]) for _, r in recs],
                                    [q.get("head_dim", 64) for q in p], [q.get("seq", 512) for q in p],
                                    [r["time_s"] for _, r in recs], [d == "fwdbwd" for d, _ in recs],
                                    peak * 1e12, launch_s, BWD_FLOPS_FACTOR,
                                    shape=shape, fixed=None if shape else halves)
        if shape:
            halves = (f_a.params["head_dim_half"], f_a.params["seq_half"])
        fits[f"attention/{field_}"] = {**f_a.as_dict(), "backend": backend, "precision": prec}
        attn[f"{field_}_fwd"] = min(1.0, f_a.params["fwd"])
        if any(d == "fwdbwd" for d, _ in recs):
            attn[f"{field_}_bwd"] = min(1.0, f_a.params["bwd"])
        attn_notes.append(f"{field_}: {backend} {prec}, {f_a.n} pts, rms {f_a.rms_log:.2f}"
                          + (" (shape fit)" if shape else ""))

    main_backend, main_prec = ("flash", "fp32") if dev.kind == "cpu" else ("flash", aprec)
    main_field = "mem_efficient" if main_prec == "fp32" else "flash"
    _attn(main_backend, main_prec, main_field, shape=True)
    if main_field != "flash":
        _attn("flash", aprec, "flash")
    if main_field != "mem_efficient":
        _attn("efficient", "fp32", "mem_efficient")
    if "mem_efficient_fwd" not in attn and "mem_efficient_bwd" not in attn:
        _attn("flash", "fp32", "mem_efficient")  # CPU: SDPA runs fp32 on the flash kernel
        if "mem_efficient_fwd" in attn:
            attn_notes.append("efficient backend unsupported here: fp32 fields from SDPA's flash kernel")
    for a, b in (("flash", "mem_efficient"), ("mem_efficient", "flash")):
        for d in ("fwd", "bwd"):
            if f"{a}_{d}" not in attn and f"{b}_{d}" in attn:
                attn[f"{a}_{d}"] = attn[f"{b}_{d}"]
                attn_notes.append(f"{a} {d} unsupported/unmeasured here: copied from {b}")
                warn.append(f"attention {a}_{d} copied from {b}_{d}")
    missing = [f"{a}_{d}" for a in ("flash", "mem_efficient") for d in ("fwd", "bwd")
               if f"{a}_{d}" not in attn]
    if missing:
        g = gemm.get(aprec, gemm["fp32"])
        fallback = max(1e-4, g["e_max"] * 21.0 / (21.0 + g["x_half"]))  # thickness of (s, s, 64)
        for m in missing:
            attn[m] = min(1.0, fallback)
        attn_notes.append(f"{', '.join(missing)}: {PLACEHOLDER} (GEMM efficiency at thickness 21)")
        warn.append(f"attention not measured for {', '.join(missing)}; using GEMM-derived value")
    at_bound = [f for f, v in attn.items() if v >= 0.999]
    if at_bound:
        warn.append(f"attention {', '.join(at_bound)} at the bound 1 (the kernels measured ran at or above the "
                    "reference peak, or the sweep never slowed them): a bound, not a measured efficiency")
    if halves is not None:
        attn["head_dim_half"], attn["seq_half"] = halves
        attn_notes.append(f"efficiency x d/(d+{halves[0]:.3g}) x s/(s+{halves[1]:.3g})")
    attn_src = (f"{tag}: SDPA causal; FLOPs fwd 4*b*heads*s^2*d/2, bwd {BWD_FLOPS_FACTOR}x fwd "
                "(joint fit of fwd and fwd+bwd calls); flash vs the mixed-precision peak, mem_efficient "
                "vs the fp32 peak; " + "; ".join(attn_notes))
    basis = "published" if "flash_fwd" in missing else "measured"  # placeholders are no measurement of the kernel
    return Part({"attention": {**attn, "basis": basis, "source": attn_src}}, fits, warn)


def fresh_section(results: dict[str, dict], tag: str, bw_gbs: float) -> Fresh:
    """``fresh_memory``, the first-touch cost of fresh host pages: the ``fresh/`` benches (allocate,
    write and free tensors of one size, minus writing a kept buffer of the same total) fitted to a
    rate and the bytes the allocator keeps; none where the rate beats the copy bandwidth ``bw_gbs``."""
    warn = []
    fits: dict[str, Any] = {}
    fresh = None
    fr = [r for _, r in _ok(results, "fresh/")]
    if fr:
        mmap = FreshMemory.model_fields["mmap_bytes"].default
        f_fr = F.fit_fresh([r["tensor_bytes"] for r in fr], [r["bytes"] for r in fr],
                           [r["time_s"] for r in fr], [r["reuse_s"] for r in fr], mmap)
        if f_fr is not None and f_fr.params["gbs"] > bw_gbs:
            # faster than writing the pages at the copy bandwidth: no first-touch cost to model (the
            # 'keep' host allocator serves every block from pages already mapped), only noise
            warn.append(f"fresh pages: no first-touch cost measured ({f_fr.params['gbs']:.0f} GB/s fitted, above "
                        f"the {bw_gbs:.0f} GB/s copy bandwidth); no fresh_memory term")
        elif f_fr is not None:
            fits["fresh_memory"] = f_fr.as_dict()
            fresh = {"gbs": f_fr.params["gbs"], "keep_bytes": f_fr.params["keep_bytes"], "mmap_bytes": mmap,
                     "source": (f"{tag}: {f_fr.n} calls allocating, writing and freeing tensors of one size "
                                f"minus writing a kept buffer of the same total, rms rel err {f_fr.rms_log:.2f}")}
    return Fresh({"fresh_memory": fresh}, fits, warn, memory=FreshMemory(**fresh) if fresh else None)


def _fresh_seconds(fresh: FreshMemory | None) -> Callable[[float, float], float]:
    """``fresh_s(size, total)``: seconds to first-touch ``total`` bytes of fresh ``size``-byte
    tensors at the ``fresh`` rate (0 without one)."""
    def fresh_s(size, total) -> float:
        if fresh is None:
            return 0.0
        return float(fresh_time([(size, total)], _FreshOnly(fresh)))
    return fresh_s


def op_class_section(results: dict[str, dict], tag: str, bw: Bandwidth, launch_s: float,
                     fresh: FreshMemory | None) -> Part:
    """``bw_eff_ops``, the bandwidth efficiency of the op classes around the layers, each fitted with
    its fresh output pages as known seconds: elementwise and softmax (``bandwidth/`` benches),
    activations (``activation[_bwd]/``), loss, embedding, casts and the broadcast class (the mask add, the
    rotary multiply and the permuted copy: ``mask_add/``, ``rotary_mul/``, ``permute_copy/``);
    GEMM operands take the copy's."""
    fits: dict[str, Any] = {}
    fresh_s = _fresh_seconds(fresh)
    ops_eff: dict[str, float] = {} if bw.copy_eff is None else {"gemm": bw.copy_eff}
    ops_notes: list[str] = [] if bw.copy_eff is None else [
        f"gemm {_fmt(bw.copy_eff)} (the copy kernel's: GEMM operands and outputs stream as a copy does)"]

    def _ops(cls: str, pts: list[dict], nbytes, known, kernels) -> None:
        if not pts:
            return
        f_c = F.fit_bw_with_known(nbytes, [r["time_s"] for r in pts], known, bw.gbs * 1e9, launch_s, kernels)
        ops_eff[cls] = f_c.params["bw_eff"]
        fits[f"bw_eff_ops/{cls}"] = f_c.as_dict()
        ops_notes.append(f"{cls} {_fmt(ops_eff[cls])} ({f_c.n} pts, rms {f_c.rms_log:.2f}{_raw(f_c, 'bw_eff')})")

    for cls, ops in (("elementwise", ("add", "gelu", "layer_norm", "rms_norm")), ("softmax", ("softmax",))):
        pts = [(k, r) for k, r in _ok(results, "bandwidth/") if k.split("/")[1] in ops]
        out = [r["bytes"] / OPS[k.split("/")[1]][0] for k, r in pts]  # one new output tensor per call
        _ops(cls, [r for _, r in pts], [r["bytes"] for _, r in pts], [fresh_s(o, o) for o in out],
             [r.get("kernels", 1) for _, r in pts])
    for key in ACTIVATION_CLASSES:  # activation.<act>.<dtype>[.bwd]: the activation[_bwd]/<act>/<dtype>/ benches
        _, act, dt, *bwd = key.split(".")
        ac = [r for _, r in _ok(results, f"activation{'_bwd' if bwd else ''}/{act}/{dt}/")]
        out = [r["bytes"] / (3 if bwd else 2) for r in ac]  # one new output tensor per call
        _ops(key, ac, [r["bytes"] for r in ac], [fresh_s(o, o) for o in out], 1)
    lo = [r for _, r in _ok(results, "loss/")]
    if lo:  # known: fresh pages of the log-probabilities and of the logits' gradient (as the simulator adds)
        nl = [r["logits"] for r in lo]
        _ops("loss", lo, [n * (16 + 20) for n in nl],  # simulator.model.workload.loss_bytes, eager fp32
             [fresh_s(4.0 * n, float(sum(logits_fresh_bytes(n, 4))) - 4.0 * n) for n in nl], 7)
    em = [r for _, r in _ok(results, "embedding/")]
    _ops("embedding", em, [r["bytes"] for r in em],
         [fresh_s(r["grad_bytes"], r["grad_bytes"]) + fresh_s(4.0 * r["tokens"] * r["hidden"],
                                                               4.0 * r["tokens"] * r["hidden"]) for r in em], 3)
    ca = [r for _, r in _ok(results, "cast/")]
    _ops("cast", ca, [r["bytes"] for r in ca], [fresh_s(r["out_bytes"], r["out_bytes"]) for r in ca], 1)
    ma = [r for prefix in ("mask_add/", "rotary_mul/", "permute_copy/") for _, r in _ok(results, prefix)]
    _ops("broadcast", ma, [r["bytes"] for r in ma], [fresh_s(r["out_bytes"], r["out_bytes"]) for r in ma], 1)
    return Part({"bw_eff_ops": ops_eff,
                 "bw_eff_ops_source": (f"{tag}: " + "; ".join(ops_notes)) if ops_notes else None}, fits)


def optimizer_section(results: dict[str, dict], tag: str, bw_gbs: float, launch_s: float,
                      fresh: FreshMemory | None) -> Part:
    """``optimizer_bw_eff`` per implementation (fused, foreach, for_loop) and ``optimizer_tensor_us``
    (foreach): the ``optimizer/`` and ``optmix/`` benches fitted to bandwidth plus a host cost per
    parameter tensor over tensor-size mixes (one mix only: one eager launch per tensor), with the
    fresh pages each call faulted in (measured) as known seconds at the ``fresh`` rate."""
    warn = []
    fits: dict[str, Any] = {}
    fresh_s = _fresh_seconds(fresh)
    opt_eff: dict[str, float] = {}
    opt_tensor_us = None
    notes = []
    temps = {"foreach": 1, "for_loop": 2, "fused": 0}  # fresh fp32 temporaries per tensor per step
    for impl in ("fused", "foreach", "for_loop"):
        pts = [(k, r) for k, r in list(_ok(results, f"optimizer/{impl}/")) + list(_ok(results, f"optmix/{impl}/"))]
        if pts:
            sizes = [r.get("tensor_bytes") or _layer_tensor_bytes(k) for k, r in pts]
            known = [_faulted_s(r, temps[impl], sz, fresh, fresh_s) for (_, r), sz in zip(pts, sizes, strict=True)]
            items = [len(sz) for sz in sizes]
            ratio = [n / r["bytes"] for n, (_, r) in zip(items, pts, strict=True)]
            if max(ratio) > 2 * min(ratio):  # tensor-size mixes separate per-tensor and per-byte costs
                f_o = F.fit_optimizer_mix([r["bytes"] for _, r in pts], [r["time_s"] for _, r in pts], known,
                                          items, bw_gbs * 1e9)
            else:  # one mix only: one eager launch per tensor, as before
                f_o = F.fit_bw_with_known([r["bytes"] for _, r in pts], [r["time_s"] for _, r in pts], known,
                                          bw_gbs * 1e9, launch_s, items)
                f_o.params["item_s"] = launch_s
            opt_eff[impl] = f_o.params["bw_eff"]
            fits[f"optimizer/{impl}"] = f_o.as_dict()
            if impl == "foreach":
                opt_tensor_us = f_o.params["item_s"] * 1e6
            notes.append(f"{impl} {f_o.n} pts rms {f_o.rms_log:.2f}{_raw(f_o, 'bw_eff')}, "
                         f"{f_o.params['item_s'] * 1e6:.1f} us/tensor")
        else:
            why = next((r.get("reason", "") for k, r in results.items()
                        if k.startswith(f"optimizer/{impl}/") and r.get("status") == "unsupported"), "")
            if why:
                notes.append(f"{impl} unsupported ({why[:80]})")
    if opt_eff:
        opt_src = (f"{tag}: torch.optim.AdamW fp32 + gradient clipping from cold caches over large and small "
                   "tensor mixes, "
                   f"fitted to a cost per tensor + 28 B/param (read p,g,m,v; write p,m,v; clipping 12 more) "
                   f"at {bw_gbs:.1f} GB/s "
                   "+ the measured page faults of each call at the fresh-memory rate; " + "; ".join(notes))
    else:
        opt_eff = {"foreach": 0.5}
        opt_src = f"optimizer: {PLACEHOLDER}"
        warn.append("optimizer not measured; foreach = 0.5")
    return Part({"optimizer_bw_eff": opt_eff, "optimizer_source": opt_src, "optimizer_tensor_us": opt_tensor_us},
                fits, warn)


def host_section(dev: DeviceContext, results: dict[str, dict], tag: str) -> Part:
    """Host -> device copy bandwidth (GB/s), alpha-beta fits: a GPU's pinned ``host/h2d_pinned/``
    copies (and the pageable ones'), a CPU's host memcpy proxy (``host/h2d_memcpy_proxy/``)."""
    def _host(kind: str) -> F.Fit | None:
        pts = [r for _, r in _ok(results, f"host/{kind}/")]
        if not pts:
            return None
        return F.fit_alpha_beta([r["bytes"] for r in pts], [r["time_s"] for r in pts])

    warn = []
    fits: dict[str, Any] = {}
    pageable = None
    if dev.kind == "cpu":
        f_h = _host("h2d_memcpy_proxy")
        host_note = "CPU device: host memcpy proxy (one-way bytes / time), alpha-beta fit"
    else:
        f_h = _host("h2d_pinned")
        f_p = _host("h2d_pageable")
        pageable = f_p.params["bw"] / 1e9 if f_p else None
        host_note = "pinned h2d copy_, alpha-beta fit" + (
            f"; pageable {pageable:.1f} GB/s" if pageable else "")
    if f_h:
        h2d = f_h.params["bw"] / 1e9
        fits["host"] = f_h.as_dict()
        host_src = f"{tag}: {host_note}, {f_h.n} sizes, rms {f_h.rms_log:.2f}, alpha {f_h.params['alpha_s'] * 1e6:.1f} us"
    else:
        h2d, host_src = 10.0, f"host: {PLACEHOLDER}"
        warn.append("host copies not measured; 10 GB/s")
    return Part({"host_to_device_gbs": h2d, "host_to_device_pageable_gbs": pageable, "host_source": host_src},
                fits, warn)


def cpu_adam_section(dev: DeviceContext, results: dict[str, dict], tag: str) -> Part:
    """``cpu_adam_gparams_per_s`` (offload): the best torch.optim.AdamW on the CPU, params / step
    time, from the ``optimizer/`` benches on a CPU device, else the ``cpu_adam/`` ones."""
    warn = []
    cpu_prefix = "optimizer/" if dev.kind == "cpu" else "cpu_adam/"
    rates = [(r["params"] / r["time_s"], k) for k, r in _ok(results, cpu_prefix)]
    if rates:
        best = max(rates)
        cpu_adam = best[0] / 1e9
        cpu_adam_src = f"{tag}: best torch.optim.AdamW on CPU ({best[1]}), params / step time"
    else:
        cpu_adam, cpu_adam_src = 0.1, f"cpu adam: {PLACEHOLDER}"
        warn.append("CPU Adam not measured; 0.1 Gparams/s")
    return Part({"cpu_adam_gparams_per_s": cpu_adam, "cpu_adam_source": cpu_adam_src}, warnings=warn)


def collectives_section(results: dict[str, dict], tag: str) -> Part:
    """``collectives.local``: latency and bus bandwidth of the ``collectives/`` sweeps, a joint
    alpha-beta fit over bus bytes (:func:`fit_collectives`)."""
    fits: dict[str, Any] = {}
    collectives = {}
    for key, rec in _ok(results, "collectives/"):
        f_c = fit_collectives(rec)
        if f_c is not None:
            fits[key] = f_c.as_dict()
            collectives["local"] = {
                "alpha_us": f_c.params["alpha_s"] * 1e6, "busbw_gbs": f_c.params["bw"] / 1e9,
                "source": (f"{tag}: torch.distributed {rec.get('backend')} x{rec.get('world_size')} "
                           f"{', '.join(rec.get('ops_ok', []))}, bus bytes (ring), rms {f_c.rms_log:.2f}")}
    return Part({"collectives": collectives}, fits)


def device_section(dev: DeviceContext, command: str, name: str, gpu_id: str | None, peaks: Peaks,
                   bw: Bandwidth, extra_sources: list[str] | None, host_allocator: str | None) -> Part:
    """The profile's name, ``device`` (``peaks`` and ``bw``'s bandwidth on ``dev``'s memory) and
    ``provenance``: where the peaks and bandwidth come from, ``extra_sources``, the command and
    the versions of the software measured."""
    sources = [f"peak {p}: {_fmt(v)} TFLOPS ({peaks.sources[p]})" for p, v in peaks.tflops.items()]
    sources.append(f"mem_bw: {bw.gbs:.1f} GB/s ({bw.gbs_source})")
    sources.append(f"threads: {dev.threads}")
    sources += extra_sources or []
    total_mem = dev.memory_gib
    return Part({
        "schema_version": SCHEMA_VERSION, "name": name,
        "device": {"kind": dev.kind, "name": dev.name, "gpu_id": gpu_id, "peak_tflops": peaks.tflops,
                   "mem_bw_gbs": bw.gbs, "memory_gib": total_mem,
                   "usable_memory_gib": min(dev.usable_memory_gib, total_mem),
                   "host_memory_gib": dev.host_memory_gib},
        "provenance": {"method": "calibration", "sources": sources, **provenance_fields(dev, command),
                       "host_allocator": host_allocator}})


def at_bound_warning(ops_eff: dict[str, float]) -> Part:
    """The warning, last, for the op classes of ``bw_eff_ops`` fitted at the efficiency bound 1."""
    at_one = [c for c, v in ops_eff.items() if v >= 0.999]
    if not at_one:
        return Part()
    return Part(warnings=[
        f"bandwidth efficiency at the bound 1 for {', '.join(at_one)}: these ops moved their counted bytes at or "
        "above the datasheet bandwidth (fewer bytes than counted, or caches); a bound, not a measured efficiency"])


def dispatch_section(results: dict[str, dict], profile: Profile, launch_source: str) -> Part:
    """``train_fwd_kernel_us`` and ``train_bwd_kernel_us``: the host time per counted kernel of eager
    training passes beyond the launch overhead, from the ``dispatch/`` benches' tiny decoders
    predicted with ``profile`` (:func:`dispatch_overhead`); the ``_amp`` pair likewise under the
    autocast type of their ``/<precision>`` benches; ``launch_source`` with both added."""
    over = dispatch_overhead(results, profile)
    if over is None:
        return Part()
    fits: dict[str, Any] = {"dispatch": over}
    fields: dict[str, Any] = {
        "train_fwd_kernel_us": over["fwd_us"], "train_bwd_kernel_us": over["bwd_us"],
        "launch_source": launch_source + (
            f"; eager training passes add {over['fwd_us']:.1f} us (forward) and {over['bwd_us']:.1f} us "
            f"(backward) per counted kernel (median over {over['n']} tiny decoders, GPT-2/NeoX/Llama "
            "blocks: measured minus predicted time over the kernels the simulator counts)")}
    amp = next((r["precision"] for _, r in _ok(results, "dispatch/") if r.get("precision", "fp32") != "fp32"),
               None)  # the autocast type of the dispatch benches, if any
    over_amp = dispatch_overhead(results, profile, amp) if amp else None
    if over_amp is not None:
        fits[f"dispatch/{amp}"] = over_amp
        fields.update(train_fwd_kernel_us_amp=over_amp["fwd_us"], train_bwd_kernel_us_amp=over_amp["bwd_us"],
                      launch_source=fields["launch_source"] + (
                          f"; under {amp} autocast {over_amp['fwd_us']:.1f} us and {over_amp['bwd_us']:.1f} us "
                          f"(median over {over_amp['n']} tiny decoders)"))
    return Part(fields, fits)


def _e_max_warning(sec: str, prec: str, cap: float, peak_tflops: float, best_flops: float) -> str:
    """The warning for a GEMM asymptote ``e_max`` fitted at its bound ``cap``
    (:func:`calibration.fit.e_max_cap`); ``best_flops``: the best measured point, FLOP/s."""
    where = ("the device peak" if cap >= 1.0 else
             f"{1 + F.E_MAX_MARGIN:.2f} x the best point measured ({best_flops / 1e12:.4g} TFLOP/s)")
    return (f"{sec} {prec}: e_max at its bound {cap:.3f} of {peak_tflops:.4g} TFLOPS = {where}: the grid did not "
            "reach saturation, so larger GEMMs are predicted no faster than that (calibrate with larger shapes, "
            "e.g. --for-model)")


def dispatch_overhead(results: dict[str, dict], profile: Profile, precision: str = "fp32") -> dict | None:
    """Host time per counted kernel of eager training passes beyond the launch overhead (us), forward
    and backward: for each tiny decoder of the ``dispatch/`` benches in ``precision`` (fp32, or the
    autocast type of the ``/<precision>`` benches), (measured - predicted time) / the kernels
    :mod:`simulator.physics.compute` counts for it; the median over the decoders, floored at 0."""
    import numpy as np

    from simulator.hardware.device import device_from_profile
    from simulator.physics.compute import micro_batch_time

    from .benches.dispatch import TOKENS, tiny_spec

    base = profile.model_copy(update={"train_fwd_kernel_us": None, "train_bwd_kernel_us": None,
                                      "train_fwd_kernel_us_amp": None, "train_bwd_kernel_us_amp": None})
    devs = [device_from_profile(base.model_copy(update={"launch_overhead_us": us})) for us in (0.0, 1.0)]
    dev = device_from_profile(base)
    fwd, bwd = [], []
    for key, r in _ok(results, "dispatch/"):
        if r.get("precision", "fp32") != precision:
            continue
        fam, att = key.split("/")[1].split("-", 1)
        spec = tiny_spec(fam, int(r["layers"]))

        def mbt(d, spec=spec, att=att):
            return micro_batch_time(spec, TOKENS, np.array([1.0]), precision, att, False, "none", d)

        pred, (t0, t1) = mbt(dev), (mbt(d) for d in devs)
        kf, kb = float(t1.fwd[0] - t0.fwd[0]) * 1e6, float(t1.bwd[0] - t0.bwd[0]) * 1e6  # counted kernels
        fwd.append((r["fwd_s"] - float(pred.fwd[0])) / kf)
        bwd.append((r["bwd_s"] - float(pred.bwd[0])) / kb)
    if not fwd:
        return None
    return {"fwd_us": max(0.0, statistics.median(fwd) * 1e6), "bwd_us": max(0.0, statistics.median(bwd) * 1e6),
            "n": len(fwd), "fwd_each_us": [x * 1e6 for x in fwd], "bwd_each_us": [x * 1e6 for x in bwd]}


SPREAD_REPLICATES = 8


def _layouts(rec: dict) -> dict[str, float]:
    """Seconds per call of a GEMM record in each layout (median; ``layouts_min_s``, the fastest
    call, in measurements taken before medians were recorded), or {} if not split by layout."""
    return rec.get("layouts_s") or rec.get("layouts_min_s") or {}


@dataclass
class _FreshOnly:
    """Stands in for a profile in :func:`simulator.physics.fresh_memory.fresh_time` during fitting."""

    fresh_memory: FreshMemory


def _resample(results: dict[str, dict], rng) -> dict[str, dict]:
    """``results`` with each ok record's time replaced by the median of a bootstrap resample of
    its timed samples (GEMMs: per layout), after its rounds are drawn again where it has some
    (:func:`calibration.store.merge_rounds`), so refitting shows how measurement noise moves the fit.
    Records of an older format, whose times are the fastest sample, resample the fastest."""
    out = {}
    for key, rec in results.items():
        if rec.get("status") != "ok":
            out[key] = rec
            continue
        if rec.get("rounds"):  # the median of rounds drawn again (each round a draw of the host's speed)
            rec = merge_rounds([rec["rounds"][i] for i in rng.integers(len(rec["rounds"]), size=len(rec["rounds"]))])
        new = dict(rec)
        lt = rec.get("layouts_times")
        stat = np.median if rec.get("stat") == "median" else np.min
        if lt and all(lt.values()):
            per = {n: float(stat(rng.choice(ts, len(ts)))) for n, ts in lt.items()}
            new["layouts_s" if "layouts_s" in rec else "layouts_min_s"] = per
            new["time_s"] = sum(per.values()) / len(per)
        else:
            ts = (rec.get("timing") or {}).get("times") or []
            if len(ts) >= 2 and min(ts) > 0:
                new["time_s"] = rec["time_s"] * float(stat(rng.choice(ts, len(ts)))) / float(stat(ts))
        out[key] = new
    return out


def _flat(profile: Profile) -> dict[str, float]:
    """The fitted scalars of a profile, by dotted name."""
    d = profile.model_dump()
    out: dict[str, float] = {}
    for sec in ("gemm", "gemm_bwd", "gemm_wgrad"):
        for prec, g in d[sec].items():
            out.update({f"{sec}.{prec}.e_max": g["e_max"], f"{sec}.{prec}.x_half": g["x_half"]})
            out.update({f"{sec}.{prec}.{p}": g[p] for p in ("m_half", "n_half", "k_half") if g.get(p)})
            if g.get("k_half"):
                out[f"{sec}.{prec}.k_power"] = g["k_power"]
            if g.get("operand_half_mib"):
                out[f"{sec}.{prec}.operand_half_mib"] = g["operand_half_mib"]
                out[f"{sec}.{prec}.operand_floor"] = g["operand_floor"]
            if g.get("strided"):
                out.update({f"{sec}.{prec}.strided.{p}": g["strided"][p]
                            for p in ("conflict_lines", "conflict_floor", "column_half", "column_floor")})
    out.update({f"attention.{k}": v for k, v in d["attention"].items() if isinstance(v, float)})
    out.update({f"bw_eff_ops.{k}": v for k, v in d["bw_eff_ops"].items()})
    out.update({f"optimizer_bw_eff.{k}": v for k, v in d["optimizer_bw_eff"].items()})
    out.update({f"gemm_misaligned.{k}": v for k, v in d["gemm_misaligned"].items()})
    out.update({f"gemm_misaligned_bwd.{k}": v for k, v in d["gemm_misaligned_bwd"].items()})
    out.update({f"grouped_gemm_m_half.{k}": v for k, v in d["grouped_gemm_m_half"].items()})
    if d["fresh_memory"]:
        out.update({"fresh_memory.gbs": d["fresh_memory"]["gbs"],
                    "fresh_memory.keep_bytes": d["fresh_memory"]["keep_bytes"]})
    for k in ("memory_bw_eff", "launch_overhead_us", "optimizer_tensor_us", "train_fwd_kernel_us",
              "train_bwd_kernel_us", "train_fwd_kernel_us_amp", "train_bwd_kernel_us_amp"):
        if d[k] is not None:
            out[k] = d[k]
    return out


def fit_spread(dev: DeviceContext, results: dict[str, dict], command: str, base: Profile,
               replicates: int = SPREAD_REPLICATES, seed: int = 0) -> dict[str, float]:
    """Relative interquartile range (IQR / median) of every fitted scalar over ``replicates``
    refits on bootstrap-resampled timings (and rounds, where benches were timed in several). It
    measures the noise within this run; a host whose state changes for longer than a run (other
    load, frequency, a memory-bandwidth state) moves the next run's fit on top of it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vals: dict[str, list[float]] = {k: [] for k in _flat(base)}
    for _ in range(replicates):
        try:
            prof = build_profile(dev, _resample(results, rng), command).profile
        except (ValueError, UsageError):
            continue
        for k, v in _flat(prof).items():
            if k in vals:
                vals[k].append(v)
    out = {}
    for k, v in vals.items():
        if len(v) >= 4 and statistics.median(v) != 0:
            q = statistics.quantiles(v, n=4)
            out[k] = round(abs(q[2] - q[0]) / abs(statistics.median(v)), 4)
    return out


def _faulted_s(rec: dict, temps: int, sizes: list[float], fresh_prof: FreshMemory | None, fresh_s) -> float:
    """Seconds of fresh pages in one optimizer bench call: its measured ``fault_bytes`` at the
    fresh-memory rate; records without the count (older measurement files) assume ``temps``
    fresh temporaries per tensor as :func:`simulator.physics.fresh_memory.fresh_bytes` would."""
    if fresh_prof is None:
        return 0.0
    if rec.get("fault_bytes") is not None:
        return float(rec["fault_bytes"]) / (fresh_prof.gbs * 1e9)
    return temps * sum(fresh_s(b, b) for b in sizes)


def _strided_walk(fits: dict, dest: dict, prec: str, plain: F.Fit, tag: str, shp, ts, peak_flops: float,
                  bw: float, bw_eff: float, launch_s: float, cache: dict[str, int]) -> None:
    """Replace ``dest[prec]`` (the input-gradient layout) by the strided-walk model
    (:func:`simulator.physics.kernels.strided_walk_factor`) where its rms log error is a fifth, and at least
    0.02, below ``plain``'s."""
    f_w = F.fit_gemm_strided(*shp, ts, peak_flops, BYTES_PER_EL[prec], bw, bw_eff, launch_s, cache)
    fits[f"gemm_bwd_strided/{prec}"] = {**f_w.as_dict(), "cache": cache}
    if not f_w.rms_log < min(0.8 * plain.rms_log, plain.rms_log - 0.02):
        return
    p = f_w.params
    geo = (f"L1 {cache['l1_sets']} sets x {cache['l1_ways']} ways, L2 {cache['l2_sets']} x {cache['l2_ways']}, "
           f"{cache['line_bytes']} B lines (sysfs {SYSFS_CACHE})")
    walk = {**cache, "conflict_lines": p["conflict_lines"], "conflict_floor": p["conflict_floor"],
            "sharpness": F.WALK_SHARPNESS, "column_half": p["column_half"], "column_floor": p["column_floor"],
            "source": f"{tag}: fitted to {f_w.n} input-gradient GEMMs with {geo}; sharpness "
                      f"{F.WALK_SHARPNESS:g} = assumption (calibration.fit.WALK_SHARPNESS)"}
    dest[prec] = {"e_max": p["e_max"], "x_half": p["x_half"], "strided": walk,
                  "source": (f"{tag}: {f_w.n} GEMMs (input-gradient layout torch.mm NN (g @ W), a reference kernel "
                             f"walking a column of W per dot product) fitted to gemm_time x strided_walk_factor, "
                             f"rms log err {f_w.rms_log:.2f} (operand-size model: {plain.rms_log:.2f}); column "
                             f"stride reaching L1 capacity C1 < {p['conflict_lines']:.0f} lines: x "
                             f"{p['conflict_floor']:.2f}; column of u x the L2 lines kept at the stride: x "
                             f"{p['column_floor']:.2f} + (1 - that) / (1 + u / {p['column_half']:.2f})")}


def _layer_tensor_bytes(key: str) -> list[float]:
    """fp32 bytes of each tensor of an 'optimizer/<impl>/h<h>x<layers>' bench."""
    h, layers = (int(v) for v in key.rsplit("/", 1)[1][1:].split("x"))
    return [4.0 * math.prod(shape) for shape in layer_shapes(h)] * layers


def r_p(key: str, dim: str) -> int:
    """Parse m, n or k from a GEMM key 'gemm/<prec>/<m>x<n>x<k>'."""
    m, n, k = (int(v) for v in key.rsplit("/", 1)[1].split("x"))
    return {"m": m, "n": n, "k": k}[dim]


def fit_collectives(rec: dict, ops: Iterable[str] | None = None) -> F.Fit | None:
    """Joint alpha-beta fit over the collective sweep in ``rec`` (bus bytes vs time)."""
    pts = [p for p in rec.get("points", []) if (ops is None or p["op"] in ops) and p["time_s"] > 0]
    if not pts:
        return None
    n = int(rec["world_size"])
    return F.fit_alpha_beta([bus_bytes(p["op"], p["bytes"], n) for p in pts],
                            [p["time_s"] for p in pts])
