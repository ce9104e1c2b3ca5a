"""The CUDA caching allocator's replay (calibration/allocator_replay.py) against its rules, by hand
(c10/cuda/CUDACachingAllocator.cpp): rounding, segment sizes, best fit, splitting, coalescing and
releasing cached segments before an out-of-memory."""

from __future__ import annotations

from calibration.allocator_replay import (
    LARGE_SEGMENT_BYTES,
    SMALL_SEGMENT_BYTES,
    Replay,
    replay,
    rounded_bytes,
    segment_bytes,
    smallest_device,
)

MIB = 1 << 20


def test_rounding_and_segment_sizes():
    assert [rounded_bytes(n) for n in (0, 1, 512, 513)] == [512, 512, 512, 1024]
    assert segment_bytes(512) == SMALL_SEGMENT_BYTES == 2 * MIB and segment_bytes(MIB) == 2 * MIB
    assert segment_bytes(MIB + 512) == LARGE_SEGMENT_BYTES == 20 * MIB and segment_bytes(10 * MIB - 512) == 20 * MIB
    assert segment_bytes(10 * MIB) == 10 * MIB and segment_bytes(11 * MIB) == 12 * MIB


def test_small_requests_share_a_segment_and_large_ones_split_theirs():
    # two 100-byte tensors: one 2 MiB segment, 512 B each
    assert replay([("a", 1, 100), ("a", 2, 100)]) == Replay(1024, 2 * MIB)
    # 4 MiB then 8 MiB: the first takes a 20 MiB segment and leaves 16 MiB cached, which the second fits
    assert replay([("a", 1, 4 * MIB), ("a", 2, 8 * MIB)]) == Replay(12 * MIB, 20 * MIB)
    # a 19.5 MiB request keeps its whole 20 MiB block (the remainder is not over 1 MiB): counted whole
    assert replay([("a", 1, 19 * MIB + MIB // 2)]) == Replay(20 * MIB, 20 * MIB)


def test_freed_blocks_coalesce_and_a_larger_request_needs_a_new_segment():
    # 30 MiB freed, split by an 8 MiB tensor: the next 30 MiB does not fit the 22 MiB left
    split = [("a", 1, 30 * MIB), ("f", 1), ("a", 2, 8 * MIB), ("a", 3, 30 * MIB)]
    assert replay(split) == Replay(38 * MIB, 60 * MIB)
    # freed neighbours merge: after freeing both halves the whole segment serves 30 MiB again
    merged = [("a", 1, 30 * MIB), ("f", 1), ("a", 2, 12 * MIB), ("a", 3, 18 * MIB), ("f", 2), ("f", 3),
              ("a", 4, 30 * MIB)]
    assert replay(merged) == Replay(30 * MIB, 30 * MIB)


def test_a_full_device_releases_cached_segments_before_running_out():
    events = [("a", 1, 30 * MIB), ("f", 1), ("a", 2, 40 * MIB)]
    assert replay(events) == Replay(40 * MIB, 70 * MIB)
    assert replay(events, capacity=40 * MIB) == Replay(40 * MIB, 40 * MIB)  # the 30 MiB segment released
    assert replay(events, capacity=39 * MIB) is None
    # a live 8 MiB tensor pins its segment: the 30 MiB one cannot be released
    pinned = [("a", 1, 30 * MIB), ("f", 1), ("a", 2, 8 * MIB), ("a", 3, 30 * MIB)]
    free_run, device = smallest_device(pinned)
    assert free_run == Replay(38 * MIB, 60 * MIB) and device == 60 * MIB
    assert 40 * MIB <= smallest_device(events)[1] <= 42 * MIB  # to within the 2 MiB resolution
