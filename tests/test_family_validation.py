"""A family's own published runs: the stored fit and residuals match the physics, its intervals
cover them, and mamba-ssm's scan backward pays for its fp32 atomicAdds."""

import math

import numpy as np
import pytest

from simulator.answer import uncertainty
from simulator.answer.api import simulate
from simulator.answer.family_runs import for_family
from simulator.hardware import catalog as hardware
from simulator.hardware.device import device_from_spec
from simulator.hardware.rates import _fit, atomic_rate
from simulator.model.families import spec_from_dict
from simulator.model.graphs import graph
from simulator.physics.compute import op_times
from simulator.validation import family_validation as fv


@pytest.fixture(scope="module")
def mamba():
    v = for_family("mamba")
    assert v is not None and len(v.runs) >= 7
    return v


def _plan(v, run):
    return simulate(spec_from_dict(v.model), f"1x{run.gpu}", stack=v.stack, **run.knobs())


def test_stored_fit_and_residuals_match_the_physics(mamba):
    """Fails when the physics moved and `python -m calibration.family_fit` was not rerun: every
    stored prediction is re-simulated, and the in-sample residuals are those of the stored rates."""
    for run in mamba.runs:
        pred = fv.predict(mamba, run)
        assert pred == pytest.approx(run.predicted_tokens_per_s, rel=1e-6), (
            f"{run}: stored prediction is stale, rerun `python -m calibration.family_fit`")
        assert run.log_ratio_in_sample == pytest.approx(math.log(pred / run.measured_tokens_per_s), abs=1e-4)


def test_fit_is_bounded_and_cross_validated():
    fit = _fit()
    assert fit is not None and set(fit.groups) == {"a100", "h100"}
    lo, hi = fit.bounds
    for g in fit.groups.values():
        assert lo < g.value < hi, "a rate at its bound is not identified"
        assert g.runs >= 2
    assert fit.mape_in_sample <= fit.mape_loo and fit.mape_cross_gpu > 0
    assert fit.mape_loo < 15.0  # the claim the interval rests on (README)


def test_mamba_interval_covers_the_published_runs(mamba):
    """The 80% interval of each published run's plan holds the measured time for at least 80% of runs."""
    covered = []
    for run in mamba.runs:
        p = _plan(mamba, run)
        assert p.feasible, "a configuration people really ran is never infeasible"
        lo, hi = p.interval_days
        measured_days = p.days * p.tokens_per_s / run.measured_tokens_per_s
        covered.append(lo <= measured_days <= hi)
        assert "published mamba runs" in p.interval_source
    assert sum(covered) >= 0.8 * len(covered), covered


def test_mamba_interval_includes_the_family_residuals(mamba):
    """A fitted GPU (A100) takes the leave-one-run-out residuals; an unfitted one (A6000) the
    leave-GPU-group-out residuals and the lowest fitted rate."""
    for gpus, cross in (("4xa100", False), ("4xrtx-a6000", True)):
        p = simulate("mamba-2.8b", gpus)
        lo, hi = p.interval_days
        q_lo, q_hi = uncertainty.bounds(mamba.residuals(cross))
        assert lo <= p.days * math.exp(q_lo) and p.days * math.exp(q_hi) <= hi * (1 + 1e-12)
        assert f"{len(mamba.runs)} published mamba runs" in p.interval_source
        assert ("other GPU's fitted rate" in p.interval_source) == cross
    fit = _fit()
    assert atomic_rate(hardware.default_profile("rtx-a6000")) == min(g.value for g in fit.groups.values())
    assert atomic_rate(hardware.default_profile("a100-80gb-sxm")) == fit.groups["a100"].value


def test_a_family_without_runs_keeps_the_profile_interval():
    p = simulate("pythia-1b", "8x3090")
    assert for_family(p.model["family"]) is None
    assert p.interval_source.startswith("80% interval from ")


def test_scan_backward_pays_its_atomics():
    """2 fp32 atomicAdds per (token, inner channel, state) (dB and dC), each at the GPU's rate: the
    backward time grows by exactly atomics / rate, and a slower rate never makes it faster."""
    from simulator.model.presets import get_model

    m = get_model("mamba-2.8b")
    mb = np.array([1.0, 2.0])
    g = graph(m, 2048, mb, "bf16", "n/a", False)
    (scan,) = [op for b in g.blocks for op in b.ops if op.name == "selective_scan"]
    E, N = m.expand * m.hidden, m.state_size
    assert np.allclose(scan.atomics_bwd, mb * 2048 * 2 * E * N)
    gpu = hardware.get_gpu("a100-80gb-sxm")
    base = hardware.default_profile(gpu)
    times = []
    for rate in (400.0, 100.0, 1e12):
        dev = device_from_spec(gpu, base.model_copy(update={"fp32_atomic_rate": rate}))
        times.append(op_times(scan, dev, "bf16")[1])
    assert np.all(times[1] > times[0]) and np.all(times[0] > times[2])
    assert np.allclose(times[1] - times[0], scan.atomics_bwd * (1 / 100e9 - 1 / 400e9))
