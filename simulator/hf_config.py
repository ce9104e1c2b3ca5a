"""Build a :class:`~simulator.models.ModelSpec` from a Hugging Face ``config.json``.

Supported ``model_type`` values: gpt_neox, gpt2, llama, mistral, mpt, bert, roberta, vit.
The resulting spec counts parameters exactly as the matching Hugging Face class
(``*ForCausalLM`` / ``GPT2LMHeadModel``, ``*ForMaskedLM``, ``ViTForImageClassification``).

Conventions where the config alone does not decide:

* ViT configs without ``num_labels`` / ``id2label`` (the ``*-in21k`` checkpoints are bare
  ``ViTModel`` s) get 21,841 classes when the name or path mentions ``21k`` (ImageNet-21k, as in
  the study), else 1,000 (ImageNet-1k).
* ``default_seq_len`` (training length in tokens): the context limit, capped at 8,192 for
  rotary / ALiBi decoders (Mistral: its sliding window); BERT 512; RoBERTa ``max_positions`` minus
  the padding offset.
* MPT: position parameters follow llm-foundry: ALiBi or RoPE → none; otherwise
  ``learned_pos_emb`` (default true) → a ``max_seq_len × d_model`` table.

Every problem (unreadable or non-JSON file, unknown ``model_type``, missing or malformed field,
an unsupported variant) raises :class:`~simulator.errors.UsageError` with one line naming the
file and the problem and listing the supported types.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.errors import UsageError
from simulator.families import hf_builders, spec_from_dict
from simulator.models import ModelSpec

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "bert",
    "gpt2",
    "gpt_neox",
    "llama",
    "mistral",
    "mpt",
    "roberta",
    "vit",
)

_MAX_DEFAULT_SEQ = 8192


class _ConfigProblem(Exception):
    """Internal: a problem with the config contents (turned into a UsageError with the source)."""


def _supported() -> str:
    return "supported model_type values: " + ", ".join(SUPPORTED_MODEL_TYPES)


class _Cfg:
    """Typed access to config fields with clear errors."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def int(self, key: str, default: int | None = None, data: Mapping[str, Any] | None = None) -> int:
        src = self.data if data is None else data
        if key not in src or src[key] is None:
            if default is None:
                raise _ConfigProblem(f"missing field {key!r}")
            return default
        value = src[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise _ConfigProblem(f"field {key!r} must be an integer, got {value!r}")
        return int(value)

    def bool(self, key: str, default: bool, data: Mapping[str, Any] | None = None) -> bool:
        src = self.data if data is None else data
        value = src.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise _ConfigProblem(f"field {key!r} must be true or false, got {value!r}")
        return value


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise _ConfigProblem(f"field {key!r} must be a number in (0, 1], got {value!r}")
    return float(value)


def _num_labels(data: Mapping[str, Any]) -> int | None:
    if isinstance(data.get("id2label"), Mapping) and data["id2label"]:
        return len(data["id2label"])
    if data.get("num_labels") is not None:
        return _Cfg(data).int("num_labels")
    return None


def _gpt_neox(c: _Cfg, name: str) -> dict[str, Any]:
    max_pos = c.int("max_position_embeddings", 2048)
    return dict(
        family="gpt_neox",
        kind="decoder",
        n_layers=c.int("num_hidden_layers"),
        hidden=c.int("hidden_size"),
        n_heads=c.int("num_attention_heads"),
        ffn_hidden=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"),
        max_positions=max_pos,
        default_seq_len=min(max_pos, _MAX_DEFAULT_SEQ),
        tied_embeddings=c.bool("tie_word_embeddings", False),
        pos_embedding="rotary",
        rotary_pct=_fraction(c.data.get("rotary_pct", 0.25), "rotary_pct"),
        norm="layernorm",
        linear_bias=True,
        norm_bias=True,
        parallel_residual=c.bool("use_parallel_residual", True),
        head="lm",
    )


def _gpt2(c: _Cfg, name: str) -> dict[str, Any]:
    hidden = c.int("n_embd")
    max_pos = c.int("n_positions", 1024)
    return dict(
        family="gpt2",
        kind="decoder",
        n_layers=c.int("n_layer"),
        hidden=hidden,
        n_heads=c.int("n_head"),
        ffn_hidden=c.int("n_inner", 4 * hidden),
        vocab_size=c.int("vocab_size", 50257),
        max_positions=max_pos,
        default_seq_len=max_pos,
        tied_embeddings=c.bool("tie_word_embeddings", True),
        pos_embedding="learned",
        norm="layernorm",
        linear_bias=True,
        norm_bias=True,
        head="lm",
    )


def _llama_like(family: str) -> Callable[[_Cfg, str], dict[str, Any]]:
    def build(c: _Cfg, name: str) -> dict[str, Any]:
        hidden = c.int("hidden_size")
        n_heads = c.int("num_attention_heads")
        head_dim = c.data.get("head_dim")
        if head_dim is not None and head_dim != hidden // n_heads:
            raise _ConfigProblem(
                f"head_dim {head_dim} != hidden_size / num_attention_heads is not supported"
            )
        attn_bias = c.bool("attention_bias", False)
        mlp_bias = c.bool("mlp_bias", False)
        if attn_bias != mlp_bias:
            raise _ConfigProblem("attention_bias != mlp_bias is not supported")
        max_pos = c.int("max_position_embeddings", 2048 if family == "llama" else 32768)
        window = c.data.get("sliding_window")
        default_seq = min(max_pos, _MAX_DEFAULT_SEQ)
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            default_seq = min(default_seq, window)
        return dict(
            family=family,
            kind="decoder",
            n_layers=c.int("num_hidden_layers"),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=c.int("num_key_value_heads", n_heads),
            ffn_hidden=c.int("intermediate_size"),
            gated_mlp=True,
            vocab_size=c.int("vocab_size"),
            max_positions=max_pos,
            default_seq_len=default_seq,
            tied_embeddings=c.bool("tie_word_embeddings", False),
            pos_embedding="rotary",
            norm="rmsnorm",
            linear_bias=attn_bias,
            norm_bias=False,
            head="lm",
        )

    return build


def _bert_like(family: str) -> Callable[[_Cfg, str], dict[str, Any]]:
    def build(c: _Cfg, name: str) -> dict[str, Any]:
        pos_type = c.data.get("position_embedding_type", "absolute")
        if pos_type not in (None, "absolute"):
            raise _ConfigProblem(f"position_embedding_type {pos_type!r} is not supported")
        max_pos = c.int("max_position_embeddings", 512)
        if family == "roberta":
            usable = max_pos - c.int("pad_token_id", 1) - 1
            type_vocab = c.int("type_vocab_size", 1)
        else:
            usable = max_pos
            type_vocab = c.int("type_vocab_size", 2)
        if usable <= 0:
            raise _ConfigProblem(f"max_position_embeddings {max_pos} leaves no usable positions")
        return dict(
            family=family,
            kind="encoder",
            n_layers=c.int("num_hidden_layers"),
            hidden=c.int("hidden_size"),
            n_heads=c.int("num_attention_heads"),
            ffn_hidden=c.int("intermediate_size"),
            vocab_size=c.int("vocab_size"),
            max_positions=max_pos,
            default_seq_len=min(usable, 512),
            type_vocab_size=type_vocab,
            tied_embeddings=c.bool("tie_word_embeddings", True),
            pos_embedding="learned",
            norm="layernorm",
            linear_bias=True,
            norm_bias=True,
            head="mlm",
            embedding_norm=True,
            final_norm=False,
        )

    return build


def _vit(c: _Cfg, name: str) -> dict[str, Any]:
    if not c.bool("qkv_bias", True):
        raise _ConfigProblem("qkv_bias false is not supported")
    image = c.int("image_size", 224)
    patch = c.int("patch_size", 16)
    if patch <= 0 or image % patch:
        raise _ConfigProblem(f"image_size {image} is not a multiple of patch_size {patch}")
    classes = _num_labels(c.data)
    if classes is None:
        hint = f"{name} {c.data.get('_name_or_path', '')}".lower()
        classes = 21841 if "21k" in hint else 1000
    seq = (image // patch) ** 2 + 1
    return dict(
        family="vit",
        kind="encoder",
        n_layers=c.int("num_hidden_layers"),
        hidden=c.int("hidden_size"),
        n_heads=c.int("num_attention_heads"),
        ffn_hidden=c.int("intermediate_size"),
        vocab_size=1,
        max_positions=seq,
        default_seq_len=seq,
        image_size=image,
        patch_size=patch,
        num_channels=c.int("num_channels", 3),
        tied_embeddings=False,
        pos_embedding="learned",
        norm="layernorm",
        linear_bias=True,
        norm_bias=True,
        head="classifier",
        num_classes=classes,
    )


def _mpt(c: _Cfg, name: str) -> dict[str, Any]:
    attn = c.data.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        raise _ConfigProblem("attn_config must be an object")
    ffn_cfg = c.data.get("ffn_config") or {}
    if not isinstance(ffn_cfg, Mapping):
        raise _ConfigProblem("ffn_config must be an object")
    d_model = c.int("d_model")
    n_heads = c.int("n_heads")
    ratio = c.data.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio <= 0:
        raise _ConfigProblem(f"field 'expansion_ratio' must be a positive number, got {ratio!r}")
    ffn_type = ffn_cfg.get("ffn_type", "mptmlp")
    if ffn_type not in ("mptmlp", "mptglu"):
        raise _ConfigProblem(f"ffn_config.ffn_type {ffn_type!r} is not supported")
    attn_type = attn.get("attn_type", "multihead_attention")
    if attn_type == "multihead_attention":
        kv_heads = n_heads
    elif attn_type == "multiquery_attention":
        kv_heads = 1
    elif attn_type == "grouped_query_attention":
        kv_heads = c.int("kv_n_heads", 1, data=attn)
    else:
        raise _ConfigProblem(f"attn_config.attn_type {attn_type!r} is not supported")
    if c.bool("qk_ln", False, data=attn):
        raise _ConfigProblem("attn_config.qk_ln true is not supported")
    norm_type = str(c.data.get("norm_type", "low_precision_layernorm"))
    no_bias = c.bool("no_bias", False)
    if c.bool("alibi", False, data=attn):
        pos = "alibi"
    elif c.bool("rope", False, data=attn):
        pos = "rotary"
    elif c.bool("learned_pos_emb", True):
        pos = "learned"
    else:
        pos = "none"
    max_pos = c.int("max_seq_len", 2048)
    return dict(
        family="mpt",
        kind="decoder",
        n_layers=c.int("n_layers"),
        hidden=d_model,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        ffn_hidden=int(round(ratio * d_model)),
        gated_mlp=ffn_type == "mptglu",
        vocab_size=c.int("vocab_size", 50368),
        max_positions=max_pos,
        default_seq_len=min(max_pos, _MAX_DEFAULT_SEQ),
        tied_embeddings=c.bool("tie_word_embeddings", True),
        pos_embedding=pos,
        norm="rmsnorm" if "rmsnorm" in norm_type else "layernorm",
        linear_bias=not no_bias,
        norm_bias=not no_bias,
        head="lm",
    )


_BUILDERS: dict[str, Callable[[_Cfg, str], dict[str, Any]]] = {
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
    "llama": _llama_like("llama"),
    "mistral": _llama_like("mistral"),
    "mpt": _mpt,
    "bert": _bert_like("bert"),
    "roberta": _bert_like("roberta"),
    "vit": _vit,
}


def _read(path: Path) -> dict[str, Any]:
    """Read a JSON object from ``path`` (a directory means its ``config.json``)."""
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; {_supported()}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise UsageError(f"{path}: cannot read file ({reason}); {_supported()}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            f"{_supported()}"
        ) from None
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
    builder = _BUILDERS.get(str(model_type))
    if builder is None:
        raise UsageError(f"{where}: unsupported model_type {model_type!r}; {_supported()}")
    spec_name = name or _default_name(data, path)
    try:
        fields = builder(_Cfg(data), spec_name)
    except _ConfigProblem as exc:
        raise UsageError(f"{where}: {exc} (model_type {model_type!r}); {_supported()}") from None
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


def _family_builder(build: Callable[[_Cfg, str], dict[str, Any]]) -> Callable[[_Cfg, str], dict[str, Any]]:
    def run(c: _Cfg, name: str) -> dict[str, Any]:
        try:
            return build(c, name)
        except ValueError as exc:
            raise _ConfigProblem(str(exc)) from None

    return run


# Families outside the transformer register their own config.json import (simulator/families).
_BUILDERS.update({t: _family_builder(b) for t, b in hf_builders().items()})
SUPPORTED_MODEL_TYPES = tuple(sorted({*SUPPORTED_MODEL_TYPES, *hf_builders()}))
