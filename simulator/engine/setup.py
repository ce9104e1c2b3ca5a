"""User input to a search problem: model, recipe, cluster, device and the knob space.

:mod:`simulator.answer.api` runs the search on it and turns the result into plans.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel

from ..core.errors import UsageError
from ..core.vocab import FP8, PRECISIONS, ROUTINGS
from ..hardware import catalog as hardware
from ..hardware.device import GIB, device_from_profile, device_from_spec
from ..hardware.profile import Profile, comm_params, load_profile
from ..model.families import family_of
from ..model.presets import model_from_dict
from ..model.recipes import Recipe, make_recipe, rounding_note
from ..model.resolve import resolve_model
from ..model.spec import ModelSpec
from ..physics import communication as comm
from ..strategy.knobs import (
    ATTENTIONS,
    CHECKPOINTINGS,
    COMPILES,
    OFFLOADS,
    SHARDINGS,
    check_choice,
    check_pins,
    checkpointed_layers,
    parse_checkpointing,
)
from ..strategy.layout import Parallelism, allowed_layouts
from ..strategy.stacks import get_stack
from .estimate import Problem, Space

#: Default host RAM per node when offloading (GiB): twice the node's GPU memory, at least 64.
#: Assumption (common server sizing rule for offload-capable training boxes); --host-memory.
HOST_RAM_FACTOR, HOST_RAM_MIN_GIB = 2.0, 64.0

_LOCAL_RE = re.compile(r"^(?:(\d+)\s*x\s*)?local$", re.IGNORECASE)


@dataclass
class Setup:
    """Model, recipe, hardware and device resolved from user input."""

    model: ModelSpec
    recipe: Recipe
    problem: Problem
    hardware: dict
    profile: Profile
    notes: list[str]
    overhead: float = 0.0  # extra wall-clock fraction: data loading, evaluation, checkpoints, failures


def _as_profile(profile) -> Profile | None:
    if profile is None or isinstance(profile, Profile):
        return profile
    if not isinstance(profile, (str, os.PathLike)):
        raise UsageError(f"profile must be a file path or a simulator.Profile, got {type(profile).__name__} "
                         f"{profile!r}")
    return load_profile(profile)


def resolve_model_input(model) -> ModelSpec:
    """A spec object (validated again: pydantic checks only at construction, and
    ``model_copy(update=...)`` skips it), a preset name or a config path; a path that exists but
    is not a config file (a device such as /dev/null, an empty file) is named as such rather than
    reported as an unknown preset."""
    if isinstance(model, BaseModel):
        return model_from_dict(model.model_dump())
    if not isinstance(model, (str, os.PathLike)):
        raise UsageError(f"model must be a preset name, a config.json path or a simulator.ModelSpec, "
                         f"got {type(model).__name__} {model!r}")
    text = os.fspath(model)
    if os.path.isdir(text) and not os.path.isfile(os.path.join(text, "config.json")):
        raise UsageError(f"--model {text!r} is a folder without a config.json; expected a preset name, a "
                         "config.json file or a folder holding one")
    if os.path.exists(text) and not os.path.isdir(text):
        from ..core.userfiles import check_regular_file

        check_regular_file(text, "--model config")
    return resolve_model(text)


def _local_setup(text: str, profile: Profile | None):
    m = _LOCAL_RE.match(text.strip())
    if not m:
        return None
    if profile is None:
        raise UsageError(f"--gpus {text!r} simulates a calibrated device: pass --profile FILE "
                         "(written by `calibrate`)")
    n = int(m.group(1) or 1)
    if n <= 0:
        raise UsageError(f"GPU count in --gpus {text!r} must be a positive integer")
    dev = device_from_profile(profile)
    fit = profile.collectives.get("local")
    if n > 1 and fit is None:
        raise UsageError(f"--gpus {text!r}: the profile {profile.name!r} has no 'local' collective "
                         "fit; run `calibrate --nproc N` to measure one, or use 1xlocal")
    fab = comm.Fabric(1, n, fit.busbw_gbs * 1e9 if fit else 1.0, fit.alpha_us * 1e-6 if fit else 0.0, 0.0, 0.0,
                      **comm_params(profile))
    hw = {"description": f"{n} × {profile.device.name} (calibrated device)", "gpu": profile.device.name,
          "gpu_id": "local", "n_gpus": n, "nodes": 1, "gpus_per_node": n,
          "intra_node": "local (calibrated)" if n > 1 else None, "inter_node": None,
          "board_power_w": profile.device.board_power_w, "price_usd": None, "cloud_usd_per_gpu_hr": None}
    host = (profile.device.host_memory_gib or HOST_RAM_MIN_GIB) * GIB
    return dev, fab, hw, host


def _catalog_setup(text, profile, intra_node, inter_node, any_gpu=False):
    cl = hardware.parse_cluster(text, intra_node=intra_node, inter_node_gbits=inter_node)
    prof = profile or hardware.default_profile(cl.gpu)
    if profile is not None:
        hardware.check_profile_device(profile, cl.gpu, text, any_gpu)
    dev = device_from_spec(cl.gpu, prof)

    def link_fit(link):
        # a calibration measures collectives among the local GPUs: key "local" (or the link id)
        f = prof.collectives.get(link.id) or (prof.collectives.get("local") if link is cl.intra else None)
        return (f.busbw_gbs * 1e9, f.alpha_us * 1e-6) if f else (link.busbw_bytes_per_s, link.latency_s)

    ib, ia = link_fit(cl.intra)
    eb, ea = link_fit(cl.inter) if cl.inter is not None else (0.0, 0.0)
    fab = comm.Fabric(cl.nodes, cl.gpus_per_node, ib, ia, eb, ea, **comm_params(prof))
    g = cl.gpu
    hw = {"description": cl.describe(), "gpu": g.short_name, "gpu_id": g.id, "n_gpus": cl.n_gpus,
          "nodes": cl.nodes, "gpus_per_node": cl.gpus_per_node,
          "intra_node": cl.intra.name if cl.gpus_per_node > 1 else None,
          "inter_node": cl.inter.name if cl.inter is not None else None,
          "board_power_w": g.board_power_w.value,
          "price_usd": g.price_usd.value if g.price_usd else None,
          "cloud_usd_per_gpu_hr": g.cloud_usd_per_gpu_hr.value if g.cloud_usd_per_gpu_hr else None}
    host = max(HOST_RAM_MIN_GIB, HOST_RAM_FACTOR * cl.gpus_per_node * g.memory_gib.value) * GIB
    return dev, fab, hw, host


def setup(model, gpus, *, profile=None, tokens=None, steps=None, global_batch=None, seq_len=None,
          optimizer=None, intra_node=None, inter_node=None, host_memory=None, overhead=None,
          stack=None, profile_any_gpu=False, capacity_factor=None, moe_dispatcher=None,
          moe_a2a_overlap=None, moe_routing=None, overlap_grad_reduce=None) -> Setup:
    """Resolve user-level inputs into a Problem (no strategy yet).

    ``stack``: the training software (simulator.strategy.stacks preset name; default hf-trainer).
    ``capacity_factor``: a mixture of experts' routing (``MoESpec.capacity_factor``; None: dropless).
    ``moe_routing``: where its tokens' experts lie (``MoESpec.routing``; None: uniform).
    ``moe_dispatcher``, ``moe_a2a_overlap``: how the stack's expert parallelism sends tokens
    (:func:`with_dispatcher`). ``overlap_grad_reduce``: whether the data-parallel gradient reduction
    runs during backward (None: the stack's ``grad_reduce_overlap``; :func:`with_grad_overlap`).

    ``overhead``: wall-clock time beyond the training steps, as a fraction of it (data loading,
    evaluation, checkpointing, restarts after failures); excluded (0) by default, docs/architecture.md, physics 7.
    """
    stk = with_grad_overlap(with_dispatcher(get_stack(stack), moe_dispatcher, moe_a2a_overlap), overlap_grad_reduce)
    spec = with_routing(with_capacity_factor(resolve_model_input(model), capacity_factor, stk), moe_routing)
    recipe = make_recipe(spec, tokens=tokens, steps=steps, global_batch=global_batch,
                         seq_len=seq_len, optimizer=optimizer)
    prof = _as_profile(profile)
    if isinstance(gpus, str) and _LOCAL_RE.match(gpus.strip()):
        dev, fab, hw, host = _local_setup(gpus, prof)
    else:
        dev, fab, hw, host = _catalog_setup(str(gpus), prof, intra_node, inter_node, bool(profile_any_gpu))
        prof = dev.profile
    if host_memory is not None:
        if not (isinstance(host_memory, (int, float)) and math.isfinite(host_memory) and host_memory > 0):
            raise UsageError(f"--host-memory must be a positive number of GiB, got {host_memory!r}")
        host = float(host_memory) * GIB
    notes = [n for n in (rounding_note(spec, recipe, tokens, steps),) if n]
    if recipe.global_batch >= fab.n and recipe.global_batch % fab.n:
        notes.append(f"global batch {recipe.global_batch} is not divisible by {fab.n} GPUs; "
                     f"the busiest GPU processes {math.ceil(recipe.global_batch / fab.n)} samples")
    extra = 0.0
    if overhead is not None:
        if not (isinstance(overhead, (int, float)) and math.isfinite(overhead) and 0 <= overhead <= 10):
            raise UsageError(f"--overhead must be a fraction of the training time between 0 and 10 "
                             f"(e.g. 0.05 or 5%), got {overhead!r}")
        extra = float(overhead)
        if extra:
            notes.append(f"days include {extra:.0%} overhead beyond training steps (data loading, "
                         "evaluation, checkpoints, failures)")
    pb = Problem(model=spec, seq_len=recipe.seq_len, global_batch=recipe.global_batch,
                 optimizer=recipe.optimizer, device=dev, fabric=fab, host_memory=host,
                 gpu_label=hw["gpu"], stack=stk)
    return Setup(spec, recipe, pb, hw, prof, notes, extra)


def with_capacity_factor(spec, capacity_factor, stack):
    """``spec`` routed with ``capacity_factor`` (a mixture of experts; None: as it is) on
    ``stack``; UsageError in one line otherwise (Hugging Face's eager expert loop has no capacity:
    it drops and pads nothing)."""
    if capacity_factor is None:
        return spec
    if not hasattr(spec, "capacity_factor"):
        raise UsageError(f"--capacity-factor: {spec.display_name} is not a mixture of experts")
    if stack.moe_experts == "loop":
        raise UsageError(f"--capacity-factor: the {stack.display} stack runs Hugging Face's eager expert loop, "
                         "which drops and pads nothing (dropless); use --stack megatron-lm or torchtitan")
    bound = spec.n_experts / spec.top_k
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or \
            not 0 < capacity_factor <= bound:
        raise UsageError(f"--capacity-factor must be a number above 0 and at most n_experts / top_k = {bound:g} "
                         f"(each expert's buffer over its mean tokens; 1.0-1.25 is usual), got {capacity_factor!r}")
    return spec.model_copy(update={"capacity_factor": float(capacity_factor)})


def with_routing(spec, routing):
    """``spec`` with its tokens routed as ``routing`` (None: as it is); UsageError in one line
    for a model without experts or an unknown routing."""
    if routing is None:
        return spec
    if not hasattr(spec, "routing"):
        raise UsageError(f"--moe-routing: {spec.display_name} is not a mixture of experts")
    if routing not in ROUTINGS:
        raise UsageError(f"--moe-routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    return spec.model_copy(update={"routing": routing})


#: The expert-parallel dispatchers (:attr:`simulator.strategy.stacks.Stack.moe_dispatcher`) and where each runs.
DISPATCHERS = {"alltoall": "NCCL all-to-all of every routed copy (Megatron-LM --moe-token-dispatcher-type alltoall)",
               "deepep": "DeepEP (Megatron-LM --moe-token-dispatcher-type flex --moe-enable-deepep; torchtitan and "
                         "NeMo Automodel's DeepEP option): each token sent once per GPU and node holding its experts"}


def with_dispatcher(stack, dispatcher, overlap=None):
    """``stack`` with its expert-parallel ``dispatcher`` and all-to-all ``overlap`` (None: the
    stack's own); UsageError in one line for an unknown dispatcher, a non-boolean overlap or a stack
    without expert parallelism."""
    update: dict = {}
    if dispatcher is not None:
        if dispatcher not in DISPATCHERS:
            raise UsageError(f"--moe-dispatcher {dispatcher!r}: valid choices: {', '.join(DISPATCHERS)}")
        update.update(moe_dispatcher=dispatcher, moe_dispatcher_source=DISPATCHERS[dispatcher])
    if overlap is not None:
        if not isinstance(overlap, bool):
            raise UsageError(f"moe_a2a_overlap must be True, False or None (the stack's), got {overlap!r}")
        update.update(moe_a2a_overlap=overlap, moe_a2a_overlap_source=(
            "overlapped with another micro-batch's compute (Megatron-LM --overlap-moe-expert-parallel-comm)"
            if overlap else "not overlapped"))
    if update and "ep" not in stack.parallelisms:
        flag = "--moe-dispatcher" if dispatcher is not None else "--moe-a2a-overlap"
        raise UsageError(f"{flag}: the {stack.display} stack has no expert parallelism")
    return stack.model_copy(update=update) if update else stack


def with_grad_overlap(stack, overlap=None):
    """``stack`` with its data-parallel gradient reduction overlapped with backward or not (None:
    the stack's own ``grad_reduce_overlap``)."""
    if overlap is None or overlap == stack.grad_reduce_overlap:
        return stack
    return stack.model_copy(update={"grad_reduce_overlap": overlap, "grad_reduce_overlap_source": (
        "overlapped with backward (as asked: --overlap-grad-reduce)" if overlap
        else "after the last backward (as asked: --no-overlap-grad-reduce)")})


def knob_space(s: Setup, pins: dict) -> tuple[Space, list[str]]:
    check_pins(pins)
    notes: list[str] = []
    dev = s.problem.device
    supported = [p for p in PRECISIONS
                 if (p in dev.peak_flops if p == "tf32" else dev.gemm_peak(p) is not None)]
    if pins.get("precision"):
        if pins["precision"] == FP8 and FP8 not in supported:
            have = ", ".join(g.id for g in hardware.list_gpus() if FP8 in g.peak_tflops)
            raise UsageError(f"--precision fp8: {s.hardware['gpu']} has no FP8 tensor cores (no fp8 peak in the "
                             f"catalog); FP8 training needs one of: {have}; valid choices here: {', '.join(supported)}")
        if pins["precision"] not in supported:
            raise UsageError(f"--precision {pins['precision']}: {s.hardware['gpu']} has no {pins['precision']} "
                             f"peak; valid choices here: {', '.join(supported)}")
        precs = [pins["precision"]]
        if precs == [FP8]:
            prof = dev.profile
            fit = "its FP8 GEMM efficiency" if FP8 in prof.gemm else "bf16's GEMM efficiency (the profile has no FP8 fit)"
            notes.append(f"fp8: the layers' linear GEMMs (QKV, output, MLP, experts) at the FP8 peak and {fit}, with "
                         f"tensor-wise dynamic scaling casts (torchao float8, Transformer Engine: the stack must be "
                         f"configured for it); attention, norms, the head, the router and the optimizer in bf16; "
                         f"memory as bf16; MFU and the floor count the FP8 peak")
    else:
        base = s.recipe.precision
        precs = [base] + (["tf32"] if base == "fp32" and "tf32" in dev.peak_flops else [])
        if dev.gemm_peak(base) is None:  # search the precisions the device has instead
            precs = [p for p in {"bf16": ("fp16", "fp32", "tf32"), "fp16": ("bf16", "fp32", "tf32")}.get(
                base, ("fp32",)) if p in supported]
            notes.append(f"{s.hardware['gpu']} has no {base}: searched {', '.join(precs)} instead")
    mb = pins.get("micro_batch")
    if pins.get("compile") is not None:
        check_choice("--compile", pins["compile"], COMPILES)

    def pick(key, choices):
        return [pins[key]] if pins.get(key) is not None else list(choices)

    stack = s.problem.stack
    if pins.get("sharding") is not None and pins["sharding"] not in stack.shardings:
        raise UsageError(f"--sharding {pins['sharding']} is not offered by --stack {stack.name}; "
                         f"valid choices there: {', '.join(stack.shardings)}")
    if pins.get("checkpointing") is not None:
        pins = {**pins, "checkpointing": parse_checkpointing(pins["checkpointing"])}
        L = s.model.n_layers
        if pins["checkpointing"].startswith("every:") and checkpointed_layers(pins["checkpointing"], L) == 0:
            raise UsageError(f"--checkpointing {pins['checkpointing']}: K must be at most the model's "
                             f"{L} layers (every:{L} checkpoints one layer)")

    # one GPU: sharding changes nothing but the optimizer's memory layout; FSDP modes are left out
    free_shardings = SHARDINGS if s.problem.n_gpus > 1 else ("ddp", "zero1", "zero2", "zero3")
    offloads = pick("offload", OFFLOADS)
    if s.profile.device.kind == "cpu" and s.hardware["gpu_id"] == "local":
        if pins.get("offload") not in (None, "none"):
            raise UsageError(f"--offload {pins['offload']} means nothing on a CPU device "
                             f"({s.profile.device.name}): its memory already is host memory; use --offload none")
        offloads = ["none"]

    attentions, compiles, checkpointings = family_knobs(s, pins, pick, notes)
    return Space(
        precisions=precs,
        attentions=attentions,
        compiles=compiles,
        checkpointings=checkpointings,
        shardings=pick("sharding", [x for x in free_shardings if x in stack.shardings] or ["ddp"]),
        offloads=offloads,
        micro_batches=np.array([mb]) if mb is not None else None,
    ), notes


def family_knobs(s: Setup, pins: dict, pick, notes: list[str]) -> tuple[list, list, list]:
    """Attention, compile and checkpointing values to search: the transformer's full spaces, or
    what the model's family says applies (a pin of a knob that does not apply is ignored with a
    note; a pin outside what applies is a usage error)."""
    fam = family_of(s.model)
    if fam.name == "transformer":
        return pick("attention", ATTENTIONS), pick("compile", COMPILES), pick("checkpointing", CHECKPOINTINGS)
    notes.extend(fam.notes(s.model, s.problem.stack))
    if pins.get("attention") is not None and pins["attention"] not in fam.attentions:
        notes.append(f"--attention {pins['attention']} ignored: {s.model.display_name} has no attention")
    out = []
    applies = {"compile": lambda v: v in fam.compiles, "checkpointing": fam.allows_checkpointing}
    for key, allowed in (("compile", fam.compiles), ("checkpointing", fam.checkpointings)):
        if pins.get(key) is not None and not applies[key](pins[key]):
            shown = ["every:K" if str(a).startswith("every:") else str(a).lower() for a in allowed]
            raise UsageError(f"--{key} {str(pins[key]).lower()} does not apply to {s.model.display_name} "
                             f"({fam.name}); valid here: {', '.join(shown)}")
        out.append([pins[key]] if pins.get(key) is not None else list(allowed))
    return list(fam.attentions), out[0], out[1]


_PIN_KEYS = ("precision", "attention", "compile", "checkpointing", "sharding", "offload", "micro_batch")
LAYOUT_KEYS = ("tp", "pp", "vp", "sequence_parallel", "async_tp", "cp", "ep", "etp")

#: knobs that take True, False or None (searched; profile_any_gpu: None is False)
_BOOL_KEYS = ("compile", "sequence_parallel", "async_tp", "profile_any_gpu", "moe_a2a_overlap", "overlap_grad_reduce")


def _plain(value):
    """A NumPy scalar (``np.int64(64)``, ``np.bool_(True)``) as the Python int, bool or float it
    holds; anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def split_knobs(knobs: dict) -> tuple[dict, dict]:
    """(setup knobs, pins) of the API's keyword arguments, NumPy scalars made plain and the
    boolean knobs checked; UsageError naming an unknown or malformed one."""
    knobs = {k: _plain(v) for k, v in knobs.items()}
    for k in _BOOL_KEYS:
        if knobs.get(k) is not None and not isinstance(knobs[k], bool):
            raise UsageError(f"{k} must be True, False or None (searched, or the stack's default), got {knobs[k]!r}")
    setup_keys = ("profile", "tokens", "steps", "global_batch", "seq_len", "optimizer", "intra_node",
                  "inter_node", "host_memory", "overhead", "stack", "profile_any_gpu", "capacity_factor",
                  "moe_dispatcher", "moe_a2a_overlap", "moe_routing", "overlap_grad_reduce")
    bad = set(knobs) - set(setup_keys) - set(_PIN_KEYS) - set(LAYOUT_KEYS)
    if bad:
        raise UsageError(f"unknown option(s) {', '.join(sorted(bad))}; valid: "
                         f"{', '.join(setup_keys + _PIN_KEYS + LAYOUT_KEYS)}")
    return ({k: v for k, v in knobs.items() if k in setup_keys},
            {k: v for k, v in knobs.items() if k in _PIN_KEYS + LAYOUT_KEYS})


def batch_fits(s: Setup, pars: list[Parallelism], mb: int | None) -> list[Parallelism]:
    """Layouts whose data-parallel replicas each get at least one sample (and the pinned
    micro-batch); UsageError when none does."""
    gb = s.recipe.global_batch
    ok = [p for p in pars if p.dp <= gb]
    if not ok:
        raise UsageError(f"--global-batch {gb} is smaller than the {min(p.dp for p in pars)} data-parallel "
                         f"replicas of every layout searched ({s.problem.n_gpus} GPUs); each replica needs at "
                         "least one sample per step (pin --tp/--pp to split the model instead)")
    fit = [p for p in ok if mb is None or mb <= math.ceil(gb / p.dp)]
    if not fit:
        most = max(math.ceil(gb / p.dp) for p in ok)
        raise UsageError(f"--micro-batch {mb} exceeds the largest per-GPU batch of any layout, {most} samples "
                         f"(global batch {gb} over {min(p.dp for p in ok)} data-parallel replica(s))")
    return fit


def layout_space(s: Setup, lay: dict, space: Space) -> list[Parallelism]:
    """The dp x tp x pp layouts to search for this problem, pinned ones checked by the layout rules
    (:func:`simulator.strategy.layout.allowed_layouts`; UsageError naming valid values)."""
    pb = s.problem
    return allowed_layouts(pb.n_gpus, pb.fabric.gpus_per_node, pb.model, pb.seq_len, pb.stack, lay,
                           space.attentions, space.shardings, space.compiles)
