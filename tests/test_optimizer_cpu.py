"""Issue 10, optimizer step on a CPU: the fresh pages of foreach AdamW's temporaries (glibc heap
trim model), the optimizer benches' fault counting and cold-cache timing, and the fit that
separates per-byte and per-tensor costs once the measured faults are known."""

from __future__ import annotations

import math
import mmap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibration import fit as F
from calibration.benches import optimizer as OB
from calibration.benches import stepops
from calibration.build import _faulted_s
from simulator.answer.api import simulate
from simulator.hardware.profile import FreshMemory
from simulator.model.presets import get_model
from simulator.physics import fresh_memory
from tests.test_calibration_generalizes import _cpu_profile

MIB = 2.0**20
MMAP = 32 * MIB


# ------------------------------------------------------------------ fresh temporaries (simulator)
def test_small_temporaries_within_the_trim_threshold_are_reused():
    assert fresh_memory.optimizer_temp_bytes([16 * MIB] * 3, MMAP) == 0.0  # 48 MiB < 2 x 32 MiB


def test_small_temporaries_beyond_the_trim_threshold_are_fresh():
    sizes = [16 * MIB] * 8  # 128 MiB of heap temporaries: beyond 64 MiB the heap trims them all
    assert fresh_memory.optimizer_temp_bytes(sizes, MMAP) == pytest.approx(128 * MIB)


def test_temporaries_above_the_mmap_threshold_are_always_fresh():
    assert fresh_memory.optimizer_temp_bytes([64 * MIB, MIB], MMAP) == pytest.approx(64 * MIB)


def test_more_or_larger_tensors_never_fault_less():
    rng = np.random.default_rng(0)
    sizes = list(rng.uniform(0.1, 40, 30) * MIB)
    prev = 0.0
    for i in range(1, len(sizes) + 1):
        now = fresh_memory.optimizer_temp_bytes(sizes[:i], MMAP)
        assert now >= prev
        prev = now
    grown = fresh_memory.optimizer_temp_bytes([s * 2 for s in sizes], MMAP)
    assert grown >= prev


def _opt_time(profile, vocab):
    m = get_model("pythia-14m").model_copy(update={"vocab_size": vocab})
    return simulate(m, "1xlocal", profile=profile, seq_len=128, global_batch=1, steps=1, micro_batch=1,
                    precision="fp32", attention="sdpa", compile=False, checkpointing="none",
                    sharding="ddp", offload="none").breakdown_s["optimizer"]


def test_optimizer_pays_fresh_temporaries_at_the_fault_rate():
    slow = _cpu_profile(fresh_memory=FreshMemory(gbs=1.0, keep_bytes=1e9, source="t"))
    fast = _cpu_profile(fresh_memory=FreshMemory(gbs=1000.0, keep_bytes=1e9, source="t"))
    # a 128k x 128 embedding (64 MiB) and untied head: temporaries beyond both thresholds
    assert _opt_time(slow, 131072) > _opt_time(fast, 131072) + 0.05
    assert _opt_time(slow, 131072) > _opt_time(slow, 8192)  # more parameters, more time


# ------------------------------------------------------------------ benches
def test_counting_faults_sees_fresh_pages():
    n = 64 * 2**20  # a fresh anonymous mapping each call: every page faulted in on the write

    def fresh() -> None:
        with mmap.mmap(-1, n) as buf:
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                buf.madvise(mmap.MADV_NOHUGEPAGE)
            np.frombuffer(buf, dtype=np.uint8)[:: 4096] = 1

    wrapped, faults = OB.counting_faults(fresh)
    if not OB.kernel_counts_faults():  # a sandbox that reports no faults: the count is unknown
        wrapped()
        assert faults() is None
        return
    assert faults() == 0.0
    for _ in range(2):
        wrapped()
    assert faults() >= 32 * MIB
    keep = torch.empty(n // 4)
    keep.fill_(0.0)
    wrapped2, faults2 = OB.counting_faults(lambda: keep.fill_(1.0))
    for _ in range(2):
        wrapped2()
    assert faults2() < 4 * MIB


def test_counting_faults_reports_unknown_where_the_kernel_counts_none(monkeypatch):
    monkeypatch.setattr(OB, "kernel_counts_faults", lambda: False)
    wrapped, faults = OB.counting_faults(lambda: None)
    wrapped()
    assert faults() is None


def test_time_cold_times_at_least_min_runs_after_a_warmup(monkeypatch):
    monkeypatch.setattr(OB, "FLUSH_BYTES", 4 * 2**20)
    calls = []
    ctx = SimpleNamespace(settings=SimpleNamespace(budget_s=0.0, min_runs=3))
    t = OB.time_cold(ctx, lambda: calls.append(1))
    assert t.samples == 3 and len(calls) == 4 and 0 <= t.min_s <= t.median_s


def test_quick_big_mix_stays_below_the_allocator_thresholds():
    """The per-byte point must be measured without fresh temporaries: each tensor below the
    mmap threshold, all of them within the heap's trim threshold, and far beyond the caches."""
    shapes = stepops.OPT_MIX["quick"]["big"]
    sizes = [4.0 * math.prod(s) for s in shapes]
    assert max(sizes) < stepops.PRIME_BYTES
    assert sum(sizes) < fresh_memory.HEAP_TRIM_FACTOR * stepops.PRIME_BYTES
    assert sum(sizes) * 4 > OB.FLUSH_BYTES  # p, g, m, v: beyond what a flush evicts


# ------------------------------------------------------------------ fit
def test_faulted_seconds_use_the_measured_count():
    fm = FreshMemory(gbs=2.0, keep_bytes=1e9, source="t")
    assert _faulted_s({"fault_bytes": 4e9}, 1, [1e6], fm, lambda s, t: 99.0) == pytest.approx(2.0)
    assert _faulted_s({}, 2, [1e6, 1e6], fm, lambda s, t: 0.5) == pytest.approx(2.0)  # older records
    assert _faulted_s({"fault_bytes": 4e9}, 1, [1e6], None, lambda s, t: 99.0) == 0.0


def test_fit_optimizer_mix_recovers_known_costs_and_ignores_the_middle_mix():
    bw, eff, item = 60e9, 0.2, 50e-6
    b = np.array([5e8, 6.3e7, 8.8e7])  # large tensors; many small layer tensors; a middle mix
    items = np.array([2, 96, 12])
    known = np.array([0.02, 0.0, 0.001])  # measured fresh pages of each call
    t = known + items * item + b / (bw * eff)
    t[2] *= 1.5  # a noisy middle point must not move the two parameters
    fit = F.fit_optimizer_mix(b, t, known, items, bw)
    assert fit.params["bw_eff"] == pytest.approx(eff, rel=1e-6)
    assert fit.params["item_s"] == pytest.approx(item, rel=1e-6)
    wrong = F.fit_optimizer_mix(b, t, np.zeros(3), items, bw)  # ignoring the faults biases bw_eff
    assert wrong.params["bw_eff"] < 0.95 * eff
