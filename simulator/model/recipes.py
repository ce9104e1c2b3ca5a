"""Training recipes: how many sequences of which length for how many optimizer steps.

Defaults come from ``simulator/data/recipes.yaml``: the study's recipes (``data/paper_recipes.csv``)
for its models, published recipes for a few others, and a documented generic default
(~2^19 tokens per step, 20 tokens per parameter, bf16, AdamW) for everything else.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ..core.errors import UsageError, unknown
from ..core.vocab import FP8, PRECISIONS
from ..strategy.knobs import OPTIMIZERS, Optimizer
from .presets import get_model
from .spec import ModelSpec

#: A recipe's own precision: a training precision but TF32, which is a way to run an fp32
#: recipe's GEMMs (a strategy the search tries where the GPU has it), and FP8, which the user pins
#: (``--precision fp8``: the training stack must be configured for it, so it is never searched).
RECIPE_PRECISIONS: tuple[str, ...] = tuple(p for p in PRECISIONS if p not in ("tf32", FP8))
RecipePrecision = Literal[RECIPE_PRECISIONS]


class Recipe(BaseModel):
    """A pre-training recipe.

    ``seq_len`` in tokens per sequence (ViT: patches + CLS), ``global_batch`` in sequences
    (images) per optimizer step, ``steps`` in optimizer steps, ``precision`` the recipe's own
    training precision (mixed precision for fp16/bf16).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    steps: int = Field(gt=0)
    optimizer: Optimizer = "adamw"
    precision: RecipePrecision = "bf16"
    source: str = ""

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: ``global_batch * seq_len``."""
        return self.global_batch * self.seq_len

    @property
    def tokens(self) -> int:
        """Total training tokens: ``global_batch * seq_len * steps``."""
        return self.global_batch * self.seq_len * self.steps

    def describe(self) -> str:
        """E.g. ``300 B tokens (1024 × 2049 × 143,000 steps)``."""
        return (
            f"{format_count(self.tokens)} tokens ({self.global_batch} × {self.seq_len} × "
            f"{self.steps:,} steps)"
        )


# ---------------------------------------------------------------------- counts
#: Largest training run the simulator accepts, in tokens (steps x global batch x sequence length).
#: An assumption chosen to keep every product of counts exact in 64-bit arithmetic: about a
#: hundred thousand times the largest published pre-training runs (~1e13 tokens).
MAX_TOKENS = 10**18


_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}
_COUNT_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKmMbBgGtTpP]?)$")


def parse_count(text: str | int | float, flag: str = "count") -> int:
    """Parse a count such as ``300B``, ``2.5e11``, ``1T``, ``50k``, ``1_000_000`` or ``1,000``.

    Suffixes K/M/B(=G)/T/P are powers of 1000 (case-insensitive). The value must be a whole
    number (the sign is kept: callers check positivity). Garbage raises UsageError naming ``flag``.
    """
    if isinstance(text, bool):
        raise UsageError(f"{flag}: expected a count, got {text!r}")
    if isinstance(text, int):
        if abs(text) > MAX_TOKENS:
            raise UsageError(f"{flag} (a {int(abs(text).bit_length() * 0.30103) + 1}-digit number) is beyond "
                             f"what this simulator models (at most "
                             f"{MAX_TOKENS:.0e} for any count)")
        return text
    if isinstance(text, float):
        if not math.isfinite(text) or text != int(text):
            raise UsageError(f"{flag}: expected a whole number, got {text!r}")
        return int(text)
    if not isinstance(text, str):
        raise UsageError(f"{flag}: expected a count, got {text!r}")
    cleaned = text.strip().replace("_", "").replace(",", "")
    m = _COUNT_RE.match(cleaned)
    if not m:
        raise UsageError(
            f"{flag}: cannot read {text!r} as a count (examples: 300B, 2.5e11, 1T, 50000)"
        )
    try:
        value = Decimal(m.group(1)) * _SUFFIX[m.group(2).upper()]
    except (InvalidOperation, ArithmeticError):  # e.g. an exponent beyond Decimal's range
        raise UsageError(f"{flag} {text} is beyond what this simulator models (at most "
                         f"{MAX_TOKENS:.0e} for any count)") from None
    if value.copy_abs() > MAX_TOKENS:
        raise UsageError(f"{flag} {text} is beyond what this simulator models (at most "
                         f"{MAX_TOKENS:.0e} for any count)")
    if value != value.to_integral_value():
        raise UsageError(f"{flag}: {text!r} is not a whole number")
    return int(value)


def format_count(n: int | float) -> str:
    """``300000000000`` → ``300 B``; ``1.5e12`` → ``1.5 T``; small numbers with separators."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}"
    return f"{int(n):,}"


# ---------------------------------------------------------------------- defaults
@functools.lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    text = resources.files("simulator").joinpath("data/recipes.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    by_model: dict[str, dict[str, Any]] = {}
    for row in raw["recipes"]:
        row = dict(row)
        names = row.pop("models")
        Recipe(**row)  # validate the data file eagerly
        for name in names:
            key = get_model(name).name  # canonical preset name; also checks the name exists
            if key in by_model:
                raise RuntimeError(f"recipes.yaml: two recipes for {name!r}")
            by_model[key] = row
    return {"generic": raw["generic"], "family": raw.get("family_generic", {}), "rows": by_model}


def _preset_name(model: ModelSpec) -> str | None:
    """The preset a spec corresponds to (its name, or its Hugging Face id), if any."""
    for candidate in (model.name, model.hf_id):
        if not candidate:
            continue
        try:
            return get_model(candidate).name
        except UsageError:
            continue
    return None


def default_recipe(model: ModelSpec) -> Recipe:
    """The default recipe for ``model``: the study's or a published one where known, else the
    generic default (~2^19 tokens per step, 20 tokens per parameter, bf16, AdamW)."""
    data = _load()
    key = _preset_name(model)
    if key is not None and key in data["rows"]:
        row = dict(data["rows"][key])
        if model.family == "vit":
            row["seq_len"] = model.seq_len_default
        return Recipe(**row)
    if model.family in data["family"]:
        row = dict(data["family"][model.family])
        if "same_as" in row:  # the family's preset recipe, at this model's own sequence length
            preset = get_model(row.pop("same_as")).name
            row = {k: v for k, v in data["rows"][preset].items() if k != "seq_len"}
            row["source"] = f"the {preset} recipe (the family's preset): {row['source']}"
        return Recipe(seq_len=model.seq_len_default, **row)
    g = data["generic"]
    seq_len = model.seq_len_default
    global_batch = max(1, round(g["tokens_per_step"] / seq_len))
    steps = max(1, math.ceil(g["tokens_per_param"] * model.n_params() / (global_batch * seq_len)))
    return Recipe(
        seq_len=seq_len,
        global_batch=global_batch,
        steps=steps,
        optimizer=g["optimizer"],
        precision=g["precision"],
        source=g["source"],
    )


def _positive(value: Any, flag: str) -> int:
    n = parse_count(value, flag)
    if n <= 0:
        raise UsageError(f"{flag} must be a positive integer, got {value}")
    if n > MAX_TOKENS:
        raise UsageError(f"{flag} {value} is beyond what this simulator models (at most "
                         f"{MAX_TOKENS:.0e} for any count)")
    return n


def _model_too_large(model: ModelSpec, base: Recipe) -> str:
    """Why a model's own default recipe is beyond :data:`MAX_TOKENS`: its size (the generic recipe
    trains a fixed number of tokens per parameter), naming the dimensions to check."""
    dims = ", ".join(f"{label} {getattr(model, f):,}" for f, label in (
        ("hidden", "hidden size"), ("n_layers", "layers"), ("ffn_hidden", "MLP size"), ("vocab_size", "vocabulary"))
        if isinstance(getattr(model, f, None), int))
    return (f"{model.display_name} has {model.n_params():.2e} parameters ({dims}; {model.source or 'no source'}): "
            f"its default recipe of {_load()['generic']['tokens_per_param']} tokens per parameter is "
            f"{base.tokens:.1e} tokens, beyond what this simulator models (at most {MAX_TOKENS:.0e}); check the "
            "model's sizes (in a config.json: hidden_size, num_hidden_layers, intermediate_size, vocab_size)")


def _seq_len(value: Any) -> int:
    """``--seq-len`` as a positive count written without a K/M suffix: "2K" could mean 2,000 or
    2,048 tokens, so a suffix is refused (UsageError suggesting the binary reading)."""
    if isinstance(value, str):
        m = _COUNT_RE.match(value.strip().replace("_", "").replace(",", ""))
        if m and m.group(2):
            power = {"K": 1, "M": 2, "B": 3, "G": 3, "T": 4, "P": 5}[m.group(2).upper()]
            binary = float(m.group(1)) * 1024**power
            hint = f" such as {int(binary)}" if binary == int(binary) and 0 < binary <= MAX_TOKENS else ""
            raise UsageError(f"--seq-len {value!r}: give the tokens per sequence as a plain number{hint} (the "
                             f"{m.group(2)} suffix is ambiguous: 1K is 1,000 or 1,024 tokens)")
    return _positive(value, "--seq-len")


def rounding_note(model, recipe: Recipe, tokens: Any = None, steps: Any = None) -> str | None:
    """A note when whole optimizer steps train more than 1% beyond the token budget asked
    (``tokens``, or the model's default budget when neither ``tokens`` nor ``steps`` is given):
    a global batch larger than the budget makes one step of it. None otherwise."""
    if steps is not None:
        return None
    asked = _positive(tokens, "--tokens") if tokens is not None else default_recipe(model).tokens
    if recipe.tokens <= 1.01 * asked:
        return None
    return (f"{format_count(asked)} token{'' if asked == 1 else 's'} round{'s' if asked == 1 else ''} up to whole steps of {recipe.global_batch:,} x {recipe.seq_len:,} "
            f"tokens: {format_count(recipe.tokens)} simulated, {recipe.tokens / asked:,.3g}x as many; a smaller "
            "--global-batch comes closer")


def make_recipe(
    model: ModelSpec,
    tokens: int | float | str | None = None,
    steps: int | str | None = None,
    global_batch: int | str | None = None,
    seq_len: int | str | None = None,
    optimizer: str | None = None,
    precision: str | None = None,
) -> Recipe:
    """The default recipe for ``model`` with command-line style overrides.

    * ``tokens`` (e.g. ``"300B"``): steps = ceil(tokens / (global_batch * seq_len));
    * ``steps``: optimizer steps; giving both ``tokens`` and ``steps`` is an error;
    * ``global_batch`` (sequences) / ``seq_len`` (tokens) without ``tokens`` or ``steps`` keep the
      default recipe's token budget (steps recomputed, rounded up);
    * ``seq_len`` beyond ``max_positions`` is an error for learned position embeddings; ViT's
      sequence length is fixed by image and patch size.

    Raises UsageError naming the flag (``--tokens``, ``--steps``, ``--global-batch``,
    ``--seq-len``, ``--optimizer``, ``--precision``).
    """
    base = default_recipe(model)
    if tokens is not None and steps is not None:
        raise UsageError("give --tokens or --steps, not both")
    n_tokens = _positive(tokens, "--tokens") if tokens is not None else None
    n_steps = _positive(steps, "--steps") if steps is not None else None
    gb = _positive(global_batch, "--global-batch") if global_batch is not None else base.global_batch
    sl = _seq_len(seq_len) if seq_len is not None else base.seq_len
    opt = base.optimizer
    if optimizer is not None:
        opt = str(optimizer).strip().lower()
        if opt not in OPTIMIZERS:
            raise unknown("optimizer", str(optimizer), OPTIMIZERS)
    prec = base.precision
    if precision is not None:
        prec = str(precision).strip().lower()
        if prec not in RECIPE_PRECISIONS:
            raise unknown("precision", str(precision), RECIPE_PRECISIONS)

    if model.family == "vit" and sl != model.seq_len_default:
        raise UsageError(
            f"--seq-len {sl} does not fit {model.display_name}: its sequence is fixed at "
            f"{model.seq_len_default} tokens ({model.n_patches} patches + CLS)"
        )
    fixed = getattr(model, "fixed_seq_len", None)  # e.g. ConvNeXt: a sample is one image
    if fixed is not None and sl != fixed:
        raise UsageError(f"--seq-len {sl} does not fit {model.display_name}: its samples are fixed at "
                         f"seq_len {fixed} ({model.sample_unit})")
    if getattr(model, "pos_embedding", None) == "learned" and sl > model.max_positions:
        raise UsageError(
            f"--seq-len {sl} exceeds {model.display_name}'s {model.max_positions} learned "
            f"position embeddings"
        )

    changes: list[str] = []
    if n_tokens is not None:
        n_steps = -(-n_tokens // (gb * sl))
        changes.append(f"tokens {format_count(n_tokens)}")
    elif n_steps is not None:
        changes.append(f"steps {n_steps:,}")
    elif gb != base.global_batch or sl != base.seq_len:
        n_steps = math.ceil(base.tokens / (gb * sl))
        changes.append(f"same {format_count(base.tokens)} tokens")
    else:
        n_steps = base.steps
    if gb != base.global_batch:
        changes.append(f"global batch {gb}")
    if sl != base.seq_len:
        changes.append(f"seq len {sl}")
    if opt != base.optimizer:
        changes.append(f"optimizer {opt}")
    if prec != base.precision:
        changes.append(f"precision {prec}")
    if n_tokens is None and steps is None and base.tokens > MAX_TOKENS:  # the budget is the model's own
        raise UsageError(_model_too_large(model, base))
    if n_steps * gb * sl > MAX_TOKENS:
        raise UsageError(f"{n_steps:,} steps x {gb:,} sequences x {sl:,} tokens is {n_steps * gb * sl:.1e} "
                         f"tokens, beyond what this simulator models (at most {MAX_TOKENS:.0e}); lower "
                         "--tokens, --steps or --global-batch")
    source = base.source + (f" (overridden: {', '.join(changes)})" if changes else "")
    return Recipe(
        seq_len=sl,
        global_batch=gb,
        steps=n_steps,
        optimizer=opt,  # type: ignore[arg-type]
        precision=prec,  # type: ignore[arg-type]
        source=source,
    )
