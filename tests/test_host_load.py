"""Quietness of the host: other processes' CPU use, not the measuring process's own threads."""

import subprocess
import sys
import time

import pytest

from calibration import host_load

linux = pytest.mark.skipif(host_load.sample() is None, reason="needs /proc/stat")


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@linux
def test_own_work_is_not_counted_as_other_processes():
    """A busy measuring process reads as a quiet machine (the load average would count it)."""
    a = host_load.sample()
    _spin(0.6)
    b = host_load.sample()
    assert b.own_s - a.own_s > 0.3
    assert host_load.other_cores(a, b) < 0.5


BURN = "import time\nend = time.monotonic() + 0.8\nwhile time.monotonic() < end: pass"


@linux
def test_own_children_are_not_counted_as_other_processes():
    """torch.compile's workers and a torchrun child are part of the measurement."""
    a = host_load.sample()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    b = host_load.sample()
    assert b.own_s - a.own_s > 0.3
    assert host_load.other_cores(a, b) < 0.5


@linux
def test_another_process_burning_a_core_is_counted():
    """A process that is not ours (the shell exits at once; its orphan burns a core)."""
    a = host_load.sample()
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{BURN}' >/dev/null 2>&1 &"], check=True)
    time.sleep(1.2)
    b = host_load.sample()
    assert host_load.other_cores(a, b) > 0.4


def test_missing_samples_and_thresholds():
    s = host_load.CpuSample(1.0, 10.0, 1.0)
    assert host_load.other_cores(None, s) is None
    assert host_load.other_cores(s, s) is None  # no time passed
    later = host_load.CpuSample(3.0, 14.0, 2.0)  # 4 host s, 1 own s over 2 wall s
    assert host_load.other_cores(s, later) == pytest.approx(1.5)
    assert host_load.is_busy(0.3, 2) and not host_load.is_busy(0.1, 2) and not host_load.is_busy(None, 2)
