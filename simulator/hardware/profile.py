"""Efficiency profiles: what a device achieves relative to its peaks.

One validated file format, written by calibration (``calibrate``) and used for the
catalog's default profiles (``hardware_catalog/profiles/<gpu_id>.json``, derived from
published microbenchmarks). Every fraction here is dimensionless; times are in
microseconds, bandwidths in GB/s (1e9 bytes/s), peaks in TFLOPS (1e12 FLOP/s, dense).

The kernel-time model these parameters feed lives in :mod:`simulator.physics.kernels`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from ..core.atomic import write_text_atomic
from ..core.errors import UsageError
from ..core.strict import StrictModel
from ..core.userfiles import parse_json, read_text
from ..core.vocab import ACTIVATIONS, PRECISIONS

SCHEMA_VERSION = 1


class StridedWalk(StrictModel):
    """A GEMM kernel without cache blocking that walks a strided column per dot product
    (PyTorch's reference bf16 ``mm`` NN on CPUs without bf16 BLAS), :func:`simulator.physics.kernels.strided_walk_factor`.

    The cache geometry is the device's (Linux sysfs ``/sys/devices/system/cpu/cpu0/cache``);
    the conflict and column terms are fitted to calibration's GEMM benchmarks."""

    line_bytes: int = Field(gt=0)
    l1_sets: int = Field(gt=0)
    l1_ways: int = Field(gt=0)
    l2_sets: int = Field(gt=0)
    l2_ways: int = Field(gt=0)
    conflict_lines: float = Field(gt=0, description="L1 lines the walk needs to keep to run unhindered")
    conflict_floor: float = Field(gt=0, le=1, description="efficiency factor of a walk that thrashes its L1 sets")
    sharpness: float = Field(gt=0, le=64, description="steepness of the conflict transition (assumption)")
    column_half: float = Field(gt=0, description="column length / L2 lines kept at the stride, at which "
                               "the column factor is halfway to its floor")
    column_floor: float = Field(gt=0, le=1, description="efficiency factor of a column far larger than the L2")
    source: str


#: upper bound of a GEMM's k-term steepness (``GemmEfficiency.k_power``): a measured drop sharper than
#: this is a step the calibration points cannot resolve
K_POWER_MAX = 8.0
#: Upper bound of ``gemm_misaligned`` and ``gemm_misaligned_bwd`` (time factors): an H200 ran GPT-2 XL's
#: 50257-column LM head 4.8-7.1x slower than aligned layer GEMMs of its width (calibration/results/h200/
#: microbench_shapes.csv, 2026-12-04); a factor past 10 would be no tensor-core kernel at all.
MISALIGNED_MAX = 10.0
#: Upper bound of ``grouped_gemm_m_half`` (rows per group): a grouped GEMM at twice the time of one
#: GEMM of all its rows even with 4096 rows per group would be no grouped kernel at all.
GROUPED_M_HALF_MAX = 4096.0


class GemmEfficiency(StrictModel):
    """Achieved fraction of the dtype's dense peak for a GEMM of shape (m, n, k).

    eff(m, n, k) = e_max * x / (x + x_half), with x = m*n*k / (m*n + n*k + m*k)
    (a shape "thickness" in elements: n/3 for a square GEMM, ~min dim for thin ones), times the
    per-dimension terms of blocked CPU kernels where calibrated (m_half, n_half, k_half, k_power;
    :func:`simulator.physics.kernels.gemm_efficiency`).
    """

    e_max: float = Field(gt=0, le=1)
    x_half: float = Field(ge=0, description="thickness at which eff = e_max/2 (elements)")
    m_half: float = Field(default=0.0, ge=0, description="rows (elements) at which the m term is 1/2; 0: none")
    n_half: float = Field(default=0.0, ge=0, description="columns (elements) at which the n term is 1/2; 0: none")
    k_half: float = Field(default=0.0, ge=0, description="reduction length (elements) at which the k term is "
                          "1/2; 0: none")
    k_power: float = Field(default=1.0, ge=1, le=K_POWER_MAX, description="steepness of the k term (1: hyperbolic)")
    operand_half_mib: float | None = Field(
        default=None, gt=0, description="size (MiB) of the (k x n) operand at which eff halves again "
        "(kernels without cache blocking, :func:`simulator.physics.kernels.operand_factor`); None: no dependence")
    operand_floor: float = Field(default=0.0, ge=0, le=1, description="efficiency of a large operand relative "
                                 "to a cache-resident one (with operand_half_mib)")
    strided: StridedWalk | None = None  # input-gradient layout only: the strided-column walk (None: none)
    source: str

    @property
    def halves(self) -> tuple[float, float, float]:
        """(m_half, n_half, k_half), elements."""
        return (self.m_half, self.n_half, self.k_half)

    @property
    def operand_half_bytes(self) -> float | None:
        return None if self.operand_half_mib is None else self.operand_half_mib * 2.0**20


class AttentionEfficiency(StrictModel):
    """Achieved fraction of the dtype's dense peak for fused attention kernels (FLOP-bound).

    'flash' and 'mem_efficient' are SDPA fused backends; 'math' (eager) is modelled as
    GEMMs plus bandwidth-bound softmax over the materialised s x s scores. The fused fractions
    are the large-head, long-sequence limits: the achieved fraction is scaled by
    d/(d + head_dim_half) * s/(s + seq_half) (:func:`simulator.physics.kernels.attention_efficiency`).
    """

    flash_fwd: float = Field(gt=0, le=1)
    flash_bwd: float = Field(gt=0, le=1)
    mem_efficient_fwd: float = Field(gt=0, le=1)
    mem_efficient_bwd: float = Field(gt=0, le=1)
    head_dim_half: float = Field(default=0.0, ge=0)  # elements; 0 = no head-size dependence
    seq_half: float = Field(default=0.0, ge=0)  # tokens; 0 = no sequence-length dependence
    # the fp32 (memory-efficient) kernel's own halves where its figures were fitted with other ones (None: the above)
    mem_efficient_head_dim_half: float | None = Field(default=None, ge=0)
    mem_efficient_seq_half: float | None = Field(default=None, ge=0)
    # where the flash figures come from: 'published' benchmark charts (another GPU's shape, another
    # kernel build: an end-to-end fit's attention_scale corrects them) or 'measured' on this device's own
    # SDPA at training shapes (causal, the training layouts), which an end-to-end fit leaves as they are
    basis: Literal["published", "measured"] = "published"
    source: str


#: Fused-attention kernels a profile may time apart from ``attention`` (FlashAttention-2, the flash backend
#: of torch SDPA and the flash-attn package): ``cudnn``, cuDNN's fused flash attention (what torch SDPA
#: dispatches to on sm90 and later, and Transformer Engine's FusedAttention), a stack's choice
#: (:attr:`simulator.strategy.stacks.Stack.attention_kernel`)
ATTENTION_KERNELS = ("cudnn",)


class FreshMemory(StrictModel):
    """First touch of freshly mapped host memory (page faults + zeroing), CPU devices.

    The C allocator (glibc malloc) maps every tensor of at least ``mmap_bytes`` anew and unmaps
    it when freed; smaller tensors come from a heap whose free top is returned to the OS once it
    exceeds a trim threshold. A step that allocates T bytes in small tensors therefore re-faults
    about T * T^2 / (T^2 + keep_bytes^2) of them, and all of its large tensors, each byte at
    ``gbs`` (1e9 bytes/s) on top of the work done with it. Fitted by ``calibrate`` (``fresh``
    benches); GPU caching allocators reuse their blocks (no such term).
    """

    gbs: float = Field(gt=0, description="bytes/s (1e9) at which fresh pages are faulted in")
    keep_bytes: float = Field(ge=0, description="small-tensor bytes per step the heap keeps mapped")
    mmap_bytes: float = Field(default=32 * 2**20, gt=0, description=(
        "tensors at least this large are always fresh; glibc DEFAULT_MMAP_THRESHOLD_MAX "
        "(4 * 1024 * 1024 * sizeof(long) = 32 MiB on 64-bit, mallopt(3))"))
    source: str


#: Op classes with their own bandwidth efficiency (``Profile.bw_eff_ops``): norms/activations/
#: residual adds, eager softmax, cross-entropy over the logits, embedding gather and its gradient,
#: autocast weight casts; the operand and output traffic of GEMMs (the memory side of their roofline); and
#: ``broadcast``, elementwise kernels that broadcast one operand and promote another's dtype (Hugging Face's
#: eager attention mask add under torch.autocast: half scores + an fp32 [b, 1, s, s] mask -> fp32; its eager
#: rotary, half Q/K times fp32 [1, 1, s, d] cos/sin tables, and the copies of permuted Q/K/V views), which
#: PyTorch's CUDA TensorIterator runs in its generic, non-vectorized ``elementwise_kernel`` with casts on load.
BW_OP_CLASSES = ("elementwise", "softmax", "loss", "embedding", "cast", "gemm", "broadcast")
#: ``broadcast`` kernels' bandwidth over a plain copy's on a CUDA GPU whose profile has no figure of its own:
#: an NVIDIA H200 ran the mask add of Pythia-160M's eager attention (bf16 [8, 12, 2048, 2048] scores + fp32
#: [8, 1, 2048, 2048] mask -> fp32, 10 bytes per score) at 1.69 TB/s (2.383 ms a layer; torch.profiler,
#: calibration/results/h200/prof_p160m_eager_s2048_mb8.txt) and a bf16 copy of 128-512 MiB at 3.05-3.60 TB/s
#: (microbench_shapes.csv copy_bf16): 1.69 / 3.60 = 0.47. MEASURED on one GPU, applied to every CUDA GPU
#: until calibrated; a CPU's vectorized loops have no such split, so a CPU profile uses its copy figure.
BROADCAST_COPY_RATIO = 0.47
#: Element types an eager MLP activation runs in: fp32 (also under TF32) or the autocast half type.
ACTIVATION_DTYPES = ("fp32", "bf16", "fp16")
#: Suffix of an activation's backward bandwidth class
BWD_SUFFIX = ".bwd"
#: Bandwidth classes of eager MLP activations, per activation, element type and direction: the
#: forward kernel (``activation.<act>.<dtype>``: reads the input, writes the output) and the
#: backward's (``activation.<act>.<dtype>.bwd``: reads the output gradient and the input, writes
#: the input gradient). On a CPU the tanh-approximated GELU is compute-bound (~3x the exact GELU's
#: time) and its backward costs about what its forward does, not the 1.5x its bytes say
#: (calibration/benches/bandwidth.py ``activation/``, ``activation_bwd/``). Absent from a profile,
#: a backward class runs at its forward's efficiency and a forward class at the ``elementwise``
#: class's.
ACTIVATION_CLASSES = tuple(f"activation.{a}.{d}{s}" for a in ACTIVATIONS for d in ACTIVATION_DTYPES
                           for s in ("", BWD_SUFFIX))


def activation_class(activation: str, precision: str, backward: bool = False) -> str:
    """The bandwidth class of an eager MLP ``activation`` under ``precision`` (fp32 for fp32/TF32),
    of its forward kernel or (``backward``) of its backward kernel."""
    dt = precision if precision in ACTIVATION_DTYPES else "fp32"
    return f"activation.{activation}.{dt}{BWD_SUFFIX if backward else ''}"


class CollectiveFit(StrictModel):
    """alpha-beta model of one collective over one link: t = alpha + bytes_bus / busbw."""

    alpha_us: float = Field(ge=0)
    busbw_gbs: float = Field(gt=0)
    source: str


def _check_map(v: dict[str, float], name: str, valid, lo: float, hi: float, bounds: str,
               lo_closed: bool = False) -> dict[str, float]:
    """Check a ``{key: value}`` profile field: every key among ``valid``, every value finite and
    in (lo, hi] (``lo_closed``: [lo, hi]); ``bounds`` words the range for the error message."""
    for key, val in v.items():
        if key not in valid:
            raise ValueError(f"{name}: unknown key {key!r}; valid: {', '.join(valid)}")
        if not (math.isfinite(val) and (val >= lo if lo_closed else val > lo) and val <= hi):
            raise ValueError(f"{name}[{key}] must be {bounds}")
    return v


class DeviceInfo(StrictModel):
    """The device a profile describes (enough to simulate it as ``1xlocal``)."""

    kind: Literal["cuda", "cpu", "rocm"]
    name: str
    gpu_id: str | None = None  # catalog id when the device is a catalog GPU
    peak_tflops: dict[str, float]  # dense peaks per precision, TFLOPS
    mem_bw_gbs: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    usable_memory_gib: float = Field(gt=0)
    host_memory_gib: float | None = None
    board_power_w: float | None = None

    @field_validator("peak_tflops")
    @classmethod
    def _peaks(cls, v: dict[str, float]) -> dict[str, float]:
        _check_map(v, "peak_tflops", PRECISIONS, 0.0, math.inf, "a positive finite number")
        if "fp32" not in v:
            raise ValueError("peak_tflops needs at least 'fp32'")
        return v


class Provenance(StrictModel):
    # published: bundled (datasheets, published benchmarks, the dev runs); calibration: `calibrate`'s
    # microbenchmarks; fitted: `calibrate --from-runs` on the user's own runs
    method: Literal["published", "calibration", "fitted"]
    date: str
    sources: list[str] = []
    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    host: str | None = None
    command: str | None = None
    # CPU: how the measuring process's C allocator treated freed memory ('keep': glibc kept it,
    # nothing re-faulted; 'default': glibc as shipped; calibration/host_alloc.py); None: not recorded
    host_allocator: Literal["keep", "default", "mixed"] | None = None


class ValidationSummary(StrictModel):
    """Residuals of predicted vs measured step time / throughput, for intervals.

    residuals are log(measured / predicted) of throughput-equivalent quantities
    (positive = real run slower than predicted... see ``simulator.answer.uncertainty``).
    """

    source: str
    n: int = Field(ge=0)
    mape: float = Field(ge=0)
    log_ratio_residuals: list[float] = []
    mape_cv: float | None = None  # cross-validated MAPE behind the residuals, where they are held-out
    widen: float = Field(default=1.0, ge=1.0)  # spread multiplier for a GPU whose residuals are borrowed


class FitParameter(StrictModel):
    """One fitted, physically named parameter: its value, bounds and starting point."""

    value: float
    lower: float
    upper: float
    start: float
    meaning: str


class RunsFit(StrictModel):
    """Provenance of ``calibrate --from-runs``: which runs, which sources, what was fitted, how well."""

    method: str
    date: str
    n_runs: int = Field(ge=0)
    sources: dict[str, int]  # source -> runs used
    runs: list[str] = []  # run ids (file:line)
    base_profile: str
    parameters: dict[str, FitParameter]
    mape_in_sample: float = Field(ge=0)
    mape_loo: float | None = None  # leave one run out
    mape_loso: float | None = None  # leave one source out
    coverage80_heldout: float | None = None  # share of held-out runs inside the stored 80% interval
    carried_over: str | None = None  # for a GPU with no runs: what was carried over from which fit


class Profile(StrictModel):
    schema_version: int
    name: str
    device: DeviceInfo
    provenance: Provenance
    gemm: dict[str, GemmEfficiency]  # per precision actually executed: fp32, tf32, bf16, fp16
    attention: AttentionEfficiency
    # further fused-attention kernels timed apart (ATTENTION_KERNELS: half precision only; absent, a stack that
    # asks for one runs at ``attention``'s flash figures)
    attention_kernels: dict[str, AttentionEfficiency] = {}
    memory_bw_eff: float = Field(gt=0, le=1)  # of device.mem_bw_gbs, bandwidth-bound kernels
    memory_bw_eff_source: str
    launch_overhead_us: float = Field(ge=0)  # per kernel, eager PyTorch
    compiled_launch_overhead_us: float = Field(ge=0)  # per fused kernel under torch.compile
    launch_source: str
    optimizer_bw_eff: dict[str, float]  # 'fused', 'foreach', 'for_loop' -> fraction of mem bw
    optimizer_source: str
    host_to_device_gbs: float = Field(gt=0)  # pinned copies
    host_to_device_pageable_gbs: float | None = None
    host_source: str
    cpu_adam_gparams_per_s: float = Field(gt=0)  # CPU Adam throughput for offload, 1e9 params/s
    cpu_adam_source: str
    collectives: dict[str, CollectiveFit] = {}  # optional overrides keyed by link id
    # End-to-end effects (fitted by `calibrate --from-runs`; defaults leave the microbenchmark model as is)
    layer_overhead_us: float = Field(default=0.0, ge=0, le=2000)  # host time per layer per pass, not hidden
    collective_busbw_eff: float = Field(default=1.0, gt=0, le=1)  # of the links' bus bandwidth, in training
    collective_overlap: float = Field(default=1.0, ge=0, le=1)  # of concurrent compute a collective hides behind
    collective_hop_latency_us: float = Field(default=0.0, ge=0, le=1000)  # per extra ring step across nodes
    end_to_end_source: str | None = None  # where the four values above come from
    fit: RunsFit | None = None  # provenance of a `calibrate --from-runs` fit
    validation: ValidationSummary | None = None
    # Optional refinements fitted by `calibrate` (absent: the single figures above apply, so
    # catalog profiles predict exactly as before).
    gemm_bwd: dict[str, GemmEfficiency] = {}  # backward GEMM layouts per precision: input gradient g @ W
    # (and the weight gradient g^T @ x too unless gemm_wgrad has the precision)
    gemm_wgrad: dict[str, GemmEfficiency] = {}  # weight-gradient layout g^T @ x, where calibrated apart
    bw_eff_ops: dict[str, float] = {}  # per op class (BW_OP_CLASSES) -> fraction of mem bw
    bw_eff_ops_source: str | None = None
    fresh_memory: FreshMemory | None = None  # host page-fault cost of fresh tensors (CPU)
    optimizer_tensor_us: float | None = Field(default=None, ge=0)  # host time per parameter tensor per step
    # host time per counted kernel of an eager training pass beyond launch_overhead_us (module calls,
    # views, autograd recording in the forward, autograd-engine nodes in the backward), us
    train_fwd_kernel_us: float | None = Field(default=None, ge=0, le=1000)
    train_bwd_kernel_us: float | None = Field(default=None, ge=0, le=1000)
    # the same under autocast (bf16/fp16 mixed precision: input casts and autocast dispatch per op), us;
    # absent: the values above
    train_fwd_kernel_us_amp: float | None = Field(default=None, ge=0, le=1000)
    train_bwd_kernel_us_amp: float | None = Field(default=None, ge=0, le=1000)
    # time factor of a misaligned GEMM's forward (simulator.physics.compute.misaligned_gemms: on a CPU, output
    # rows that are not whole 64-byte cache lines; on a GPU, a weight dimension that is not a multiple of
    # 16 bytes, e.g. GPT-2's 50257-token LM head), per precision; absent: 1
    # (calibration/benches/gemm_align.py)
    gemm_misaligned: dict[str, float] = {}
    # the same for both backward GEMMs (input and weight gradient), whose gradient operand has the
    # forward output's misaligned rows; absent: 1 (a CPU's fit measures the forward only)
    gemm_misaligned_bwd: dict[str, float] = {}
    gemm_misaligned_source: str | None = None
    # grouped GEMMs (a mixture of experts' experts, Op.grouped): rows per group at which a grouped GEMM
    # of g groups of m rows takes twice the time of one GEMM of their g x m rows (time factor
    # 1 + m_half / m), per precision; absent: each group timed as its own GEMM of m rows
    # (calibration/benches/grouped_gemm.py)
    grouped_gemm_m_half: dict[str, float] = {}
    grouped_gemm_m_half_source: str | None = None
    spread: dict[str, float] = {}  # relative IQR of each fitted parameter over measurement resamples
    # fitted parameters that sit at a bound (an efficiency at the peak, a GEMM asymptote capped just above
    # the best point measured): what the measurements could not pin down, and why; written by `calibrate`
    fit_warnings: list[str] = []
    # Sustained fp32 atomicAdd rate into global memory (L2), 1e9 adds/s, where `calibrate --from-runs`
    # fitted it (absent: the family fit's value for this GPU, simulator.hardware.rates.atomic_rate)
    fp32_atomic_rate: float | None = Field(default=None, gt=0)

    @field_validator("bw_eff_ops")
    @classmethod
    def _bw_ops(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_map(v, "bw_eff_ops", BW_OP_CLASSES + ACTIVATION_CLASSES, 0.0, 1.0, "in (0, 1]")

    @field_validator("attention_kernels")
    @classmethod
    def _attention_kernels(cls, v: dict[str, AttentionEfficiency]) -> dict[str, AttentionEfficiency]:
        bad = [k for k in v if k not in ATTENTION_KERNELS]
        if bad:
            raise ValueError(f"attention_kernels: unknown key {bad[0]!r}; valid: {', '.join(ATTENTION_KERNELS)}")
        return v

    def attention_kernel(self, kernel: str) -> AttentionEfficiency:
        """The fused-attention efficiencies of ``kernel`` (``flash`` or one of :data:`ATTENTION_KERNELS`):
        its own where timed apart, else ``attention``'s."""
        return self.attention_kernels.get(kernel, self.attention)

    @field_validator("gemm_misaligned", "gemm_misaligned_bwd")
    @classmethod
    def _misaligned(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        return _check_map(v, info.field_name, PRECISIONS, 1.0, MISALIGNED_MAX, f"in [1, {MISALIGNED_MAX:g}]",
                          lo_closed=True)

    @field_validator("grouped_gemm_m_half")
    @classmethod
    def _grouped(cls, v: dict[str, float]) -> dict[str, float]:
        return _check_map(v, "grouped_gemm_m_half", PRECISIONS, 0.0, GROUPED_M_HALF_MAX,
                          f"in [0, {GROUPED_M_HALF_MAX:g}] rows", lo_closed=True)

    def bw_eff(self, op: str) -> float:
        """Bandwidth efficiency of op class ``op`` (``memory_bw_eff`` unless calibrated apart; an
        activation's backward class not calibrated: its forward class's; a forward class not
        calibrated: the ``elementwise`` class's; ``broadcast`` not calibrated on a GPU:
        :data:`BROADCAST_COPY_RATIO` of ``memory_bw_eff``)."""
        if op not in self.bw_eff_ops and op in ACTIVATION_CLASSES and op.endswith(BWD_SUFFIX):
            op = op.removesuffix(BWD_SUFFIX)
        if op not in self.bw_eff_ops and op in ACTIVATION_CLASSES:
            op = "elementwise"
        if op == "broadcast" and op not in self.bw_eff_ops and self.device.kind != "cpu":
            return self.memory_bw_eff * BROADCAST_COPY_RATIO
        return self.bw_eff_ops.get(op, self.memory_bw_eff)

    def gemm_bwd_for(self, precision: str) -> GemmEfficiency:
        """GEMM efficiency of the backward layouts (the forward's unless calibrated apart)."""
        return self.gemm_bwd.get(precision) or self.gemm_for(precision)

    def gemm_wgrad_for(self, precision: str) -> GemmEfficiency:
        """GEMM efficiency of the weight-gradient layout g^T @ x (``gemm_bwd_for`` unless calibrated apart)."""
        return self.gemm_wgrad.get(precision) or self.gemm_bwd_for(precision)

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {v}; this simulator reads version {SCHEMA_VERSION}")
        return v

    @field_validator("gemm")
    @classmethod
    def _gemm_keys(cls, v: dict[str, GemmEfficiency]) -> dict[str, GemmEfficiency]:
        if "fp32" not in v:
            raise ValueError("gemm needs at least 'fp32'")
        for key in v:
            if key not in PRECISIONS:
                raise ValueError(f"gemm: unknown precision {key!r}; valid: {', '.join(PRECISIONS)}")
        return v

    @field_validator("optimizer_bw_eff")
    @classmethod
    def _opt_keys(cls, v: dict[str, float]) -> dict[str, float]:
        for key, val in v.items():
            if key not in ("fused", "foreach", "for_loop"):
                raise ValueError(f"optimizer_bw_eff: unknown implementation {key!r}")
            if not (math.isfinite(val) and 0 < val <= 1):
                raise ValueError(f"optimizer_bw_eff[{key}] must be in (0, 1]")
        return v

    def gemm_for(self, precision: str) -> GemmEfficiency:
        """GEMM efficiency for the precision GEMMs execute in (falls back to bf16/fp16 peers; fp8
        without a fit of its own to bf16's, which FP8 GEMMs reach a few percent below in practice)."""
        if precision in self.gemm:
            return self.gemm[precision]
        for alt in {"bf16": ("fp16",), "fp16": ("bf16",), "tf32": ("fp32",), "fp8": ("bf16", "fp16")}.get(precision, ()):
            if alt in self.gemm:
                return self.gemm[alt]
        return self.gemm["fp32"]


def comm_params(profile: Profile | None) -> dict:
    """The profile's collective parameters as :class:`simulator.physics.communication.Fabric` keywords."""
    if profile is None:
        return {}
    return {"busbw_eff": profile.collective_busbw_eff, "hop_alpha": 1e-6 * profile.collective_hop_latency_us,
            "overlap": profile.collective_overlap}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
    return f"field {loc}: {err.get('msg', 'invalid')}"


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and validate a profile file; raise UsageError naming the file and the field."""
    p = Path(path)
    return parse_profile(parse_json(read_text(p, "profile"), f"profile {str(p)!r}"), origin=str(p))


def parse_profile(data: object, origin: str = "<profile>") -> Profile:
    """Validate an already-parsed profile mapping."""
    if not isinstance(data, dict):
        raise UsageError(f"profile {origin!r}: expected a JSON object at the top level")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"profile {origin!r} is malformed: {_first_error(exc)}") from None


def write_json_atomic(path: str | os.PathLike, data: object) -> None:
    """Write JSON to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def save_profile(profile: Profile, path: str | os.PathLike) -> None:
    """Validate and write a profile atomically (without ``fit_warnings`` where there are none)."""
    data = profile.model_dump(mode="json")
    if not data["fit_warnings"]:
        del data["fit_warnings"]
    write_json_atomic(path, data)
