"""Whether a calibration profile describes the device a validation's steps ran on."""

from __future__ import annotations

from simulator.core.errors import UsageError


def check_device(profile, device_name: str | None, memory_gib: float | None = None, where: str = "") -> str | None:
    """UsageError unless ``profile`` describes the device the steps ran on, ``device_name`` (as
    :func:`calibration.device.detect` names it; ``memory_gib`` its memory where known): the same
    processor (:func:`calibration.device.processor`), or the same catalog GPU
    (:func:`simulator.hardware.catalog.profile_is_for`, simulate's rule). A profile predicts its own device:
    another device's steps against it give neither a check of it nor residuals for its interval.
    Returns a warning where the same CPU ran with another thread count (torchrun gives each rank
    one), else None. ``where`` says where the name comes from (a --measured file)."""
    from simulator.hardware.catalog import profile_is_for

    from ..device import match_catalog_gpu, processor

    if not device_name:
        raise UsageError(f"{where or 'the measurement'} names no device (column 'device'); cannot tell it was "
                         f"measured on {profile.device.name!r}, the device profile {profile.name!r} describes")
    if device_name == profile.device.name:
        return None
    if processor(device_name) == processor(profile.device.name):
        on = f"the steps in {where} ran as" if where else "the steps run as"
        return f"profile {profile.name!r} measured {profile.device.name!r}, {on} {device_name!r}"
    gpu = match_catalog_gpu(device_name, memory_gib) if profile.device.gpu_id else None
    if gpu is not None and profile_is_for(profile, gpu):
        return None
    on = f"the steps in {where} ran on" if where else "the steps run on"
    raise UsageError(f"profile {profile.name!r} describes {profile.device.name!r}, but {on} {device_name!r}: its "
                     "predictions and residuals are another device's; validate with a profile of that device "
                     "(calibrate on it)")

