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

    def describe(self) -> dict[str, object]:
        """JSON-able identity, stored in the measurements file to refuse mixing devices."""
        return {"kind": self.kind, "name": self.name, "slug": self.slug, "threads": self.threads,
                "precisions": list(self.precisions), **self.versions}


def detect(device: str | None = None) -> DeviceContext:
    """Describe ``device`` ('cpu', 'cuda', 'cuda:1'; default: cuda if available else cpu)."""
    from simulator.errors import UsageError

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
    """Provenance keys of :class:`simulator.profile.Provenance` other than method/sources."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": ctx.versions.get("torch"),
        "cuda": ctx.versions.get("cuda"),
        "driver": ctx.versions.get("driver"),
        "host": socket.gethostname(),
        "command": command,
    }


def catalog_peaks(ctx: DeviceContext) -> tuple[str | None, dict[str, float], float | None, str | None]:
    """Look the device up in ``simulator.hardware``'s catalog (CUDA only).

    Returns (gpu_id, dense peak TFLOPS per precision, memory bandwidth GB/s, source); empty
    when the catalog module is missing or has no matching GPU (calibration then uses
    measured maxima). Written defensively: the catalog API is owned by another module.
    """
    if ctx.kind != "cuda":
        return None, {}, None, None
    try:
        from simulator import hardware  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - optional dependency owned elsewhere
        return None, {}, None, None
    try:
        gpus = hardware.catalog()
        items = gpus.values() if isinstance(gpus, dict) else list(gpus)
        target = slugify(ctx.name)
        best = None
        for gpu in items:
            names = [getattr(gpu, "id", None), getattr(gpu, "name", None)]
            names += list(getattr(gpu, "aliases", []) or [])
            names += list(getattr(gpu, "device_names", []) or [])
            for n in names:
                if n and (slugify(str(n)) == target or slugify(str(n)) in target.split("nvidia-", 1)[-1]):
                    cand = slugify(str(n))
                    if best is None or len(cand) > best[0]:
                        best = (len(cand), gpu)
        if best is None:
            return None, {}, None, None
        gpu = best[1]
        peaks_raw = getattr(gpu, "peak_tflops", None) or {}
        peaks = {k: float(getattr(v, "value", v)) for k, v in dict(peaks_raw).items()}
        bw = getattr(gpu, "mem_bw_gbs", None)
        bw = float(getattr(bw, "value", bw)) if bw is not None else None
        gid = getattr(gpu, "id", None)
        return (str(gid) if gid else None), peaks, bw, f"hardware catalog entry {gid}"
    except Exception:  # noqa: BLE001 - fall back to measured peaks
        return None, {}, None, None
