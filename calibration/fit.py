"""Fitting measured times to the kernel-time model of :mod:`simulator.kernels`.

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

from simulator import kernels


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


def _solve(resid_fn, x0: list[float], lo: list[float], hi: list[float]) -> np.ndarray:
    x0 = np.clip(np.asarray(x0, dtype=float), np.asarray(lo) + 1e-9, np.asarray(hi) - 1e-9)
    res = least_squares(resid_fn, x0, bounds=(lo, hi), method="trf", x_scale="jac")
    return res.x


def fit_gemm(m, n, k, times, peak_flops: float, bytes_per_el: float, bw: float, bw_eff: float,
             launch_s: float) -> Fit:
    """Fit ``e_max`` in (0, 1] and ``x_half`` >= 0 of :func:`simulator.kernels.gemm_time`.

    peak_flops, bw, bw_eff and launch_s are held fixed (device peak, fitted bandwidth and
    launch overhead). With a single point, x_half is fixed at 0 and e_max alone is fitted.
    """
    m, n, k, t = (_arr(a) for a in (m, n, k, times))
    logt = np.log(t)

    def model(log_e: float, log_xh: float) -> np.ndarray:
        return kernels.gemm_time(m, n, k, peak_flops, math.exp(log_e), math.exp(log_xh),
                                 bytes_per_el, bw, bw_eff, launch_s)

    eff_meas = 2 * m * n * k / (peak_flops * np.maximum(t - launch_s, 1e-12))
    e0 = float(min(1.0, max(1e-4, eff_meas.max() * 1.05)))
    lo_xh, hi_xh = math.log(1e-3), math.log(1e7)
    if t.size == 1:
        x = _solve(lambda p: np.log(model(p[0], lo_xh)) - logt, [math.log(e0)],
                   [math.log(1e-6)], [0.0])
        x = np.array([x[0], lo_xh])
    else:
        xh0 = float(np.median(kernels.gemm_thickness(m, n, k)))
        x = _solve(lambda p: np.log(model(p[0], p[1])) - logt, [math.log(e0), math.log(xh0)],
                   [math.log(1e-6), lo_xh], [0.0, hi_xh])
    e_max, x_half = math.exp(x[0]), math.exp(x[1])
    clipped = ["e_max"] if e_max > 0.999 else []
    if x_half <= 1.001e-3:
        x_half = 0.0
    resid = np.log(model(math.log(e_max), math.log(max(x_half, 1e-3)))) - logt
    return Fit({"e_max": min(e_max, 1.0), "x_half": x_half}, int(t.size), _rms(resid), clipped)


def fit_bandwidth(nbytes, times, bw: float, launch_s: float, kernels_per_call=1) -> Fit:
    """Fit ``bw_eff`` in (0, 1] of :func:`simulator.kernels.memory_bound_time`."""
    b, t = _arr(nbytes), _arr(times)
    nk = np.broadcast_to(_arr(kernels_per_call), b.shape)
    logt = np.log(t)

    def resid(p):
        return np.log(kernels.memory_bound_time(b, bw, math.exp(p[0]), launch_s, nk)) - logt

    e0 = float(np.clip(np.median(b / (bw * np.maximum(t - nk * launch_s, 1e-12))), 1e-4, 1.0))
    x = _solve(resid, [math.log(e0)], [math.log(1e-6)], [math.log(MAX_RAW)])
    eff = math.exp(x[0])
    return _clipped_fit("bw_eff", eff, int(t.size), resid)


def fit_compute_eff(flops, times, peak_flops: float, launch_s: float) -> Fit:
    """Fit one efficiency ``eff`` in (0, 1] for t = launch + flops / (peak * eff).

    Used for fused attention kernels (FLOP-bound), per backend and direction.
    """
    f, t = _arr(flops), _arr(times)
    logt = np.log(t)

    def resid(p):
        return np.log(launch_s + f / (peak_flops * math.exp(p[0]))) - logt

    e0 = float(np.clip(np.median(f / (peak_flops * np.maximum(t - launch_s, 1e-12))), 1e-5, 1.0))
    x = _solve(resid, [math.log(e0)], [math.log(1e-7)], [math.log(MAX_RAW)])
    eff = math.exp(x[0])
    return _clipped_fit("eff", eff, int(t.size), resid)


def fit_alpha_beta(nbytes, times) -> Fit:
    """Fit latency ``alpha_s`` (s) and bandwidth ``bw`` (bytes/s) of
    :func:`simulator.kernels.collective_time`: t = alpha + bytes / bw (bytes > 0 only)."""
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
