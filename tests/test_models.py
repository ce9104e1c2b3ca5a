"""Model specs, exact parameter counts, presets, Hugging Face config import and recipes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from simulator.core.errors import UsageError
from simulator.model.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from simulator.model.presets import get_model, list_models
from simulator.model.recipes import Recipe, default_recipe, make_recipe, parse_count
from simulator.model.resolve import resolve_model
from simulator.model.spec import BREAKDOWN_TOTAL_KEYS, ModelSpec

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
#: the packaged copy of the llm-foundry table (with its source column), so the test always runs
VALIDATION_DEV = Path(__file__).resolve().parents[1] / "simulator" / "data" / "validation_dev.csv"

# Exact `sum(p.numel() for p in model.parameters())` of the Hugging Face classes
# (checked against transformers 4.57 on the meta device; the newer families against 5.24).
EXACT = {
    "pythia-14m": 14_067_712,
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-base": 109_514_298,
    "bert-large": 335_174_458,
    "roberta-base": 124_697_433,
    "roberta-large": 355_412_057,
    "vit-b-16": 86_567_656,
    "vit-l-16": 304_326_632,
    "vit-large-16-in21k": 325_688_657,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-3-8b": 8_030_261_248,
    "tinyllama-1.1b": 1_100_048_384,
    "mistral-7b": 7_241_732_096,
    "mpt-7b-hf": 6_649_286_656,
    # transformers 5.24 (tests/data/transformers_counts.json)
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen3-0.6b": 596_049_920,
    "gemma-2b": 2_506_172_416,
    "gemma-2-2b": 2_614_341_888,
    "gemma-3-1b": 999_885_952,
    "phi-3-mini": 3_821_079_552,
    "olmo-1b": 1_176_764_416,
    "olmo-2-1b": 1_484_916_736,
    "stablelm-2-1.6b": 1_644_515_328,
    "falcon-7b": 6_921_720_704,
    "opt-125m": 125_239_296,
    "opt-1.3b": 1_315_758_080,
    "bloom-560m": 559_214_592,
    "bloom-1b1": 1_065_314_304,
}


# ---------------------------------------------------------------------- counts
@pytest.mark.parametrize("name,expected", sorted(EXACT.items()))
def test_exact_parameter_counts(name: str, expected: int) -> None:
    assert get_model(name).n_params() == expected


def test_pythia_non_embedding_matches_published() -> None:
    # Pythia's table lists non-embedding parameters: 805,736,448 for 1B.
    assert get_model("pythia-1b").n_params_non_embedding() == 805_736_448
    assert get_model("pythia-160m").n_params_non_embedding() == 85_056_000


@pytest.mark.parametrize("name", ["pythia-1b", "gpt2", "roberta-large", "vit-large-16-in21k", "llama-3-8b", "mpt-7b"])
def test_breakdown_adds_up(name: str) -> None:
    m = get_model(name)
    b = m.param_breakdown()
    assert sum(b[k] for k in BREAKDOWN_TOTAL_KEYS) == m.n_params()
    assert b["layer_per_layer"] * m.n_layers == b["attention"] + b["mlp"] + b["norms"]
    assert 0 < m.n_params_non_embedding() < m.n_params()


def test_shapes() -> None:
    p = get_model("pythia-1b")
    assert (p.head_dim, p.kv_dim, p.seq_len_default) == (256, 2048, 2048)
    llama3 = get_model("llama-3-8b")
    assert (llama3.head_dim, llama3.kv_dim) == (128, 1024)
    vit = get_model("vit-large-16-in21k")
    assert vit.seq_len_default == 197 and vit.n_patches == 196
    assert p.display_name == "Pythia-1B"


def _mpt_rows() -> list[dict[str, str]]:
    if not VALIDATION_DEV.exists():
        return []
    with VALIDATION_DEV.open() as fh:
        return [r for r in csv.DictReader(fh)]


def test_mpt_llm_foundry_counts_reproduce_validation_table() -> None:
    # llm-foundry's pretrain yamls keep MPTConfig defaults (biases, learned positions of length
    # max_seq_len = the run's seq_len), hence num_params grows by seq_len * d_model.
    rows = _mpt_rows()
    assert rows
    for r in rows:
        m = get_model("mpt-" + r["model"]).with_max_positions(int(r["seq_len"]))
        assert m.hidden == int(r["d_model"]) and m.n_layers == int(r["n_layers"])
        assert m.n_heads == int(r["n_heads"]) and m.vocab_size == int(r["vocab_size"])
        assert m.n_params() == int(r["num_params"]), r


def test_mpt_foundry_config_dict_matches_table_row() -> None:
    cfg = {
        "model_type": "mpt",
        "d_model": 2048,
        "n_layers": 24,
        "n_heads": 16,
        "expansion_ratio": 4,
        "max_seq_len": 2048,
        "vocab_size": 50368,
        "attn_config": {"attn_impl": "triton"},
    }
    assert model_from_hf_config(cfg, name="mpt-1b").n_params() == 1_315_950_592
    alibi = dict(cfg, no_bias=True, attn_config={"alibi": True})
    m = model_from_hf_config(alibi)
    assert m.pos_embedding == "alibi" and not m.linear_bias
    # no position table, no biases: 24 * (12 d^2 + 2 d) + V d + d
    assert m.n_params() == 24 * (12 * 2048**2 + 2 * 2048) + 50368 * 2048 + 2048


# ---------------------------------------------------------------------- validation
def _base_kwargs(**over: object) -> dict[str, object]:
    kw: dict[str, object] = get_model("pythia-160m").model_dump()
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "over",
    [
        {"hidden": 770},  # not divisible by 12 heads
        {"n_kv_heads": 5},  # 12 % 5
        {"n_layers": 0},
        {"vocab_size": -1},
        {"family": "t5"},
        {"unknown_field": 1},
        {"kind": "decoder", "head": "mlm"},
    ],
)
def test_spec_validation(over: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ModelSpec(**_base_kwargs(**over))


def test_with_max_positions_changes_learned_table_only() -> None:
    g = get_model("gpt2")
    assert g.with_max_positions(2048).n_params() - g.n_params() == 1024 * 768
    p = get_model("pythia-160m")
    assert p.with_max_positions(4096).n_params() == p.n_params()


# ---------------------------------------------------------------------- presets
def test_required_presets_present() -> None:
    names = set(list_models())
    required = {
        *(f"pythia-{s}" for s in ["14m", "31m", "70m", "160m", "410m", "1b", "1.4b", "2.8b", "6.9b", "12b"]),
        "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
        "bert-base", "bert-large", "roberta-base", "roberta-large",
        "vit-b-16", "vit-l-16", "vit-large-16-in21k",
        *(f"mpt-{s}" for s in ["125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b"]),
        "llama-2-7b", "llama-2-13b", "llama-3-8b", "tinyllama-1.1b",
        "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "qwen2.5-0.5b", "qwen2.5-1.5b",
        "qwen3-0.6b", "gemma-2b", "gemma-2-2b", "gemma-3-1b", "phi-3-mini", "olmo-1b",
        "olmo-2-1b", "stablelm-2-1.6b", "falcon-7b", "opt-125m", "opt-1.3b", "bloom-560m",
        "bloom-1b1",
    }  # fmt: skip
    assert required <= names
    for n in names:
        m = get_model(n)
        assert m.source, n
        assert m.hf_id or m.family == "mpt" or getattr(m, "kernel", None) == "slow", n  # slow: a run variant


@pytest.mark.parametrize("alias", ["pythia-1b", "Pythia-1B", "EleutherAI/pythia-1b", " PYTHIA-1B "])
def test_aliases(alias: str) -> None:
    assert get_model(alias).name == "pythia-1b"


def test_hf_id_aliases() -> None:
    assert get_model("google/vit-large-patch16-224-in21k").name == "vit-large-16-in21k"
    assert get_model("mosaicml/mpt-7b").name == "mpt-7b-hf"
    assert get_model("meta-llama/Meta-Llama-3-8B").name == "llama-3-8b"
    assert get_model("bert-base-uncased").name == "bert-base"


def test_unknown_model() -> None:
    with pytest.raises(UsageError) as exc:
        get_model("pythia-1c")
    msg = str(exc.value)
    assert "unknown model 'pythia-1c'" in msg and "pythia-1b" in msg and "\n" not in msg


def test_resolve_model_preset_and_path() -> None:
    assert resolve_model("pythia-160m").name == "pythia-160m"
    m = resolve_model(str(FIXTURES / "pythia-160m.json"))
    assert m.n_params() == EXACT["pythia-160m"]
    with pytest.raises(UsageError, match="no such file"):
        resolve_model("does/not/exist.json")


# ---------------------------------------------------------------------- HF import
FIXTURE_TO_PRESET = {
    "pythia-160m": "pythia-160m",
    "gpt2": "gpt2",
    "llama-2-7b": "llama-2-7b",
    "mistral-7b": "mistral-7b",
    "bert-base-uncased": "bert-base",
    "roberta-large": "roberta-large",
    "vit-large-patch16-224-in21k": "vit-large-16-in21k",
    "mpt-7b": "mpt-7b-hf",
    "SmolLM2-135M": "smollm2-135m",
    "SmolLM2-360M": "smollm2-360m",
    "SmolLM2-1.7B": "smollm2-1.7b",
    "Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen2.5-1.5B": "qwen2.5-1.5b",
    "Qwen3-0.6B-Base": "qwen3-0.6b",
    "gemma-2b": "gemma-2b",
    "gemma-2-2b": "gemma-2-2b",
    "gemma-3-1b-pt": "gemma-3-1b",
    "Phi-3-mini-4k-instruct": "phi-3-mini",
    "OLMo-1B-hf": "olmo-1b",
    "OLMo-2-0425-1B": "olmo-2-1b",
    "stablelm-2-1_6b": "stablelm-2-1.6b",
    "falcon-7b": "falcon-7b",
    "opt-125m": "opt-125m",
    "opt-1.3b": "opt-1.3b",
    "bloom-560m": "bloom-560m",
    "bloom-1b1": "bloom-1b1",
    "Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "OLMoE-1B-7B-0924": "olmoe-1b-7b",
    "Qwen3-30B-A3B-Base": "qwen3-30b-a3b",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "DeepSeek-V2-Lite": "deepseek-v2-lite",
}


@pytest.mark.parametrize("fixture,preset", sorted(FIXTURE_TO_PRESET.items()))
def test_hf_config_matches_preset(fixture: str, preset: str) -> None:
    m = model_from_hf_config(FIXTURES / f"{fixture}.json")
    p = get_model(preset)
    assert m.n_params() == p.n_params()
    assert m.param_breakdown() == p.param_breakdown()
    for field in ("family", "kind", "n_layers", "hidden", "n_heads", "kv_heads", "ffn_hidden",
                  "gated_mlp", "vocab_size", "tied_embeddings", "pos_embedding", "norm",
                  "linear_bias", "head", "seq_len_default", "head_dim", "q_dim", "kv_dim",
                  "qkv_bias", "qk_norm", "norms_per_layer", "norm_affine", "sliding_window",
                  "n_window_layers", "attn_softcap", "logit_softcap", "rotary_pct",
                  "max_positions", "parallel_residual", "embedding_norm", "final_norm"):
        assert getattr(m, field) == getattr(p, field), field


def test_all_supported_types_have_fixtures() -> None:
    types = {json.loads(f.read_text())["model_type"] for f in FIXTURES.glob("*.json")}
    assert types == set(SUPPORTED_MODEL_TYPES)


def test_hf_config_accepts_dict_and_name() -> None:
    cfg = json.loads((FIXTURES / "gpt2.json").read_text())
    m = model_from_hf_config(cfg, name="my-gpt")
    assert m.name == "my-gpt" and m.n_params() == EXACT["gpt2"]


def test_hf_config_folder(tmp_path: Path) -> None:
    (tmp_path / "pythia").mkdir()
    (tmp_path / "pythia" / "config.json").write_text((FIXTURES / "pythia-160m.json").read_text())
    m = model_from_hf_config(tmp_path / "pythia")
    assert m.name == "pythia" and m.n_params() == EXACT["pythia-160m"]


def _one_line_error(arg: object) -> str:
    with pytest.raises(UsageError) as exc:
        model_from_hf_config(arg)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "\n" not in msg
    assert "gpt_neox" in msg and "roberta" in msg  # lists supported types
    return msg


def test_hf_unknown_model_type(tmp_path: Path) -> None:
    f = tmp_path / "deberta.json"
    f.write_text(json.dumps({"model_type": "deberta-v2", "hidden_size": 512}))
    msg = _one_line_error(f)
    assert str(f) in msg and "unsupported model_type 'deberta-v2'" in msg
    assert all(t in msg for t in SUPPORTED_MODEL_TYPES)


def test_hf_malformed_json(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "gpt2", ')
    msg = _one_line_error(f)
    assert str(f) in msg and "not valid JSON" in msg


def test_hf_not_an_object(tmp_path: Path) -> None:
    f = tmp_path / "list.json"
    f.write_text("[1, 2]")
    assert "JSON object" in _one_line_error(f)


def test_hf_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "missing.json"
    msg = _one_line_error(f)
    assert str(f) in msg and "no such file" in msg


def test_hf_missing_fields(tmp_path: Path) -> None:
    cfg = json.loads((FIXTURES / "llama-2-7b.json").read_text())
    del cfg["hidden_size"]
    f = tmp_path / "llama.json"
    f.write_text(json.dumps(cfg))
    msg = _one_line_error(f)
    assert str(f) in msg and "'hidden_size'" in msg
    assert "model_type" in _one_line_error({"hidden_size": 4})


def test_hf_bad_values() -> None:
    msg = _one_line_error({"model_type": "gpt2", "n_embd": "768", "n_layer": 12, "n_head": 12})
    assert "'n_embd'" in msg
    msg = _one_line_error({"model_type": "gpt2", "n_embd": 100, "n_layer": 2, "n_head": 3})
    assert "divisible" in msg


def test_vit_num_labels_from_config() -> None:
    cfg = json.loads((FIXTURES / "vit-large-patch16-224-in21k.json").read_text())
    assert model_from_hf_config(cfg, name="vit").num_classes == 1000
    assert model_from_hf_config(dict(cfg, num_labels=10), name="vit").num_classes == 10
    assert model_from_hf_config(FIXTURES / "vit-large-patch16-224-in21k.json").num_classes == 21841


# ---------------------------------------------------------------------- recipes
def test_study_recipes() -> None:
    r = default_recipe(get_model("pythia-1b"))
    assert (r.global_batch, r.seq_len, r.steps, r.precision) == (1024, 2049, 143_000, "bf16")
    assert r.tokens == 1024 * 2049 * 143_000
    assert default_recipe(get_model("pythia-160m")).precision == "fp16"
    rl = default_recipe(get_model("roberta-large"))
    assert (rl.global_batch, rl.seq_len, rl.steps, rl.precision) == (8192, 512, 500_000, "fp16")
    v = default_recipe(get_model("vit-large-16-in21k"))
    assert (v.global_batch, v.seq_len, v.steps, v.precision) == (4096, 197, 311_948, "fp32")
    # an imported config named like a preset gets the preset's recipe
    imported = model_from_hf_config(FIXTURES / "pythia-160m.json")
    assert default_recipe(imported).steps == 143_000


def test_generic_recipe() -> None:
    m = get_model("gpt2")
    r = default_recipe(m)
    assert (r.global_batch, r.seq_len, r.precision, r.optimizer) == (512, 1024, "bf16", "adamw")
    assert r.steps == -(-20 * m.n_params() // (512 * 1024))
    assert "generic" in r.source
    for name in list_models():
        model = get_model(name)
        rec = default_recipe(model)
        assert getattr(model, "pos_embedding", None) != "learned" or rec.seq_len <= model.max_positions


def test_recipe_overrides() -> None:
    m = get_model("pythia-1b")
    r = make_recipe(m, tokens="300B")
    assert r.steps == -(-300 * 10**9 // (1024 * 2049))
    r = make_recipe(m, tokens="1T", global_batch=512, seq_len=1024)
    assert r.steps == -(-10**12 // (512 * 1024))
    r = make_recipe(m, steps=10, optimizer="Lion")
    assert (r.steps, r.optimizer, r.tokens) == (10, "lion", 10 * 1024 * 2049)
    # changing the batch keeps the default token budget
    r = make_recipe(m, global_batch=512)
    assert r.steps == 286_000
    assert make_recipe(m) == default_recipe(m)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"global_batch": 0}, "--global-batch must be a positive integer, got 0"),
        ({"steps": -5}, "--steps must be a positive integer"),
        ({"seq_len": 0}, "--seq-len must be a positive integer"),
        ({"tokens": "0"}, "--tokens must be a positive integer"),
        ({"tokens": "lots"}, "--tokens"),
        ({"tokens": "1T", "steps": 3}, "not both"),
        ({"optimizer": "adagrad"}, "unknown optimizer"),
    ],
)
def test_recipe_override_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        make_recipe(get_model("pythia-1b"), **kwargs)  # type: ignore[arg-type]


def test_seq_len_limits() -> None:
    with pytest.raises(UsageError, match="learned position"):
        make_recipe(get_model("gpt2"), seq_len=2048)
    with pytest.raises(UsageError, match="learned position"):
        make_recipe(get_model("roberta-large"), seq_len=1024)
    with pytest.raises(UsageError, match="197"):
        make_recipe(get_model("vit-l-16"), seq_len=256)
    assert make_recipe(get_model("pythia-160m"), seq_len=8192).seq_len == 8192  # rotary


@pytest.mark.parametrize(
    "text,value",
    [
        ("300B", 300 * 10**9),
        ("2.5e11", 250 * 10**9),
        ("1T", 10**12),
        ("1.5t", 1_500 * 10**9),
        ("50k", 50_000),
        ("1_000_000", 10**6),
        ("1,000", 1000),
        (" 7 ", 7),
        (42, 42),
        (3e9, 3 * 10**9),
    ],
)
def test_parse_count(text: str | int | float, value: int) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.5", "12X", "1e", "--3", "nan", "B", True])
def test_parse_count_garbage(text: object) -> None:
    with pytest.raises(UsageError):
        parse_count(text)  # type: ignore[arg-type]


def test_recipe_model_validation() -> None:
    with pytest.raises(ValidationError):
        Recipe(seq_len=0, global_batch=1, steps=1)
    with pytest.raises(ValidationError):
        Recipe(seq_len=1, global_batch=1, steps=1, optimizer="adagrad")
    with pytest.raises(ValidationError):
        Recipe(seq_len=1, global_batch=1, steps=1, extra=1)


def test_hf_bad_rotary_pct() -> None:
    cfg = json.loads((FIXTURES / "pythia-160m.json").read_text())
    assert "'rotary_pct'" in _one_line_error(dict(cfg, rotary_pct="quarter"))


def test_resolve_model_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((FIXTURES / "mistral-7b.json").read_text())
    assert resolve_model(str(tmp_path)).n_params() == EXACT["mistral-7b"]


def test_hf_config_read_is_guarded(tmp_path: Path, monkeypatch) -> None:
    """model_from_hf_config reads through simulator.core.userfiles: devices, oversized and non-UTF-8
    files are one-line UsageErrors naming the file (never a hang on /dev/zero)."""
    from simulator.core import userfiles

    assert "not a regular file" in _one_line_error(Path("/dev/null"))
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"model_type": "gpt2", "name": "caf\xe9"}')
    msg = _one_line_error(bad)
    assert str(bad) in msg and "not UTF-8" in msg
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"model_type": "gpt2", "pad": "x" * 100}))
    monkeypatch.setattr(userfiles, "MAX_INPUT_BYTES", 64)
    assert "limit" in _one_line_error(big)


def test_models_does_not_depend_on_hf_config():
    # one-directional: hf_config and resolve build on models; models imports neither (nor the Hub)
    import ast

    import simulator.model.presets

    tree = ast.parse(Path(simulator.model.presets.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not [m for m in names if any(bad in m for bad in ("hf_config", "resolve", "hub"))]
