"""The host allocator setting: 'keep' starts glibc with tunables that stop it from mapping large
blocks anew, trimming the heap and caching small blocks between large ones, so a loop that
allocates and frees the same large tensors stops faulting after its first round; the commands
start themselves again with the setting asked for; profiles record it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from calibration import host_alloc
from simulator.hardware.profile import Provenance

PROBE = """
import resource, torch
from calibration import host_alloc
print(host_alloc.active())
for _ in range(8):  # a training step's pattern: allocate, use and free large tensors, again and again
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.empty(mib * 2**18).fill_(1.0) for mib in (64, 16, 100)]
    del xs
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
GLIBC = pytest.mark.skipif(not host_alloc.glibc(), reason="glibc tunables")


def _probe(mode: str) -> tuple[str, list[int]]:
    env = host_alloc.environment(mode)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env).stdout
    first, *faults = out.split()
    return first, [int(f) for f in faults]


@GLIBC
def test_keep_stops_refaulting_large_blocks():
    mode, faults = _probe("keep")
    assert mode == "keep"
    assert max(faults[1:]) < 1000  # 180 MiB: 46080 pages when fresh
    mode, faults = _probe("default")
    assert mode == "default" and min(faults[1:]) > 40000  # glibc as shipped maps the two large ones anew


def test_environment_adds_and_removes_only_its_tunables():
    env = host_alloc.environment("keep", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
    assert env["X"] == "1" and env["GLIBC_TUNABLES"].startswith("glibc.malloc.arena_max=2:")
    assert all(t in env["GLIBC_TUNABLES"] for t in host_alloc.KEEP_TUNABLES)
    back = host_alloc.environment("default", env)
    assert back["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
    assert "GLIBC_TUNABLES" not in host_alloc.environment("default", {})
    with pytest.raises(ValueError, match="valid: keep, default"):
        host_alloc.environment("jemalloc")


def test_recorded_default_for_older_profiles():
    assert host_alloc.recorded(Provenance(method="calibration", date="2026-12-02")) == "default"
    assert host_alloc.recorded(Provenance(method="calibration", date="2026-12-02", host_allocator="keep")) == "keep"


@GLIBC
def test_validate_from_the_command_line_starts_itself_with_the_profiles_allocator(tmp_path):
    """A profile measured with 'keep': validate relaunches with the tunables and records 'keep'."""
    import json

    from calibration.device import detect
    from simulator.hardware import catalog as hardware

    data = hardware.default_profile("rtx3090").model_dump(mode="json")
    data["device"] = {"kind": "cpu", "name": detect("cpu").name, "peak_tflops": {"fp32": 0.05}, "mem_bw_gbs": 10.0,
                      "memory_gib": 16.0, "usable_memory_gib": 15.0}
    data["name"], data["provenance"]["host_allocator"] = "test-cpu", "keep"
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(data))
    out = tmp_path / "rows.csv"
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", host_alloc.RELAUNCHED)}
    cmd = [sys.executable, "-m", "calibration.validate", "--profile", str(prof), "--device", "cpu",
           "--only", "gpt2-2x128-v2k-s64-mb1x1-fp32-sdpa", "--suite", "calibration/suites/cpu_broad.yaml",
           "--steps", "1", "--warmup", "1", "--csv", str(out)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert ",keep" in out.read_text().splitlines()[1]


def test_no_first_touch_cost_means_no_fresh_memory_term():
    """Under 'keep' the fresh-page benches cost what reusing a buffer costs, give or take noise:
    a fitted rate above the copy bandwidth is no cost at all, and the profile gets no term."""
    import json
    from pathlib import Path

    from calibration.build import build_profile
    from calibration.device import detect

    meas = Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-intel-xeon.measurements.json"
    results = json.loads(meas.read_text())["results"]
    assert build_profile(detect("cpu"), results, "test").profile.fresh_memory is not None  # as measured
    for key, rec in results.items():
        if key.startswith("fresh/"):  # 12% over the reuse time: noise, far faster than any page fault
            results[key] = {**rec, "time_s": 1.12 * rec["reuse_s"]}
    built = build_profile(detect("cpu"), results, "test")
    assert built.profile.fresh_memory is None
    assert any("no first-touch cost" in w for w in built.warnings)
