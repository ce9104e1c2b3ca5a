"""Roofline time of single kernels, from a device's peaks and its efficiency profile.

Pure functions, vectorized over numpy arrays. Units: FLOPs, bytes, seconds; peaks in
FLOP/s, bandwidth in bytes/s. Shared by the simulator and by calibration's fitting, so a
profile fitted to microbenchmarks means exactly what the simulator uses.
"""

from __future__ import annotations

import numpy as np


def gemm_thickness(m, n, k):
    """Shape thickness x = m*n*k / (m*n + n*k + m*k) (elements); n/3 for a square GEMM."""
    m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    return m * n * k / (m * n + n * k + m * k)


def gemm_efficiency(m, n, k, e_max: float, x_half: float, halves: tuple[float, float, float] = (0.0, 0.0, 0.0),
                    k_power: float = 1.0):
    """Achieved fraction of dense peak for GEMM (m x k) @ (k x n):
    ``e_max * x / (x + x_half) * m / (m + m_half) * n / (n + n_half) * kterm(k)``.

    The thickness term is the whole-shape view (operand traffic per FLOP; GPUs). The per-dimension
    terms, ``halves`` = (m_half, n_half, k_half) in elements, describe a blocked CPU kernel (oneDNN,
    MKL, OpenBLAS): a register tile of a few rows and columns needs enough of both to fill it, and
    each tile's load and store of C is amortized over the k-loop, so a short reduction runs far
    below peak however large m and n are. ``kterm(k) = k^p / (k^p + k_half^p)`` with ``p`` =
    ``k_power`` (the measured drop is steeper than hyperbolic); below ``k* = k_half (p - 1)^(1/p)``,
    where that would make a longer reduction finish sooner, it continues as ``kterm(k*) k / k*`` (a
    fixed time per output element): time never falls as k grows and stays finite as k shrinks.
    Zeros give 1.
    """
    x = gemm_thickness(m, n, k)
    eff = e_max * x / (x + x_half)
    m_half, n_half, k_half = halves
    if m_half or n_half or k_half:
        m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
        kk = np.maximum(k, k_half * (k_power - 1.0) ** (1.0 / k_power))
        eff = eff * m / (m + m_half) * n / (n + n_half) * (k / kk) * kk**k_power / (kk**k_power + k_half**k_power)
    return eff


def operand_factor(operand_bytes, half_bytes: float | None, floor: float = 0.0):
    """Efficiency factor floor + (1 - floor) / (1 + S / S_half) of a GEMM kernel without cache
    blocking, whose inner loops stream a weight-sized matrix of S bytes (PyTorch's bf16 ``mm`` on
    CPUs without bf16 BLAS: the (k x n) operand of ``g @ W``, the output of ``g^T @ x``): it runs at
    ``floor`` of its in-cache rate once that matrix leaves the caches. ``half_bytes`` None (blocked
    BLAS, GPUs): 1."""
    s = np.asarray(operand_bytes, dtype=float)
    if half_bytes is None:
        return np.ones_like(s)
    return floor + (1.0 - floor) / (1.0 + s / half_bytes)


def strided_capacity_lines(stride_bytes, sets: int, ways: int, line_bytes: int):
    """Cache lines a walk down a column with ``stride_bytes`` between elements can keep in a
    ``sets`` x ``ways`` set-associative cache of ``line_bytes`` lines: ``ways * sets / gcd(stride
    in lines, sets)``. A stride of a multiple of ``line_bytes * sets`` reaches one set (``ways``
    lines); a stride that is not a whole number of lines, or shorter than one, reaches them all."""
    s = np.asarray(stride_bytes, dtype=float)
    lines = np.floor(s / line_bytes).astype(np.int64)
    whole = (np.mod(s, line_bytes) == 0) & (lines >= 1)
    g = np.where(whole, np.gcd(np.maximum(lines, 1), sets), 1)
    return ways * sets / g


def strided_walk_factor(stride_el, length_el, bytes_per_el: float, walk) -> np.ndarray:
    """Efficiency factor of a GEMM kernel without cache blocking whose inner dot product walks a
    column of ``length_el`` elements ``stride_el`` elements apart (PyTorch's reference bf16 ``mm``
    NN on CPUs without bf16 BLAS: the (k x n) operand's column of k elements, n apart), one cache
    line per element. ``walk`` (:class:`simulator.hardware.profile.StridedWalk`) holds the L1 and L2
    geometry and the fitted terms:

    * conflict: the walk reaches only ``L1 sets / gcd(stride lines, sets)`` sets of the L1, so it
      keeps ``C1`` lines there (:func:`strided_capacity_lines`); below ``conflict_lines`` the
      column's lines evict each other and the kernel runs at ``conflict_floor``:
      ``floor + (1 - floor) / (1 + (conflict_lines / C1) ** sharpness)``;
    * column: the column's ``length_el`` lines against the ``C2`` lines the L2 keeps at that
      stride, ``u = length / C2``: ``column_floor + (1 - column_floor) / (1 + u / column_half)``.
    """
    stride_b = np.asarray(stride_el, dtype=float) * bytes_per_el
    c1 = strided_capacity_lines(stride_b, walk.l1_sets, walk.l1_ways, walk.line_bytes)
    c2 = strided_capacity_lines(stride_b, walk.l2_sets, walk.l2_ways, walk.line_bytes)
    conflict = walk.conflict_floor + (1.0 - walk.conflict_floor) / (1.0 + (walk.conflict_lines / c1) ** walk.sharpness)
    u = np.asarray(length_el, dtype=float) / c2
    column = walk.column_floor + (1.0 - walk.column_floor) / (1.0 + u / walk.column_half)
    return conflict * column


def gemm_time(m, n, k, peak_flops: float, e_max: float, x_half: float, bytes_per_el: float,
              bw: float, bw_eff: float, launch_s: float, operand_half_bytes: float | None = None,
              operand_floor: float = 0.0, operand_bytes=None, walk_factor=1.0,
              halves: tuple[float, float, float] = (0.0, 0.0, 0.0), k_power: float = 1.0):
    """Seconds for one GEMM (m x k) @ (k x n): launch + max(compute at shape efficiency
    (:func:`gemm_efficiency`, with ``halves`` and ``k_power``), operand traffic);
    ``operand_half_bytes`` and ``operand_floor``: :func:`operand_factor` of the streamed
    weight-sized matrix, ``operand_bytes`` (default the (k x n) operand, k * n * bytes_per_el);
    ``walk_factor``: a further efficiency factor (:func:`strided_walk_factor`)."""
    m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    flops = 2.0 * m * n * k
    ob = k * n * bytes_per_el if operand_bytes is None else operand_bytes
    eff = (gemm_efficiency(m, n, k, e_max, x_half, halves, k_power) * operand_factor(ob, operand_half_bytes, operand_floor)
           * np.asarray(walk_factor, dtype=float))
    t_compute = flops / (peak_flops * eff)
    return launch_s + np.maximum(t_compute, gemm_traffic_time(m, n, k, bytes_per_el, bw, bw_eff))


def gemm_traffic_time(m, n, k, bytes_per_el: float, bw: float, bw_eff: float):
    """Seconds to move one GEMM's operands and output once, (m x k) + (k x n) + (m x n) elements of
    ``bytes_per_el`` at ``bw`` x ``bw_eff`` bytes/s: the memory side of its roofline."""
    m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    return bytes_per_el * (m * k + k * n + m * n) / (bw * bw_eff)


def attention_efficiency(e_max, head_dim, seq_len, d_half: float = 0.0, s_half: float = 0.0):
    """Achieved fraction of dense peak for fused (flash) attention of one head size and sequence length.

    e_max * d / (d + d_half) * s / (s + s_half): small heads and short sequences leave the tensor
    cores less work per tile load and per softmax rescale (FlashAttention-2 benchmark tables,
    Dao 2023 fig. 4-7). ``head_dim`` in elements, ``seq_len`` in tokens; d_half = s_half = 0
    gives the constant ``e_max``.
    """
    d = np.asarray(head_dim, dtype=float)
    s = np.asarray(seq_len, dtype=float)
    return e_max * d / (d + d_half) * s / (s + s_half)


def memory_bound_time(nbytes, bw: float, bw_eff: float, launch_s: float, n_kernels=1):
    """Seconds for bandwidth-bound kernels moving ``nbytes`` in total."""
    return np.asarray(n_kernels, dtype=float) * launch_s + np.asarray(nbytes, dtype=float) / (bw * bw_eff)


def collective_time(bus_bytes, alpha_s: float, busbw: float):
    """alpha-beta collective: latency + bus bytes / bus bandwidth (bytes, bytes/s)."""
    bus_bytes = np.asarray(bus_bytes, dtype=float)
    return np.where(bus_bytes > 0, alpha_s + bus_bytes / busbw, 0.0)
