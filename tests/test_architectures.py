"""Architectures beyond GPT and Llama: exact counts against ``transformers``, FLOPs per token
against hand counts, the physics of head_dim, sliding windows, QK-norm and soft-capping, and the
one-sentence refusals of what is not modelled (mixture-of-experts, encoder-decoder)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hf_reference import COUNTS, all_configs, count_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.answer.api import simulate
from simulator.core.errors import UsageError
from simulator.frontends.cli import main
from simulator.model import workload
from simulator.model.graphs import model_flops_per_token, palm_flops_per_token
from simulator.model.hf_config import NOT_MODELLED, model_from_hf_config
from simulator.model.presets import get_model
from simulator.model.spec import ModelSpec

REFERENCE = json.loads(COUNTS.read_text())
SMALL = {k: v for k, v in all_configs().items() if k.startswith("small-")}
HAVE_TRANSFORMERS = all(importlib.util.find_spec(m) for m in ("torch", "transformers"))
#: Where our count follows a documented convention rather than the bare config.
CONVENTIONS = {
    # no num_labels: we count the study's 21,841 ImageNet-21k classes, transformers a 2-label head
    "vit-large-patch16-224-in21k",
}


# ---------------------------------------------------------------------- exact counts
def test_reference_counts_cover_every_config() -> None:
    from hf_reference import TYPES

    from simulator.model.hf_config import SUPPORTED_MODEL_TYPES

    assert set(REFERENCE["counts"]) == set(all_configs())
    assert set(TYPES) <= set(SUPPORTED_MODEL_TYPES)
    assert REFERENCE["transformers_version"].split(".")[0].isdigit()


@pytest.mark.parametrize("name", sorted(set(all_configs()) - CONVENTIONS))
def test_counts_match_transformers(name: str) -> None:
    """Live against transformers on the meta device when installed, else the committed counts."""
    cfg = all_configs()[name]
    expected = count_params(cfg) if HAVE_TRANSFORMERS else REFERENCE["counts"][name]
    assert model_from_hf_config(cfg, name=name).n_params() == expected


def test_every_new_type_has_a_small_config() -> None:
    types = {c["model_type"] for c in SMALL.values()}
    assert {"qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2",
            "stablelm", "falcon", "opt", "bloom"} <= types


def test_features_reach_the_spec() -> None:
    g3 = model_from_hf_config(SMALL["small-gemma3"])
    assert (g3.head_dim, g3.q_dim, g3.kv_dim) == (32, 128, 32)
    assert (g3.qk_norm, g3.norms_per_layer, g3.sliding_window, g3.n_window_layers) == ("shared", 4, 16, 5)
    g2 = model_from_hf_config(SMALL["small-gemma2"])
    assert (g2.n_window_layers, g2.attn_softcap, g2.logit_softcap) == (3, 50.0, 30.0)
    q2 = model_from_hf_config(SMALL["small-qwen2-window"])
    assert (q2.sliding_window, q2.n_window_layers, q2.qkv_bias, q2.linear_bias) == (32, 3, True, False)
    falcon = model_from_hf_config(SMALL["small-falcon-mqa-parallel"])
    assert (falcon.kv_heads, falcon.norms_per_layer, falcon.parallel_residual) == (1, 1, True)
    new = model_from_hf_config(SMALL["small-falcon-new-arch"])
    assert (new.kv_heads, new.norms_per_layer) == (2, 2)
    assert model_from_hf_config(SMALL["small-olmo"]).norm_affine is False
    assert model_from_hf_config(SMALL["small-olmo2"]).qk_norm == "full"
    assert model_from_hf_config(SMALL["small-opt-post-ln-nobias"]).final_norm is False
    # layer_types, where present, decide which layers are windowed
    listed = dict(SMALL["small-gemma2"], layer_types=["full_attention"] * 4 + ["sliding_attention"])
    assert model_from_hf_config(listed).n_window_layers == 1
    # Qwen2 without use_sliding_window: no window, whatever sliding_window says
    off = dict(SMALL["small-qwen2-window"], use_sliding_window=False)
    assert model_from_hf_config(off).sliding_window is None


# ---------------------------------------------------------------------- FLOPs by hand
# model_flops_per_token = 3 x forward per token: 2 x (weights of the layer GEMMs) x layers
# + 2 h V (logits) + 4 s q w per layer (scores and values over q = heads x head_dim, w the
# fraction of the s x s matrix computed: 1/2 causal, (w s - w^2/2) / s^2 in a window w < s).
HAND = {
    # qwen3: h 64, q 4x32=128, kv 2x32=64, f 96 gated, 3 layers, V 320, s 64
    ("small-qwen3", 64): 3 * (3 * 2 * (64 * (128 + 2 * 64) + 128 * 64 + 3 * 64 * 96)
                              + 2 * 64 * 320 + 3 * 4 * 64 * 128 * 0.5),
    # qwen2: h 64, q 64, kv 32, f 96, 5 layers (3 windowed, w 32), s 128
    ("small-qwen2-window", 128): 3 * (5 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                                      + 2 * 64 * 320 + 2 * 4 * 128 * 64 * 0.5
                                      + 3 * 4 * 128 * 64 * (32 * 128 - 32**2 / 2) / 128**2),
    # gemma: h 48, q 3x32=96, kv 1x32, f 80 gated, 2 layers, s 64
    ("small-gemma", 64): 3 * (2 * 2 * (48 * (96 + 2 * 32) + 96 * 48 + 3 * 48 * 80)
                              + 2 * 48 * 320 + 2 * 4 * 64 * 96 * 0.5),
    # gemma2: h 48, q 4x16=64, kv 2x16, f 80, 5 layers (layers 0, 2, 4 windowed, w 32), s 128
    ("small-gemma2", 128): 3 * (5 * 2 * (48 * (64 + 2 * 32) + 64 * 48 + 3 * 48 * 80)
                                + 2 * 48 * 320 + 2 * 4 * 128 * 64 * 0.5
                                + 3 * 4 * 128 * 64 * (32 * 128 - 32**2 / 2) / 128**2),
    # gemma3: h 64, q 128, kv 32, f 80, 7 layers (5 windowed, w 16), s 64
    ("small-gemma3", 64): 3 * (7 * 2 * (64 * (128 + 2 * 32) + 128 * 64 + 3 * 64 * 80)
                               + 2 * 64 * 320 + 2 * 4 * 64 * 128 * 0.5
                               + 5 * 4 * 64 * 128 * (16 * 64 - 16**2 / 2) / 64**2),
    # phi3: h 64, q 64, kv 32, f 96, 2 layers, all windowed (w 64), s 128
    ("small-phi3", 128): 3 * (2 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                              + 2 * 64 * 320 + 2 * 4 * 128 * 64 * (64 * 128 - 64**2 / 2) / 128**2),
    # phi3 with s <= window: plain causal
    ("small-phi3", 64): 3 * (2 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                             + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    # olmo / olmo2 / stablelm: h 64, q 64, kv 32, f 96 gated, 2 layers, s 64
    ("small-olmo", 64): 3 * (2 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                             + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    ("small-olmo2", 64): 3 * (2 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                              + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    ("small-stablelm-parallel-qknorm", 64): 3 * (2 * 2 * (64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 96)
                                                 + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    # falcon MQA: h 64, q 64, kv 1x16, f 256 (2 matrices), 2 layers, s 64
    ("small-falcon-mqa-parallel", 64): 3 * (2 * 2 * (64 * (64 + 2 * 16) + 64 * 64 + 2 * 64 * 256)
                                            + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    # opt: h 64, f 96 (ReLU, 2 matrices), 2 layers, s 64 (learned positions: a lookup, no FLOPs)
    ("small-opt-post-ln-nobias", 64): 3 * (2 * 2 * (64 * 3 * 64 + 64 * 64 + 2 * 64 * 96)
                                           + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
    # bloom: h 64, f 256, 2 layers, s 64 (ALiBi: a bias in the score pass, no GEMM)
    ("small-bloom", 64): 3 * (2 * 2 * (64 * 3 * 64 + 64 * 64 + 2 * 64 * 256)
                              + 2 * 64 * 320 + 2 * 4 * 64 * 64 * 0.5),
}


@pytest.mark.parametrize("name,seq", sorted(HAND))
def test_flops_per_token_hand_count(name: str, seq: int) -> None:
    m = model_from_hf_config(SMALL[name])
    assert model_flops_per_token(m, seq) == pytest.approx(HAND[(name, seq)], rel=1e-12)


# ---------------------------------------------------------------------- physics
def test_head_dim_sets_projection_widths() -> None:
    g = get_model("gemma-2-2b")  # hidden 2304, 8 heads x 256, 4 kv heads
    gemms = {x.name: x for x in workload.layer_gemms(g, np.array([1.0]))}
    assert (gemms["qkv"].n, gemms["qkv"].k) == (2048 + 2 * 1024, 2304)
    assert (gemms["attn_out"].n, gemms["attn_out"].k) == (2304, 2048)
    assert palm_flops_per_token(g, 8192) - 6 * g.n_params() == 12 * 26 * 2048 * 8192  # 12 L (heads x head_dim) s
    eager = workload.eager_attention_gemms(g, np.array([1.0]), 128)
    assert all(256 in (x.n, x.k) for x in eager)


def _windowed(window: int | None, n: int) -> ModelSpec:
    base = get_model("smollm2-135m").model_dump()
    return ModelSpec(**dict(base, sliding_window=window, n_window_layers=n))


def test_sliding_window_shrinks_fused_attention_only() -> None:
    mb, s = np.array([2.0]), 4096
    full = _windowed(None, 0)
    fl = workload.attention_flops_fwd(full, mb, s, fused=True)
    w1k = workload.attention_flops_fwd(_windowed(1024, 30), mb, s, fused=True)
    w2k = workload.attention_flops_fwd(_windowed(2048, 30), mb, s, fused=True)
    half = workload.attention_flops_fwd(_windowed(1024, 15), mb, s, fused=True)
    assert w1k < half < fl and w1k < w2k < fl
    assert workload.attention_flops_fwd(_windowed(s, 30), mb, s, fused=True) == fl
    assert workload.attention_flops_fwd(_windowed(8192, 30), mb, s, fused=True) == fl
    # materialised attention computes the whole matrix, then masks it
    assert workload.attention_flops_fwd(_windowed(1024, 30), mb, s, fused=False) == \
        workload.attention_flops_fwd(full, mb, s, fused=False)
    # the band fraction: w s - w^2/2 over s^2
    assert workload.attention_span_fraction(4096, 1024) == pytest.approx((1024 * 4096 - 1024**2 / 2) / 4096**2)


def test_qk_norm_and_extra_norms_cost_bytes_and_memory() -> None:
    base = get_model("smollm2-135m").model_dump()
    plain = ModelSpec(**base)
    qk = ModelSpec(**dict(base, qk_norm="shared"))
    four = ModelSpec(**dict(base, norms_per_layer=4))
    mb = np.array([1.0])
    eager = [workload.layer_elementwise(m, mb, 2048, 2, compiled=False)[0].nbytes[0] for m in (plain, qk, four)]
    assert eager[0] < eager[1] and eager[0] < eager[2]
    act = [workload.layer_activation_bytes_per_token(m, 2048, 2, "sdpa") for m in (plain, qk, four)]
    assert act[0] < act[1] and act[0] < act[2]
    assert qk.n_params() - plain.n_params() == 30 * 2 * 64


def test_soft_capping_costs_eager_passes_not_compiled() -> None:
    g = get_model("gemma-2-2b")
    plain = ModelSpec(**dict(g.model_dump(), attn_softcap=None, logit_softcap=None))
    mb = np.array([1.0])
    for compiled in (False, True):
        capped = workload.loss_bytes(g, mb, 2048, 2, "fused" if compiled else "upcast")[0].nbytes[0]
        uncapped = workload.loss_bytes(plain, mb, 2048, 2, "fused" if compiled else "upcast")[0].nbytes[0]
        assert (capped > uncapped) == (not compiled)
    sf = workload.eager_softmax_bytes(g, mb, 2048, 2)[0].nbytes[0]
    assert sf > workload.eager_softmax_bytes(plain, mb, 2048, 2)[0].nbytes[0]
    kw = dict(attention="eager", compile=False, micro_batch=1, seq_len=2048, precision="bf16")
    capped_plan, plain_plan = simulate(g, "8xa100-80gb", **kw), simulate(plain, "8xa100-80gb", **kw)
    assert capped_plan.memory_gib["logits"] > plain_plan.memory_gib["logits"]
    assert capped_plan.memory_gib["activations"] > plain_plan.memory_gib["activations"]
    assert capped_plan.step_time_s > plain_plan.step_time_s


@pytest.mark.parametrize("over, needle", [
    ({"n_window_layers": 31, "sliding_window": 512}, "n_window_layers"),
    ({"n_window_layers": 3}, "sliding_window"),
    ({"norms_per_layer": 0}, "norms_per_layer"),
    ({"qk_norm": "sometimes"}, "qk_norm"),
])
def test_new_fields_validated(over: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        ModelSpec(**dict(get_model("smollm2-135m").model_dump(), **over))


def test_head_dim_lifts_divisibility() -> None:
    m = ModelSpec(**dict(get_model("gemma-2b").model_dump(), hidden=2000))  # 2000 % 8 == 0 anyway
    assert m.q_dim == 2048
    odd = ModelSpec(**dict(get_model("gemma-2b").model_dump(), hidden=2002))
    assert odd.head_dim == 256


@pytest.mark.parametrize("cfg, needle", [
    ({"sliding_window": "wide"}, "'sliding_window'"),
    ({"layer_types": ["full_attention"]}, "'layer_types'"),
    ({"attn_logit_softcapping": -1}, "'attn_logit_softcapping'"),
    ({"head_dim": 0}, "'head_dim'"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
])
def test_bad_new_fields_one_line(cfg: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError) as exc:
        model_from_hf_config(dict(SMALL["small-gemma2"], **cfg))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_new_presets_simulate() -> None:
    for name in ("smollm2-360m", "gemma-2-2b", "qwen3-0.6b", "falcon-7b"):
        plan = simulate(name, "8xa100-80gb")
        assert plan.feasible, name
        assert np.isfinite(plan.days) and plan.days > 0


# ---------------------------------------------------------------------- not modelled
MOE = {  # mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3 and gpt_oss are modelled (tests/test_moe.py)
    "dbrx": {"model_type": "dbrx", "d_model": 6144},
    "jamba": {"model_type": "jamba", "num_experts": 16},
    "llama with experts": dict(SMALL["small-llama-head-dim"], num_local_experts=8),
    "unknown type with experts": {"model_type": "brand_new_moe", "num_experts": 16},
}
ENC_DEC = {
    "t5": {"model_type": "t5", "d_model": 512},
    "bart": {"model_type": "bart", "d_model": 1024},
    "is_encoder_decoder": {"model_type": "brand_new_seq2seq", "is_encoder_decoder": True},
}


@pytest.mark.parametrize("name", sorted(MOE))
def test_mixture_of_experts_refused(name: str) -> None:
    with pytest.raises(UsageError) as exc:
        model_from_hf_config(MOE[name])
    msg = str(exc.value)
    assert "mixture-of-experts is not modelled yet for this architecture" in msg and "mixtral" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("name", sorted(ENC_DEC))
def test_encoder_decoder_refused(name: str) -> None:
    with pytest.raises(UsageError) as exc:
        model_from_hf_config(ENC_DEC[name])
    msg = str(exc.value)
    assert "encoder-decoder models are not modelled yet" in msg and "\n" not in msg


def test_gemma3_image_text_refused() -> None:
    with pytest.raises(UsageError, match="gemma3_text"):
        model_from_hf_config({"model_type": "gemma3", "text_config": {}, "vision_config": {}})
    assert set(NOT_MODELLED) >= {"dbrx", "jamba", "t5"}
    assert not set(NOT_MODELLED) & {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gpt_oss"}


@pytest.mark.parametrize("cfg", [MOE["dbrx"], MOE["jamba"], ENC_DEC["t5"], ENC_DEC["bart"]])
def test_cli_exits_2_with_one_sentence(cfg: dict[str, object], tmp_path: Path, capsys) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    code = main(["--gpus", "8x3090", "--model", str(f)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not modelled yet" in err


# ---------------------------------------------------------------------- invariants
@st.composite
def modern_models(draw) -> ModelSpec:
    """Random decoders with the features of this module: head_dim != hidden / heads, sliding
    windows, QK-norm, 1/2/4 norms per block, soft-capping, Q/K/V-only biases."""
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, heads) if heads % h == 0]))
    hidden = draw(st.sampled_from([256, 512, 768, 1024]))
    layers = draw(st.integers(1, 24))
    window = draw(st.sampled_from([None, 128, 512, 4096]))
    return ModelSpec(
        name="random-modern", family="gemma2", kind="decoder", n_layers=layers, hidden=hidden,
        n_heads=heads, n_kv_heads=kv, attn_head_dim=draw(st.sampled_from([None, 64, 128, 256])),
        ffn_hidden=4 * hidden, gated_mlp=True, vocab_size=draw(st.sampled_from([32000, 256000])),
        max_positions=8192, default_seq_len=2048, tied_embeddings=True, pos_embedding="rotary",
        norm="rmsnorm", linear_bias=False, qkv_bias=draw(st.booleans()), norm_bias=False,
        qk_norm=draw(st.sampled_from(["none", "shared", "full"])),
        norms_per_layer=draw(st.sampled_from([1, 2, 4])), sliding_window=window,
        n_window_layers=draw(st.integers(0, layers)) if window else 0,
        attn_softcap=draw(st.sampled_from([None, 50.0])), logit_softcap=draw(st.sampled_from([None, 30.0])),
        head="lm")


INVARIANTS = settings(max_examples=12, derandomize=True, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@INVARIANTS
@given(model=modern_models(), gpus=st.sampled_from(["1x3090", "8xa100-80gb", "2x8xh100"]),
       attention=st.sampled_from(["eager", "sdpa"]), compiled=st.booleans(),
       seq=st.sampled_from([512, 2048]))
def test_modern_models_physics_holds(model, gpus, attention, compiled, seq) -> None:
    kw = dict(seq_len=seq, global_batch=64, steps=10, micro_batch=1, offload="none",
              precision="bf16", attention=attention, compile=compiled)
    plan = simulate(model, gpus, **kw)
    assert 0 < plan.step_time_s < float("inf") and plan.mfu <= plan.hfu + 1e-9 <= 1.0 + 1e-9
    assert plan.days >= plan.days_at_peak
    # a wider window (or none) is never faster
    if model.sliding_window and model.n_window_layers:
        wider = model.model_copy(update={"sliding_window": 2 * model.sliding_window})
        assert simulate(wider, gpus, **kw).step_time_s >= plan.step_time_s * (1 - 1e-12)


def test_every_family_has_a_display_name() -> None:
    from simulator.model.families import registered
    from simulator.model.presets import list_models
    from simulator.model.spec import FAMILIES

    families = registered()
    for spec in (get_model(n) for n in list_models()):
        assert spec.family in families and spec.family_display
    assert set(FAMILIES) <= set(families)  # every transformer type is a transformer-family spec


def test_eager_softmax_passes_over_the_scores():
    """Eager attention scales, masks and softmaxes the s x s scores as three kernels (6 passes
    forward; backward 3 + 2 + 2 = 7); compiled keeps the counts the GPU profiles were fitted with."""
    m = get_model("pythia-160m")
    mb = np.array([2.0])
    elems = 2.0 * m.n_heads * 1024**2 * m.n_layers
    f, b = workload.eager_softmax_bytes(m, mb, 1024, 4)
    assert float(f.nbytes[0]) == 6 * elems * 4 and float(b.nbytes[0]) == 7 * elems * 4
    assert float(f.kernels) == float(b.kernels) == 3 * m.n_layers
    cf, cb = workload.eager_softmax_bytes(m, mb, 1024, 4, compiled=True)
    assert float(cf.nbytes[0]) == 4 * elems * 4 and float(cb.nbytes[0]) == 3 * elems * 4
    assert float(cf.kernels) == 3 * m.n_layers and float(cb.kernels) == 2 * m.n_layers
