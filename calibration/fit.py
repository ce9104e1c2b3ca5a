"""Fitting measured times to the kernel-time model of :mod:`simulator.physics.kernels`.

Every fit minimises squared residuals of log(model time) - log(measured time), so small
and large kernels weigh alike and the fitted parameters make the *same* functions the
simulator calls reproduce the measurements. Inputs are seconds, FLOPs, bytes, FLOP/s and
bytes/s; outputs are dimensionless efficiencies, seconds and bytes/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from simulator.hardware.profile import K_POWER_MAX
from simulator.physics import kernels


@dataclass
class Fit:
    """Fitted parameters with the quality of the fit.

    ``rms_log`` is the root-mean-square of log(model/measured) over the ``n`` points
    (0.1 means the model is typically within ~10% of a measurement). ``clipped`` names
    parameters that hit a bound (e.g. an efficiency capped at 1).
    """

    params: dict[str, float]
    n: int
    rms_log: float
    clipped: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"params": self.params, "n": self.n, "rms_log": self.rms_log, "clipped": self.clipped}


MAX_RAW = 100.0  # single efficiencies are fitted unbounded above, then capped at 1


def _clipped_fit(name: str, raw: float, n: int, resid) -> Fit:
    """An efficiency capped at 1 (profile bound); the uncapped value is kept as 'raw_<name>'.

    A raw value above 1 means the kernel beat the reference peak or bandwidth (e.g. an
    optimizer that rewrites the lines it read, against a copy that also pays for
    write-allocate reads); the 1-D least-squares optimum under the cap is the capped value.
    """
    eff = min(raw, 1.0)
    params = {name: eff}
    if raw > 1.0:
        params[f"raw_{name}"] = raw
    return Fit(params, n, _rms(resid([math.log(eff)])), [name] if raw > 0.999 else [])


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _rms(resid: np.ndarray) -> float:
    return float(np.sqrt(np.mean(resid**2))) if resid.size else float("nan")


#: log error beyond which a robust fit's loss grows linearly (15%: above the repeat-to-repeat noise of a
#: microbenchmark's minimum on a quiet machine, below what a noisy neighbour does to one)
ROBUST_SCALE = 0.15


def _soft_l1(resid: np.ndarray) -> float:
    """Mean soft-L1 loss of log errors at :data:`ROBUST_SCALE` (what a robust :func:`_solve` minimizes)."""
    z = (np.asarray(resid) / ROBUST_SCALE) ** 2
    return float(np.mean(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _solve(resid_fn, x0: list[float], lo: list[float], hi: list[float], robust: bool = False) -> np.ndarray:
    """Bounded least squares; ``robust``: soft-L1 loss beyond :data:`ROBUST_SCALE` (log error), so
    a point slowed by the machine (one noisy minimum) pulls the fit less than a squared error would."""
    x0 = np.clip(np.asarray(x0, dtype=float), np.asarray(lo) + 1e-9, np.asarray(hi) - 1e-9)
    kw = {"loss": "soft_l1", "f_scale": ROBUST_SCALE} if robust else {}
    res = least_squares(resid_fn, x0, bounds=(lo, hi), method="trf", x_scale="jac", **kw)
    return res.x


#: how far above the best efficiency a GEMM grid measured its fitted asymptote ``e_max`` may go (5%:
#: a grid whose largest shapes reach saturation measures within a few percent of it). A grid that
#: stopped short of saturation (an H200's quick grid: 0.66 of peak at 2048^3, where layer-sized GEMMs
#: reach 0.74-0.77) would otherwise let the fit extrapolate e_max to the peak itself.
E_MAX_MARGIN = 0.05


def e_max_cap(flops, times, peak_flops: float) -> float:
    """Upper bound of a fitted GEMM ``e_max``: (1 + :data:`E_MAX_MARGIN`) x the best measured
    efficiency, flops / (peak x time) with nothing subtracted (a lower bound of the kernel's own),
    and at most 1."""
    best = float(np.max(_arr(flops) / (peak_flops * _arr(times))))
    return min(1.0, (1.0 + E_MAX_MARGIN) * best)


def fit_gemm(m, n, k, times, peak_flops: float, bytes_per_el: float, bw: float, bw_eff: float,
             launch_s: float, operand_bytes=None) -> Fit:
    """Fit ``e_max`` in (0, :func:`e_max_cap`] and ``x_half`` >= 0 of :func:`simulator.physics.kernels.gemm_time`.

    peak_flops, bw, bw_eff and launch_s are held fixed (device peak, fitted bandwidth and
    launch overhead). With a single point, x_half is fixed at 0 and e_max alone is fitted.
    With at least :data:`DIMS_MIN_POINTS` points, the per-dimension terms (``m_half``,
    ``n_half``, ``k_half``, ``k_power``; :func:`simulator.physics.kernels.gemm_efficiency`) are fitted in
    place of the thickness term (robustly, :func:`_solve`) and kept if they lower the soft-L1 loss
    by a fifth and predict the points left out of a :data:`CV_FOLDS`-fold cross-validation
    better too (:func:`_cv_soft_l1`: five free terms can follow one round's noise where two cannot;
    the operand terms face the same test, given at least twice :data:`CV_FOLDS` points).
    ``operand_bytes`` (per point, the weight-sized matrix the kernel streams): then,
    on top of that shape model, ``operand_half_bytes`` and ``operand_floor``
    (:func:`simulator.physics.kernels.operand_factor`: the size at which efficiency falls halfway to the
    floor) when the points span sizes by at least 16x (:func:`_fit_operand`): a slowdown the
    shape model already explains (thin GEMMs over large weights) is not taken for a cache effect.
    """
    m, n, k, t = (_arr(a) for a in (m, n, k, times))
    logt = np.log(t)
    ob = k * n * bytes_per_el if operand_bytes is None else _arr(operand_bytes)

    def model(log_e: float, log_xh: float, log_oh: float | None = None, floor: float = 0.0,
              dims: tuple[float, float, float, float] | None = None, idx=_ALL) -> np.ndarray:
        halves, power = ((0.0, 0.0, 0.0), 1.0) if dims is None else (tuple(math.exp(v) for v in dims[:3]), dims[3])
        return kernels.gemm_time(m[idx], n[idx], k[idx], peak_flops, math.exp(log_e), math.exp(log_xh),
                                 bytes_per_el, bw, bw_eff, launch_s,
                                 None if log_oh is None else math.exp(log_oh), floor, ob[idx], halves=halves,
                                 k_power=power)

    eff_meas = 2 * m * n * k / (peak_flops * np.maximum(t - launch_s, 1e-12))
    cap = e_max_cap(2 * m * n * k, t, peak_flops)
    hi_e = math.log(cap)
    e0 = float(min(cap, max(1e-4, eff_meas.max() * 1.05)))
    lo_xh, hi_xh = math.log(1e-3), math.log(1e7)
    extra: dict[str, float] = {}

    def thick(idx=_ALL) -> np.ndarray:
        xh0 = float(np.median(kernels.gemm_thickness(m[idx], n[idx], k[idx])))
        return _solve(lambda p: np.log(model(p[0], p[1], idx=idx)) - logt[idx], [math.log(e0), math.log(xh0)],
                      [math.log(1e-6), lo_xh], [hi_e, hi_xh])

    def per_dim(idx=_ALL) -> np.ndarray:
        return _fit_dims(lambda p: np.log(model(p[0], lo_xh, dims=tuple(p[1:]), idx=idx)) - logt[idx],
                         math.log(e0), [float(np.median(v[idx])) for v in (m, n, k)], hi_e)

    if t.size == 1:
        x = _solve(lambda p: np.log(model(p[0], lo_xh)) - logt, [math.log(e0)],
                   [math.log(1e-6)], [hi_e])
        x = np.array([x[0], lo_xh])
    else:
        x = thick()

    def held_out_thick(train, test) -> np.ndarray:
        return np.log(model(*thick(train), idx=test)) - logt[test]

    def held_out_dims(train, test) -> np.ndarray:
        q = per_dim(train)
        return np.log(model(q[0], lo_xh, dims=tuple(q[1:]), idx=test)) - logt[test]

    flops = m * n * k
    cv: dict = {}  # each shape model's cross-validated loss, computed once

    def cv_loss(held_out) -> float:
        if held_out not in cv:
            cv[held_out] = _cv_soft_l1(held_out, flops)
        return cv[held_out]

    dims = None
    held_out = held_out_thick
    if t.size >= DIMS_MIN_POINTS:
        d = per_dim()
        if (_soft_l1(np.log(model(d[0], lo_xh, dims=tuple(d[1:]))) - logt)
                < 0.8 * _soft_l1(np.log(model(x[0], x[1])) - logt)
                and cv_loss(held_out_dims) < cv_loss(held_out_thick)):
            x, dims, held_out = np.array([d[0], lo_xh]), tuple(float(v) for v in d[1:]), held_out_dims
    if operand_bytes is not None and t.size >= 4 and ob.max() >= 16 * ob.min():
        x, extra = _fit_operand(model, logt, ob, x, dims, lo_xh, hi_xh,
                                cv_loss(held_out) if t.size >= CV_FOLDS * 2 else None, flops, hi_e)
    log_oh = math.log(extra["operand_half_bytes"]) if extra else None
    floor = extra.get("operand_floor", 0.0)
    e_max, x_half = math.exp(x[0]), math.exp(x[1])
    clipped = ["e_max"] if e_max > 0.999 * cap else []
    if x_half <= 1.001e-3:
        x_half = 0.0
    resid = np.log(model(math.log(e_max), math.log(max(x_half, 1e-3)), log_oh, floor, dims)) - logt
    if dims is not None:
        extra = {**extra, **{nm: (0.0 if v <= _LO_HALF + 1e-6 else math.exp(v))
                             for nm, v in zip(("m_half", "n_half", "k_half"), dims[:3], strict=True)},
                 "k_power": dims[3]}
        clipped += ["k_power"] if dims[3] >= K_POWER_MAX - 1e-6 else []
    return Fit({"e_max": min(e_max, cap), "x_half": x_half, **extra, "e_max_cap": cap}, int(t.size), _rms(resid),
               clipped)


def _fit_operand(model, logt: np.ndarray, ob: np.ndarray, x: np.ndarray, dims, lo_xh: float,
                 hi_xh: float, base_cv: float | None = None, flops: np.ndarray | None = None,
                 hi_e: float = 0.0) -> tuple[np.ndarray, dict[str, float]]:
    """Try the streamed-operand terms (``operand_half_bytes``, ``operand_floor``) on top of the
    fitted shape model (``x``: log e_max, log x_half; ``dims`` held fixed), robustly. They are
    kept only if they lower the soft-L1 loss by a fifth, the halfway size lies inside the measured
    sizes with at least two points at or above it (a slowdown seen on one point is noise, not a
    cache leaving), the floor is below 0.9, and, given the shape model's cross-validated loss
    ``base_cv`` (:func:`_cv_soft_l1` over ``flops``), they lower that too; otherwise ``x`` is
    returned unchanged, with no terms."""
    thick = dims is None
    base = _soft_l1(np.log(model(x[0], x[1], dims=dims)) - logt)

    def resid(p: np.ndarray, idx=_ALL) -> np.ndarray:
        return np.log(model(p[0], p[1] if thick else lo_xh, p[-2], p[-1], dims, idx=idx)) - logt[idx]

    def solve(idx=_ALL) -> np.ndarray:
        x0 = [min(hi_e, x[0] + 0.5)] + ([x[1]] if thick else []) + [math.log(float(np.median(ob[idx]))), 0.3]
        lo = [math.log(1e-6)] + ([lo_xh] if thick else []) + [math.log(ob[idx].min() / 16), 0.0]
        hi = [hi_e] + ([hi_xh] if thick else []) + [math.log(ob[idx].max() * 16), 1.0]
        return _solve(lambda p: resid(p, idx), x0, lo, hi, robust=True)

    p = solve()
    half, floor = math.exp(p[-2]), float(p[-1])
    if (_soft_l1(resid(p)) < 0.8 * base and ob.min() <= half <= ob.max() and int((ob >= half).sum()) >= 2
            and floor < 0.9 and (base_cv is None or _cv_soft_l1(lambda tr, te: resid(solve(tr), te), flops) < base_cv)):
        return np.array([p[0], p[1] if thick else lo_xh]), {"operand_half_bytes": half, "operand_floor": floor}
    return x, {}


#: fewest GEMM points for fitting the four per-dimension terms
DIMS_MIN_POINTS = 8
#: folds of the cross-validation a richer GEMM model must win as well as the in-sample loss
CV_FOLDS = 5
_ALL = slice(None)


def _cv_soft_l1(fit_resid, flops: np.ndarray) -> float:
    """Mean soft-L1 loss of the log errors on held-out points: the points, in order of ``flops``,
    dealt round-robin into :data:`CV_FOLDS` folds (each fold spans the sizes); ``fit_resid(train,
    test)`` fits on the ``train`` indices and returns the log errors at ``test``."""
    order = np.argsort(flops, kind="stable")
    folds = [order[i::CV_FOLDS] for i in range(CV_FOLDS)]
    return _soft_l1(np.concatenate([fit_resid(np.setdiff1d(order, f), f) for f in folds]))


_LO_HALF = math.log(1e-3)


def _fit_dims(resid_fn, log_e0: float, medians: list[float], hi_e: float = 0.0) -> np.ndarray:
    """[log e_max, log m_half, log n_half, log k_half, k_power] minimizing ``resid_fn``: log e_max up to
    ``hi_e``, halves in (1e-3, 1e5) elements (the lower bound meaning none), k_power in [1, :data:`K_POWER_MAX`]."""
    x0 = [min(hi_e, log_e0 + 0.5)] + [math.log(v / 8) for v in medians] + [2.0]
    return _solve(resid_fn, x0, [math.log(1e-6)] + [_LO_HALF] * 3 + [1.0], [hi_e] + [math.log(1e5)] * 3 + [K_POWER_MAX],
                  robust=True)


#: steepness of the L1-conflict transition of a strided walk (assumption: the measured speeds step
#: between L1 capacities of 64 and 128 lines on an AMD EPYC, too sharply for the points to resolve it)
WALK_SHARPNESS = 8.0


def fit_gemm_strided(m, n, k, times, peak_flops: float, bytes_per_el: float, bw: float, bw_eff: float,
                     launch_s: float, cache: dict[str, int]) -> Fit:
    """Fit ``e_max``, ``x_half`` and the strided-walk terms (``conflict_lines``, ``conflict_floor``,
    ``column_half``, ``column_floor``; :func:`simulator.physics.kernels.strided_walk_factor`) of a GEMM
    kernel whose dot products walk a column of the (k x n) operand, n elements apart, with the
    cache geometry ``cache`` (line bytes, L1 and L2 sets and ways) held fixed."""
    from simulator.hardware.profile import StridedWalk

    m, n, k, t = (_arr(a) for a in (m, n, k, times))
    logt = np.log(t)

    def walk(p) -> StridedWalk:
        return StridedWalk(**cache, conflict_lines=math.exp(p[2]), conflict_floor=p[3], sharpness=WALK_SHARPNESS,
                           column_half=math.exp(p[4]), column_floor=p[5], source="fit")

    def model(p) -> np.ndarray:
        f = kernels.strided_walk_factor(n, k, bytes_per_el, walk(p))
        return kernels.gemm_time(m, n, k, peak_flops, math.exp(p[0]), math.exp(p[1]), bytes_per_el, bw, bw_eff,
                                 launch_s, walk_factor=f)

    eff_meas = 2 * m * n * k / (peak_flops * np.maximum(t - launch_s, 1e-12))
    e0 = float(min(1.0, max(1e-4, eff_meas.max() * 1.2)))
    l1 = cache["l1_sets"] * cache["l1_ways"]
    lo = [math.log(1e-6), math.log(1e-3), math.log(cache["l1_ways"]), 0.02, math.log(1 / 64), 0.02]
    hi = [0.0, math.log(1e4), math.log(l1), 1.0, math.log(64.0), 1.0]
    x = _solve(lambda p: np.log(model(p)) - logt,
               [math.log(e0), math.log(1.0), math.log(l1 / 4), 0.5, 0.0, 0.3], lo, hi)
    resid = np.log(model(x)) - logt
    names = ["e_max", "x_half", "conflict_lines", "conflict_floor", "column_half", "column_floor"]
    vals = [math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), float(x[3]), math.exp(x[4]), float(x[5])]
    clipped = [nm for nm, v, a, b in zip(names, x, lo, hi, strict=True) if v <= a + 1e-6 or v >= b - 1e-6]
    params = dict(zip(names, vals, strict=True))
    if params["x_half"] <= 1.001e-3:
        params["x_half"] = 0.0
    return Fit(params, int(t.size), _rms(resid), clipped)


def fit_ratio(slow_times, fast_times, lo: float = 1.0, hi: float = 4.0) -> Fit:
    """Fit one time factor ``ratio`` in [lo, hi] of paired calls (``slow`` = ``ratio`` x ``fast``):
    the geometric mean of the pairs' ratios, clipped to the bounds."""
    s, f = _arr(slow_times), _arr(fast_times)
    logs = np.log(s / f)
    raw = math.exp(float(np.mean(logs)))
    ratio = min(max(raw, lo), hi)
    rms = float(np.sqrt(np.mean((logs - math.log(ratio)) ** 2)))
    return Fit({"ratio": ratio}, int(s.size), rms, ["ratio"] if ratio != raw else [])


def fit_grouped(rows, grouped_times, dense_times, hi: float = 4096.0) -> Fit:
    """Fit ``m_half`` in [0, hi] rows of a grouped GEMM's time over one GEMM of all its rows,
    ``1 + m_half / rows`` (:attr:`simulator.hardware.profile.Profile.grouped_gemm_m_half`), by least
    squares of the log ratios, robust (a round the loaded host stalled pulls it less; a grouped call
    faster than the reference fits 0)."""
    m, r = _arr(rows), _arr(grouped_times) / _arr(dense_times)
    logr = np.log(r)

    def resid(p):
        return np.log1p(p[0] / m) - logr

    x0 = float(np.clip(np.median((r - 1.0) * m), 1e-3, hi - 1e-3))
    h = float(_solve(resid, [x0], [0.0], [hi], robust=True)[0])
    rms = float(np.sqrt(np.mean(resid([h]) ** 2)))
    return Fit({"m_half": h}, int(m.size), rms, ["m_half"] if h <= 1e-6 or h >= hi - 1e-6 else [])


def fit_bandwidth(nbytes, times, bw: float, launch_s: float, kernels_per_call=1) -> Fit:
    """Fit ``bw_eff`` in (0, 1] of :func:`simulator.physics.kernels.memory_bound_time`."""
    b, t = _arr(nbytes), _arr(times)
    nk = np.broadcast_to(_arr(kernels_per_call), b.shape)
    logt = np.log(t)

    def resid(p):
        return np.log(kernels.memory_bound_time(b, bw, math.exp(p[0]), launch_s, nk)) - logt

    e0 = float(np.clip(np.median(b / (bw * np.maximum(t - nk * launch_s, 1e-12))), 1e-4, 1.0))
    x = _solve(resid, [math.log(e0)], [math.log(1e-6)], [math.log(MAX_RAW)])
    eff = math.exp(x[0])
    return _clipped_fit("bw_eff", eff, int(t.size), resid)


def fit_alpha_beta(nbytes, times) -> Fit:
    """Fit latency ``alpha_s`` (s) and bandwidth ``bw`` (bytes/s) of
    :func:`simulator.physics.kernels.collective_time`: t = alpha + bytes / bw (bytes > 0 only)."""
    b, t = _arr(nbytes), _arr(times)
    keep = b > 0
    b, t = b[keep], t[keep]
    logt = np.log(t)

    def resid(p):
        return np.log(kernels.collective_time(b, math.exp(p[0]), math.exp(p[1]))) - logt

    i_big, i_small = int(np.argmax(b)), int(np.argmin(b))
    bw0 = float(b[i_big] / t[i_big])
    a0 = float(max(t[i_small] - b[i_small] / bw0, t[i_small] * 0.1, 1e-9))
    if b.size == 1:
        x = _solve(lambda p: np.log(kernels.collective_time(b, 1e-12, math.exp(p[0]))) - logt,
                   [math.log(bw0)], [math.log(1.0)], [math.log(1e15)])
        x = np.array([math.log(1e-12), x[0]])
    else:
        x = _solve(resid, [math.log(a0), math.log(bw0)], [math.log(1e-12), math.log(1.0)],
                   [math.log(100.0), math.log(1e15)])
    alpha, bw = math.exp(x[0]), math.exp(x[1])
    if alpha <= 1.001e-12:
        alpha = 0.0
    return Fit({"alpha_s": alpha, "bw": bw}, int(t.size), _rms(resid(x)))


def fit_attention_shape(flops_fwd, head_dim, seq, times, is_fwdbwd, peak_flops: float, launch_s: float,
                        bwd_factor: float, shape: bool = True,
                        fixed: tuple[float, float] | None = None) -> Fit:
    """Joint fit of forward and backward attention efficiencies over a head-size x sequence sweep.

    Forward points: t = launch + F / (peak * e_f(d, s)); forward+backward points: t = 2 launch +
    F / (peak * e_f) + bwd_factor * F / (peak * e_b), with e_x(d, s) = e_x_max * d/(d + d_half) *
    s/(s + s_half) (:func:`simulator.physics.kernels.attention_efficiency`) and d_half, s_half
    shared (0 when ``shape`` is False or there are too few distinct shapes; ``fixed`` holds them
    at given values). Parameters: ``fwd``, ``bwd`` (asymptotic efficiencies), ``head_dim_half``,
    ``seq_half``; efficiencies are fitted up to MAX_RAW and capped at 1 by the caller.
    """
    f, d, s, t = _arr(flops_fwd), _arr(head_dim), _arr(seq), _arr(times)
    both = np.asarray(is_fwdbwd, dtype=bool)
    logt = np.log(t)
    fit_d = shape and fixed is None and np.unique(d).size >= 2
    fit_s = shape and fixed is None and np.unique(s).size >= 2
    dh0, sh0 = fixed if fixed is not None else (0.0, 0.0)
    has_b = bool(both.any())

    def unpack(p):
        i = 1
        e_f = math.exp(p[0])
        e_b = e_f
        if has_b:
            e_b, i = math.exp(p[1]), 2
        dh = math.exp(p[i]) if fit_d else dh0
        sh = math.exp(p[i + int(fit_d)]) if fit_s else sh0
        return e_f, e_b, dh, sh

    def model(p):
        e_f, e_b, dh, sh = unpack(p)
        ef = kernels.attention_efficiency(e_f, d, s, dh, sh)
        eb = kernels.attention_efficiency(e_b, d, s, dh, sh)
        tt = launch_s + f / (peak_flops * ef)
        return np.where(both, tt + launch_s + bwd_factor * f / (peak_flops * eb), tt)

    # with a shape dependence the limits are bounded by 1 (else e_max and the halves trade off
    # without bound); halves up to 1e3 elements of head size and 1e5 tokens
    e_hi = math.log(1.0) if (fit_d or fit_s) else math.log(MAX_RAW)
    ne = 2 if has_b else 1
    x0 = [math.log(0.5)] * ne + [math.log(16.0)] * int(fit_d) + [math.log(128.0)] * int(fit_s)
    lo = [math.log(1e-7)] * ne + [math.log(1e-2)] * int(fit_d) + [math.log(1e-1)] * int(fit_s)
    hi = [e_hi] * ne + [math.log(1e3)] * int(fit_d) + [math.log(1e5)] * int(fit_s)
    x = _solve(lambda p: np.log(model(p)) - logt, x0, lo, hi)
    e_f, e_b, dh, sh = unpack(x)
    dh = 0.0 if fit_d and dh < 0.0101 else dh  # at the lower bound: no dependence
    sh = 0.0 if fit_s and sh < 0.101 else sh
    params = {"fwd": e_f, "bwd": e_b, "head_dim_half": dh, "seq_half": sh}
    return Fit(params, int(t.size), _rms(np.log(model(x)) - logt),
               [k for k in ("fwd", "bwd") if params[k] > 1.0])


def fit_bw_with_known(nbytes, times, known, bw: float, launch_s: float, kernels_per_call=1,
                      items=None) -> Fit:
    """Fit ``bw_eff`` (and, with ``items``, a cost per item ``item_s`` >= 0) of
    t = known + kernels * launch + items * item_s + bytes / (bw * bw_eff).

    ``known`` are seconds already explained by other fitted terms (GEMMs, fresh pages) of the
    same measured call; used for the LM head + loss, the embedding, casts and the optimizer over
    a tensor-size mix (items = tensors). ``bw_eff`` is fitted up to MAX_RAW (raw value kept)."""
    b, t, kn = _arr(nbytes), _arr(times), _arr(known)
    nk = np.broadcast_to(_arr(kernels_per_call), b.shape)
    it = None if items is None else _arr(items)
    logt = np.log(t)

    def model(p):
        out = kn + nk * launch_s + b / (bw * math.exp(p[0]))
        return out + (it * math.exp(p[1]) if it is not None else 0.0)

    rest = np.maximum(t - kn - nk * launch_s, 0.05 * t)
    e0 = float(np.clip(np.median(b / (bw * rest)), 1e-4, 1.0))
    x0, lo, hi = [math.log(e0)], [math.log(1e-6)], [math.log(MAX_RAW)]
    if it is not None:
        x0, lo, hi = x0 + [math.log(1e-6)], lo + [math.log(1e-10)], hi + [math.log(1.0)]
    x = _solve(lambda p: np.log(model(p)) - logt, x0, lo, hi)
    eff = math.exp(x[0])
    params = {"bw_eff": min(eff, 1.0)}
    if eff > 1.0:
        params["raw_bw_eff"] = eff
    if it is not None:
        params["item_s"] = math.exp(x[1]) if x[1] > math.log(1e-10) + 1e-6 else 0.0
    x_c = np.array([math.log(min(eff, 1.0))] + list(x[1:]))
    return Fit(params, int(t.size), _rms(np.log(model(x_c)) - logt), ["bw_eff"] if eff > 0.999 else [])


def fit_fresh(tensor_bytes, total_bytes, fresh_times, reuse_times, mmap_bytes: float) -> Fit | None:
    """Fit ``gbs`` (1e9 bytes/s) and ``keep_bytes`` of :func:`simulator.physics.fresh_memory.fresh_bytes`
    to fresh minus reuse times of calls that allocate ``total_bytes`` in tensors of
    ``tensor_bytes`` each (``mmap_bytes`` held at the allocator's constant).

    Two stages where a point's tensors reach ``mmap_bytes`` (all of their bytes are fresh): ``gbs``
    from those points alone (median rate), then ``keep_bytes`` from the rest; the small tensors'
    heap pages depend on what the process allocated before, and a joint fit let one of them move
    the rate 6x between two calibrations. Residuals are relative to the fresh time, so noise in a
    near-zero difference does not dominate. Returns None when no point costs 10% more than its
    reuse time (GPU caching allocators: nothing to model)."""
    from types import SimpleNamespace

    from simulator.physics.fresh_memory import fresh_bytes

    s, tot, tf, tr = _arr(tensor_bytes), _arr(total_bytes), _arr(fresh_times), _arr(reuse_times)
    extra = tf - tr
    if not np.any(extra > 0.1 * tr):
        return None

    def model(p):
        fm = SimpleNamespace(mmap_bytes=mmap_bytes, keep_bytes=math.exp(p[1]))
        return fresh_bytes([(s, tot)], fm) / math.exp(p[0])

    big = (s >= mmap_bytes) & (extra > 0)
    lo, hi = [math.log(1e6), math.log(2.0**20)], [math.log(1e13), math.log(2.0**32)]
    keep0 = math.log(float(np.median(tot)))
    if big.any() and not big.all():
        log_rate = float(np.clip(np.log(np.median(tot[big] / extra[big])), lo[0], hi[0]))
        k = _solve(lambda p: (model([log_rate, p[0]]) - extra) / tf, [keep0], [lo[1]], [hi[1]])
        x = np.array([log_rate, k[0]])
    else:
        i = int(np.argmax(extra))
        rate0 = float(tot[i] / max(extra[i], 1e-9))
        x = _solve(lambda p: (model(p) - extra) / tf, [math.log(rate0), keep0], lo, hi)
    return Fit({"gbs": math.exp(x[0]) / 1e9, "keep_bytes": math.exp(x[1])}, int(s.size),
               _rms((model(x) - extra) / tf))


def fit_optimizer_mix(nbytes, times, known, items, bw: float) -> Fit:
    """Optimizer step over tensor-size mixes: t = known + items * item_s + bytes / (bw * bw_eff).

    Two stages, because small tensors stay in the caches and large ones do not: ``bw_eff`` from
    the mix with the most bytes per tensor (the embedding-sized tensors that dominate a real
    model's traffic), then ``item_s`` (host cost per tensor, >= 0) from the mix with the most
    tensors per byte (the layers of a small model, where the per-tensor cost is most of the
    time): what that bandwidth leaves unexplained there, per tensor. Mixes in between are
    checks (they count in ``rms_log``), not inputs: their per-tensor residual is the difference
    of two similar times and swings with every timing wobble."""
    b, t, kn, it = _arr(nbytes), _arr(times), _arr(known), _arr(items)
    i, j = int(np.argmin(it / b)), int(np.argmax(it / b))
    item_s = 0.0
    for _ in range(20):  # each stage net of the other's (small) share: a fast fixed point
        eff = float(b[i] / (bw * max(t[i] - kn[i] - it[i] * item_s, 1e-12 * t[i])))
        item_s = max(0.0, float((t[j] - kn[j] - b[j] / (bw * eff)) / it[j])) if j != i else 0.0
    params = {"bw_eff": min(eff, 1.0), "item_s": item_s}
    if eff > 1.0:
        params["raw_bw_eff"] = eff
    model = kn + it * item_s + b / (bw * min(eff, 1.0))
    return Fit(params, int(t.size), _rms(np.log(model) - np.log(t)), ["bw_eff"] if eff > 0.999 else [])
