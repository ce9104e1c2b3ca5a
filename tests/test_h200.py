"""One NVIDIA H200 measured by the project (2026-12-04; calibration/results/h200/README.md):
its quick calibration refits on any machine, and the profile fitted from it holds to timings
taken at the shapes of real training steps."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

from calibration import cli  # noqa: E402
from calibration.device import from_description  # noqa: E402
from calibration.store import measurements_path  # noqa: E402
from simulator.errors import UsageError  # noqa: E402
from simulator.profile import load_profile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "calibration" / "results" / "h200"


@pytest.fixture(scope="module")
def refitted(tmp_path_factory):
    """The H200's quick-calibration measurements refitted here (a CPU machine): (rc, profile path, stdout)."""
    out = tmp_path_factory.mktemp("h200") / "nvidia-h200.json"
    shutil.copy(DATA / "calibrate_quick_measurements.json", measurements_path(out))
    rc = cli.main(["--refit", "--out", str(out), "--no-progress"])
    return rc, out


def test_refit_of_another_devices_measurements_keeps_that_device(refitted):
    rc, out = refitted
    assert rc == 0
    prof = load_profile(out)
    assert prof.device.kind == "cuda" and prof.device.name == "NVIDIA H200" and prof.device.gpu_id == "h200"
    assert prof.provenance.torch == "2.11.0+cu130" and prof.provenance.cuda == "13.0"
    assert prof.provenance.host != socket.gethostname()  # not this machine
    assert 130 < prof.device.memory_gib < 145  # the catalog's H200 (the file predates recorded memory)
    assert json.loads(measurements_path(out).read_text())["device"]["name"] == "NVIDIA H200"


def test_device_description_without_memory_is_refused_for_a_cpu():
    with pytest.raises(UsageError, match="memory"):
        from_description({"kind": "cpu", "name": "Some CPU (4 threads)"})
    with pytest.raises(UsageError, match="kind"):
        from_description({"kind": "tpu", "name": "x"})


def test_refit_bounds_e_max_by_the_best_gemm_measured_and_says_so(refitted):
    """The quick grid's best bf16 GEMM ran at 662 TFLOP/s (0.67 of the 989 peak); before the bound the
    fit put e_max at the peak itself. Now it stays within E_MAX_MARGIN of that point, and the profile
    carries the warning calibrate printed."""
    from calibration.fit import E_MAX_MARGIN

    _, out = refitted
    prof = load_profile(out)
    g = prof.gemm["bf16"]
    assert g.e_max <= (1 + E_MAX_MARGIN) * 662.2 / 989.0 + 1e-3
    assert any(w.startswith("gemm bf16: e_max at its bound") for w in prof.fit_warnings)
    assert any("attention mem_efficient_fwd" in w for w in prof.fit_warnings)
