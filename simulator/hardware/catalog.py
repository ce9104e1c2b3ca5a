"""Hardware specs (GPUs, links, clusters) and the catalog that holds them.

The catalog is one validated YAML file per GPU (``hardware_catalog/gpus/<id>.yaml``) and
per link type (``hardware_catalog/links/<id>.yaml``), loaded through the installed package
and, additionally, from the folders named in ``$SIMULATOR_CATALOG_DIR`` (``os.pathsep``
separated; each with the same ``gpus/``, ``links/``, ``profiles/`` layout). A user file
with the id of a built-in entry replaces it.

Units: memory in GiB (2**30 bytes), bandwidths in GB/s (1e9 bytes/s), peaks in TFLOPS
(1e12 FLOP/s, dense, FP32 accumulate), latencies in microseconds, power in watts,
inter-node bandwidth in Gbit/s per node.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ValidationError, field_validator, model_validator

from ..core.errors import UsageError, did_you_mean, unknown
from ..core.strict import StrictModel
from ..core.vocab import PRECISIONS
from .profile import parse_profile

CATALOG_ENV = "SIMULATOR_CATALOG_DIR"


class Sourced(StrictModel, frozen=True):
    """A number with the source it comes from (publication, datasheet, or a labelled assumption)."""

    value: float
    source: str

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"value must be finite, got {v}")
        return v

    @field_validator("source")
    @classmethod
    def _nonempty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("source must be a non-empty string")
        return v.strip()


def _positive(s: Sourced | None, what: str) -> None:
    if s is not None and s.value <= 0:
        raise ValueError(f"{what} must be > 0, got {s.value}")


class GPUSpec(StrictModel, frozen=True):
    """One GPU model: memory, bandwidth, dense peaks per precision, links, prices."""

    id: str
    name: str
    short_name: str  # e.g. "RTX 3090 24 GB", used in reports
    aliases: list[str] = []
    vendor: str
    arch: str
    year: int
    consumer: bool  # GeForce: bf16/fp16 with FP32 accumulate is half the FP16-accumulate headline
    memory_gib: Sourced  # label capacity
    usable_memory_gib: Sourced  # what a PyTorch process can allocate after the CUDA context
    mem_bw_gbs: Sourced  # DRAM bandwidth, GB/s
    peak_tflops: dict[str, Sourced]  # dense, FP32 accumulate; keys among PRECISIONS
    board_power_w: Sourced
    intra_node_link: str  # default link id between GPUs of one node
    host_link: str  # link id host <-> device
    max_gpus_per_node: int = 8
    default_inter_node_link: str
    price_usd: Sourced | None = None
    cloud_usd_per_gpu_hr: Sourced | None = None

    @model_validator(mode="after")
    def _check(self) -> GPUSpec:
        for key in self.peak_tflops:
            if key not in PRECISIONS:
                raise ValueError(f"peak_tflops: unknown precision {key!r}; valid: {', '.join(PRECISIONS)}")
        if "fp32" not in self.peak_tflops:
            raise ValueError("peak_tflops needs at least 'fp32'")
        for key, val in self.peak_tflops.items():
            _positive(val, f"peak_tflops.{key}")
        for name in ("memory_gib", "usable_memory_gib", "mem_bw_gbs", "board_power_w"):
            _positive(getattr(self, name), name)
        _positive(self.price_usd, "price_usd")
        _positive(self.cloud_usd_per_gpu_hr, "cloud_usd_per_gpu_hr")
        if self.usable_memory_gib.value >= self.memory_gib.value:
            raise ValueError("usable_memory_gib must be below the label memory_gib")
        if self.max_gpus_per_node < 1:
            raise ValueError("max_gpus_per_node must be >= 1")
        return self

    @property
    def precisions(self) -> tuple[str, ...]:
        """Precisions this GPU has a peak for, in canonical order."""
        return tuple(p for p in PRECISIONS if p in self.peak_tflops)

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for ``precision`` (fp32 = CUDA cores, tf32/bf16/fp16/fp8 = tensor cores).

        Raises UsageError when the GPU has no such unit (e.g. bf16 on V100).
        """
        key = str(precision).lower()
        if key not in self.peak_tflops:
            raise UsageError(
                f"{self.short_name} has no {precision!r} peak; available precisions: "
                f"{', '.join(self.precisions)}"
            )
        return self.peak_tflops[key].value * 1e12


class LinkSpec(StrictModel, frozen=True):
    """A link type with its achievable ring-collective bus bandwidth and latency.

    ``busbw_gbs`` is busbw as nccl-tests defines it (GB/s per GPU, unidirectional): a ring
    all-reduce of S bytes over n ranks takes about ``latency + 2(n-1)/n * S / busbw``. For
    inter-node links it is the node's injection bandwidth ``gbits_per_node / 8 * efficiency``
    (NCCL runs one ring per NIC, so a ring that crosses nodes reaches about the whole node's
    NIC bandwidth; e.g. H200 4 nodes x 3,200 Gb/s: busbw 364.9 GB/s).
    """

    id: str
    name: str  # e.g. "PCIe 4.0 x16, no peer-to-peer"
    kind: Literal["intra", "inter", "host"]
    busbw_gbs: Sourced
    latency_us: Sourced  # alpha of the alpha-beta model, per collective call
    p2p: bool
    max_gpus: int | None = None  # e.g. 2 for NVLink bridges
    gbits_per_node: float | None = None  # inter-node only: NIC bandwidth per node, Gbit/s
    efficiency: Sourced | None = None  # inter-node only: busbw / (gbits_per_node / 8)

    @model_validator(mode="after")
    def _check(self) -> LinkSpec:
        _positive(self.busbw_gbs, "busbw_gbs")
        if self.latency_us.value < 0:
            raise ValueError("latency_us must be >= 0")
        if self.max_gpus is not None and self.max_gpus < 1:
            raise ValueError("max_gpus must be >= 1")
        if self.kind == "inter":
            if self.gbits_per_node is None or not (self.gbits_per_node > 0):
                raise ValueError("inter-node links need gbits_per_node > 0")
            if self.efficiency is None or not (0 < self.efficiency.value <= 1):
                raise ValueError("inter-node links need an efficiency in (0, 1]")
        elif self.gbits_per_node is not None:
            raise ValueError("gbits_per_node is only for inter-node links")
        return self

    @property
    def busbw_bytes_per_s(self) -> float:
        """Bus bandwidth in bytes/s."""
        return self.busbw_gbs.value * 1e9

    @property
    def latency_s(self) -> float:
        """Latency (alpha) in seconds."""
        return self.latency_us.value * 1e-6


class Cluster(StrictModel, frozen=True):
    """nodes x gpus_per_node identical GPUs with their intra-node, inter-node and host links."""

    gpu: GPUSpec
    nodes: int
    gpus_per_node: int
    intra: LinkSpec
    inter: LinkSpec | None = None  # None for a single node
    host: LinkSpec

    @property
    def n_gpus(self) -> int:
        """Total number of GPUs."""
        return self.nodes * self.gpus_per_node

    @property
    def text(self) -> str:
        """The canonical --gpus text, e.g. '8xrtx3090' or '2x8xa100-80gb-sxm'."""
        return cluster_text(self.nodes, self.gpus_per_node, self.gpu.id)

    def describe(self) -> str:
        """One line, e.g. '8 × RTX 3090 24 GB · PCIe 4.0 x16, no peer-to-peer'."""
        if self.nodes == 1:
            head = f"{self.gpus_per_node} × {self.gpu.short_name}"
            return head if self.gpus_per_node == 1 else f"{head} · {self.intra.name}"
        inter = f" · {self.inter.name}" if self.inter is not None else ""
        return (f"{self.nodes} nodes × {self.gpus_per_node} × {self.gpu.short_name} · "
                f"{self.intra.name}{inter}")


@dataclass(frozen=True)
class Catalog:
    """All GPUs, links and default-profile files, indexed by id."""

    gpus: dict[str, GPUSpec]
    links: dict[str, LinkSpec]
    profiles: dict[str, Traversable] = field(default_factory=dict)  # gpu id -> profile JSON
    origins: dict[str, str] = field(default_factory=dict)  # "gpu:<id>"/"link:<id>" -> file
    _names: dict[str, str] = field(default_factory=dict)  # normalized id/alias -> gpu id

    def __iter__(self):
        """Iterate over the GPUs, sorted by id."""
        return iter(self.gpus[k] for k in sorted(self.gpus))

    def __len__(self) -> int:
        return len(self.gpus)

    def gpu(self, name: str) -> GPUSpec:
        """GPU by id or alias (case-insensitive; '-', '_', ' ' ignored)."""
        gid = self._names.get(_norm(name))
        if gid is None:
            raise UsageError(
                f"unknown GPU {name!r}{did_you_mean(name, self.gpu_names())}; valid choices: "
                f"{', '.join(sorted(self.gpus))} (or an alias such as 3090, 4090, a6000, a100, h100, v100)")
        return self.gpus[gid]

    def link(self, name: str) -> LinkSpec:
        """Link by id (case-insensitive)."""
        key = str(name).strip().lower()
        if key not in self.links:
            raise unknown("link", name, self.links)
        return self.links[key]

    def gpu_names(self) -> list[str]:
        """Every id and alias a GPU can be named by."""
        names = set(self.gpus)
        for g in self.gpus.values():
            names.update(a.lower() for a in g.aliases)
        return sorted(names)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    return f"field {loc}: {err.get('msg', 'invalid')}"


def _read_yaml(f: Traversable) -> dict:
    try:
        data = yaml.safe_load(f.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(f"catalog file {str(f)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"catalog file {str(f)!r}: expected a mapping at the top level")
    return data


def _files(root: Traversable, sub: str, suffixes: tuple[str, ...]) -> list[Traversable]:
    d = root / sub
    if not d.is_dir():
        return []
    return sorted((f for f in d.iterdir() if f.is_file() and f.name.endswith(suffixes)),
                  key=lambda f: f.name)


def _roots(extra_dirs: tuple[str, ...]) -> list[Traversable]:
    roots: list[Traversable] = [resources.files("hardware_catalog")]
    for d in extra_dirs:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise UsageError(f"{CATALOG_ENV} entry {d!r} is not a folder; expected a folder "
                             "with gpus/*.yaml, links/*.yaml and/or profiles/*.json")
        roots.append(p)
    return roots


def _load(extra_dirs: tuple[str, ...]) -> Catalog:
    gpus: dict[str, GPUSpec] = {}
    links: dict[str, LinkSpec] = {}
    profiles: dict[str, Traversable] = {}
    origins: dict[str, str] = {}
    for root in _roots(extra_dirs):
        for sub, model, kind, into in (("links", LinkSpec, "link", links), ("gpus", GPUSpec, "GPU", gpus)):
            for f in _files(root, sub, (".yaml", ".yml")):
                try:
                    spec = model.model_validate(_read_yaml(f))
                except ValidationError as exc:
                    raise UsageError(f"{kind} file {str(f)!r} is malformed: {_first_error(exc)}") from None
                into[spec.id.lower()] = spec
                origins[f"{kind.lower()}:{spec.id.lower()}"] = str(f)
        for f in _files(root, "profiles", (".json",)):
            profiles[f.name[: -len(".json")].lower()] = f
    names: dict[str, str] = {}
    for gid in gpus:  # ids first, so an alias never shadows an id
        names[_norm(gid)] = gid
    for gid, gpu in gpus.items():
        for alias in gpu.aliases:
            names.setdefault(_norm(alias), gid)
    for gid, gpu in gpus.items():
        for attr in ("intra_node_link", "host_link", "default_inter_node_link"):
            ref = getattr(gpu, attr).lower()
            if ref not in links:
                raise UsageError(f"GPU file {origins['gpu:' + gid]!r}: {attr} {ref!r} is not a "
                                 f"catalog link{did_you_mean(ref, links)}")
    return Catalog(gpus=gpus, links=links, profiles=profiles, origins=origins, _names=names)


@functools.lru_cache(maxsize=8)
def _cached(extra_dirs: tuple[str, ...]) -> Catalog:
    return _load(extra_dirs)


def catalog() -> Catalog:
    """The hardware catalog: built-in files plus those under ``$SIMULATOR_CATALOG_DIR`` (cached)."""
    env = os.environ.get(CATALOG_ENV, "")
    dirs = tuple(d for d in env.split(os.pathsep) if d.strip())
    return _cached(dirs)


def clear_cache() -> None:
    """Forget loaded catalogs and profiles (after editing catalog files in the same process)."""
    _cached.cache_clear()
    _profile_at.cache_clear()


def get_gpu(name: str) -> GPUSpec:
    """GPU by id or alias, case-insensitive (e.g. '3090', 'a100' -> a100-80gb-sxm, 'h100' -> h100-sxm)."""
    return catalog().gpu(name)


def get_link(name: str) -> LinkSpec:
    """Link by id (e.g. 'pcie4-nop2p', 'nvswitch-3', 'ib-ndr')."""
    return catalog().link(name)


def list_gpus() -> list[GPUSpec]:
    """Every catalog GPU, sorted by id."""
    cat = catalog()
    return [cat.gpus[k] for k in sorted(cat.gpus)]


def list_links(kind: str | None = None) -> list[LinkSpec]:
    """Every catalog link (optionally only 'intra', 'inter' or 'host'), sorted by id."""
    cat = catalog()
    return [cat.links[k] for k in sorted(cat.links) if kind is None or cat.links[k].kind == kind]


def default_profile_path(gpu: str | GPUSpec) -> Traversable:
    """The default (published) efficiency profile file for a catalog GPU."""
    cat = catalog()
    spec = gpu if isinstance(gpu, GPUSpec) else cat.gpu(gpu)
    f = cat.profiles.get(spec.id.lower())
    if f is None:
        raise UsageError(f"no default profile for GPU {spec.id!r}; add profiles/{spec.id}.json "
                         f"to the catalog or pass a calibration profile")
    return f


def default_profile(gpu: str | GPUSpec):
    """The validated default efficiency profile (:class:`simulator.hardware.profile.Profile`), read once
    per process (every search needs it; :func:`clear_cache` forgets it). Treat it as read-only."""
    return _profile_at(default_profile_path(gpu))


@functools.lru_cache(maxsize=64)
def _profile_at(f: Traversable):
    import json


    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"profile {str(f)!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    return parse_profile(data, origin=str(f))


def profile_is_for(profile, gpu: GPUSpec) -> bool:
    """Whether ``profile`` describes the catalog GPU ``gpu``: its ``device.gpu_id`` names it (a CPU
    calibration or an uncatalogued GPU describes no catalog GPU). The rule behind simulate's
    (:func:`check_profile_device`) and validate's refusal of another device's profile."""
    return profile.device.gpu_id is not None and profile.device.gpu_id == gpu.id


def check_profile_device(profile, gpu: GPUSpec, gpus_text: str, any_gpu: bool = False) -> None:
    """A profile drives only the device it describes: the catalog GPU named by its
    ``device.gpu_id``. Anything else (a CPU calibration, an uncatalogued GPU, another catalog GPU)
    is a UsageError naming the profile's device and the explicit override, unless ``any_gpu``."""
    gid = profile.device.gpu_id
    if any_gpu or profile_is_for(profile, gpu):
        return
    what = (f"catalog GPU, device.gpu_id {gid!r}" if gid else
            f"a {profile.device.kind.upper() if profile.device.kind == 'cpu' else profile.device.kind} "
            "device outside the catalog")
    use = (f"--gpus Nx{gid}" if gid else "--gpus Nxlocal (the calibrated device itself)")
    raise UsageError(f"profile {profile.name!r} describes {profile.device.name!r} ({what}), not "
                     f"{gpu.short_name} (--gpus {gpus_text!r}); simulate {use}, or pass --profile-any-gpu "
                     f"(API: profile_any_gpu=True) to apply its efficiencies to {gpu.short_name} anyway")


_CLUSTER_FORMS = "GPU, NxGPU or NODESxGPUSxGPU (e.g. 3090, 8x3090, 2x8xa100-80gb)"
_CLUSTER_RE = re.compile(r"^(?:([+-]?\d+)\s*[x×*]\s*)?(?:([+-]?\d+)\s*[x×*]\s*)?(.*)$", re.IGNORECASE)


def _inter_link(base: LinkSpec, gbits: float) -> LinkSpec:
    eff = base.efficiency
    assert eff is not None
    busbw = gbits / 8.0 * eff.value
    return LinkSpec(
        id=f"custom-{gbits:g}gbit",
        name=f"{gbits:g} Gb/s per node (efficiency of {base.id})",
        kind="inter",
        busbw_gbs=Sourced(value=busbw, source=(
            f"--inter-node {gbits:g} Gbit/s per node / 8 x efficiency {eff.value:g} "
            f"(efficiency of {base.id}: {eff.source})")),
        latency_us=base.latency_us,
        p2p=base.p2p,
        gbits_per_node=gbits,
        efficiency=eff,
    )


def cluster_text(nodes: int, gpus_per_node: int, gpu_id: str) -> str:
    """The --gpus text of ``nodes`` x ``gpus_per_node`` GPUs ``gpu_id`` (what :func:`parse_cluster`
    reads): '8x3090' on one node, '2x8xa100' on several."""
    return f"{gpus_per_node}x{gpu_id}" if nodes == 1 else f"{nodes}x{gpus_per_node}x{gpu_id}"


def parse_cluster(text: str, intra_node: str | None = None,
                  inter_node_gbits: float | None = None) -> Cluster:
    """Parse '8x3090', '3090' (one GPU) or '2x8xa100-80gb' (nodes x GPUs per node x GPU).

    ``intra_node`` overrides the GPU's default intra-node link id; ``inter_node_gbits``
    replaces the default inter-node link by one with that NIC bandwidth per node (Gbit/s),
    keeping the default link's efficiency and latency. Raises UsageError on bad input.
    """
    raw = str(text).strip()
    m = _CLUSTER_RE.match(raw)
    if not raw or m is None or not m.group(3).strip():
        raise UsageError(f"malformed --gpus value {text!r}; expected {_CLUSTER_FORMS}")
    a, b, name = m.group(1), m.group(2), m.group(3).strip()
    if re.match(r"^[+-]?\d+\s*[x×*]", name):
        raise UsageError(f"--gpus {text!r} has more than two counts; expected {_CLUSTER_FORMS}")
    if name.lower() == "local":
        raise UsageError(f"--gpus {text!r}: a calibrated device is simulated as Nxlocal (one node of N "
                         "devices, with --profile); multi-node local clusters are not supported")
    counts = [int(c) for c in (a, b) if c is not None]
    for c in counts:
        if c <= 0:
            raise UsageError(f"GPU/node count {c} in {text!r} must be a positive integer; "
                             f"expected {_CLUSTER_FORMS}")
    if len(counts) == 2:
        nodes, per_node = counts
    else:
        nodes, per_node = 1, (counts[0] if counts else 1)
    cat = catalog()
    gpu = cat.gpu(name)
    if per_node > gpu.max_gpus_per_node:
        hint = ""
        if nodes == 1 and per_node % gpu.max_gpus_per_node == 0:
            hint = f" (for several nodes write {per_node // gpu.max_gpus_per_node}x{gpu.max_gpus_per_node}x{name})"
        raise UsageError(f"{per_node} GPUs per node in {text!r} exceeds {gpu.max_gpus_per_node}, the "
                         f"most a {gpu.short_name} node holds{hint}; expected {_CLUSTER_FORMS}")
    intra = cat.link(intra_node) if intra_node is not None else cat.link(gpu.intra_node_link)
    if intra.kind != "intra":
        choices = [k for k, v in cat.links.items() if v.kind == "intra"]
        raise UsageError(f"--intra-node {intra_node!r} is a {intra.kind} link, not an intra-node "
                         f"link; valid choices: {', '.join(sorted(choices))}")
    if intra.max_gpus is not None and per_node > intra.max_gpus:
        raise UsageError(f"{intra.id} ({intra.name}) connects at most {intra.max_gpus} GPUs, "
                         f"got {per_node} GPUs per node in {text!r}; use a PCIe link "
                         f"(e.g. pcie4-p2p) or at most {intra.max_gpus} GPUs per node")
    if inter_node_gbits is not None:
        try:
            g = float(inter_node_gbits)
        except (TypeError, ValueError):
            raise UsageError(f"--inter-node {inter_node_gbits!r} must be a number of Gbit/s per "
                             "node (e.g. 200 for one HDR InfiniBand port)") from None
        if not (math.isfinite(g) and g > 0):
            raise UsageError(f"--inter-node {inter_node_gbits!r} must be a positive number of "
                             "Gbit/s per node (e.g. 200 for one HDR InfiniBand port)")
    inter = None
    if nodes > 1:
        base = cat.link(gpu.default_inter_node_link)
        inter = base if inter_node_gbits is None else _inter_link(base, float(inter_node_gbits))
    return Cluster(gpu=gpu, nodes=nodes, gpus_per_node=per_node, intra=intra, inter=inter,
                   host=cat.link(gpu.host_link))
