"""How the measuring process's C allocator treats freed memory (CPU calibration and validation).

glibc's malloc maps every block of 32 MiB or more anew and unmaps it when freed, and trims the
heap's free top back to the OS, so a training step on a CPU faults in its logits, gradients and
optimizer temporaries again every step. What that costs depends on the kernel and, in a virtual
machine, on the hypervisor: on a Firecracker guest with free-page reporting the same 164 MB fill
ran at 0.4 GB/s when its pages had been handed back to the host and at 4 GB/s when they had not,
so steps of the same model varied by 2x. Tuned CPU training keeps freed memory instead (PyTorch's
CPU launcher preloads jemalloc or tcmalloc for this reason).

``keep`` (the default of ``calibrate`` and ``validate`` on a CPU) starts the process with glibc
tunables (tunables(7)) that serve every block from the heap (``mmap_max=0``), never trim it
(``trim_threshold``) and turn off the per-thread cache (``tcache_count=0``), whose cached small
blocks sit between large ones and keep a freed large block from merging with its neighbours, so
the next, 64-byte-aligned request of the same size would not fit and the heap would grow by fresh
pages. After the first steps nothing is faulted in again, the calibration's fresh-page benches
measure no first-touch cost, and the profile has no ``fresh_memory`` term. ``default`` leaves
glibc as it is; the profile then models the faults (:mod:`simulator.physics.fresh_memory`). A profile
records which one it was measured with, and ``validate`` uses the same.

Tunables are read when a process starts, so a command asked for another setting than its own
starts itself again with it (:func:`relaunch_for`).
"""

from __future__ import annotations

import os
import platform
import sys

#: Host allocator modes, the default first.
ALLOCATORS = ("keep", "default")
#: glibc tunables of ``keep`` (glibc >= 2.26; unknown to other C libraries, which ignore them)
KEEP_TUNABLES = ("glibc.malloc.tcache_count=0", "glibc.malloc.mmap_max=0",
                 f"glibc.malloc.trim_threshold={1 << 40}")
ENV = "GLIBC_TUNABLES"
#: set in a process this module started again, so it never starts itself twice
RELAUNCHED = "PRETRAIN_SIM_ALLOCATOR_RELAUNCHED"


def glibc() -> bool:
    """Whether this Python runs on glibc (the only C library whose allocator ``keep`` tunes)."""
    return platform.libc_ver()[0] == "glibc"


def active() -> str:
    """The mode this process started with: ``keep`` where all :data:`KEEP_TUNABLES` are set."""
    have = os.environ.get(ENV, "").split(":")
    return "keep" if glibc() and all(t in have for t in KEEP_TUNABLES) else "default"


def environment(mode: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``GLIBC_TUNABLES`` set for ``mode``: the keep
    tunables added to or removed from whatever else it holds."""
    if mode not in ALLOCATORS:
        raise ValueError(f"unknown host allocator {mode!r}; valid: {', '.join(ALLOCATORS)}")
    out = dict(os.environ if env is None else env)
    ours = {t.split("=")[0] for t in KEEP_TUNABLES}
    rest = [t for t in out.get(ENV, "").split(":") if t and t.split("=")[0] not in ours]
    tunables = rest + (list(KEEP_TUNABLES) if mode == "keep" else [])
    if tunables:
        out[ENV] = ":".join(tunables)
    else:
        out.pop(ENV, None)
    return out


def relaunch_for(mode: str) -> None:
    """Start this command again (``os.execve``, same arguments) with ``mode``'s tunables unless
    it runs with them already, runs on another C library, or was started again once."""
    if active() == mode or not glibc() or os.environ.get(RELAUNCHED):
        return
    env = environment(mode)
    env[RELAUNCHED] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def recorded(provenance) -> str:
    """The allocator a profile was measured with (profiles from before the setting: ``default``)."""
    return provenance.host_allocator or "default"
