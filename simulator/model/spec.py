"""Transformer model descriptions and their exact parameter counts (:class:`ModelSpec`).

A :class:`ModelSpec` describes a decoder (GPT-NeoX, GPT-2, Llama, Mistral, MPT, Qwen2/3, Gemma
1/2/3, Phi-3, OLMo 1/2, StableLM, Falcon, OPT, BLOOM) or encoder (BERT, RoBERTa, ViT) transformer
precisely enough to count its parameters exactly as the
Hugging Face implementation's ``sum(p.numel() for p in model.parameters())`` does (buffers such
as rotary frequencies or attention masks are not parameters; tied weights count once).

The model classes whose counts we reproduce:

* decoders with ``head="lm"``: ``*ForCausalLM`` / ``GPT2LMHeadModel`` (no bias on the LM head);
* ``head="mlm"``: ``BertForMaskedLM`` / ``RobertaForMaskedLM`` (no pooler; the MLM head is a
  dense + LayerNorm transform and a decoder tied to the word embeddings plus a vocab-size bias);
* ``head="classifier"``: ``ViTForImageClassification`` (no pooler; linear classifier with bias).

The presets (of every family) are :mod:`simulator.model.presets`; the other families' specs
live in ``simulator/model/families``.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..core.vocab import Activation

Family = Literal[
    "gpt_neox", "gpt2", "llama", "mistral", "mpt", "bert", "roberta", "vit",
    "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "olmo", "olmo2", "stablelm",
    "falcon", "opt", "bloom",
]  # fmt: skip
#: Every ``family`` value a :class:`ModelSpec` takes (the transformer families).
FAMILIES: tuple[str, ...] = get_args(Family)

#: Keys of :meth:`ModelSpec.param_breakdown` whose values add up to :meth:`ModelSpec.n_params`.
BREAKDOWN_TOTAL_KEYS: tuple[str, ...] = (
    "embedding",
    "position_embedding",
    "token_type_embedding",
    "embedding_norm",
    "patch_embedding",
    "cls_token",
    "attention",
    "mlp",
    "norms",
    "final_norm",
    "pooler",
    "head",
)

_DISPLAY_FAMILY = {
    "gpt_neox": "GPT-NeoX",
    "gpt2": "GPT-2",
    "llama": "Llama",
    "mistral": "Mistral",
    "mpt": "MPT",
    "bert": "BERT",
    "roberta": "RoBERTa",
    "vit": "ViT",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "phi3": "Phi-3",
    "olmo": "OLMo",
    "olmo2": "OLMo 2",
    "stablelm": "StableLM",
    "falcon": "Falcon",
    "opt": "OPT",
    "bloom": "BLOOM",
}


class NamedSpec(BaseModel):
    """What every family's spec shares: its preset ``name`` and an optional ``display`` name."""

    @property
    def display_name(self) -> str:
        """Human-readable name, e.g. ``Pythia-1B``."""
        return self.display or self.name


class ModelSpec(NamedSpec):
    """Architecture of one transformer, enough to count parameters and FLOPs exactly.

    Sizes are in elements (not bytes). ``ffn_hidden`` is the MLP inner width (for gated MLPs the
    width of each of the gate/up projections). ``max_positions`` is the context limit (for learned
    position embeddings also the size of the position table). ``default_seq_len`` is the
    training sequence length in tokens the model was built for (ViT: patches + CLS).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: Family
    kind: Literal["decoder", "encoder"]
    n_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(default=None, gt=0)
    ffn_hidden: int = Field(gt=0)
    gated_mlp: bool = False
    activation: Activation | None = None
    """The MLP's activation (:data:`ACTIVATIONS`); None: :attr:`mlp_activation`'s default."""
    vocab_size: int = Field(gt=0)
    max_positions: int = Field(gt=0)
    tied_embeddings: bool
    pos_embedding: Literal["learned", "rotary", "alibi", "none"]
    norm: Literal["layernorm", "rmsnorm"]
    linear_bias: bool
    norm_bias: bool
    parallel_residual: bool = False
    head: Literal["lm", "mlm", "classifier"]
    num_classes: int | None = Field(default=None, gt=0)
    type_vocab_size: int = Field(default=0, ge=0)
    image_size: int | None = Field(default=None, gt=0)
    patch_size: int | None = Field(default=None, gt=0)
    num_channels: int | None = Field(default=None, gt=0)
    default_seq_len: int = Field(gt=0)
    # Extra structure needed to count exactly.
    embedding_norm: bool = False
    """LayerNorm right after the embeddings (BERT, RoBERTa)."""
    final_norm: bool = True
    """Norm after the last block (GPT ``ln_f``, Llama ``norm``, ViT ``layernorm``; BERT: none)."""
    pooler: bool = False
    """A dense ``hidden x hidden`` + bias pooler on the CLS token (not in *ForMaskedLM / ViT-cls)."""
    rotary_pct: float = Field(default=1.0, gt=0.0, le=1.0)
    """Fraction of each head's dimensions that get rotary embeddings (Pythia: 0.25)."""
    attn_head_dim: int | None = Field(default=None, gt=0)
    """Width of one attention head when it is not ``hidden / n_heads`` (Gemma: 256, Qwen3: 128);
    then the Q/K/V/O projections are ``hidden x n_heads*head_dim`` rather than square."""
    qkv_bias: bool | None = None
    """Biases on the Q/K/V projections when they differ from ``linear_bias`` (Qwen2, StableLM:
    Q/K/V biased, output projection and MLP not)."""
    qk_norm: Literal["none", "shared", "full"] = "none"
    """Normalization of queries and keys before the scores: ``shared`` one ``head_dim``-wide norm
    shared by all heads (Qwen3, Gemma 3); ``full`` one weight per channel of Q and K (OLMo 2
    normalizes over all heads; StableLM has one norm per head). Weights only, no bias."""
    norms_per_layer: int = Field(default=2, ge=1, le=4)
    """Norms in one block: 2 (pre-attention, pre-MLP), 1 (parallel attention sharing one norm:
    Falcon-7B, StableLM with parallel residual), 4 (Gemma 2/3: pre and post norms)."""
    norm_affine: bool = True
    """Norms have a learned weight (OLMo-1: non-parametric LayerNorm, no weight and no bias)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Tokens a query attends to in the windowed layers (Gemma 2: 4096, Gemma 3: 512)."""
    n_window_layers: int = Field(default=0, ge=0)
    """How many of the layers use ``sliding_window`` (the rest attend to the whole context)."""
    attn_softcap: float | None = Field(default=None, gt=0)
    """Attention-logit soft-capping ``c * tanh(x / c)`` (Gemma 2: 50)."""
    logit_softcap: float | None = Field(default=None, gt=0)
    """Final-logit soft-capping before the loss (Gemma 2: 30)."""
    # Provenance.
    display: str | None = None
    hf_id: str | None = None
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.attn_head_dim is None and self.hidden % self.n_heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads})"
            )
        if self.n_window_layers > self.n_layers:
            raise ValueError(
                f"n_window_layers ({self.n_window_layers}) exceeds n_layers ({self.n_layers})"
            )
        if self.n_window_layers and self.sliding_window is None:
            raise ValueError("n_window_layers needs sliding_window")
        if self.head == "classifier" and self.num_classes is None:
            raise ValueError("head 'classifier' needs num_classes")
        if self.family == "vit":
            if None in (self.image_size, self.patch_size, self.num_channels):
                raise ValueError("ViT models need image_size, patch_size and num_channels")
            assert self.image_size is not None and self.patch_size is not None
            if self.image_size % self.patch_size:
                raise ValueError(
                    f"image_size ({self.image_size}) must be divisible by patch_size ({self.patch_size})"
                )
        if self.kind == "decoder" and self.head != "lm":
            raise ValueError("decoder models have head 'lm'")
        return self

    # ------------------------------------------------------------------ shapes
    @property
    def mlp_activation(self) -> str:
        """``activation``, else the family's: tanh-approximated GELU for GPT-2 and BLOOM and for
        Gemma's gated MLP (GeGLU), ReLU for OPT, SiLU for other gated MLPs (SwiGLU), else GELU."""
        if self.activation is not None:
            return self.activation
        if self.family in ("gpt2", "bloom", "gemma", "gemma2", "gemma3"):
            return "gelu_tanh"
        if self.family == "opt":
            return "relu"
        return "silu" if self.gated_mlp else "gelu"

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``n_heads`` unless grouped-query attention)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head (elements): ``attn_head_dim`` or ``hidden / n_heads``."""
        return self.attn_head_dim if self.attn_head_dim is not None else self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the Q projection output and of the attention output: ``n_heads * head_dim``."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the K (or V) projection output: ``kv_heads * head_dim`` (elements)."""
        return self.kv_heads * self.head_dim

    @property
    def n_patches(self) -> int:
        """ViT: number of image patches per image (0 for text models)."""
        if self.image_size is None or self.patch_size is None:
            return 0
        return (self.image_size // self.patch_size) ** 2

    @property
    def seq_len_default(self) -> int:
        """Default training sequence length in tokens (ViT: patches + 1 CLS token)."""
        if self.family == "vit":
            return self.n_patches + 1
        return self.default_seq_len


    @property
    def family_display(self) -> str:
        """Human-readable family name, e.g. ``GPT-NeoX``."""
        return _DISPLAY_FAMILY[self.family]

    # ------------------------------------------------------------------ counts
    def _norm_params(self) -> int:
        """Parameters of one norm layer over ``hidden`` (weight, plus bias if any)."""
        if not self.norm_affine:
            return 0
        return self.hidden * (2 if (self.norm_bias and self.norm == "layernorm") else 1)

    def qk_norm_params_per_layer(self) -> int:
        """Weights of the query and key norms of one layer (0 without QK-norm)."""
        if self.qk_norm == "shared":
            return 2 * self.head_dim
        if self.qk_norm == "full":
            return self.q_dim + self.kv_dim
        return 0

    def attention_params_per_layer(self) -> int:
        """Q, K, V and output projections of one layer (weights + biases) and any QK-norm."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * (q + 2 * kv) + q * h
        qkv_bias = self.linear_bias if self.qkv_bias is None else self.qkv_bias
        biases = ((q + 2 * kv) if qkv_bias else 0) + (h if self.linear_bias else 0)
        return weights + biases + self.qk_norm_params_per_layer()

    def mlp_params_per_layer(self) -> int:
        """MLP of one layer: 2 matrices (up, down) or 3 if gated (gate, up, down)."""
        h, f = self.hidden, self.ffn_hidden
        n_in = 2 if self.gated_mlp else 1
        weights = (n_in + 1) * h * f
        biases = n_in * f + h if self.linear_bias else 0
        return weights + biases

    def norm_params_per_layer(self) -> int:
        """The norms of one block (``norms_per_layer`` of them over ``hidden``)."""
        return self.norms_per_layer * self._norm_params()

    def param_breakdown(self) -> dict[str, int]:
        """Parameter counts by component.

        Keys in :data:`BREAKDOWN_TOTAL_KEYS` are totals over the model and add up to
        :meth:`n_params`; ``*_per_layer`` keys are for a single block (``layer_per_layer`` is one
        whole block).
        """
        h, v = self.hidden, self.vocab_size
        attn = self.attention_params_per_layer()
        mlp = self.mlp_params_per_layer()
        norms = self.norm_params_per_layer()
        if self.family == "vit":
            embedding = 0
            patch = self.num_channels * self.patch_size**2 * h + (h if self.linear_bias else 0)  # type: ignore[operator]
            cls_token = h
            position = self.seq_len_default * h
        else:
            embedding = v * h
            patch = 0
            cls_token = 0
            position = self.max_positions * h if self.pos_embedding == "learned" else 0
        if self.head == "lm":
            head = 0 if self.tied_embeddings else v * h
        elif self.head == "mlm":
            # transform dense (h x h + bias) + LayerNorm, decoder tied to embeddings + bias (vocab)
            head = h * h + h + 2 * h + v
            if not self.tied_embeddings:
                head += v * h
        else:
            head = h * self.num_classes + self.num_classes  # type: ignore[operator]
        out = {
            "embedding": embedding,
            "position_embedding": position,
            "token_type_embedding": self.type_vocab_size * h,
            "embedding_norm": self._norm_params() if self.embedding_norm else 0,
            "patch_embedding": patch,
            "cls_token": cls_token,
            "attention": attn * self.n_layers,
            "mlp": mlp * self.n_layers,
            "norms": norms * self.n_layers,
            "final_norm": self._norm_params() if self.final_norm else 0,
            "pooler": h * h + h if self.pooler else 0,
            "head": head,
            "attention_per_layer": attn,
            "mlp_per_layer": mlp,
            "norms_per_layer": norms,
            "layer_per_layer": attn + mlp + norms,
        }
        return out

    def n_params(self) -> int:
        """Exact number of parameters (as HF ``sum(p.numel() for p in model.parameters())``)."""
        b = self.param_breakdown()
        return sum(b[k] for k in BREAKDOWN_TOTAL_KEYS)

    def n_embedding_params(self) -> int:
        """Parameters excluded from :meth:`n_params_non_embedding`.

        Token, position and token-type embeddings, the ViT CLS token, an untied LM output matrix
        and the MLM decoder's vocab-size bias. The ViT patch projection (a GEMM) is *not* counted
        as embedding.
        """
        b = self.param_breakdown()
        n = b["embedding"] + b["position_embedding"] + b["token_type_embedding"] + b["cls_token"]
        if self.head == "lm" and not self.tied_embeddings:
            n += self.vocab_size * self.hidden
        if self.head == "mlm":
            n += self.vocab_size + (0 if self.tied_embeddings else self.vocab_size * self.hidden)
        return n

    def n_params_non_embedding(self) -> int:
        """Parameters outside the embeddings (Kaplan et al. 2020 convention; Pythia's figures)."""
        return self.n_params() - self.n_embedding_params()

    # ------------------------------------------------------------------ copies
    def with_max_positions(self, max_positions: int) -> ModelSpec:
        """A validated copy with another context limit (for learned positions this changes the
        parameter count by ``max_positions * hidden``; llm-foundry MPT configs set it to the
        run's sequence length). ``default_seq_len`` is capped at the new limit."""
        data = self.model_dump()
        data["max_positions"] = max_positions
        data["default_seq_len"] = min(self.default_seq_len, max_positions)
        return ModelSpec(**data)

    def describe(self) -> str:
        """One line: display name, parameter count, shape."""
        n = self.n_params()
        size = f"{n / 1e9:.2f} B" if n >= 999.5e6 else f"{n / 1e6:.0f} M"
        return (
            f"{self.display_name} · {size} parameters · {self.n_layers} layers × {self.hidden} "
            f"hidden × {self.n_heads} heads · {self.family_display} {self.kind}"
        )
