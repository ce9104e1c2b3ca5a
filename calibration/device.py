"""The device being calibrated: name, slug, supported dtypes, memory, catalog peaks, provenance."""

from __future__ import annotations

import datetime as _dt
import platform
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Precision name -> torch dtype used for operands (tf32 runs fp32 operands with TF32 matmul).
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
BYTES_PER_EL: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def slugify(text: str) -> str:
    """Lower-case, alphanumerics and single dashes: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s or "device"


def _meminfo_gib() -> tuple[float | None, float | None]:
    """(MemTotal, MemAvailable) from /proc/meminfo in GiB, or (None, None)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None, None
    vals: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in ("MemTotal", "MemAvailable"):
            vals[parts[0].rstrip(":")] = int(parts[1]) * 1024 / 2**30
    return vals.get("MemTotal"), vals.get("MemAvailable")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()
    return line[0].strip() if out.returncode == 0 and line else None


@dataclass
class DeviceContext:
    """What calibration needs to know about the device before measuring.

    ``precisions`` lists GEMM precisions to measure (CPU: fp32, bf16; CUDA: fp32 with TF32
    off, tf32, bf16 where supported, fp16).
    """

    kind: str  # "cpu" | "cuda"
    device: torch.device
    name: str
    slug: str
    precisions: list[str]
    memory_gib: float
    usable_memory_gib: float
    host_memory_gib: float | None
    threads: int
    versions: dict[str, str | None] = field(default_factory=dict)
    host: str | None = None  # the machine measured; None: this one (socket.gethostname())

    def describe(self) -> dict[str, object]:
        """JSON-able identity, stored in the measurements file to refuse mixing devices and to
        refit them elsewhere (:func:`from_description`); memory in GiB."""
        return {"kind": self.kind, "name": self.name, "slug": self.slug, "threads": self.threads,
                "precisions": list(self.precisions), **self.versions,
                "memory_gib": self.memory_gib, "usable_memory_gib": self.usable_memory_gib,
                "host_memory_gib": self.host_memory_gib, "host": self.host or socket.gethostname()}


def same_device(stored: dict, ctx: DeviceContext) -> bool:
    """True if a measurements file's device description names the device ``ctx`` describes."""
    return all(stored.get(key) == getattr(ctx, key) for key in ("kind", "name"))


def from_description(desc: dict) -> DeviceContext:
    """The device a measurements file was taken on, rebuilt from its stored description, so its
    measurements can be refitted on another machine (``calibrate --refit``) without probing any
    device here. Files written before memory was recorded take a catalog GPU's memory (matched by
    name); UsageError where neither says how much memory the device has."""
    from simulator.core.errors import UsageError

    kind, name = desc.get("kind"), desc.get("name")
    if kind not in ("cpu", "cuda") or not isinstance(name, str) or not name:
        raise UsageError(f"measurements device {desc!r}: needs kind 'cpu' or 'cuda' and a name")
    mem = desc.get("memory_gib")
    usable = desc.get("usable_memory_gib")
    if mem is None and kind == "cuda":
        gpu = match_catalog_gpu(name, None)
        if gpu is not None:
            mem = usable = float(gpu.usable_memory_gib.value)
    if mem is None:
        raise UsageError(f"measurements taken on {name!r} do not record its memory; refit them on that device")
    versions = {k: desc.get(k) for k in ("torch", "python", "cuda", "driver")}
    return DeviceContext(kind, torch.device("cpu"), name, desc.get("slug") or slugify(name),
                         list(desc.get("precisions") or ["fp32"]), float(mem), float(usable or mem),
                         desc.get("host_memory_gib"), int(desc.get("threads") or 1), versions,
                         host=desc.get("host") or "not recorded")


def processor(name: str) -> str:
    """A device name less the thread count a CPU's carries (``detect``: 'AMD EPYC (2 threads)' ->
    'AMD EPYC'); a GPU's name as it is."""
    return re.sub(r" \(\d+ threads\)$", "", name)


def detect(device: str | None = None) -> DeviceContext:
    """Describe ``device`` ('cpu', 'cuda', 'cuda:1'; default: cuda if available else cpu)."""
    from simulator.core.errors import UsageError

    try:
        dev = torch.device(device) if device else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
    except RuntimeError:
        raise UsageError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from None
    total, avail = _meminfo_gib()
    versions: dict[str, str | None] = {"torch": torch.__version__, "python": platform.python_version()}
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda requested but torch reports no CUDA device")
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        dev = torch.device("cuda", idx)
        props = torch.cuda.get_device_properties(idx)
        name = props.name
        torch.cuda.set_device(idx)
        free, total_b = torch.cuda.mem_get_info(idx)
        precisions = ["fp32", "tf32"]
        if torch.cuda.is_bf16_supported():
            precisions.append("bf16")
        precisions.append("fp16")
        versions.update(cuda=torch.version.cuda, driver=_nvidia_driver())
        return DeviceContext("cuda", dev, name, slugify(name), precisions, total_b / 2**30,
                             free / 2**30, total, torch.get_num_threads(), versions)
    if dev.type != "cpu":
        raise UsageError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:N]'")
    threads = torch.get_num_threads()
    model = _cpu_model()
    name = f"{model} ({threads} threads)"
    versions.update(cuda=None, driver=None)
    return DeviceContext("cpu", dev, name, "cpu-" + slugify(model), ["fp32", "bf16"],
                         total or 1.0, avail or total or 1.0, total, threads, versions)


def provenance_fields(ctx: DeviceContext, command: str) -> dict[str, str | None]:
    """Provenance keys of :class:`simulator.hardware.profile.Provenance` other than method/sources."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": ctx.versions.get("torch"),
        "cuda": ctx.versions.get("cuda"),
        "driver": ctx.versions.get("driver"),
        "host": ctx.host or socket.gethostname(),
        "command": command,
    }


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def match_catalog_gpu(device_name: str, memory_gib: float | None):
    """The :mod:`simulator.hardware.catalog` GPU whose id/name/alias occurs in ``device_name``
    (e.g. torch's 'NVIDIA A100-SXM4-80GB') and whose usable memory is within 12% of
    ``memory_gib`` (None: not known, the name alone decides); the longest such match wins. None
    if there is none (or no catalog)."""
    try:
        from simulator.hardware import catalog as hardware
    except Exception:  # noqa: BLE001 - the catalog module is optional for calibration
        return None
    target = _norm(device_name)
    best = None
    for gpu in hardware.catalog():
        if memory_gib is not None and abs(gpu.usable_memory_gib.value - memory_gib) > 0.12 * gpu.usable_memory_gib.value:
            continue
        for alias in [gpu.id, gpu.name, gpu.short_name, *gpu.aliases]:
            a = _norm(alias)
            if a and a in target and (best is None or len(a) > best[0]):
                best = (len(a), gpu)
    return best[1] if best else None


def catalog_peaks(ctx: DeviceContext) -> tuple[str | None, dict[str, float], float | None, str | None]:
    """Datasheet figures for a CUDA device found in the hardware catalog.

    Returns (gpu_id, dense peak TFLOPS per precision, memory bandwidth GB/s, source), or
    (None, {}, None, None) for CPUs and GPUs the catalog lacks (calibration then uses
    measured maxima as peaks).
    """
    if ctx.kind != "cuda":
        return None, {}, None, None
    gpu = match_catalog_gpu(ctx.name, ctx.memory_gib)
    if gpu is None:
        return None, {}, None, None
    peaks = {k: float(v.value) for k, v in gpu.peak_tflops.items()}
    return gpu.id, peaks, float(gpu.mem_bw_gbs.value), f"hardware catalog entry {gpu.id!r} (datasheet)"
