"""Issue 10: the optional profile refinements (absent = today's numbers), the fits that produce
them recover known parameters, fresh host pages and per-tensor optimizer costs behave
physically, torch models of every block type count like the simulator, the broad CPU suite spans
what users train, and validate reports per-pass errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration import fit as F
from simulator.answer.api import simulate
from simulator.hardware import catalog as hardware
from simulator.hardware.profile import FreshMemory, GemmEfficiency, parse_profile
from simulator.model.presets import get_model
from simulator.physics import fresh_memory, kernels

SUITE_SPECS = {"base": "gpt2", "n_layers": 2, "hidden": 128, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 512,
               "vocab_size": 2048, "max_positions": 1024, "default_seq_len": 128}


def _cpu_profile(**update):
    p = hardware.default_profile("rtx3090")
    data = p.model_dump()
    data["device"] = {"kind": "cpu", "name": "test cpu", "peak_tflops": {"fp32": 0.05, "bf16": 0.02},
                      "mem_bw_gbs": 10.0, "memory_gib": 16.0, "usable_memory_gib": 15.0}
    data["name"] = "test-cpu"
    # no training-pass host time of its own (the catalog GPU's carries the H200 node's): what a profile
    # calibrated without the dispatch benches holds
    data.update({k: None for k in ("train_fwd_kernel_us", "train_bwd_kernel_us", "train_fwd_kernel_us_amp",
                                   "train_bwd_kernel_us_amp")})
    data.update(update)
    return parse_profile(data)


def _step(profile, model="pythia-14m", **kw):
    args = dict(seq_len=128, global_batch=4, steps=1, micro_batch=4, precision="fp32",
                attention="sdpa", compile=False, checkpointing="none", sharding="ddp", offload="none")
    args.update(kw)
    return simulate(get_model(model) if isinstance(model, str) else model, "1xlocal", profile=profile, **args)


# ------------------------------------------------------------------ profile fields
def test_absent_refinements_reproduce_todays_numbers():
    p = hardware.default_profile("rtx3090")
    assert p.gemm_bwd == {} and p.bw_eff_ops == {} and p.fresh_memory is None
    assert p.optimizer_tensor_us is None and p.spread == {}
    assert p.bw_eff("loss") == p.memory_bw_eff and p.gemm_bwd_for("bf16") == p.gemm_for("bf16")
    base = _cpu_profile()
    same = _cpu_profile(bw_eff_ops={}, gemm_bwd={}, fresh_memory=None)
    assert _step(base).step_time_s == _step(same).step_time_s


def test_profile_rejects_unknown_op_class_and_bad_values():
    from simulator.core.errors import UsageError

    with pytest.raises(UsageError, match="bw_eff_ops"):
        _cpu_profile(bw_eff_ops={"matmul": 0.5})
    with pytest.raises(UsageError, match="bw_eff_ops"):
        _cpu_profile(bw_eff_ops={"loss": 1.5})


def test_each_refinement_moves_its_own_pass():
    base = _cpu_profile()
    t0 = _step(base, "gpt2", seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    slow_loss = _cpu_profile(bw_eff_ops={"loss": 0.01})
    t1 = _step(slow_loss, "gpt2", seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    assert t1["forward"] > t0["forward"] and t1["backward"] > t0["backward"]
    assert t1["optimizer"] == t0["optimizer"]
    g = base.gemm["fp32"]
    slow_bwd = _cpu_profile(gemm_bwd={"fp32": GemmEfficiency(e_max=g.e_max / 4, x_half=g.x_half, source="t")})
    t2 = _step(slow_bwd, "gpt2", seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    assert t2["forward"] == pytest.approx(t0["forward"]) and t2["backward"] > 1.5 * t0["backward"]


def test_fresh_pages_cost_more_with_vocabulary_and_less_with_checkpointing():
    prof = _cpu_profile(fresh_memory=FreshMemory(gbs=0.3, keep_bytes=64 * 2**20, source="t"))
    plain = _cpu_profile()
    small = _step(prof, get_model("gpt2").model_copy(update={"vocab_size": 4096}), seq_len=256)
    big = _step(prof, "gpt2", seq_len=256)
    ref = _step(plain, "gpt2", seq_len=256)
    assert big.step_time_s > ref.step_time_s  # fresh pages only add time
    extra_big = big.breakdown_s["forward"] - ref.breakdown_s["forward"]
    extra_small = small.breakdown_s["forward"] - _step(
        plain, get_model("gpt2").model_copy(update={"vocab_size": 4096}), seq_len=256).breakdown_s["forward"]
    assert extra_big > extra_small >= 0  # 100 MB of logits are mapped anew; 4 MB come from the heap
    # MLP-wide activations of 4096 tokens (48 MiB each) are mapped anew; checkpointing stores fewer
    full = _step(prof, "pythia-160m", seq_len=512, micro_batch=8, global_batch=8, checkpointing="full").breakdown_s
    none = _step(prof, "pythia-160m", seq_len=512, micro_batch=8, global_batch=8).breakdown_s
    assert full["forward"] < none["forward"]
    assert big.breakdown_s["optimizer"] > ref.breakdown_s["optimizer"]  # foreach temporaries


def test_eager_attention_maps_every_s_by_s_temporary_in_each_pass():
    """Materialised attention allocates four s x s tensors per layer in forward and four in
    backward, all above the mmap threshold at s=1024 (opcompare --faults); checkpointing re-runs
    them in recomputation instead of keeping the probabilities."""
    prof = _cpu_profile(fresh_memory=FreshMemory(gbs=1.0, keep_bytes=0.0, source="t"))
    m = get_model("gpt2").model_copy(update={"n_layers": 6, "hidden": 192, "n_heads": 3, "vocab_size": 4096})
    mb = np.array([4.0])
    f_s, b_s, r_s = fresh_memory.micro_batch_fresh(m, 1024, mb, "fp32", "sdpa", "none", prof)
    f_e, b_e, r_e = fresh_memory.micro_batch_fresh(m, 1024, mb, "fp32", "eager", "none", prof)
    temps = 6 * 4 * 3 * 1024**2 * 4 * 4.0 / 1e9  # layers x mb x heads x s^2 x 4 tensors x 4 bytes (s)
    assert float(b_e[0] - b_s[0]) == pytest.approx(temps, rel=1e-6)
    assert float(f_e[0] - f_s[0]) == pytest.approx(temps, rel=0.05)  # less the probabilities no longer counted as kept
    assert float(r_e[0]) == float(r_s[0]) == 0.0
    f_f, b_f, r_f = fresh_memory.micro_batch_fresh(m, 1024, mb, "fp32", "eager", "full", prof)
    assert float(r_f[0]) == pytest.approx(temps, rel=1e-6) and float(b_f[0]) == pytest.approx(float(b_e[0]))
    half = fresh_memory.micro_batch_fresh(m, 1024, mb, "bf16", "eager", "none", prof)[1] - \
        fresh_memory.micro_batch_fresh(m, 1024, mb, "bf16", "sdpa", "none", prof)[1]
    # bf16: four 2-byte tensors of 25 MB come from the heap; the fp32 probabilities (50 MB) are fresh
    assert float(half[0]) == pytest.approx(temps / 4, rel=1e-6)


def test_a_training_steps_small_activations_reuse_the_heap():
    """Tensors under the mmap threshold come from heap pages the previous step used (gradients
    allocated after them keep the heap from trimming): no fresh pages, however many of them."""
    fm = FreshMemory(gbs=1.0, keep_bytes=0.0, source="t")
    parts = [(2**20, np.array([1e8, 1e9])), (64 * 2**20, 3e8)]
    assert np.allclose(fresh_memory.fresh_bytes(parts, fm, heap_kept=True), 3e8)
    assert np.allclose(fresh_memory.fresh_bytes(parts, fm), [4e8, 1.3e9])


def test_fresh_bytes_monotone_bounded_and_large_tensors_always_fresh():
    fm = FreshMemory(gbs=1.0, keep_bytes=64 * 2**20, source="t")
    totals = np.logspace(5, 10, 40)
    small = fresh_memory.fresh_bytes([(2**20, totals)], fm)
    assert np.all(np.diff(small) >= 0) and np.all(small <= totals) and small[0] < 1e-3 * totals[0]
    assert small[-1] > 0.99 * totals[-1]
    big = fresh_memory.fresh_bytes([(64 * 2**20, totals)], fm)
    assert np.allclose(big, totals)


@pytest.mark.parametrize("name", ["gpt2", "pythia-160m", "tinyllama-1.1b", "mistral-7b", "bert-base",
                                  "vit-b-16"])
def test_param_tensor_sizes_add_up(name):
    m = get_model(name)
    sizes = fresh_memory.param_tensor_sizes(m)
    assert sizes.sum() == pytest.approx(m.n_params()) and sizes.min() > 0
    assert sizes.size >= 4 * m.n_layers


def test_optimizer_tensor_cost_scales_with_tensor_count():
    prof = _cpu_profile(optimizer_tensor_us=50.0)
    t4 = _step(prof, get_model("pythia-160m").model_copy(update={"n_layers": 4})).breakdown_s["optimizer"]
    t8 = _step(prof, get_model("pythia-160m").model_copy(update={"n_layers": 8})).breakdown_s["optimizer"]
    assert t8 > t4
    n4 = fresh_memory.param_tensor_sizes(get_model("pythia-160m").model_copy(update={"n_layers": 4})).size
    assert fresh_memory.optimizer_loop_time(get_model("pythia-160m").model_copy(update={"n_layers": 4}),
                                            prof) == pytest.approx(n4 * 50e-6)


# ------------------------------------------------------------------ fits
def test_fit_attention_shape_recovers_halves():
    pts = [(d, s) for d in (32, 64, 128) for s in (128, 512, 2048)]
    d = np.array([p[0] for p in pts] * 2, float)
    s = np.array([p[1] for p in pts] * 2, float)
    both = np.array([False] * len(pts) + [True] * len(pts))
    f = 4 * 8 * s**2 * d / 2
    peak, launch = 1e11, 5e-6
    ef = kernels.attention_efficiency(0.8, d, s, 40.0, 300.0)
    eb = kernels.attention_efficiency(0.4, d, s, 40.0, 300.0)
    t = launch + f / (peak * ef) + np.where(both, launch + 2.5 * f / (peak * eb), 0.0)
    fit = F.fit_attention_shape(f, d, s, t, both, peak, launch, 2.5)
    assert fit.params["fwd"] == pytest.approx(0.8, rel=1e-3) and fit.params["bwd"] == pytest.approx(0.4, rel=1e-3)
    assert fit.params["head_dim_half"] == pytest.approx(40.0, rel=1e-2)
    assert fit.params["seq_half"] == pytest.approx(300.0, rel=1e-2)
    const = F.fit_attention_shape(f, d, s, t, both, peak, launch, 2.5, shape=False)
    assert const.params["head_dim_half"] == 0.0 and const.rms_log > fit.rms_log


def test_fit_bw_with_known_and_per_item_cost():
    b = np.array([1e6, 1e7, 1e8, 5e8, 2e7])
    items = np.array([200, 12, 1, 100, 400])
    known = np.array([1e-3, 0.0, 2e-2, 0.0, 5e-3])
    t = known + items * 30e-6 + b / (20e9 * 0.4)
    fit = F.fit_bw_with_known(b, t, known, 20e9, 0.0, 0, items=items)
    assert fit.params["bw_eff"] == pytest.approx(0.4, rel=1e-3)
    assert fit.params["item_s"] == pytest.approx(30e-6, rel=1e-3)
    plain = F.fit_bw_with_known(b, b / (20e9 * 0.7) + 2 * 1e-5, 0.0, 20e9, 1e-5, 2)
    assert plain.params["bw_eff"] == pytest.approx(0.7, rel=1e-3)


def test_fit_fresh_recovers_rate_and_kept_heap_and_ignores_caching_allocators():
    mib = 2**20
    size = np.array([mib, mib, mib, 8 * mib, 64 * mib])
    total = np.array([16, 48, 128, 128, 64]) * mib
    reuse = total / 10e9
    fm = FreshMemory(gbs=0.4, keep_bytes=40 * mib, source="t")
    fresh = reuse + np.array([fresh_memory.fresh_bytes([(s, t)], fm) for s, t in zip(size, total, strict=True)]) / 0.4e9
    fit = F.fit_fresh(size, total, fresh, reuse, fm.mmap_bytes)
    assert fit.params["gbs"] == pytest.approx(0.4, rel=1e-2)
    assert fit.params["keep_bytes"] == pytest.approx(40 * mib, rel=2e-2)
    assert F.fit_fresh(size, total, reuse * 1.02, reuse, fm.mmap_bytes) is None
    # a small-tensor point 3x off (heap state left by earlier benches) leaves the rate alone
    noisy = fresh.copy()
    noisy[1] = reuse[1] + 3 * (fresh[1] - reuse[1])
    assert F.fit_fresh(size, total, noisy, reuse, fm.mmap_bytes).params["gbs"] == pytest.approx(0.4, rel=1e-2)


# ------------------------------------------------------------------ torch models and suite
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("base", ["gpt2", "pythia-14m", "tinyllama-1.1b"])
@pytest.mark.parametrize("tied", [True, False])
def test_every_block_type_tied_or_untied_counts_like_the_simulator(base, tied):
    from calibration import validate as V
    from calibration.torch_model import build_model

    spec = V.suite._spec_from("t", {**SUITE_SPECS, "base": base, "tied_embeddings": tied})
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == spec.n_params()
    assert (model.lm_head is None) == tied


def test_selective_checkpointing_matches_and_its_recompute_is_timed():
    from calibration import validate as V
    from calibration.torch_model import build_model

    spec = V.suite._spec_from("t", {**SUITE_SPECS, "base": "pythia-14m", "hidden": 64, "n_heads": 4,
                               "ffn_hidden": 128, "vocab_size": 256})
    torch.manual_seed(0)
    ref = build_model(spec, "eager")
    sel = build_model(spec, "eager", "selective")
    sel.load_state_dict(ref.state_dict())
    x = torch.randint(0, 256, (2, 32))
    y = torch.randint(0, 256, (2, 32))
    ref(x, y).backward()
    loss = sel(x, y)
    sel.clock.in_backward = True
    loss.backward()
    sel.clock.in_backward = False
    assert sel.clock.seconds > 0
    assert torch.allclose(sel.blocks[0].attn.qkv.weight.grad, ref.blocks[0].attn.qkv.weight.grad, atol=1e-5)


def test_broad_suite_spans_what_users_train():
    from calibration import validate as V
    from calibration.torch_model import build_model

    suite = V.load_suite(V.SUITE_DIR / "cpu_broad.yaml")
    cs = suite.configs
    assert len(cs) >= 30
    hid = {c.spec.hidden for c in cs}
    voc = {c.spec.vocab_size for c in cs}
    seq = {c.seq_len for c in cs}
    mbs = {c.micro_batch for c in cs}
    assert min(hid) <= 128 and max(hid) >= 1024 and min(voc) <= 2048 and max(voc) >= 50000
    assert min(seq) <= 64 and max(seq) >= 1024 and min(mbs) == 1 and max(mbs) >= 16
    assert {c.precision for c in cs} == {"fp32", "bf16"} and {c.attention for c in cs} == {"eager", "sdpa"}
    assert {c.checkpointing for c in cs} == {"none", "full", "selective"}
    assert {c.spec.tied_embeddings for c in cs} == {True, False}
    assert {c.spec.family for c in cs} == {"gpt2", "gpt_neox", "llama"}
    for c in cs:
        assert sum(p.numel() for p in build_model(c.spec, device="meta").parameters()) == c.spec.n_params()


def test_summary_reports_per_component_errors():
    from calibration import validate as V

    rows = [{"error_pct": 10.0, "predicted_step_s": 1.1, "measured_step_s": 1.0, "measured_min_s": 1.0,
             "log_ratio": math.log(1 / 1.1), "measured_fwd_s": 0.3, "predicted_fwd_s": 0.33,
             "measured_bwd_s": 0.6, "predicted_bwd_s": 0.54, "measured_rec_s": 0.0, "predicted_rec_s": 0.0,
             "measured_opt_s": 0.1, "predicted_opt_s": 0.2}]
    s = V.summarize(rows)
    assert s["components"]["fwd"]["mape_pct"] == pytest.approx(10.0)
    assert s["components"]["bwd"]["signed_pct"] == pytest.approx(-10.0)
    assert s["components"]["opt"]["mape_pct"] == pytest.approx(100.0)
    assert "rec" not in s["components"] and s["worst_pct"] == pytest.approx(10.0)


def test_for_model_adds_the_models_shapes_to_the_plan():
    from calibration.benches import plan
    from calibration.benches.base import RunContext, Settings
    from calibration.device import detect

    dev = detect("cpu")
    base = {b.key for b in plan(RunContext(dev, Settings("quick", 0.05, 0.3, False, 2)))}
    m = get_model("pythia-1b")
    keys = {b.key for b in plan(RunContext(dev, Settings("quick", 0.05, 0.3, False, 2, m)))}
    new = keys - base
    assert any(k.startswith("gemm/fp32/") and k.endswith("x50304x2048") for k in new)
    assert any(k.startswith("loss/") and k.endswith("v50304") for k in new)
    assert any(k.startswith("optmix/foreach/pythia-1b") for k in new)
    assert any(k.startswith("attention/flash/") and k.endswith("d256") for k in new)
    assert base <= keys


def test_fit_optimizer_mix_takes_bandwidth_from_the_large_tensors():
    b = np.array([5e8, 4e7, 1e8])  # one embedding-sized tensor; two mixes of small layer tensors
    items = np.array([1, 96, 12])
    t = items * 20e-6 + b / (30e9 * 0.35)
    fit = F.fit_optimizer_mix(b, t, np.zeros(3), items, 30e9)
    assert fit.params["bw_eff"] == pytest.approx(0.35, rel=1e-2)
    assert fit.params["item_s"] == pytest.approx(20e-6, rel=5e-2)


def test_autocast_casts_weights_forward_and_their_gradients_back():
    """Under autocast over fp32 weights each micro-batch casts every weight to half (read 4, write
    2 bytes) and backward casts its half gradient back (read 2, write 4): 12 bytes per parameter,
    half in each pass, and nothing where the model itself is half (Megatron-LM, fla)."""
    from simulator.model import workload
    from simulator.strategy.stacks import get_stack

    p = _cpu_profile(bw_eff_ops={"cast": 0.5})
    bf, fp = _step(p, precision="bf16"), _step(p, precision="fp32")
    assert float(workload.autocast_cast_bytes(1e6, "bf16", half_params=False).nbytes) == 12e6
    assert float(workload.autocast_cast_bytes(1e6, "fp32", half_params=False).nbytes) == 0.0
    cast = 12.0 * get_model("pythia-14m").n_params() / (10e9 * 0.5)
    b = bf.breakdown_s
    assert b["compute"] == pytest.approx(b["forward"] + b["backward"] + b["recompute"])
    assert fp.breakdown_s["compute"] == pytest.approx(fp.breakdown_s["forward"] + fp.breakdown_s["backward"])
    half_model = get_stack("hf-trainer").model_copy(update={"states": "master"})
    meg = _step(p, precision="bf16", stack=half_model).breakdown_s
    assert b["forward"] - meg["forward"] == pytest.approx(cast / 2, rel=1e-6)
    assert b["backward"] - meg["backward"] == pytest.approx(cast / 2, rel=1e-6)


def test_megatron_stack_keeps_half_weights_and_fp32_main_weights():
    """Megatron-LM's Float16Module + Float16OptimizerWithFloat16Params: 2 + 4 + (4 + 8) bytes per
    parameter with Adam under bf16 (fp32 main_grad), 2 + 2 + (4 + 8) under fp16, no autocast weight
    copies; the published table's name finds the preset."""
    from simulator.answer import runs
    from simulator.physics import memory
    from simulator.strategy.stacks import for_published, get_stack

    meg = get_stack("megatron-lm")
    assert memory.state_bytes_per_param("bf16", "ddp", "adamw", meg) == (2, 4, 12)
    assert memory.state_bytes_per_param("fp16", "ddp", "adamw", meg) == (2, 2, 12)
    assert memory.state_bytes_per_param("fp32", "ddp", "adamw", meg) == (4, 4, 8)
    assert not memory.autocast_fp32_params("bf16", "ddp", meg)
    assert not memory.autocast_fp32_params("bf16", "ddp", meg) and meg.half_model and not meg.half_states
    assert for_published("Megatron").name == runs.stack_preset("megatron-lm") == "megatron-lm"


def test_recomputation_casts_the_rerun_layers_weights_again():
    """Under autocast a checkpointed layer's recomputed forward casts its weights to half again
    (6 bytes per parameter of each re-run layer): in the recompute part, only with fp32 weights."""
    from simulator.strategy.stacks import get_stack

    p = _cpu_profile(bw_eff_ops={"cast": 0.5})
    m = get_model("pythia-14m")
    layer = (m.n_params() - m.n_embedding_params()) / m.n_layers
    full, none = _step(p, precision="bf16", checkpointing="full"), _step(p, precision="bf16")
    half_model = get_stack("hf-trainer").model_copy(update={"states": "master"})
    meg = _step(p, precision="bf16", checkpointing="full", stack=half_model)
    again = full.breakdown_s["recompute"] - meg.breakdown_s["recompute"]
    assert again == pytest.approx(6.0 * layer * m.n_layers / (10e9 * 0.5), rel=1e-6)
    assert none.breakdown_s["recompute"] == 0.0
    fp = _step(p, checkpointing="full")
    assert fp.breakdown_s["compute"] == pytest.approx(sum(fp.breakdown_s[k] for k in ("forward", "backward", "recompute")))
    assert full.breakdown_s["compute"] == pytest.approx(
        sum(full.breakdown_s[k] for k in ("forward", "backward", "recompute")))
