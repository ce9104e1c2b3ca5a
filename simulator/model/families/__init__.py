"""Model families: each turns its own spec into operations (``families/base.py``).

The registry maps a spec's ``family`` field to its :class:`~simulator.model.families.base.Family`
(torchtitan's model registry is the model): ``transformer`` (GPT-NeoX, GPT-2, Llama, Mistral, MPT,
BERT, RoBERTa, ViT), ``moe``, ``mamba`` and ``convnext``. A new family is one new module here
defining its :class:`Family`, one entry in :data:`FAMILY_DEFS`, and its presets in
``data/models.yaml`` (docs/adding_a_family.md).
"""

from __future__ import annotations

from typing import Any

from ..spec import ModelSpec
from . import convnext, mamba, moe, transformer
from .base import Block, Family, Graph, Knobs, Op

__all__ = ["AnySpec", "Block", "Family", "Graph", "Knobs", "Op", "FAMILY_DEFS", "family_of", "spec_from_dict",
           "hf_builders", "registered"]

#: The spec of any registered family (a mixture of experts' ``MoESpec`` is a ``ModelSpec``).
AnySpec = ModelSpec | mamba.MambaSpec | convnext.ConvNextSpec

#: Every model family, in the order the registry lists them (a new family adds its entry here).
FAMILY_DEFS: tuple[Family, ...] = (convnext.CONVNEXT, mamba.MAMBA, moe.MOE, transformer.TRANSFORMER)


def _registry(families: tuple[Family, ...]) -> dict[str, Family]:
    """Spec ``family`` value -> its Family; each value may be claimed by one family only."""
    out: dict[str, Family] = {}
    for family in families:
        for key in family.families:
            if key in out:
                raise RuntimeError(f"model family {key!r} registered twice")
            out[key] = family
    return out


_REGISTRY = _registry(FAMILY_DEFS)


def registered() -> dict[str, Family]:
    """Spec ``family`` value -> its Family."""
    return dict(_REGISTRY)


def family_of(spec: Any) -> Family:
    """The Family that owns ``spec`` (by its ``family`` field)."""
    try:
        return _REGISTRY[spec.family]
    except (KeyError, AttributeError):
        raise TypeError(f"not a model spec of a registered family: {spec!r}") from None


def spec_from_dict(data: dict[str, Any]) -> AnySpec:
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

