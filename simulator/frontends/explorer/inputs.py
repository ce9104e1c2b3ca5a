"""The explorer's inputs: uploaded files (size, encoding and JSON checked), the keys that keep the
app's caches hashable, a custom model's dimensions and recipe, prices with the sidebar's
overrides, whether a profile describes the chosen GPU, and the search itself (``api.answer``, the
API the ``simulate`` command calls)."""

from __future__ import annotations

import json
from typing import Any

from simulator.answer import api, costs
from simulator.core.errors import UsageError
from simulator.core.userfiles import parse_json
from simulator.hardware import catalog as hardware
from simulator.hardware.profile import Profile, parse_profile
from simulator.model.hf_config import model_from_hf_config
from simulator.model.presets import get_model, model_from_dict
from simulator.model.recipes import default_recipe
from simulator.model.spec import ModelSpec

MAX_UPLOAD_MB = 1  # the upload widget's limit, in Streamlit's megabytes (MiB)
MAX_UPLOAD_BYTES = MAX_UPLOAD_MB * 1024 * 1024  # uploads above it are refused before parsing
#: rows of the Top strategies table
TOP_N = 10
#: the sidebar's price fields that override the built-in prices (``costs.with_overrides``)
PRICE_OVERRIDES = ("price_per_gpu", "rent_per_gpu_hour", "kwh_price", "pue", "lifetime_years")


def _read_upload(data: bytes, what: str) -> dict:
    """Bytes of an uploaded JSON file -> dict; UsageError for too large, not UTF-8 or not JSON."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise UsageError(f"{what} is {len(data) / 2**20:.1f} MB; the limit is {MAX_UPLOAD_MB} MB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} is not a UTF-8 text file; expected JSON") from None
    obj = parse_json(text, what)
    if not isinstance(obj, dict):
        raise UsageError(f"{what}: expected a JSON object at the top level, got "
                         f"{type(obj).__name__}")
    return obj


def upload_name(file_name: str, cfg: dict) -> str:
    """What to call an uploaded model: the config's ``_name_or_path`` ('meta-llama/Llama-2-7b-hf'),
    else the file's name ('my-model.json' -> 'my-model'; a bare 'config.json' stays 'config.json'),
    never its ``model_type``."""
    ref = cfg.get("_name_or_path")
    if isinstance(ref, str) and ref.strip().strip("/"):
        return ref.strip().strip("/")
    base = file_name.rsplit("/", 1)[-1]
    stem = base.removesuffix(".json")
    return stem if stem and stem.lower() != "config" else f"uploaded {base or 'config.json'}"


def model_from_upload(name: str, data: bytes) -> ModelSpec:
    """An uploaded Hugging Face ``config.json`` -> ModelSpec (raises UsageError)."""
    cfg = _read_upload(data, f"model config {name!r}")
    return model_from_hf_config(cfg, name=upload_name(name, cfg))


def profile_from_upload(name: str, data: bytes) -> Profile:
    """An uploaded calibration profile JSON -> Profile (raises UsageError)."""
    return parse_profile(_read_upload(data, f"profile {name!r}"), origin=name)


def model_from_key(model_key: str) -> ModelSpec:
    """``preset:<name>`` or ``spec:<ModelSpec JSON>`` -> ModelSpec (keys keep caches hashable)."""
    kind, _, rest = model_key.partition(":")
    return get_model(rest) if kind == "preset" else model_from_dict(json.loads(rest))


def profile_from_json(profile_json: str | None) -> Profile | None:
    """A profile kept as JSON (a cache key) -> Profile; None stays None (the built-in profiles)."""
    return None if profile_json is None else parse_profile(json.loads(profile_json), origin="upload")


def custom_spec(base: ModelSpec, layers: int, hidden: int, heads: int, ffn: int, vocab: int,
                ctx: int) -> ModelSpec:
    """A transformer with the given dimensions (layers, hidden size, heads, MLP width, vocabulary,
    max positions) and everything else of ``base``; its sequence length is the base's, capped at
    ``ctx``; grouped-query heads that no longer divide ``heads`` are dropped (raises UsageError)."""
    data = base.model_dump()
    data.update(name=f"custom-{base.name}", display=f"Custom ({base.display_name})", hf_id=None,
                n_layers=int(layers), hidden=int(hidden), n_heads=int(heads), ffn_hidden=int(ffn),
                vocab_size=int(vocab), max_positions=int(ctx),
                default_seq_len=min(base.default_seq_len, int(ctx)),
                source=f"custom dimensions starting from {base.name}")
    if data.get("n_kv_heads") and int(heads) % data["n_kv_heads"]:
        data["n_kv_heads"] = None
    return model_from_dict(data)


def with_base_recipe(rec: dict[str, Any], base_preset: str) -> dict[str, Any]:
    """``rec`` (the sidebar's training length and batch) completed from the recipe of
    ``base_preset``, which custom dimensions start from: its batch, sequence length and optimizer
    where not set, and its steps (same shape) or its tokens (reshaped) where no length is set."""
    base = default_recipe(get_model(base_preset))
    same_shape = "global_batch" not in rec and "seq_len" not in rec
    rec.setdefault("global_batch", base.global_batch)
    rec.setdefault("seq_len", base.seq_len)
    rec.setdefault("optimizer", base.optimizer)
    if "tokens" not in rec and "steps" not in rec:  # the preset's steps, or its tokens if reshaped
        if same_shape and rec["seq_len"] == base.seq_len:
            rec["steps"] = base.steps
        else:
            rec["tokens"] = int(base.tokens)
    return rec


def search(model: ModelSpec, gpus: str, knobs: dict[str, Any]) -> tuple[Any, Any, list]:
    """``api.answer`` for one input set: (result, the best plan with fixes if nothing fits, the top
    :data:`TOP_N` distinct plans: micro-batch variants of one plan collapsed, ties listed simplest first)."""
    ans = api.answer(model, gpus, **knobs)
    return ans.result, ans.plan, ans.result.plans(TOP_N, distinct=True)


def prices_from(overrides: dict[str, Any], base: costs.Prices) -> costs.Prices:
    """``base`` prices with the sidebar's overrides (``costs.with_overrides``; None keeps a price)."""
    over = {k: v for k, v in overrides.items() if k in PRICE_OVERRIDES and v is not None}
    return costs.with_overrides(base, **over)


def canonical_cluster(gpus: str) -> str:
    """Canonical form of a cluster text for matching the sweep ('8x3090' -> '8xrtx3090')."""
    try:
        cl = hardware.parse_cluster(gpus)
    except UsageError:
        return gpus
    return cl.text


def profile_gpu_mismatch(prof: Profile | None, gpus: str, any_gpu: bool) -> str | None:
    """The app's words for a profile that describes another device than the GPU chosen (``gpus``);
    None where it matches, where there is no profile, or where it is to be used for any GPU."""
    if prof is None or any_gpu or gpus.endswith("local"):
        return None
    try:
        hardware.check_profile_device(prof, hardware.parse_cluster(gpus).gpu, gpus)
    except UsageError:
        gid = prof.device.gpu_id
        g = hardware.get_gpu(gid).short_name if gid else None
        return (f"The profile {prof.name!r} measured {prof.device.name}"
                + (f" ({g})" if g else "") + ", not the GPU chosen above: choose "
                + (f"{g}" if g else "“calibrated device”") + " as the GPU, or tick “Use this profile for the "
                "GPU chosen above” under Efficiency profile.")
    return None
