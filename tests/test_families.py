"""The operation layer (simulator/model/families, simulator/model/graphs): exact parameter counts, FLOPs,
bytes and activation memory of Mamba and ConvNeXt by hand; the transformer's operations, also
from a tensor-parallel view (its per-layer bytes by hand: test_physics, test_stacks_checkpointing,
test_architectures)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator.answer.api import run_search, simulate
from simulator.answer.family_runs import load
from simulator.core.errors import UsageError
from simulator.hardware.catalog import default_profile, get_gpu
from simulator.hardware.device import device_from_spec
from simulator.model import graphs
from simulator.model.families import family_of, registered, spec_from_dict
from simulator.model.families.mamba import SCAN_CHUNK, MambaSpec
from simulator.model.presets import get_model
from simulator.model.resolve import resolve_model
from simulator.physics import compute, memory
from simulator.physics.parallel import ShardView
from simulator.strategy.layout import Parallelism
from simulator.strategy.stacks import get_stack

DATA = Path(__file__).parent / "data"
FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
COUNTS = json.loads((DATA / "family_param_counts.json").read_text())


def _device(gpu="a100-80gb-sxm"):
    """A catalog device; ``NAME+shape``: its profile with attention efficiency by head size and
    sequence and host time per layer switched on (whatever the stored profile holds)."""
    name, _, shape = gpu.partition("+")
    g = get_gpu(name)
    prof = default_profile(g)
    if shape:
        att = prof.attention.model_copy(update={"head_dim_half": 24.0, "seq_half": 400.0})
        prof = prof.model_copy(update={"attention": att, "layer_overhead_us": 40.0})
    return device_from_spec(g, prof)


# ------------------------------------------------------------------ exact parameter counts
def _reference_counts() -> dict[str, int]:
    """From transformers when installed (meta device), else the committed fixture."""
    try:
        import torch
        from transformers import (
            ConvNextConfig,
            ConvNextForImageClassification,
            MambaConfig,
            MambaForCausalLM,
        )
    except ImportError:
        return {k: v["params"] for k, v in COUNTS["counts"].items()}

    def count(cls, cfg):
        with torch.device("meta"):
            return sum(p.numel() for p in cls(cfg).parameters())

    mc = MambaConfig(vocab_size=50280, hidden_size=2560, state_size=16, num_hidden_layers=64, expand=2,
                     conv_kernel=4, time_step_rank=160, use_bias=False, use_conv_bias=True, tie_word_embeddings=True)
    cx = dict(depths=[3, 3, 27, 3], hidden_sizes=[256, 512, 1024, 2048])
    return {"mamba-2.8b": count(MambaForCausalLM, mc),
            "convnext-xlarge-22k": count(ConvNextForImageClassification, ConvNextConfig(num_labels=21841, **cx)),
            "convnext-xlarge-1k-head": count(ConvNextForImageClassification, ConvNextConfig(num_labels=1000, **cx))}


def test_exact_parameter_counts():
    ref = _reference_counts()
    assert get_model("mamba-2.8b").n_params() == ref["mamba-2.8b"] == 2_768_345_600
    cx = get_model("convnext-xlarge-22k")
    assert cx.n_params() == ref["convnext-xlarge-22k"] == 392_900_177
    assert cx.model_copy(update={"num_classes": 1000}).n_params() == ref["convnext-xlarge-1k-head"] == 350_196_968
    # the fixture is what transformers gave when it was written
    assert COUNTS["transformers_version"] and all(ref[k] == v["params"] for k, v in COUNTS["counts"].items())


@pytest.mark.parametrize("name", ["mamba-2.8b", "mamba-2.8b-slow", "convnext-xlarge-22k", "pythia-1b",
                                  "roberta-large", "vit-large-16-in21k"])
def test_operations_own_every_parameter_once(name):
    """Sum of op params over the graph = the exact count (transformer: its layers)."""
    m = get_model(name)
    g = graphs.graph(m, 1, np.array([1.0]), "bf16", family_of(m).attentions[-1], False)
    owned = sum(b.repeat * sum(op.params for op in b.ops) for b in g.blocks)
    if family_of(m).name == "transformer":
        b = m.param_breakdown()
        assert owned == b["attention"] + b["mlp"] + b["norms"]
        # the GEMMs own the projections (weights and biases), the norms op the norms
        norms = next(op for op in g.blocks[0].ops if op.name == "norms_residual_activation")
        assert norms.params == b["norms_per_layer"]
    else:
        assert owned + sum(op.params for op in g.outside) == m.n_params()


def test_hf_config_import():
    mamba = resolve_model(FIXTURES / "mamba-2.8b-hf.json")
    assert mamba.family == "mamba" and mamba.n_params() == get_model("mamba-2.8b").n_params()
    cx = resolve_model(FIXTURES / "convnext-xlarge-224-22k.json")
    assert cx.family == "convnext" and cx.n_params() == 392_900_177
    assert cx.hf_id == "facebook/convnext-xlarge-224-22k"


def test_spec_from_dict_discriminates_by_family():
    assert isinstance(spec_from_dict(dict(name="m", family="mamba", n_layers=2, hidden=64, vocab_size=100)), MambaSpec)
    with pytest.raises(ValueError, match="unknown model family"):
        spec_from_dict({"name": "x", "family": "rwkv"})
    assert {"mamba", "convnext", "gpt_neox", "vit"} <= set(registered())


# ------------------------------------------------------------------ FLOPs by hand
def test_mamba_flops_by_hand():
    m = get_model("mamba-2.8b")
    d, E, N, R, K, V, L = 2560, 5120, 16, 160, 4, 50280, 64
    gemm = 2 * (d * 2 * E + E * (R + 2 * N) + R * E + E * d)  # per token per layer
    other = 2 * K * E + 9 * E * N  # conv, scan
    per_token = 3 * (L * (gemm + other) + 2 * d * V)
    assert graphs.model_flops_per_token(m, 4096) == pytest.approx(per_token, rel=1e-12)
    # training FLOPs ~ 6 N per token (Kaplan et al.): GEMMs dominate, scan and conv ~1%
    assert per_token / (6 * m.n_params()) == pytest.approx(1.0, abs=0.03)
    assert graphs.palm_flops_per_token(m, 4096) == 6 * m.n_params()


def test_convnext_forward_macs_match_the_paper():
    """ConvNeXt-XL at 224: 60.9 G FLOPs (multiply-adds) with the 1k head (Liu et al. 2022, table 1)."""
    cx = get_model("convnext-xlarge-22k").model_copy(update={"num_classes": 1000})
    macs = graphs.model_flops_per_token(cx, 1) / 3 / 2
    assert macs == pytest.approx(60.9e9, rel=0.01)
    # by hand: stem, blocks (49 C depthwise + 8 C^2 pointwise per pixel), downsampling, head
    widths, depths, grids = (256, 512, 1024, 2048), (3, 3, 27, 3), (56, 28, 14, 7)
    hand = 56**2 * 256 * 48 + sum(dep * g * g * (49 * c + 8 * c * c) for dep, c, g in zip(depths, widths, grids, strict=True))
    hand += sum(grids[i] ** 2 * 4 * widths[i - 1] * widths[i] for i in (1, 2, 3)) + 2048 * 1000
    assert macs == pytest.approx(hand, rel=1e-12)
    assert graphs.palm_flops_per_token(cx, 1) == graphs.model_flops_per_token(cx, 1)  # 6N means nothing here


# ------------------------------------------------------------------ bytes and activations by hand
def test_mamba_fused_scan_bytes_and_activations_by_hand():
    m = get_model("mamba-2.8b")
    d, E, N, R, L, s, e = 2560, 5120, 16, 160, 64, 4096, 2
    g = graphs.graph(m, s, np.array([1.0]), "bf16", "n/a", False)
    scan = next(op for op in g.blocks[0].ops if op.name == "selective_scan")
    assert float(scan.bytes_fwd[0]) == s * e * (5 * E + 2 * N)  # u, delta, z, B, C in; out and out_z out
    # saved per token per layer, read off mamba-ssm's MambaInnerFn.forward (checkpoint_lvl=1) and
    # Hugging Face's MambaBlock: fp32 norm input and normalized vector (2 x 4d), in_proj's input
    # (d), xz (2E), x_dbl (R + 2N), contiguous B and C (2N), the scan output before gating (E);
    # conv1d_out and delta are recomputed, out_proj runs inside the Function (nothing kept);
    # plus the fp32 chunk states [inner, n_chunks, 2 x state] per sequence
    per_token = 8 * d + e * (d + 2 * E + R + 2 * N + 2 * N + E)
    assert per_token == 8 * 2560 + 2 * (2560 + 10240 + 160 + 64 + 5120) == 56_768
    per_layer = s * per_token + 2 * N * E * 4 * (s // SCAN_CHUNK)
    outside = s * 4 * d * 2 + s * e * d  # embedding output, final norm input (fp32) ; head input
    act = memory.activations(m, s, np.array([1.0]), "bf16", "n/a", "none")
    assert float(act[0]) == pytest.approx(L * per_layer + outside, rel=1e-12)
    # full: every layer keeps its fp32 residual input; the layer rebuilt during backward holds its
    # working set less that input (fidelity-mem's rule)
    full = memory.activations(m, s, np.array([1.0]), "bf16", "n/a", "full")
    assert float(full[0]) == pytest.approx(L * s * 4 * d + (per_layer - s * 4 * d) + outside, rel=1e-12)
    # every:4: a quarter of the layers keep their input only
    ev4 = memory.activations(m, s, np.array([1.0]), "bf16", "n/a", "every:4")
    assert float(ev4[0]) == pytest.approx(48 * per_layer + 16 * s * 4 * d + (per_layer - s * 4 * d) + outside,
                                          rel=1e-12)
    # logits: eager upcast loss (hf-trainer): in backward the saved fp32 log-probabilities,
    # nll_loss's fp32 gradient and log_softmax's fp32 input gradient (12 per logit, more than the
    # forward's e + 4 + 4); a fused loss kernel (llm-foundry) keeps 2e
    assert float(memory.logits_bytes(m, s, np.array([2.0]), "bf16", False, get_stack(None))[0]) \
        == 2 * s * 50280 * 12
    assert float(memory.logits_bytes(m, s, np.array([2.0]), "bf16", False, get_stack("llm-foundry"))[0]) \
        == 2 * s * 50280 * 2 * e


#: fla's default MambaConfig (fla-org/flash-linear-attention#32's runs): one definition, in the package's data
FLA_MAMBA = load()["mamba"].model


def test_fla_stack_half_states_and_fused_norm_by_hand():
    """fla's benchmark casts the model to bf16 and steps torch's AdamW: 2 + 2 + 2 x 2 bytes per
    parameter, no autocast weight copies; its fused RMSNorm keeps its bf16 input and fp32 1/rms."""
    fla = get_stack("fla")
    assert memory.state_bytes_per_param("bf16", "ddp", "adamw", fla) == (2, 2, 4)
    assert memory.state_bytes_per_param("bf16", "ddp", "adamw", get_stack(None)) == (4, 4, 8)
    assert memory.state_bytes_per_param("fp32", "ddp", "adamw", fla) == (4, 4, 8)
    assert not memory.autocast_fp32_params("bf16", "ddp", fla)
    m = spec_from_dict(FLA_MAMBA)
    d, E, N, R, e, s = 2048, 4096, 16, 128, 2, 16384
    g = graphs.graph(m, s, np.array([1.0]), "bf16", "n/a", False, fla)
    per_token = (e * d + 4) + e * (d + 2 * E + R + 4 * N + E)  # norm; in_proj in, xz, x_dbl, B, C, out
    assert per_token == 4100 + 2 * (2048 + 8192 + 128 + 64 + 4096) == 33_156
    chunks = 4 * 2 * N * E * (s // SCAN_CHUNK)
    assert float(g.blocks[0].kept_under("none")[0]) == s * per_token + chunks
    # Hugging Face's fp32 MambaRMSNorm (hf-trainer) keeps 2 fp32 vectors instead: 8d - (2d + 4) more
    hf = graphs.graph(m, s, np.array([1.0]), "bf16", "n/a", False, get_stack(None))
    assert float(hf.blocks[0].kept_under("none")[0]) - s * per_token - chunks == s * (8 * d - (e * d + 4))


def test_fla_published_mamba_runs_fit():
    """fla-org/flash-linear-attention#32 ran these on an A100-SXM4-40GB and an H100: never infeasible."""
    m = spec_from_dict(FLA_MAMBA)
    for gpus, mb, seq in (("1xa100-40gb-sxm", 1, 16384), ("1xa100-40gb-sxm", 2, 8192), ("1xh100-sxm", 1, 32768)):
        p = simulate(m, gpus, stack="fla", precision="bf16", compile=False, micro_batch=mb, global_batch=mb,
                     seq_len=seq, steps=1, optimizer="adamw", sharding="ddp", checkpointing="none", offload="none")
        assert p.feasible, (gpus, mb, seq, p.reasons)


def test_mamba_slow_path_materializes_fp32_states():
    fused, slow = get_model("mamba-2.8b"), get_model("mamba-2.8b-slow")
    one = np.array([1.0])
    a_f = float(memory.activations(fused, 4096, one, "bf16", "n/a", "none")[0])
    a_s = float(memory.activations(slow, 4096, one, "bf16", "n/a", "none")[0])
    # the slow path keeps discretized A and B*dt (fp32) and each step's state: > 12 bytes per
    # (token, inner channel, state) and layer
    assert a_s > 64 * 4096 * 12 * 5120 * 16 > 10 * a_f
    dev = _device()
    t_f = compute.micro_batch_time(fused, 4096, np.array([4.0]), "bf16", "n/a", False, "full", dev).total
    t_s = compute.micro_batch_time(slow, 4096, np.array([4.0]), "bf16", "n/a", False, "full", dev).total
    assert t_s[0] > 2 * t_f[0]


def test_convnext_bytes_and_activations_by_hand():
    cx = get_model("convnext-xlarge-22k")
    e = 4
    g = graphs.graph(cx, 1, np.array([1.0]), "fp32", "n/a", False)
    stage2 = next(b for b in g.blocks if b.name == "stage2")
    dw = next(op for op in stage2.ops if op.name == "dwconv7x7")
    assert float(dw.bytes_fwd[0]) == 14 * 14 * 1024 * 2 * e  # read + write one feature map
    assert float(dw.fwd_flops()[0]) == 14 * 14 * 1024 * 2 * 49
    # saved per image: every block 12 C per pixel (dw input, LN in, pw1 in, GELU in 4C, pw2 in 4C,
    # scale in); downsampling 2 C_in per input pixel; stem image + conv out + norm in; head
    widths, depths, grids = (256, 512, 1024, 2048), (3, 3, 27, 3), (56, 28, 14, 7)
    blocks = sum(dep * g * g * 12 * c for dep, c, g in zip(depths, widths, grids, strict=True))
    down = sum(2 * (2 * grids[i]) ** 2 * widths[i - 1] for i in (1, 2, 3))
    stem = 3 * 224 * 224 + 56 * 56 * 256
    head = 2 * 2048
    act = float(memory.activations(cx, 1, np.array([1.0]), "fp32", "n/a", "none")[0])
    assert act == pytest.approx(e * (blocks + down + stem + head), rel=1e-12)


# ------------------------------------------------------------------ the transformer through operations
CASES = [("pythia-1b", 2048), ("mistral-7b", 1024), ("roberta-large", 512), ("vit-large-16-in21k", 197),
         ("gpt2", 1024), ("gemma-2-2b", 1024), ("qwen3-0.6b", 2048)]
KNOBS = [("bf16", "sdpa", True, "none"), ("bf16", "eager", False, "selective"), ("fp32", "eager", True, "full"),
         ("tf32", "sdpa", False, "selective"), ("fp16", "sdpa", False, "full"), ("bf16", "sdpa", False, "op"),
         ("bf16", "eager", False, "op"), ("bf16", "sdpa", False, "every:3"), ("fp16", "eager", True, "every:2")]
#: a stored profile, and one whose attention efficiency depends on head size and sequence and
#: which charges host time per layer
PROFILES = ["a100-80gb-sxm", "h100-sxm+shape"]


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("precision, attention, compiled, ckpt", KNOBS)
def test_tensor_parallel_view_divides_the_operations(tp, precision, attention, compiled, ckpt):
    """The transformer's operations built from a tensor-parallel ``ShardView`` (heads, MLP width
    and vocabulary divided; with sequence parallelism the hidden-sized activations too) carry
    exactly 1/tp of the model's FLOPs, saved activations and logits (Llama-2-7B: no biases, every
    dimension divisible), and take less time than the whole model."""
    spec, seq, dev = get_model("llama-2-7b"), 1024, _device("h100-sxm+shape")
    view = ShardView(spec, Parallelism(1, tp, 1, sp=True))
    mb = np.array([1.0, 3.0])
    whole = compute.micro_batch_time(spec, seq, mb, precision, attention, compiled, ckpt, dev)
    part = compute.micro_batch_time(view, seq, mb, precision, attention, compiled, ckpt, dev)
    np.testing.assert_allclose(part.hw_flops, whole.hw_flops / tp, rtol=1e-12)
    assert (part.total < whole.total).all()
    # a tensor-parallel stack's modules (Hugging Face's eager ones are not tensor-parallel)
    np.testing.assert_allclose(memory.activations(view, seq, mb, precision, attention, ckpt, stack="megatron-lm"),
                               memory.activations(spec, seq, mb, precision, attention, ckpt, stack="megatron-lm") / tp,
                               rtol=1e-12)
    np.testing.assert_allclose(memory.logits_bytes(view, seq, mb, precision, compiled),
                               memory.logits_bytes(spec, seq, mb, precision, compiled) / tp, rtol=1e-12)


@pytest.mark.parametrize("name, seq", CASES)
@pytest.mark.parametrize("precision, attention, compiled, ckpt", KNOBS)
@pytest.mark.parametrize("gpu", PROFILES)
def test_transformer_time_by_parts(name, seq, precision, attention, compiled, ckpt, gpu):
    """A micro-batch's forward is never faster than its GEMMs alone at their shape efficiency,
    more samples never take less time, and the executed FLOPs are the ops' forward and backward
    plus what the policy re-runs."""
    m, dev = get_model(name), _device(gpu)
    mb = np.array([1.0, 3.0, 8.0])
    g = graphs.graph(m, seq, mb, precision, attention, compiled)
    t = compute.micro_batch_time(m, seq, mb, precision, attention, compiled, ckpt, dev)
    gemm_fwd = sum(reps * compute.op_times(op, dev, precision, compiled)[0] for op, reps in g.all_ops()
                   if op.kind == "gemm")
    assert (t.fwd >= gemm_fwd).all() and (np.diff(t.total) >= 0).all()
    fl = sum(reps * (op.fwd_flops() + op.bwd_flops()) for op, reps in g.all_ops())
    assert (t.hw_flops >= fl * (1 - 1e-12)).all()
    if ckpt == "none":
        np.testing.assert_allclose(t.hw_flops, fl, rtol=1e-12)
        assert (t.recompute == 0).all()


def test_shard_views_of_one_layout_are_equal():
    """Views are compared by value (the graph and timing caches serve every view of a layout)."""
    spec = get_model("llama-2-7b")
    a, b = ShardView(spec, Parallelism(2, 4, 1, sp=True)), ShardView(spec, Parallelism(2, 4, 1, sp=True))
    assert a == b and hash(a) == hash(b)
    h = hash(a)
    assert a.hidden == spec.hidden and hash(a) == h  # reading through to the spec leaves the key alone
    assert a != ShardView(spec, Parallelism(2, 4, 1)) and a != ShardView(spec, Parallelism(1, 8, 1, sp=True))
    assert a != a.with_layers(spec.n_layers - 1) and a != spec


def test_a_stage_view_without_layers_keeps_only_the_embedding_output():
    """Pipeline stages ask for one layer fewer than they hold (stored activations per layer): a
    view of no layers saves the embedding output and final-norm input and nothing else."""
    spec, seq, mb = get_model("pythia-160m"), 1024, np.array([1.0, 2.0])
    empty = ShardView(spec, Parallelism(1, 1, 12)).with_layers(0)
    for ck in ("none", "full", "selective", "op", "every:2"):
        np.testing.assert_array_equal(memory.activations(empty, seq, mb, "bf16", "eager", ck, stack="megatron-lm"),
                                      mb * seq * 768 * 2 * 2)
        assert compute.micro_batch_time(empty, seq, mb, "bf16", "sdpa", False, ck, _device()).recompute.sum() == 0


def test_bandwidth_classes_price_their_ops():
    """A profile's bandwidth efficiency of one op class (calibrated apart on CPU profiles) slows
    exactly the ops of that class: eager attention's softmax, not fused attention; the same graph
    timed on another device is timed anew."""
    m, seq, mb = get_model("pythia-160m"), 1024, np.array([2.0])
    dev = _device()
    slow = dataclasses.replace(dev, profile=dev.profile.model_copy(update={"bw_eff_ops": {"softmax": 0.05}}))
    for att, slower in (("eager", True), ("sdpa", False)):
        base = compute.micro_batch_time(m, seq, mb, "bf16", att, False, "none", dev).total
        other = compute.micro_batch_time(m, seq, mb, "bf16", att, False, "none", slow).total
        assert (other > base).all() if slower else (other == base).all()
        assert (compute.micro_batch_time(m, seq, mb, "bf16", att, False, "none", dev).total == base).all()


def test_equality_cases_exercise_the_new_physics():
    """One profile above makes attention efficiency depend on shape and charges host time per
    layer (else the tests would not exercise those paths)."""
    prof = _device(PROFILES[-1]).profile
    assert prof.attention.head_dim_half > 0 and prof.attention.seq_half > 0 and prof.layer_overhead_us > 0


# ------------------------------------------------------------------ end to end
@pytest.mark.parametrize("name", ["mamba-2.8b", "convnext-xlarge-22k"])
def test_simulate_answers_like_any_model(name):
    p = simulate(name, "4xa100")
    assert p.feasible and 1 < p.days < 1000 and p.days >= p.days_at_peak
    assert p.strategy["attention"] == "n/a" and any("attention knob does not apply" in n for n in p.notes)
    # executed FLOPs are at least the model's (equal up to rounding when nothing is recomputed)
    assert 0 < p.mfu <= p.hfu + 1e-9 and p.hfu <= 1 and p.cost
    assert p.memory_gib["total"] <= p.memory_gib["capacity"]


def test_knobs_that_do_not_apply():
    # attention pinned (the study's naive baseline pins it for every model): ignored, with a note
    p = simulate("mamba-2.8b", "4xa100", attention="eager", checkpointing="full")
    assert p.strategy["attention"] == "n/a" and any("--attention eager ignored" in n for n in p.notes)
    assert p.strategy["compile"] is False
    res = run_search("mamba-2.8b", "4xa100")
    assert set(res.table.pack) and all(pk[1] == "n/a" and pk[2] is False for pk in res.table.packs)
    env = {"PYTHONPATH": str(Path(__file__).parents[1])}
    for args in (["--model", "mamba-2.8b", "--compile"], ["--model", "convnext-xlarge-22k", "--checkpointing", "full"],
                 ["--model", "convnext-xlarge-22k", "--seq-len", "4"]):
        r = subprocess.run([sys.executable, "-m", "simulator.frontends.cli", "--gpus", "4xa100", *args], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_mamba_checkpointing_is_per_layer():
    """Mamba offers none, every:K and full (layer-granular); selective and op do not apply. Each
    step towards full checkpointing trades memory for recomputation time."""
    m, dev, mb = get_model("mamba-2.8b"), _device(), np.array([2.0])
    policies = ["none", "every:4", "every:2", "full"]
    act = [float(memory.activations(m, 4096, mb, "bf16", "n/a", ck)[0]) for ck in policies]
    rec = [float(compute.micro_batch_time(m, 4096, mb, "bf16", "n/a", False, ck, dev).recompute[0]) for ck in policies]
    assert act == sorted(act, reverse=True) and len(set(act)) == 4
    assert rec == sorted(rec) and len(set(rec)) == 4
    p = simulate("mamba-2.8b", "4xa100", checkpointing="every:4")
    assert p.feasible and p.strategy["checkpointing"] == "every:4"
    for bad in ("op", "selective"):
        with pytest.raises(UsageError, match="valid here: none, every:K, full"):
            simulate("mamba-2.8b", "4xa100", checkpointing=bad)


def test_slow_mamba_needs_checkpointing_on_a100():
    """The slow path's fp32 [batch, inner, sequence, state] tensors do not fit one 4096-token
    sequence on an 80 GB card without checkpointing; full checkpointing makes it fit."""
    p = simulate("mamba-2.8b-slow", "4xa100", checkpointing="none")
    assert not p.feasible and "GiB" in p.reasons[0]
    q = simulate("mamba-2.8b-slow", "4xa100")
    assert q.feasible and q.strategy["checkpointing"] == "full"
    assert q.days > simulate("mamba-2.8b", "4xa100").days
