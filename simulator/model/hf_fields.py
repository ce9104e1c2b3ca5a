"""Hugging Face ``config.json`` fields to spec fields, per architecture (no family registry).

:mod:`simulator.model.hf_config` picks the builder and validates the spec; the mixture-of-experts
family (``families/moe.py``) builds its attention half with :data:`MOE_ROPE`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_MAX_DEFAULT_SEQ = 8192


class ConfigProblem(Exception):
    """Internal: a problem with the config contents (turned into a UsageError with the source)."""


#: Integer fields that may be 0 (a token id, "no token types", "no window layers"); every other
#: integer field is a size or a count of heads or layers and must be at least 1.
_MAY_BE_ZERO = frozenset({"pad_token_id", "type_vocab_size", "max_window_layers", "first_k_dense_replace",
                          "n_shared_experts"})


class ConfigFields:
    """Typed access to config fields with clear errors."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def int(self, key: str, default: int | None = None, data: Mapping[str, Any] | None = None) -> int:
        src = self.data if data is None else data
        if key not in src or src[key] is None:
            if default is None:
                raise ConfigProblem(f"missing field {key!r}")
            return default
        value = src[key]
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or (isinstance(value, float) and not math.isfinite(value)) or value != int(value)
                or abs(value) > 2**53):
            raise ConfigProblem(f"field {key!r} must be an integer, got {value!r}")
        if value < (0 if key in _MAY_BE_ZERO else 1):
            kind = "a non-negative" if key in _MAY_BE_ZERO else "a positive"
            raise ConfigProblem(f"field {key!r} must be {kind} integer, got {value!r}")
        return int(value)

    def bool(self, key: str, default: bool, data: Mapping[str, Any] | None = None) -> bool:
        src = self.data if data is None else data
        value = src.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigProblem(f"field {key!r} must be true or false, got {value!r}")
        return value


def _fraction(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigProblem(f"field {key!r} must be a number in (0, 1], got {value!r}")
    return float(value)


def _num_labels(data: Mapping[str, Any]) -> int | None:
    if isinstance(data.get("id2label"), Mapping) and data["id2label"]:
        return len(data["id2label"])
    if data.get("num_labels") is not None:
        return ConfigFields(data).int("num_labels")
    return None


def _gpt_neox(c: ConfigFields, name: str) -> dict[str, Any]:
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


def _gpt2(c: ConfigFields, name: str) -> dict[str, Any]:
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


def _positive_int(value: Any, key: str) -> int | None:
    """``value`` as a positive integer, or None when null (a malformed value is a problem)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigProblem(f"field {key!r} must be a positive integer or null, got {value!r}")
    return value


def _softcap(c: ConfigFields, key: str, default: float | None) -> float | None:
    value = c.data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigProblem(f"field {key!r} must be a positive number or null, got {value!r}")
    return float(value)


def _window_layers(c: ConfigFields, n_layers: int, rule: str, default: int | None = None) -> tuple[int | None, int]:
    """(sliding window, number of windowed layers) as ``transformers`` decides them.

    ``layer_types`` (newer configs) lists every layer; otherwise the family's rule: ``all``
    (Mistral, Phi-3: every layer when ``sliding_window`` is set), ``qwen`` (only with
    ``use_sliding_window``, layers from ``max_window_layers`` on), ``alternate`` (Gemma 2,
    gpt-oss: even layers 0, 2, ...), ``pattern`` (Gemma 3: all but every
    ``sliding_window_pattern``-th layer), ``none``. ``default``: the config class's default
    ``sliding_window`` where it is not the rule's (gpt-oss: 128 tokens)."""
    defaults = {"alternate": 4096, "pattern": 4096, "qwen": 4096}
    window = _positive_int(c.data.get("sliding_window", default or defaults.get(rule)), "sliding_window")
    if rule == "qwen" and not c.bool("use_sliding_window", False):
        window = None
    if window is None or rule == "none":
        return None, 0
    types = c.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            raise ConfigProblem(f"field 'layer_types' must list {n_layers} layer types")
        return window, sum(1 for t in types if t == "sliding_attention")
    if rule == "all":
        n = n_layers
    elif rule == "qwen":
        n = max(0, n_layers - c.int("max_window_layers", 28))
    elif rule == "alternate":
        n = (n_layers + 1) // 2
    else:
        n = n_layers - n_layers // max(1, c.int("sliding_window_pattern", 6))
    return (window, n) if n else (None, 0)


@dataclass(frozen=True)
class _Rope:
    """What distinguishes one rotary, RMSNorm, gated-MLP decoder from another in ``transformers``.

    ``head_dim``: the config default of ``head_dim`` (None: ``hidden / heads``); ``qkv_bias``:
    fixed by the implementation (Qwen2: biased Q/K/V; None: ``attention_bias``, which also
    biases the output projection); ``attention_bias``: the config default of ``attention_bias``
    (gpt-oss: true); ``mlp_bias``: fixed by the implementation (gpt-oss: biased experts; None:
    the config's ``mlp_bias``); ``windows``: see :func:`_window_layers`, ``window`` the config
    default of ``sliding_window`` where it is not the rule's; ``softcap``: the config defaults of
    (attention, final-logit) soft-capping, read when not None.
    """

    family: str
    max_pos: int = 2048
    tied: bool = False
    head_dim: int | None = None
    qkv_bias: bool | None = None
    qk_norm: str = "none"
    norms: int = 2
    norm_affine: bool = True
    norm: str = "rmsnorm"
    attention_bias: bool = False
    mlp_bias: bool | None = None
    windows: str = "none"
    window: int | None = None
    softcap: tuple[float | None, float | None] | None = None
    cap_seq_at_window: bool = False


def _rope_decoder(t: _Rope) -> Callable[[ConfigFields, str], dict[str, Any]]:
    def build(c: ConfigFields, name: str) -> dict[str, Any]:
        hidden = c.int("hidden_size")
        n_heads = c.int("num_attention_heads")
        n_layers = c.int("num_hidden_layers")
        head_dim = _positive_int(c.data.get("head_dim", t.head_dim), "head_dim")
        if head_dim is None and hidden % n_heads:
            raise ConfigProblem(
                f"hidden_size {hidden} is not divisible by num_attention_heads {n_heads}"
            )
        if c.bool("use_bidirectional_attention", False):
            raise ConfigProblem("bidirectional attention (an encoder, e.g. EmbeddingGemma) is not supported")
        attn_bias = c.bool("attention_bias", t.attention_bias)
        mlp_bias = c.bool("mlp_bias", False) if t.mlp_bias is None else t.mlp_bias
        if t.qkv_bias is None and attn_bias != mlp_bias:
            raise ConfigProblem("attention_bias != mlp_bias is not supported")
        max_pos = c.int("max_position_embeddings", t.max_pos)
        window, n_window = _window_layers(c, n_layers, t.windows, t.window)
        default_seq = min(max_pos, _MAX_DEFAULT_SEQ)
        if t.cap_seq_at_window and window is not None:
            default_seq = min(default_seq, window)
        attn_cap, logit_cap = (None, None)
        if t.softcap is not None:
            attn_cap = _softcap(c, "attn_logit_softcapping", t.softcap[0])
            logit_cap = _softcap(c, "final_logit_softcapping", t.softcap[1])
        rotary = c.data.get("partial_rotary_factor", 1.0)
        return dict(
            family=t.family,
            kind="decoder",
            n_layers=n_layers,
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=c.int("num_key_value_heads", n_heads),
            attn_head_dim=head_dim if head_dim != hidden // n_heads else None,
            ffn_hidden=c.int("intermediate_size"),
            gated_mlp=True,
            vocab_size=c.int("vocab_size"),
            max_positions=max_pos,
            default_seq_len=default_seq,
            tied_embeddings=c.bool("tie_word_embeddings", t.tied),
            pos_embedding="rotary",
            rotary_pct=_fraction(rotary, "partial_rotary_factor"),
            norm=t.norm,
            norm_affine=t.norm_affine,
            linear_bias=attn_bias if t.qkv_bias is None else False,
            qkv_bias=t.qkv_bias,
            norm_bias=False,
            qk_norm=t.qk_norm,
            norms_per_layer=t.norms,
            sliding_window=window,
            n_window_layers=n_window,
            attn_softcap=attn_cap,
            logit_softcap=logit_cap,
            head="lm",
        )

    return build


def _stablelm(c: ConfigFields, name: str) -> dict[str, Any]:
    n_heads = c.int("num_attention_heads")
    max_pos = c.int("max_position_embeddings", 4096)
    parallel = c.bool("use_parallel_residual", False)
    return dict(
        family="stablelm",
        kind="decoder",
        n_layers=c.int("num_hidden_layers"),
        hidden=c.int("hidden_size"),
        n_heads=n_heads,
        n_kv_heads=c.int("num_key_value_heads", 32),
        ffn_hidden=c.int("intermediate_size"),
        gated_mlp=True,
        vocab_size=c.int("vocab_size"),
        max_positions=max_pos,
        default_seq_len=min(max_pos, _MAX_DEFAULT_SEQ),
        tied_embeddings=c.bool("tie_word_embeddings", False),
        pos_embedding="rotary",
        rotary_pct=_fraction(c.data.get("partial_rotary_factor", 0.25), "partial_rotary_factor"),
        norm="layernorm",
        linear_bias=False,
        qkv_bias=c.bool("use_qkv_bias", False),
        norm_bias=True,
        qk_norm="full" if c.bool("qk_layernorm", False) else "none",
        parallel_residual=parallel,
        norms_per_layer=1 if parallel else 2,
        head="lm",
    )


def _falcon(c: ConfigFields, name: str) -> dict[str, Any]:
    hidden = c.int("hidden_size", c.int("n_embed", 4544))
    n_heads = c.int("num_attention_heads", c.int("n_head", 71))
    new_arch = c.bool("new_decoder_architecture", False)
    if new_arch:
        kv_heads = c.int("num_kv_heads", n_heads)
    elif c.bool("multi_query", True):
        kv_heads = 1
    else:
        kv_heads = n_heads
    parallel = c.bool("parallel_attn", True)
    n_ln = c.data.get("num_ln_in_parallel_attn") or (2 if new_arch else 1)
    max_pos = c.int("max_position_embeddings", 2048)
    bias = c.bool("bias", False)
    return dict(
        family="falcon",
        kind="decoder",
        n_layers=c.int("num_hidden_layers", c.int("n_layer", 32)),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=kv_heads,
        ffn_hidden=c.int("ffn_hidden_size", 4 * hidden),
        vocab_size=c.int("vocab_size", 65024),
        max_positions=max_pos,
        default_seq_len=min(max_pos, _MAX_DEFAULT_SEQ),
        tied_embeddings=c.bool("tie_word_embeddings", True),
        pos_embedding="alibi" if c.bool("alibi", False) else "rotary",
        norm="layernorm",
        linear_bias=bias,
        norm_bias=True,
        parallel_residual=parallel,
        norms_per_layer=2 if (not parallel or n_ln == 2) else 1,
        head="lm",
    )


def _opt(c: ConfigFields, name: str) -> dict[str, Any]:
    hidden = c.int("hidden_size", 768)
    proj = c.int("word_embed_proj_dim", hidden)
    if proj != hidden:
        raise ConfigProblem(
            f"word_embed_proj_dim {proj} != hidden_size {hidden} (OPT-350m's project_in/out) "
            "is not supported"
        )
    max_pos = c.int("max_position_embeddings", 2048)
    pre_ln = c.bool("do_layer_norm_before", True)
    return dict(
        family="opt",
        kind="decoder",
        n_layers=c.int("num_hidden_layers", 12),
        hidden=hidden,
        n_heads=c.int("num_attention_heads", 12),
        ffn_hidden=c.int("ffn_dim", 3072),
        vocab_size=c.int("vocab_size", 50272),
        max_positions=max_pos + 2,  # OPTLearnedPositionalEmbedding keeps an offset of 2 rows
        default_seq_len=max_pos,
        tied_embeddings=c.bool("tie_word_embeddings", True),
        pos_embedding="learned",
        norm="layernorm",
        norm_affine=c.bool("layer_norm_elementwise_affine", True),
        linear_bias=c.bool("enable_bias", True),
        norm_bias=True,
        final_norm=pre_ln and not c.bool("_remove_final_layer_norm", False),
        head="lm",
    )


def _bloom(c: ConfigFields, name: str) -> dict[str, Any]:
    hidden = c.int("hidden_size", c.int("n_embed", 64))
    seq = c.int("seq_length", 2048)
    return dict(
        family="bloom",
        kind="decoder",
        n_layers=c.int("n_layer", c.int("num_hidden_layers", 2)),
        hidden=hidden,
        n_heads=c.int("n_head", c.int("num_attention_heads", 8)),
        ffn_hidden=4 * hidden,
        vocab_size=c.int("vocab_size", 250880),
        max_positions=seq,
        default_seq_len=min(seq, _MAX_DEFAULT_SEQ),
        tied_embeddings=c.bool("tie_word_embeddings", True),
        pos_embedding="alibi",
        norm="layernorm",
        linear_bias=True,
        norm_bias=True,
        embedding_norm=True,
        head="lm",
    )


def _bert_like(family: str) -> Callable[[ConfigFields, str], dict[str, Any]]:
    def build(c: ConfigFields, name: str) -> dict[str, Any]:
        pos_type = c.data.get("position_embedding_type", "absolute")
        if pos_type not in (None, "absolute"):
            raise ConfigProblem(f"position_embedding_type {pos_type!r} is not supported")
        max_pos = c.int("max_position_embeddings", 512)
        if family == "roberta":
            usable = max_pos - c.int("pad_token_id", 1) - 1
            type_vocab = c.int("type_vocab_size", 1)
        else:
            usable = max_pos
            type_vocab = c.int("type_vocab_size", 2)
        if usable <= 0:
            raise ConfigProblem(f"max_position_embeddings {max_pos} leaves no usable positions")
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


def _vit(c: ConfigFields, name: str) -> dict[str, Any]:
    if not c.bool("qkv_bias", True):
        raise ConfigProblem("qkv_bias false is not supported")
    image = c.int("image_size", 224)
    patch = c.int("patch_size", 16)
    if patch <= 0 or image % patch:
        raise ConfigProblem(f"image_size {image} is not a multiple of patch_size {patch}")
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


def _mpt(c: ConfigFields, name: str) -> dict[str, Any]:
    attn = c.data.get("attn_config") or {}
    if not isinstance(attn, Mapping):
        raise ConfigProblem("attn_config must be an object")
    ffn_cfg = c.data.get("ffn_config") or {}
    if not isinstance(ffn_cfg, Mapping):
        raise ConfigProblem("ffn_config must be an object")
    d_model = c.int("d_model")
    n_heads = c.int("n_heads")
    ratio = c.data.get("expansion_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio <= 0:
        raise ConfigProblem(f"field 'expansion_ratio' must be a positive number, got {ratio!r}")
    ffn_type = ffn_cfg.get("ffn_type", "mptmlp")
    if ffn_type not in ("mptmlp", "mptglu"):
        raise ConfigProblem(f"ffn_config.ffn_type {ffn_type!r} is not supported")
    attn_type = attn.get("attn_type", "multihead_attention")
    if attn_type == "multihead_attention":
        kv_heads = n_heads
    elif attn_type == "multiquery_attention":
        kv_heads = 1
    elif attn_type == "grouped_query_attention":
        kv_heads = c.int("kv_n_heads", 1, data=attn)
    else:
        raise ConfigProblem(f"attn_config.attn_type {attn_type!r} is not supported")
    if c.bool("qk_ln", False, data=attn):
        raise ConfigProblem("attn_config.qk_ln true is not supported")
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


_BUILDERS: dict[str, Callable[[ConfigFields, str], dict[str, Any]]] = {
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
    "llama": _rope_decoder(_Rope("llama")),
    "mistral": _rope_decoder(_Rope("mistral", 32768, windows="all", cap_seq_at_window=True)),
    "qwen2": _rope_decoder(_Rope("qwen2", 32768, qkv_bias=True, windows="qwen")),
    "qwen3": _rope_decoder(_Rope("qwen3", 32768, head_dim=128, qk_norm="shared", windows="qwen")),
    "gemma": _rope_decoder(_Rope("gemma", 8192, tied=True, head_dim=256)),
    "gemma2": _rope_decoder(
        _Rope("gemma2", 8192, tied=True, head_dim=256, norms=4, windows="alternate",
              softcap=(50.0, 30.0))
    ),
    "gemma3_text": _rope_decoder(
        _Rope("gemma3", 131072, tied=True, head_dim=256, qk_norm="shared", norms=4,
              windows="pattern", softcap=(None, None))
    ),
    "phi3": _rope_decoder(_Rope("phi3", 4096, windows="all")),
    "olmo": _rope_decoder(_Rope("olmo", norm="layernorm", norm_affine=False)),
    "olmo2": _rope_decoder(_Rope("olmo2", qk_norm="full")),
    "stablelm": _stablelm,
    "falcon": _falcon,
    "opt": _opt,
    "bloom": _bloom,
    "mpt": _mpt,
    "bert": _bert_like("bert"),
    "roberta": _bert_like("roberta"),
    "vit": _vit,
}

#: The attention half of the mixture-of-experts decoders simulator/model/families/moe.py reads (it adds
#: the routing): rotary, RMSNorm decoders as ``transformers`` builds them.
MOE_ROPE: dict[str, Callable[[ConfigFields, str], dict[str, Any]]] = {
    "mixtral": _rope_decoder(_Rope("mixtral", 131072, windows="all", cap_seq_at_window=True)),
    "qwen2_moe": _rope_decoder(_Rope("qwen2_moe", 32768, qkv_bias=True, windows="qwen")),
    "qwen3_moe": _rope_decoder(_Rope("qwen3_moe", 32768, head_dim=128, qk_norm="shared", windows="qwen")),
    "olmoe": _rope_decoder(_Rope("olmoe", 4096, qk_norm="full")),
    # DeepSeek: the decoder's common fields; families/moe.py replaces the attention by MLA
    "deepseek_v2": _rope_decoder(_Rope("deepseek_v2", 2048)),
    "deepseek_v3": _rope_decoder(_Rope("deepseek_v3", 4096)),
    # gpt-oss: biased attention projections (attention_bias, default true) and experts (always);
    # layer_types alternate a 128-token sliding window with full attention, sliding first
    "gpt_oss": _rope_decoder(_Rope("gpt_oss", 131072, head_dim=64, attention_bias=True, mlp_bias=True,
                                   windows="alternate", window=128)),
}
