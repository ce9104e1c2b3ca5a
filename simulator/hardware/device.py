"""The numbers of one accelerator the physics needs, in SI units, with its efficiency profile."""

from __future__ import annotations

from dataclasses import dataclass, field

from .profile import Profile

GIB = 1024**3


@dataclass(frozen=True)
class Device:
    """Peaks (FLOP/s, dense, fp32-accumulate), bandwidths (bytes/s), memory (bytes) and profile."""

    name: str
    peak_flops: dict[str, float]  # precision -> FLOP/s (fp32 = CUDA cores, tf32/bf16/fp16 tensor)
    mem_bw: float  # bytes/s
    usable_memory: float  # bytes
    memory_label: float  # bytes
    host_bw: float  # bytes/s, host <-> device, pinned
    board_power_w: float | None
    profile: Profile
    notes: list[str] = field(default_factory=list)

    def gemm_peak(self, precision: str) -> float | None:
        """FLOP/s of GEMMs under a training precision, or None if the device lacks it.

        fp32 -> CUDA-core fp32; tf32 -> TF32 tensor peak (fp32 if the device has none);
        bf16/fp16 -> that tensor peak (mixed precision, fp32 accumulate).
        """
        if precision == "tf32":
            return self.peak_flops.get("tf32", self.peak_flops["fp32"])
        return self.peak_flops.get(precision)


def device_from_spec(gpu, profile: Profile) -> Device:
    """Build a Device from a catalog GPUSpec and an efficiency profile."""
    peaks = {k: v.value * 1e12 for k, v in gpu.peak_tflops.items()}
    host_bw = profile.host_to_device_gbs * 1e9
    return Device(
        name=gpu.short_name,
        peak_flops=peaks,
        mem_bw=gpu.mem_bw_gbs.value * 1e9,
        usable_memory=gpu.usable_memory_gib.value * GIB,
        memory_label=gpu.memory_gib.value * GIB,
        host_bw=host_bw,
        board_power_w=gpu.board_power_w.value,
        profile=profile,
    )


def device_from_profile(profile: Profile) -> Device:
    """Build a Device from the device a profile describes (``--gpus 1xlocal --profile FILE``)."""
    d = profile.device
    return Device(
        name=d.name,
        peak_flops={k: v * 1e12 for k, v in d.peak_tflops.items()},
        mem_bw=d.mem_bw_gbs * 1e9,
        usable_memory=d.usable_memory_gib * GIB,
        memory_label=d.memory_gib * GIB,
        host_bw=profile.host_to_device_gbs * 1e9,
        board_power_w=d.board_power_w,
        profile=profile,
    )
