"""Quietness of the host: other processes' CPU use, not the measuring process's own threads."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibration import host_load

linux = pytest.mark.skipif(host_load.sample() is None, reason="needs /proc/stat")


def _spin(seconds: float) -> None:
    """Use ``seconds`` of CPU (not of wall time: a loaded machine may give us less)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@linux
def test_own_work_is_not_counted_as_other_processes():
    """A busy measuring process reads as a quiet machine (the load average would count it)."""
    a = host_load.sample()
    _spin(0.6)
    b = host_load.sample()
    assert b.own_s - a.own_s >= 0.55  # all of it ours, whatever else the machine runs


BURN = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass"


@linux
def test_own_children_are_not_counted_as_other_processes():
    """torch.compile's workers and a torchrun child are part of the measurement."""
    a = host_load.sample()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    b = host_load.sample()
    assert b.own_s - a.own_s >= 0.75  # the child's CPU second counts as ours


@linux
def test_another_process_burning_a_core_is_counted():
    """A process that is not ours (the shell exits at once; its orphan burns a core)."""
    a = host_load.sample()
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{BURN}' >/dev/null 2>&1 &"], check=True)
    other_s = 0.0
    for _ in range(100):  # until it has burnt most of its CPU second (wall time varies with load)
        time.sleep(0.2)
        b = host_load.sample()
        other_s = host_load.other_cores(a, b) * (b.wall_s - a.wall_s)
        if other_s > 0.6:
            break
    assert other_s > 0.6


def test_missing_samples_and_thresholds():
    s = host_load.CpuSample(1.0, 10.0, 1.0)
    assert host_load.other_cores(None, s) is None
    assert host_load.other_cores(s, s) is None  # no time passed
    later = host_load.CpuSample(3.0, 14.0, 2.0)  # 4 host s, 1 own s over 2 wall s
    assert host_load.other_cores(s, later) == pytest.approx(1.5)
    assert host_load.is_busy(0.3, 2) and not host_load.is_busy(0.1, 2) and not host_load.is_busy(None, 2)


def test_host_speed_compares_a_probe_gemm_with_the_profile():
    """1 = the host runs as calibrated; a profile that believes the CPU 10x faster predicts the
    probe about 10x shorter (its operands' traffic bounds it a little)."""
    pytest.importorskip("torch")
    from simulator.hardware.profile import load_profile

    prof = load_profile(Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-intel-xeon.json")
    speed = host_load.host_speed(prof)
    assert speed is not None and 0.0 < speed < 20.0
    dev = prof.device.model_copy(update={"peak_tflops": {k: 10 * v for k, v in prof.device.peak_tflops.items()}})
    fast = host_load.probe_prediction(prof.model_copy(update={"device": dev}))
    assert 0.09 < fast / host_load.probe_prediction(prof) < 0.2
    assert host_load.host_speed(prof.model_copy(update={"gemm": {}})) is None


def test_drift_is_the_larger_factor_either_way():
    assert host_load.drift((1.0, 2.0), (1.0, 2.0)) == 1.0
    assert host_load.drift((1.0, 2.0), (1.3, 2.0)) == pytest.approx(1.3)
    assert host_load.drift((1.0, 2.0), (1.0, 1.0)) == pytest.approx(2.0)  # a faster copy counts too


def test_calibrate_warns_when_the_host_changes_speed(tmp_path, monkeypatch, capsys):
    from calibration import cli

    readings = iter([(0.010, 0.020), (0.014, 0.020)])
    monkeypatch.setattr(host_load, "probe_pair", lambda: next(readings))
    out = tmp_path / "p.json"
    assert cli.main(["--tiny", "--no-progress", "--out", str(out), "--only", "launch,bandwidth/copy/*,gemm/fp32/*"]) == 0
    assert "changed speed while calibrating" in capsys.readouterr().err
    runs = json.loads(out.with_name("p.measurements.json").read_text())["runs"]
    assert runs[-1]["host_probe_s"] == {"start": [0.010, 0.020], "end": [0.014, 0.020]}


def test_calibrated_level_compares_the_profile_with_the_calibration_probes():
    pytest.importorskip("torch")
    from simulator.hardware.profile import load_profile

    prof = load_profile(Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-intel-xeon.json")
    pred = host_load.probe_prediction(prof)
    assert host_load.calibrated_level(prof, [pred, pred]) == pytest.approx(1.0)
    assert host_load.calibrated_level(prof, [pred / 0.5, pred / 2.0]) == pytest.approx(1.0)  # geometric mean
    assert host_load.calibrated_level(prof, [pred / 0.7, pred / 0.7]) == pytest.approx(0.7)
    assert host_load.calibrated_level(prof, []) is None
    assert host_load.calibrated_level(prof.model_copy(update={"gemm": {}}), [pred]) is None


def test_calibrate_warns_when_its_benchmarks_ran_faster_than_its_probes(tmp_path, monkeypatch, capsys):
    """Probe GEMMs of 1 s at the start and end (a few ms fitted): the benchmarks saw a faster host."""
    from calibration import cli

    monkeypatch.setattr(host_load, "probe_pair", lambda: (1.0, 0.02))
    out = tmp_path / "p.json"
    assert cli.main(["--tiny", "--no-progress", "--out", str(out), "--only", "launch,bandwidth/copy/*,gemm/fp32/*"]) == 0
    assert "its benchmarks caught the host faster than the probes read" in capsys.readouterr().out
    run = json.loads(out.with_name("p.measurements.json").read_text())["runs"][-1]
    assert 0.0 < run["host_level"] < 1.0 / host_load.DRIFT_FACTOR
