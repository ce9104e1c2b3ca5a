"""Model families: each turns its own spec into operations (``families/base.py``).

The registry maps a spec's ``family`` field to its :class:`~simulator.families.base.Family`
(torchtitan's model registry is the model): ``transformer`` (GPT-NeoX, GPT-2, Llama, Mistral, MPT,
BERT, RoBERTa, ViT), ``mamba`` and ``convnext``. A new family is one new module here that calls
:func:`register`, plus its presets in ``data/models.yaml`` (docs/adding_a_family.md).
"""

from __future__ import annotations

from typing import Any

from .base import Block, Family, Graph, Knobs, Op

__all__ = ["Block", "Family", "Graph", "Knobs", "Op", "register", "family_of", "spec_from_dict",
           "hf_builders", "registered"]

_REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family; each value of its spec's ``family`` field may be claimed once."""
    for key in family.families:
        if key in _REGISTRY and _REGISTRY[key] is not family:
            raise RuntimeError(f"model family {key!r} registered twice")
        _REGISTRY[key] = family
    return family


def registered() -> dict[str, Family]:
    """Spec ``family`` value -> its Family."""
    return dict(_REGISTRY)


def family_of(spec: Any) -> Family:
    """The Family that owns ``spec`` (by its ``family`` field)."""
    try:
        return _REGISTRY[spec.family]
    except (KeyError, AttributeError):
        raise TypeError(f"not a model spec of a registered family: {spec!r}") from None


def spec_from_dict(data: dict[str, Any]):
    """Validate ``data`` with the spec class its ``family`` names (a discriminated union).

    Raises pydantic's ValidationError for bad fields and ValueError for an unknown family.
    """
    key = data.get("family")
    if key not in _REGISTRY:
        raise ValueError(f"unknown model family {key!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key].spec_cls(**data)


def hf_builders() -> dict[str, Any]:
    """``model_type`` -> builder of spec fields, for the families that import ``config.json``."""
    out = {}
    for fam in dict.fromkeys(_REGISTRY.values()):
        if fam.from_hf_config is not None:
            for t in fam.hf_model_types:
                out[t] = fam.from_hf_config
    return out


def _import_families() -> None:
    """Import every module of this package (each registers its family on import)."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()
