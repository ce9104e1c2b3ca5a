"""Parameter counts of the ``transformers`` implementations, the reference for exact counts.

``count_params(config)`` builds the Hugging Face model a ``config.json`` describes on the meta
device (no memory, no weights) and returns ``sum(p.numel() for p in model.parameters())`` (tied
weights once). Running this file rewrites ``tests/data/transformers_counts.json`` from every
config in ``tests/fixtures/hf_configs`` and ``tests/data/small_hf_configs.json``, so that the
tests can compare with ``transformers`` where it is not installed (CI does not need it):

    python tests/hf_reference.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
CONFIGS = HERE / "fixtures" / "hf_configs"
SMALL = HERE / "data" / "small_hf_configs.json"
COUNTS = HERE / "data" / "transformers_counts.json"

#: The head each family is counted with (as simulator.model.presets documents).
_MASKED_LM = {"bert", "roberta"}
#: The transformer model_types this reference covers (other families keep their own counts:
#: tests/data/family_param_counts.json).
TYPES = ("bert", "bloom", "falcon", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "llama",
         "mistral", "mpt", "olmo", "olmo2", "opt", "phi3", "qwen2", "qwen3", "roberta", "stablelm",
         "vit")


def count_params(config: dict[str, Any]) -> int:
    """Exact parameter count of the ``transformers`` model for ``config`` (needs torch and
    transformers)."""
    import torch
    import transformers

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf_cfg = transformers.AutoConfig.for_model(model_type, **cfg)
    if model_type in _MASKED_LM:
        auto = transformers.AutoModelForMaskedLM
    elif model_type == "vit":
        auto = transformers.AutoModelForImageClassification
    else:
        auto = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(hf_cfg)
    return sum(p.numel() for p in model.parameters())


def all_configs() -> dict[str, dict[str, Any]]:
    """Every reference config by name: the fixtures (file stem) and the small ones, of the
    model_types in :data:`TYPES`."""
    out = {f.stem: json.loads(f.read_text()) for f in sorted(CONFIGS.glob("*.json"))}
    out.update(json.loads(SMALL.read_text()))
    return {k: v for k, v in out.items() if v.get("model_type") in TYPES}


def main() -> None:
    import transformers

    from simulator.core.atomic import write_text_atomic

    counts = {name: count_params(cfg) for name, cfg in all_configs().items()}
    data = {"transformers_version": transformers.__version__, "counts": counts}
    write_text_atomic(COUNTS, json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(counts)} counts (transformers {transformers.__version__}) to {COUNTS}")


if __name__ == "__main__":
    main()
