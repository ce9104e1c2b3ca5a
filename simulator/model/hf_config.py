"""Build a :class:`~simulator.model.spec.ModelSpec` from a Hugging Face ``config.json``.

Supported ``model_type`` values (:data:`SUPPORTED_MODEL_TYPES`; one entry of ``_BUILDERS`` each):
gpt_neox, gpt2, llama, mistral, mpt, bert, roberta, vit, qwen2, qwen3, gemma, gemma2,
gemma3_text, phi3, olmo, olmo2, stablelm, falcon, opt, bloom. The resulting spec counts
parameters exactly as the matching ``transformers`` class (``*ForCausalLM`` /
``GPT2LMHeadModel``, ``*ForMaskedLM``, ``ViTForImageClassification``); tests/data holds the
counts, checked against ``transformers`` on the meta device.

What changes the physics, and is modelled (see simulator.model.spec.ModelSpec):

* ``head_dim`` not ``hidden_size / num_attention_heads`` (Gemma, Qwen3, Mistral-Nemo): the
  Q/K/V/O projection widths, attention FLOPs and saved Q/K/V;
* sliding-window layers (``sliding_window`` with ``layer_types``, or each family's rule: Mistral
  and Phi-3 every layer, Qwen2/3 only with ``use_sliding_window`` from ``max_window_layers`` on,
  Gemma 2 every other layer, Gemma 3 all but every ``sliding_window_pattern``-th): fused
  attention skips the blocks outside the window;
* QK-norm (Qwen3, Gemma 3 ``q_norm``/``k_norm``; OLMo 2 full-width; StableLM ``qk_layernorm``),
  four norms per block (Gemma 2/3), one shared norm with parallel attention (Falcon, StableLM
  ``use_parallel_residual``), non-parametric LayerNorm (OLMo): parameters and elementwise work;
* soft-capping (Gemma 2 ``attn_logit_softcapping``, ``final_logit_softcapping``): elementwise
  passes over the materialised scores and over the logits;
* biases: Qwen2 (Q/K/V only), StableLM ``use_qkv_bias``, Falcon ``bias``, OPT ``enable_bias``.

Read and ignored, because they change neither parameters nor the work of a training step
(beyond a negligible elementwise op): rope_theta / rope_scaling / rope_local_base_freq,
``query_pre_attn_scalar`` (a scale folded into the scores), ``clip_qkv`` (OLMo: a clamp),
Gemma's embedding scaling by sqrt(hidden), activation choice (GeLU vs SiLU: same bytes),
dropout, initialisation, token ids, ``torch_dtype`` (precision is a recipe knob), ALiBi slopes
(added in the score pass; no parameters), BLOOM ``apply_residual_connection_post_layernorm``,
OPT ``do_layer_norm_before`` beyond the final norm it removes, Falcon's fused QKV layout.

Mixtures of experts ``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``olmoe``, ``deepseek_v2``,
``deepseek_v3`` and ``gpt_oss`` are read by their family (``simulator/model/families/moe.py``, :data:`MOE_ROPE` for
their attention half). Recognised but not modelled (:data:`NOT_MODELLED`; exit 2 with one
sentence): other mixtures of experts (``dbrx``, ``jamba`` ..., or any other config with more than one expert), encoder-decoder (``t5``, ``bart`` ..., or ``is_encoder_decoder``), Gemma 3 image-text
(``gemma3``). Not supported: ``deberta-v2`` (disentangled relative attention has its own
projections and FLOPs), OPT-350m's ``word_embed_proj_dim`` projections.

Conventions where the config alone does not decide:

* ViT configs without ``num_labels`` / ``id2label`` (the ``*-in21k`` checkpoints are bare
  ``ViTModel`` s) get 21,841 classes when the name or path mentions ``21k`` (ImageNet-21k, as in
  the study), else 1,000 (ImageNet-1k).
* ``default_seq_len`` (training length in tokens): the context limit, capped at 8,192 for
  rotary / ALiBi decoders (Mistral: its sliding window); BERT 512; RoBERTa ``max_positions`` minus
  the padding offset; OPT ``max_position_embeddings`` (its table has 2 more rows).
* MPT: position parameters follow llm-foundry: ALiBi or RoPE → none; otherwise
  ``learned_pos_emb`` (default true) → a ``max_seq_len × d_model`` table.

Every problem (unreadable or non-JSON file, unknown ``model_type``, missing or malformed field,
an unsupported variant) raises :class:`~simulator.core.errors.UsageError` with one line naming the
file and the problem and listing the supported types.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..core.errors import UsageError
from ..core.userfiles import parse_json, read_text  # bounded regular files, UTF-8, one-line errors
from .families import hf_builders, spec_from_dict
from .hf_fields import _BUILDERS, MOE_ROPE, ConfigFields, ConfigProblem
from .spec import ModelSpec


def _supported() -> str:
    return "supported model_type values: " + ", ".join(SUPPORTED_MODEL_TYPES)


_MOE = ("mixture-of-experts is not modelled yet for this architecture (its routing, shared experts or "
        "attention differ from the modelled " + ", ".join(MOE_ROPE) + ")")
_ENC_DEC = (
    "encoder-decoder models are not modelled yet: separate encoder and decoder stacks, "
    "cross-attention"
)
#: Architectures we recognise but do not model, with the reason (one sentence each).
NOT_MODELLED: dict[str, str] = {
    **dict.fromkeys(
        ("dbrx", "jamba", "phimoe", "granitemoe", "granitemoeshared", "jetmoe", "llama4", "llama4_text",
         "minimax", "glm4_moe", "ernie4_5_moe", "hunyuan_v1_moe", "dots1", "qwen3_next", "flex_olmo",
         "switch_transformers", "nllb_moe"),
        _MOE,
    ),
    **dict.fromkeys(
        ("t5", "mt5", "umt5", "longt5", "t5gemma", "bart", "mbart", "pegasus", "pegasus_x",
         "marian", "blenderbot", "blenderbot-small", "led", "m2m_100", "fsmt", "plbart",
         "prophetnet", "bigbird_pegasus", "whisper", "encoder-decoder", "speech-encoder-decoder",
         "vision-encoder-decoder"),
        _ENC_DEC,
    ),
    "gemma3": "image-text models are not modelled yet: the vision encoder and projector "
    "(the text decoder alone is model_type 'gemma3_text')",
}
#: Config fields whose presence (with more than one expert) marks a mixture of experts.
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _not_modelled(model_type: str, data: Mapping[str, Any]) -> str | None:
    """Why this config describes an architecture we do not model (None if it is not one)."""
    if model_type in NOT_MODELLED:
        return NOT_MODELLED[model_type]
    if model_type in MOE_ROPE:  # the mixtures of experts simulator/model/families/moe.py models
        return None
    experts = [data.get(k) for k in _EXPERT_FIELDS]
    if any(isinstance(n, int) and not isinstance(n, bool) and n > 1 for n in experts):
        return _MOE
    if data.get("is_encoder_decoder") is True:
        return _ENC_DEC
    return None


def _read(path: Path) -> dict[str, Any]:
    """Read a JSON object from ``path`` (a directory means its ``config.json``)."""
    if path.is_dir():
        path = path / "config.json"
    try:
        text = read_text(path, "model config")
    except UsageError as exc:
        raise UsageError(f"{exc}; {_supported()}") from None
    try:
        data = parse_json(text, str(path))
    except UsageError as exc:
        raise UsageError(f"{exc}; {_supported()}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(data).__name__}; {_supported()}")
    return data


def _default_name(data: Mapping[str, Any], path: Path | None) -> str:
    ref = data.get("_name_or_path")
    if isinstance(ref, str) and ref.strip():
        return ref.strip().rstrip("/").rsplit("/", 1)[-1]
    if path is not None:
        p = path / "config.json" if path.is_dir() else path
        if p.stem.lower() == "config" and p.parent.name:
            return p.parent.name
        return p.stem
    return str(data.get("model_type", "model"))


#: Hugging Face activation names (``transformers.activations.ACT2FN``) and the ModelSpec
#: activation each computes; names not listed keep the family's default.
HF_ACTIVATIONS = {
    "gelu": "gelu", "gelu_python": "gelu",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu", "swish": "silu", "relu": "relu",
}


def _activation(data: Mapping[str, Any]) -> str | None:
    """The MLP activation a config names (Gemma's ``hidden_activation`` before ``hidden_act``;
    GPT-2 and OPT call it ``activation_function``), or None."""
    for key in ("hidden_activation", "hidden_act", "activation_function"):
        name = data.get(key)
        if isinstance(name, str):
            return HF_ACTIVATIONS.get(name)
    return None


def model_from_hf_config(
    path_or_dict: str | os.PathLike[str] | Mapping[str, Any], name: str | None = None
) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config (path to ``config.json``, a folder holding
    one, or an already parsed mapping). ``name`` defaults to ``_name_or_path`` or the file name.
    """
    if isinstance(path_or_dict, Mapping):
        data: Mapping[str, Any] = path_or_dict
        path: Path | None = None
        where = "config"
    else:
        path = Path(os.fspath(path_or_dict))
        data = _read(path)
        where = str(path)
    model_type = data.get("model_type")
    if model_type is None:
        raise UsageError(f"{where}: missing field 'model_type'; {_supported()}")
    reason = _not_modelled(str(model_type), data)
    if reason is not None:
        raise UsageError(f"{where}: {reason} (model_type {model_type!r}); {_supported()}")
    builder = BUILDERS.get(str(model_type))
    if builder is None:
        raise UsageError(f"{where}: unsupported model_type {model_type!r}; {_supported()}")
    spec_name = name or _default_name(data, path)
    try:
        fields = builder(ConfigFields(data), spec_name)
    except ConfigProblem as exc:
        raise UsageError(f"{where}: {exc} (model_type {model_type!r}); {_supported()}") from None
    act = _activation(data)
    if act is not None and "ffn_hidden" in fields:  # transformer specs: other families keep their own
        fields["activation"] = act
    ref = data.get("_name_or_path")
    fields.update(
        name=spec_name,
        hf_id=ref if isinstance(ref, str) and "/" in ref else None,
        source=f"Hugging Face config ({where})",
    )
    try:
        return spec_from_dict(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        detail = f"{loc}: {msg}" if loc else msg
        raise UsageError(f"{where}: invalid model ({detail}); {_supported()}") from None


def _family_builder(build: Callable[[ConfigFields, str], dict[str, Any]]) -> Callable[[ConfigFields, str], dict[str, Any]]:
    def run(c: ConfigFields, name: str) -> dict[str, Any]:
        try:
            return build(c, name)
        except ValueError as exc:
            raise ConfigProblem(str(exc)) from None

    return run


#: ``model_type`` -> builder of spec fields: the transformer architectures (:mod:`simulator.model.hf_fields`)
#: and the families outside the transformer that import their own config.json (simulator/model/families).
BUILDERS: dict[str, Callable[[ConfigFields, str], dict[str, Any]]] = {
    **_BUILDERS, **{t: _family_builder(b) for t, b in hf_builders().items()}}
#: The ``model_type`` values we read, in the order the error messages list them.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(BUILDERS))
