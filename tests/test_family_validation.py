"""A family's own published runs: stored residuals match the physics, and its intervals cover them."""

import math

import pytest

from simulator import family_validation as fv
from simulator.api import simulate
from simulator.families import spec_from_dict


@pytest.fixture(scope="module")
def mamba():
    v = fv.for_family("mamba")
    assert v is not None and len(v.runs) >= 7
    return v


def _plan(v, run):
    return simulate(spec_from_dict(v.model), f"1x{run.gpu}", stack=v.stack, **run.knobs())


def test_stored_residuals_match_the_physics(mamba):
    """Fails when the physics moved and `python -m simulator.family_validation` was not rerun."""
    for run in mamba.runs:
        pred = fv.predict(mamba, run)
        assert pred == pytest.approx(run.predicted_tokens_per_s, rel=1e-6), (
            f"{run}: stored prediction is stale, rerun `python -m simulator.family_validation`")
        assert run.log_ratio == pytest.approx(math.log(run.predicted_tokens_per_s / run.measured_tokens_per_s))


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


def test_mamba_preset_interval_includes_the_family_residuals(mamba):
    p = simulate("mamba-2.8b", "4xa100")
    lo, hi = p.interval_days
    slowest = math.exp(max(mamba.log_ratio_residuals))
    fastest = math.exp(min(mamba.log_ratio_residuals))
    assert lo <= p.days < fastest * p.days <= hi <= slowest * p.days * (1 + 1e-9)
    assert f"{len(mamba.runs)} published mamba runs (real runs " in p.interval_source


def test_a_family_without_runs_keeps_the_profile_interval():
    p = simulate("pythia-1b", "8x3090")
    assert fv.for_family(p.model["family"]) is None
    assert "published" not in p.interval_source.split(":")[0]
    assert p.interval_source.startswith("80% interval from ")
