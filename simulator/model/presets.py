"""Model presets of every family and their lookup by name, alias or Hugging Face id.

Presets live in ``simulator/data/models.yaml`` (data, each with its ``hf_id`` and ``source``):
transformers (decoders, encoders, ViT; :class:`~simulator.model.spec.ModelSpec`), mixtures of
experts, Mamba and ConvNeXt (their specs in ``simulator/model/families``).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from ..core.errors import UsageError, unknown
from .families import spec_from_dict
from .spec import ModelSpec


# ---------------------------------------------------------------------- presets
def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@functools.lru_cache(maxsize=1)
def _load_presets() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    """Read ``data/models.yaml``: (presets by canonical name, alias -> canonical name)."""
    text = resources.files("simulator").joinpath("data/models.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    presets: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    for entry in raw["models"]:
        entry = dict(entry)
        extra_aliases = entry.pop("aliases", []) or []
        try:
            spec = _spec_from_dict(entry)
        except (ValidationError, ValueError) as exc:  # a broken data file is a bug, not user input
            raise RuntimeError(f"invalid model preset {entry.get('name')!r}: {exc}") from exc
        key = _normalize(spec.name)
        if key in presets:
            raise RuntimeError(f"duplicate model preset {spec.name!r}")
        presets[key] = spec
        names = [spec.name, *extra_aliases]
        if spec.hf_id:
            names.append(spec.hf_id)
        if spec.display:
            names.append(spec.display)
        for alias in names:
            a = _normalize(alias)
            if aliases.get(a, key) != key:
                raise RuntimeError(f"alias {alias!r} names two presets")
            aliases[a] = key
    return presets, aliases


def _spec_from_dict(data: dict[str, Any]) -> ModelSpec:
    """A spec of the family ``data['family']`` names (``simulator/model/families``: transformer, mamba, convnext)."""
    return spec_from_dict(data)


def list_models() -> list[str]:
    """Canonical names of all presets, in file order."""
    return [spec.name for spec in _load_presets()[0].values()]


def find_preset(name: str) -> ModelSpec | None:
    """The preset with this name, alias, display name or Hugging Face id (case-insensitive)."""
    presets, aliases = _load_presets()
    key = aliases.get(_normalize(name))
    return presets[key] if key is not None else None


def get_model(name: str) -> ModelSpec:
    """Look up a preset by name, alias, display name or Hugging Face id (case-insensitive).

    ``pythia-1b``, ``Pythia-1B`` and ``EleutherAI/pythia-1b`` all give the same spec. An
    ``org/name`` id that is not a known alias falls back to ``name``.
    """
    if not isinstance(name, str):
        raise UsageError(f"model must be a preset name (a string such as 'pythia-1b'), got {name!r}; "
                         f"valid choices: {', '.join(list_models()[:8])}, ... (simulator.list_models())")
    spec = find_preset(name)
    if spec is None and "/" in name:
        spec = find_preset(name.rsplit("/", 1)[1])
    if spec is None:
        raise unknown("model", name, list_models())
    return spec


def model_from_dict(data: dict[str, Any]) -> ModelSpec:
    """Build a spec from a plain mapping, turning validation errors into one-line UsageErrors."""
    try:
        return _spec_from_dict(data)
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            raise UsageError(f"invalid model description: {exc}") from None
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "model"
        raise UsageError(f"invalid model description: {loc}: {first['msg']}") from None
