"""Cold memory for CPU benchmarks: what a training step reads and writes comes from memory.

In a step, a layer's weight was last touched a whole step earlier, a saved activation a whole
forward earlier, and every output lands in memory the allocator last handed out many operators
ago. A benchmark that calls one operator in a loop keeps all of it in the last-level cache
instead: on a CPU with a 480 MiB L3, a (5504 x 128) @ (128 x 1024) weight gradient ran 1.54x as
long with its output cycled through twice the L3 as with one warm output (5.2 against 3.4 ms, the
time it takes inside a real step), and an fp32 -> bf16 weight cast 1.8x. So CPU benches read
such operands from views that walk an arena of :data:`COLD_LLC_FACTOR` times the last-level cache
(:func:`cold_inputs`) and keep a ring of their recent outputs alive, so that each call writes memory
last used that many bytes ago (:func:`fresh_outputs`). On GPUs (``cold == 0``) both are no-ops.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

#: sysfs cache directory of the first CPU (Linux)
SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"
#: cold operands and outputs span this many times the last-level cache
COLD_LLC_FACTOR = 2
#: at most this many views of an input or outputs in a ring (small ones stay partly cached)
COLD_MAX_OUTPUTS = 4096
#: byte alignment of the views :func:`cold_inputs` cuts from the arena (a cache line)
ALIGN = 64


def last_level_cache_bytes(root: str = SYSFS_CACHE) -> int | None:
    """Size of this CPU's largest cache in bytes (sysfs ``size``, e.g. ``32768K``), or None."""
    sizes = []
    for d in Path(root).glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def cold_bytes(device_kind: str) -> int:
    """Bytes that cold operands and outputs span on this device (0: none, as on GPUs or where
    sysfs does not tell the cache size)."""
    llc = last_level_cache_bytes() if device_kind == "cpu" else None
    return COLD_LLC_FACTOR * llc if llc else 0


def cold_inputs(t: torch.Tensor, cold: int) -> Iterator[torch.Tensor]:
    """Endless cycle over views shaped and typed like ``t`` that walk through one process-wide
    arena of ``cold`` bytes (allocated and filled once, bytes 0x3C: 0.0115 in fp32 and bf16, 1.06
    in fp16, so no value is subnormal), so each call reads its operand from memory last read
    ``cold`` bytes ago, without filling copies per benchmark. Where ``cold`` is 0 or the operand
    is over half the arena: ``t`` itself, every call. Only shape, type and memory matter to the
    timings, not the values."""
    nbytes = t.numel() * t.element_size()
    stride = -(-nbytes // ALIGN) * ALIGN
    n = ring_size(stride, cold)
    if n == 1 or t.device.type != "cpu":
        return itertools.cycle([t])
    a = _arena(cold)
    return itertools.cycle([a[i * stride:i * stride + nbytes].view(t.dtype).view(t.shape) for i in range(n)])


_arenas: dict[int, torch.Tensor] = {}


def _arena(nbytes: int) -> torch.Tensor:
    if nbytes not in _arenas:
        _arenas.clear()
        _arenas[nbytes] = torch.full((nbytes,), 0x3C, dtype=torch.uint8)
    return _arenas[nbytes]


def ring_size(item_bytes: float, cold: int) -> int:
    """Items of ``item_bytes`` (outputs kept alive, or input views) that fit in ``cold`` bytes, at
    most :data:`COLD_MAX_OUTPUTS`; 1 (no cycling) where ``cold`` is 0 or holds fewer than two."""
    n = min(COLD_MAX_OUTPUTS, cold // int(item_bytes)) if cold > 0 and item_bytes > 0 else 0
    return n if n >= 2 else 1


def fresh_outputs(fn: Callable[[], object], out_bytes: float, cold: int) -> Callable[[], None]:
    """``fn`` whose results stay alive in a ring of :func:`ring_size` entries, so the allocator
    hands each call memory that the oldest result held: out of the caches, as a step's outputs
    are. The heap is grown once beforehand to twice ``cold`` (the ring, and room for the bench's
    own tensors; :func:`grow_heap`), so the ring's first pass faults no pages in."""
    n = ring_size(out_bytes, cold)
    if n == 1:
        return fn  # type: ignore[return-value]
    grow_heap(2 * cold)
    ring: collections.deque = collections.deque(maxlen=n)
    return lambda: ring.append(fn())


_grown = 0


def grow_heap(nbytes: int) -> None:
    """Where glibc keeps freed memory (``calibrate --allocator keep``), touch ``nbytes`` once per
    process and free them, so later allocations up to that size reuse resident pages instead of
    faulting new ones in while timed. Elsewhere a no-op (the memory would go straight back)."""
    global _grown
    from ..host_alloc import active

    if nbytes <= _grown or active() != "keep":
        return
    torch.empty(nbytes, dtype=torch.uint8).fill_(0)
    _grown = nbytes
