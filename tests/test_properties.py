"""Property tests (hypothesis): invariants over random models, clusters and strategies."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simulator.answer.api import run_search, simulate
from simulator.model.graphs import model_flops_per_token
from simulator.model.spec import ModelSpec
from simulator.strategy.knobs import SHARDINGS

CLUSTERS = ["1x3090", "2x3090", "8x3090", "4xa100", "8xa100-40gb", "2x8xh100", "8xrtx4090", "4xa6000", "1xh200"]
# CI runs a fixed (derandomized) sample so a landing never hinges on luck; explore more with
# HYPOTHESIS_PROFILE=thorough (300 random examples per property).
settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
SETTINGS = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@st.composite
def models(draw):
    heads = draw(st.sampled_from([4, 8, 16]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    hidden = heads * head_dim
    gated = draw(st.booleans())
    return ModelSpec(
        name="random", family="llama" if gated else "gpt_neox", kind="decoder",
        n_layers=draw(st.integers(1, 40)), hidden=hidden, n_heads=heads,
        ffn_hidden=draw(st.sampled_from([2, 3, 4])) * hidden, gated_mlp=gated,
        vocab_size=draw(st.sampled_from([1000, 32000, 50304])), max_positions=8192,
        tied_embeddings=draw(st.booleans()), pos_embedding="rotary",
        norm="rmsnorm" if gated else "layernorm", linear_bias=not gated, norm_bias=not gated,
        head="lm", default_seq_len=2048)


knobs = st.fixed_dictionaries({
    "precision": st.sampled_from(["fp32", "tf32", "bf16", "fp16"]),
    "attention": st.sampled_from(["eager", "sdpa"]),
    "compile": st.booleans(),
    "checkpointing": st.sampled_from(["none", "selective", "op", "every:2", "full"]),
    "sharding": st.sampled_from(list(SHARDINGS)),
})


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), k=knobs, seq=st.sampled_from([256, 1024, 2048]),
       mb=st.integers(1, 8))
def test_throughput_never_above_peak(model, gpus, k, seq, mb):
    assume(k["checkpointing"] != "every:2" or model.n_layers >= 2)  # every:K needs K layers
    plan = simulate(model, gpus, seq_len=seq, global_batch=128, steps=10, micro_batch=mb, offload="none", **k)
    n = plan.hardware["n_gpus"]
    res = run_search(model, gpus, seq_len=seq, global_batch=128, steps=10, micro_batch=mb, offload="none", **k)
    peak = res.setup.problem.device.gemm_peak(k["precision"])
    # executed FLOPs per second per GPU can never exceed the dense peak, nor can the model's
    # minimum FLOPs (what MFU and the floor count), which never exceed the executed ones
    assert plan.hfu <= 1.0
    assert plan.mfu <= plan.hfu + 1e-9
    assert plan.tokens_per_s * model_flops_per_token(model, seq) <= n * peak
    assert plan.days >= plan.days_at_peak
    assert plan.step_time_s > 0 and np.isfinite(plan.step_time_s)


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), k=knobs, steps=st.integers(1, 1000))
def test_days_linear_in_tokens(model, gpus, k, steps):
    assume(k["checkpointing"] != "every:2" or model.n_layers >= 2)  # every:K needs K layers
    a = simulate(model, gpus, seq_len=512, global_batch=128, steps=steps, micro_batch=2, offload="none", **k)
    b = simulate(model, gpus, seq_len=512, global_batch=128, steps=3 * steps, micro_batch=2, offload="none", **k)
    assert b.days == np.float64(a.days * 3) or abs(b.days - 3 * a.days) <= 1e-9 * b.days


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), k=knobs)
def test_more_work_never_takes_less_time(model, gpus, k):
    assume(k["checkpointing"] != "every:2" or model.n_layers >= 2)  # every:K needs K layers
    kw = dict(seq_len=512, steps=10, micro_batch=2, offload="none", **k)
    small = simulate(model, gpus, global_batch=128, **kw)
    big = simulate(model, gpus, global_batch=256, **kw)
    assert big.step_time_s >= small.step_time_s
    deeper = model.model_copy(update={"n_layers": model.n_layers + 4})
    assert simulate(deeper, gpus, global_batch=128, **kw).step_time_s >= small.step_time_s


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), k=knobs, mb=st.integers(1, 8))
def test_memory_never_grows_with_sharding_stage(model, gpus, k, mb):
    assume(k["checkpointing"] != "every:2" or model.n_layers >= 2)  # every:K needs K layers
    k = {key: v for key, v in k.items() if key != "sharding"}
    totals = []
    for s in ("ddp", "zero1", "zero2", "zero3"):
        p = simulate(model, gpus, seq_len=512, global_batch=128, steps=10, micro_batch=mb, offload="none",
                     sharding=s, **k)
        totals.append(p.memory_gib["total"])
    assert all(a >= b - 1e-9 for a, b in zip(totals, totals[1:], strict=False))
    fsdp_go = simulate(model, gpus, seq_len=512, global_batch=128, steps=10, micro_batch=mb, offload="none",
                       sharding="fsdp-grad-op", **k).memory_gib["total"]
    fsdp_full = simulate(model, gpus, seq_len=512, global_batch=128, steps=10, micro_batch=mb, offload="none",
                         sharding="fsdp-full", **k).memory_gib["total"]
    assert fsdp_go >= fsdp_full - 1e-9


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), k=knobs, mb=st.integers(1, 32))
def test_infeasible_exactly_when_memory_exceeds_capacity(model, gpus, k, mb):
    assume(k["checkpointing"] != "every:2" or model.n_layers >= 2)  # every:K needs K layers
    p = simulate(model, gpus, seq_len=2048, global_batch=512, steps=10, micro_batch=mb, offload="none", **k)
    assert p.feasible == (p.memory_gib["total"] <= p.memory_gib["capacity"])
    if not p.feasible:
        assert p.reasons and "GiB" in p.reasons[0]


@SETTINGS
@given(model=models(), gpus=st.sampled_from(CLUSTERS), precision=st.sampled_from(["fp32", "bf16"]),
       attention=st.sampled_from(["eager", "sdpa"]), compile=st.booleans(), mb=st.integers(1, 8))
def test_checkpointing_trades_memory_for_time(model, gpus, precision, attention, compile, mb):
    """Each policy holds no more activation memory than keeping everything and takes no less
    time; full checkpointing holds the least and recomputes the most of the layer-wise ones."""
    kw = dict(seq_len=512, global_batch=256, steps=10, micro_batch=mb, offload="none", sharding="ddp",
              precision=precision, attention=attention, compile=compile)
    p = {ck: simulate(model, gpus, checkpointing=ck, **kw) for ck in
         ["none", "selective", "op", "full"] + (["every:2"] if model.n_layers >= 2 else [])}
    mem = {ck: x.memory_gib["activations"] for ck, x in p.items()}
    step = {ck: x.step_time_s for ck, x in p.items()}
    tol = 1e-12
    for ck in p:
        assert mem[ck] <= mem["none"] + tol and step[ck] >= step["none"] - tol
        assert mem[ck] >= mem["full"] - tol
    assert step["op"] <= step["full"] + tol
    if "every:2" in p:
        assert mem["every:2"] >= mem["full"] - tol and step["every:2"] <= step["full"] + tol


@pytest.mark.parametrize("gpus, vocab, sharding, layers, hidden", [
    ("2x8xh100", 1000, "zero3", 1, 128),  # per-unit latency
    ("2x3090", 32000, "zero3", 1, 128),  # the root unit (embeddings) is never hidden
    ("2x3090", 50304, "zero2", 28, 1024),  # crossing a 5e8-element bucket boundary
])
def test_regression_deeper_model_is_not_faster(gpus, vocab, sharding, layers, hidden):
    """Cases hypothesis found where a deeper model stepped faster: collectives are issued in
    pieces that each pay the latency, and the piece that cannot overlap never shrinks as the
    model grows."""
    base = dict(name="random", family="gpt_neox", kind="decoder", hidden=hidden, n_heads=4 if hidden == 128 else 8,
                ffn_hidden=2 * hidden if hidden == 128 else 4 * hidden, vocab_size=vocab, max_positions=8192,
                tied_embeddings=False, pos_embedding="rotary", norm="layernorm", linear_bias=True, norm_bias=True,
                head="lm", default_seq_len=2048)
    kw = dict(seq_len=512, steps=10, micro_batch=2, offload="none", global_batch=128, precision="fp32",
              attention="eager", compile=layers == 1, checkpointing="none", sharding=sharding)
    shallow = simulate(ModelSpec(n_layers=layers, **base), gpus, **kw)
    deep = simulate(ModelSpec(n_layers=layers + 4, **base), gpus, **kw)
    assert deep.step_time_s >= shallow.step_time_s


# ---------------------------------------------------------------- every family (simulator/model/families)
@st.composite
def family_models(draw):
    """Random Mamba and ConvNeXt specs, with the knobs that apply to each (their family's)."""
    from simulator.model.families import spec_from_dict

    if draw(st.booleans()):
        spec = spec_from_dict(dict(
            name="random-mamba", family="mamba", n_layers=draw(st.integers(1, 24)),
            hidden=draw(st.sampled_from([256, 512, 1024])), state_size=draw(st.sampled_from([8, 16])),
            expand=2, vocab_size=draw(st.sampled_from([1000, 50280])), kernel=draw(st.sampled_from(["fused", "slow"]))))
        ck = draw(st.sampled_from(["none", "full"]))
        seq = {"seq_len": draw(st.sampled_from([128, 512, 1024]))}
    else:
        w = draw(st.sampled_from([32, 64, 96]))
        spec = spec_from_dict(dict(
            name="random-convnext", family="convnext", depths=[draw(st.integers(1, 3)) for _ in range(4)],
            widths=[w, 2 * w, 4 * w, 8 * w], num_classes=draw(st.sampled_from([10, 1000])),
            image_size=draw(st.sampled_from([64, 128]))))
        ck, seq = "none", {}
    k = {"precision": draw(st.sampled_from(["fp32", "tf32", "bf16", "fp16"])), "checkpointing": ck,
         "sharding": draw(st.sampled_from(list(SHARDINGS)))}
    return spec, k, seq


def _deeper(spec):
    if spec.family == "mamba":
        return spec.model_copy(update={"n_layers": spec.n_layers + 4})
    return spec.model_copy(update={"depths": (*spec.depths[:2], spec.depths[2] + 3, spec.depths[3])})


@SETTINGS
@given(case=family_models(), gpus=st.sampled_from(CLUSTERS), mb=st.integers(1, 8))
def test_families_never_above_peak_and_more_work_takes_longer(case, gpus, mb):
    model, k, seq = case
    kw = dict(steps=10, micro_batch=mb, offload="none", **k, **seq)
    plan = simulate(model, gpus, global_batch=128, **kw)
    res = run_search(model, gpus, global_batch=128, **kw)
    peak = res.setup.problem.device.gemm_peak(k["precision"])
    s = seq.get("seq_len", 1)
    assert plan.hfu <= 1.0 and plan.mfu <= plan.hfu + 1e-9
    assert plan.tokens_per_s * model_flops_per_token(model, s) <= plan.hardware["n_gpus"] * peak
    assert plan.days >= plan.days_at_peak and plan.step_time_s > 0 and np.isfinite(plan.step_time_s)
    assert simulate(model, gpus, global_batch=256, **kw).step_time_s >= plan.step_time_s
    assert simulate(_deeper(model), gpus, global_batch=128, **kw).step_time_s >= plan.step_time_s
    three = simulate(model, gpus, global_batch=128, **{**kw, "steps": 30})
    assert abs(three.days - 3 * plan.days) <= 1e-9 * three.days


@SETTINGS
@given(case=family_models(), gpus=st.sampled_from(CLUSTERS), mb=st.integers(1, 32))
def test_families_memory_and_feasibility(case, gpus, mb):
    model, k, seq = case
    k = {key: v for key, v in k.items() if key != "sharding"}
    kw = dict(global_batch=512, steps=10, micro_batch=mb, offload="none", **k, **seq)
    # the same knobs under each sharding (the search may compile under one and not another)
    totals = [simulate(model, gpus, sharding=s, compile=False, **kw).memory_gib["total"]
              for s in ("ddp", "zero1", "zero2", "zero3")]
    assert all(a >= b - 1e-9 for a, b in zip(totals, totals[1:], strict=False))
    p = simulate(model, gpus, **kw)
    assert p.feasible == (p.memory_gib["total"] <= p.memory_gib["capacity"])
    if not p.feasible:
        assert p.reasons and "GiB" in p.reasons[0]
    if k["checkpointing"] == "none" and model.family == "mamba" and model.n_layers >= 2:  # 1 layer: no gain
        full = simulate(model, gpus, sharding="ddp", **{**kw, "checkpointing": "full"})
        assert full.memory_gib["activations"] <= simulate(model, gpus, sharding="ddp", **kw).memory_gib["activations"]
