"""What PyTorch's CUDA caching allocator reserves for a training step, replayed from its allocations.

A GPU runs out of memory when the caching allocator cannot find or create a segment, not when
live tensors fill it: freed blocks stay cached in their segments, split by later smaller
requests, and a large request that fits no cached block needs a new segment. This module replays
a step's sequence of allocations and frees (``("a", id, bytes)`` / ``("f", id)``, as
``calibration/hf_memory_trace.py`` records them) through the allocator's rules as
``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, default ``PYTORCH_CUDA_ALLOC_CONF``: no
expandable segments, no ``max_split_size_mb``) states them:

- a request is rounded up to a multiple of 512 B (``kMinBlockSize``);
- requests up to 1 MiB (``kSmallSize``) come from the small pool, larger ones from the large pool;
- a request takes the smallest cached free block of its pool that holds it (best fit); failing
  that, a new segment of 2 MiB (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``)
  for one under 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
- the block is split when what remains is at least 512 B (small pool) or more than 1 MiB (large
  pool); a block not split counts whole as allocated;
- a freed block merges with free neighbours of its segment;
- when a new segment would not fit the device, every wholly free cached segment is released
  (``release_cached_blocks``) and the request retried; if it still does not fit, out of memory.

:func:`smallest_device` is the least memory a step runs in: the number a plan's ``total`` stands
for. Not modelled: the cuBLAS/cuDNN workspaces and kernels' internal buffers (they allocate through
the same allocator, tens of MiB), and CUDA's own context (outside the allocator).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple of it
SMALL_REQUEST_BYTES = 1 << 20  # kSmallSize: at most this comes from the small pool
SMALL_SEGMENT_BYTES = 2 << 20  # kSmallBuffer: a small-pool segment
LARGE_SEGMENT_BYTES = 20 << 20  # kLargeBuffer: the segment of a request between 1 and 10 MiB
MIN_LARGE_ALLOC_BYTES = 10 << 20  # kMinLargeAlloc: from here a segment is the request rounded
ROUND_LARGE_BYTES = 2 << 20  # kRoundLarge: the rounding of such segments

Event = tuple  # ("a", id, nbytes) or ("f", id)


def rounded_bytes(n: int) -> int:
    """Bytes the allocator serves a request of ``n`` bytes with (a multiple of 512 B)."""
    return MIN_BLOCK_BYTES if n < MIN_BLOCK_BYTES else MIN_BLOCK_BYTES * -(-n // MIN_BLOCK_BYTES)


def segment_bytes(n: int) -> int:
    """Bytes of the new segment (one cudaMalloc) a rounded request of ``n`` bytes creates."""
    if n <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if n < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return ROUND_LARGE_BYTES * -(-n // ROUND_LARGE_BYTES)


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


def _absorb(first: _Block, second: _Block) -> _Block:
    """Merges ``second`` into ``first``, the block just before it in their segment."""
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first
    return first


@dataclass(frozen=True)
class Replay:
    """Peaks of a replayed step (bytes): ``allocated`` as the allocator counts it
    (``torch.cuda.max_memory_allocated``: rounded blocks, unsplit remainders whole) and
    ``reserved``, its segments (``torch.cuda.max_memory_reserved``)."""

    allocated: int
    reserved: int


def replay(events: Iterable[Event], capacity: float = float("inf")) -> Replay | None:
    """Replays ``events`` through the caching allocator (module docstring) on a device of
    ``capacity`` bytes; None where it runs out of memory."""
    pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # free blocks by (size, addr)
    free: dict[int, _Block] = {}
    live: dict[int, _Block] = {}
    top = reserved = allocated = peak_allocated = peak_reserved = 0

    def cache(b: _Block) -> None:
        b.free = True
        bisect.insort(pools[b.small], (b.size, b.addr))
        free[b.addr] = b

    def take(b: _Block) -> None:
        pools[b.small].remove((b.size, b.addr))
        del free[b.addr]
        b.free = False

    for e in events:
        if e[0] == "a":
            if e[2] == 0:  # a zero-byte tensor takes no block
                continue
            size = rounded_bytes(e[2])
            small = size <= SMALL_REQUEST_BYTES
            pool = pools[small]
            i = bisect.bisect_left(pool, (size, -1))
            if i < len(pool):
                b = free[pool[i][1]]
                take(b)
            else:
                seg = segment_bytes(size)
                if reserved + seg > capacity:  # cudaMalloc fails: release the wholly free segments, retry
                    for p in pools.values():
                        for sz, addr in [x for x in p if free[x[1]].prev is None and free[x[1]].next is None]:
                            take(free[addr])
                            reserved -= sz
                    if reserved + seg > capacity:
                        return None
                b = _Block(top, seg, small, free=False)
                top += seg
                reserved += seg
                peak_reserved = max(peak_reserved, reserved)
            rest = b.size - size
            if (rest >= MIN_BLOCK_BYTES) if small else (rest > SMALL_REQUEST_BYTES):
                r = _Block(b.addr + size, rest, small, prev=b, next=b.next)
                if b.next is not None:
                    b.next.prev = r
                b.next, b.size = r, size
                cache(r)
            live[e[1]] = b
            allocated += b.size
            peak_allocated = max(peak_allocated, allocated)
        else:
            b = live.pop(e[1], None)
            if b is None:
                continue
            allocated -= b.size
            if b.prev is not None and b.prev.free:  # coalesce with a free neighbour before it ...
                take(b.prev)
                b = _absorb(b.prev, b)
            if b.next is not None and b.next.free:  # ... and after it
                take(b.next)
                _absorb(b, b.next)
            cache(b)
    return Replay(peak_allocated, peak_reserved)


def smallest_device(events: list[Event], resolution_bytes: int = 2 << 20) -> tuple[Replay, int]:
    """The unbounded replay of ``events`` and the least device memory (bytes, to within
    ``resolution_bytes``) the step runs in: between the allocated and the unbounded reserved
    peak, found by bisection (cached segments are released when the device is full)."""
    free_run = replay(events)
    lo, hi = free_run.allocated, free_run.reserved
    while hi - lo > resolution_bytes:
        mid = (lo + hi) // 2
        if replay(events, mid) is None:
            lo = mid
        else:
            hi = mid
    return free_run, hi
