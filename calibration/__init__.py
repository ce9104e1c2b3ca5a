"""Calibration: torch microbenchmarks fitted into a :class:`simulator.hardware.profile.Profile`.

``calibrate`` (``python -m calibration``) measures GEMMs, attention, bandwidth-bound ops,
kernel launch overhead, optimizer steps, host copies and (optionally) collectives on the
local device, then fits the parameters of :mod:`simulator.physics.kernels` so that those exact
functions reproduce the measurements.
"""

from __future__ import annotations

__all__ = ["__version__"]
__version__ = "0.1.0"
