"""Benchmark definitions. Each :class:`Bench` measures one point and returns a record.

A record is a JSON-able dict with at least ``status`` ('ok' or 'unsupported') and, when
ok, ``time_s`` (seconds per call: the median timed sample, :attr:`calibration.timing.Timing.fit_s`;
the fastest and the spread are kept under ``timing``) plus the work it did (``flops`` and/or
``bytes``) so fitting never needs to re-derive it. Keys are stable strings such as
``gemm/bf16/2048x3072x768``; the measurements file is keyed by them, which is what
``--resume`` relies on.
"""

from __future__ import annotations

from .base import Bench, RunContext


def plan(ctx: RunContext, groups: list[str] | None = None) -> list[Bench]:
    """All benchmarks for this device and mode, in execution order."""
    from . import (
        attention,
        bandwidth,
        dispatch,
        gemm,
        gemm_align,
        grouped_gemm,
        host,
        optimizer,
        stepops,
    )

    benches: list[Bench] = []
    benches += bandwidth.plan(ctx)  # launch overhead + bandwidth first: the fits need them
    benches += gemm.plan(ctx)
    benches += gemm_align.plan(ctx)
    benches += grouped_gemm.plan(ctx)
    benches += attention.plan(ctx)
    benches += optimizer.plan(ctx)
    benches += stepops.plan(ctx)
    benches += host.plan(ctx)
    benches += dispatch.plan(ctx)
    # torch.compile last: compilation leaves worker processes and threads behind that
    # should not share the machine with the eager measurements
    benches = [b for b in benches if b.group != "compiled"] + [
        b for b in benches if b.group == "compiled"]
    if groups:
        benches = [b for b in benches if b.group in groups]
    return benches
