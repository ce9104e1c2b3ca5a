"""A ``--model`` argument to a model spec: a preset name, a Hugging Face ``config.json`` path, or a
Hub id. Depends on :mod:`simulator.model.presets` (presets), :mod:`simulator.model.hf_config` (config import)
and :mod:`simulator.model.hub` (the local cache and downloads); none of them depends on it.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import UsageError
from . import hub
from .hf_config import model_from_hf_config
from .presets import find_preset, get_model
from .spec import ModelSpec


def resolve_model(arg: str | os.PathLike[str]) -> ModelSpec:
    """A preset name; a Hugging Face ``config.json`` (an existing file, any ``*.json`` path, or a
    folder holding ``config.json``); or a Hub id ``org/name[@revision]``: the preset with that
    ``hf_id`` (without a revision), else the config (of that revision) in the local Hugging Face cache, else the config alone downloaded
    with ``huggingface_hub`` when installed and online (:mod:`simulator.model.hub`)."""
    text = os.fspath(arg)
    path = Path(text)
    if text.lower().endswith(".json") or path.is_file() or (path / "config.json").is_file():
        return model_from_hf_config(text)
    parsed = hub.parse_hub_id(text)
    if parsed is None:
        return get_model(text)
    repo_id, revision = parsed
    preset = find_preset(repo_id)
    if preset is not None and revision is None:
        return preset
    try:
        config, where = hub.find_config(repo_id, revision)
    except UsageError as exc:
        if preset is not None:  # a revision asked for: that revision's config, not the preset's
            raise UsageError(f"{exc}; or drop @{revision} for the built-in preset {preset.name!r}") from None
        near = find_preset(repo_id.rsplit("/", 1)[1])
        hint = f"; or use the preset {near.name!r}" if near is not None else ""
        raise UsageError(f"{exc}{hint}") from None
    label = repo_id + (f"@{revision}" if revision else "")
    spec = model_from_hf_config(config, name=repo_id.rsplit("/", 1)[1])
    return spec.model_copy(update={
        "display": label,
        "hf_id": repo_id,
        "source": f"huggingface.co/{repo_id} config.json, revision {revision or 'main'} ({where}: {config})",
    })
