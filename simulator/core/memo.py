"""Results of pure functions kept across the searches of one process (a warm search reuses them).

Each cache is a plain dict from a hashable key (every input that changes the result) to the
result, bounded by dropping its oldest entry. Inputs that cannot be hashed (a
:class:`simulator.hardware.device.Device` holds dicts) are a *witness*: the key names them (e.g. the
device's name) and the entry keeps them, served only to an equal one. Cached results are shared:
callers treat them as read-only (arrays are marked so).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Entries each cache keeps (a search fills a few per layout it evaluates).
SIZE = 256
_STORES: list[dict] = []


def store() -> dict:
    """A new cache, emptied by :func:`clear`."""
    d: dict = {}
    _STORES.append(d)
    return d


def clear() -> None:
    """Empties every cache made by :func:`store` (the next search computes everything again)."""
    for d in _STORES:
        d.clear()


def cached(cache: dict, key: Any, make: Callable[[], Any], witness: Any = None, size: int = SIZE) -> Any:
    """``cache[key]``'s result if its witness is (or equals) ``witness``, else ``make()`` stored
    (the oldest entry dropped beyond ``size`` entries)."""
    hit = cache.get(key)
    if hit is not None and (hit[0] is witness or hit[0] == witness):
        return hit[1]
    value = make()
    if key not in cache and len(cache) >= size:
        cache.pop(next(iter(cache)))
    cache[key] = (witness, value)
    return value


def frozen(*arrays: np.ndarray) -> None:
    """Marks ``arrays`` read-only (shared through a cache: a write would corrupt later searches)."""
    for a in arrays:
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
