"""calibration/stack_dispatch.py: the kernels it divides by are the simulator's, and without
megatron-core it says how to get it in one line (exit 2)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from calibration import stack_dispatch


def test_it_divides_by_the_kernels_the_simulator_counts_per_layer():
    k = stack_dispatch.counted_kernels()
    assert k["megatron-core"] == (13.0, 26.0)  # megatron-lm's fused layer: 6 GEMMs, softmax, norms and residuals
    assert k["torch_model"][0] > k["megatron-core"][0] and k["torch_model"][1] > k["megatron-core"][1]


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None, reason="megatron-core is installed here")
def test_without_megatron_core_it_says_how_to_get_it():
    r = subprocess.run([sys.executable, "-m", "calibration.stack_dispatch", "--steps", "10"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "megatron-core is not installed" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_too_short_run_is_refused():
    r = subprocess.run([sys.executable, "-m", "calibration.stack_dispatch", "--steps", "3"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--steps must be at least 10, got 3" in r.stderr
