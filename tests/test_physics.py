"""Unit tests of the physics modules against hand-computed values."""

import math

import numpy as np
import pytest

from simulator.answer.api import simulate
from simulator.model import workload
from simulator.model.graphs import model_flops_per_token, palm_flops_per_token
from simulator.model.presets import get_model
from simulator.physics import communication as comm
from simulator.physics import kernels, memory


def test_gemm_thickness_and_efficiency():
    assert kernels.gemm_thickness(3, 3, 3) == pytest.approx(1.0)
    assert kernels.gemm_thickness(3000, 3000, 3000) == pytest.approx(1000.0)
    # eff = e_max * x / (x + x_half): x = 1000, x_half = 1000 -> half of e_max
    assert kernels.gemm_efficiency(3000, 3000, 3000, 0.8, 1000.0) == pytest.approx(0.4)


def test_gemm_time_compute_bound_and_memory_bound():
    # 2*1000^3 FLOPs at 1e12 FLOP/s x eff (0.5 * 333.3/(333.3+0)) = 0.5 -> 4 ms + 1 us launch
    t = kernels.gemm_time(1000, 1000, 1000, 1e12, 0.5, 0.0, 2, 1e15, 1.0, 1e-6)
    assert t == pytest.approx(4e-3 + 1e-6)
    # a skinny GEMM at huge peak is bound by operand traffic: 2 B x (m*k + k*n + m*n) / bw
    t = kernels.gemm_time(1, 4096, 4096, 1e18, 1.0, 0.0, 2, 1e12, 0.5, 0.0)
    assert t == pytest.approx(2 * (4096 + 4096 * 4096 + 4096) / 0.5e12)


def test_ring_collectives_volume():
    f = comm.Fabric(nodes=1, gpus_per_node=8, intra_bw=1e10, intra_alpha=0.0, inter_bw=0.0, inter_alpha=0.0)
    assert comm.all_reduce(f, 1e9) == pytest.approx(2 * 7 / 8 * 1e9 / 1e10)
    assert comm.gather_or_scatter(f, 1e9) == pytest.approx(7 / 8 * 1e9 / 1e10)
    one = comm.Fabric(1, 1, 1e10, 1e-5, 0.0, 0.0)
    assert comm.all_reduce(one, 1e9) == 0.0
    # two nodes: intra reduce-scatter + all-gather, inter all-reduce at the node's bandwidth
    f2 = comm.Fabric(2, 8, 1e11, 0.0, 1e10, 0.0)
    expect = 2 * (7 / 8 * 1e9 / 1e11) + 2 * (1 / 2) * 1e9 / 1e10
    assert comm.all_reduce(f2, 1e9) == pytest.approx(expect)


def test_exposed_communication():
    assert comm.exposed(1.0, 0.4, 0.1) == pytest.approx(0.6)
    assert comm.exposed(1.0, 5.0, 0.1) == pytest.approx(0.1)  # the last bucket is never hidden
    assert comm.exposed(0.05, 5.0, 0.1) == pytest.approx(0.05)  # never more than the collective


def test_state_bytes_per_param():
    assert memory.state_bytes_per_param("bf16", "zero1", "adamw") == (2, 2, 12)  # 16 B/param
    assert memory.state_bytes_per_param("bf16", "ddp", "adam") == (4, 4, 8)  # autocast keeps fp32
    assert memory.state_bytes_per_param("fp32", "zero3", "adam") == (4, 4, 8)
    assert memory.state_bytes_per_param("fp32", "ddp", "sgd") == (4, 4, 4)


def test_model_states_sharding():
    P, PL, n = 1e9, 1e7, 8
    ddp = memory.model_states(P, PL, "bf16", "ddp", "none", "adam", n)
    z1 = memory.model_states(P, PL, "bf16", "zero1", "none", "adam", n)
    z3 = memory.model_states(P, PL, "bf16", "zero3", "none", "adam", n)
    assert ddp["weights"] + ddp["gradients"] + ddp["optimizer"] == pytest.approx(16e9)
    assert z1["optimizer"] == pytest.approx(12e9 / 8)
    assert z3["weights"] == pytest.approx(2e9 / 8 + 2 * PL * 2 * 7 / 8)
    off = memory.model_states(P, PL, "bf16", "zero1", "optimizer", "adam", n)
    assert off["optimizer"] == 0 and off["host"] == pytest.approx(12e9 / 8)


def test_activation_bytes_per_token_by_hand():
    m = get_model("gpt2")  # h 768, f 3072, 12 heads, plain MLP
    h, f, a, s = 768, 3072, 12, 1024
    e = 2
    expect_flash = e * (h + h + 3 * h + h) + e * (h + h + f + f) + 4 * a
    assert workload.layer_activation_bytes_per_token(m, s, e, "sdpa") == expect_flash
    # eager keeps the s x s softmax per head: fp32 (4 B) + its half copy (2 B) under autocast
    assert workload.layer_activation_bytes_per_token(m, s, e, "eager") == expect_flash - 4 * a + a * s * 6
    assert workload.layer_activation_bytes_per_token(m, s, 4, "eager") - workload.layer_activation_bytes_per_token(
        m, s, 4, "sdpa") == a * s * 4 - 4 * a


def test_ddp_buffers_and_autocast_copies():
    P = 1e9
    assert memory.comm_buffers(P, "bf16", "ddp", 8) == 4 * P  # fp32 gradient buckets
    assert memory.comm_buffers(P, "bf16", "ddp", 1) == 0  # no DDP on one GPU
    assert memory.comm_buffers(P, "bf16", "zero2", 8) == 5e8 * 4  # reduce + all-gather buckets, 2 B each
    assert memory.comm_buffers(P, "bf16", "fsdp-full", 8) == 0
    assert memory.autocast_fp32_params("bf16", "ddp")  # autocast's half copies: 2 B a parameter
    assert not memory.autocast_fp32_params("bf16", "zero1") and not memory.autocast_fp32_params("fp32", "ddp")


def test_flops_conventions():
    m = get_model("pythia-1b")
    s = 2049
    h, f, L, V = 2048, 8192, 16, 50304
    gemm = 2 * (h * 3 * h + h * h + 2 * h * f) * L + 2 * h * V  # forward FLOPs per token
    attn = 4 * s * h * L / 2  # scores + values, causal half
    assert model_flops_per_token(m, s) == pytest.approx(3 * (gemm + attn))
    assert palm_flops_per_token(m, s) == pytest.approx(6 * m.n_params() + 12 * 16 * 2048 * s)
    mb = np.array([2.0])
    full = workload.attention_flops_fwd(m, mb, s, fused=False)
    assert full[0] == pytest.approx(4 * 2 * s * s * 2048 * 16)
    assert workload.attention_flops_fwd(m, mb, s, fused=True)[0] == pytest.approx(full[0] / 2)


def test_rtx3090_uses_fp32_accumulate_peak():
    plan = simulate("pythia-160m", "1x3090", steps=1)
    # MFU is defined against 71 TFLOPS (not 142): tokens/s can never exceed peak / FLOPs per token
    flops = model_flops_per_token(get_model("pythia-160m"), 2049)
    assert plan.tokens_per_s * flops <= 71e12
    assert plan.mfu == pytest.approx(plan.tokens_per_s * flops / 71e12)


def test_days_and_floor():
    plan = simulate("pythia-1b", "8x3090")
    assert plan.feasible
    assert plan.days == pytest.approx(143000 * plan.step_time_s / 86400)
    assert plan.days >= plan.days_at_peak
    assert 0 < plan.mfu < 1 and 0 < plan.hfu < 1
    b = plan.breakdown_s
    assert plan.step_time_s == pytest.approx(b["compute"] + b["exposed_comm"] + b["optimizer"] + b["offload"])
    assert b["compute"] == pytest.approx(b["forward"] + b["backward"] + b["recompute"], rel=0.02)


def test_checkpointing_trades_memory_for_time():
    kw = dict(precision="bf16", attention="sdpa", compile=False, sharding="ddp", offload="none", micro_batch=4)
    none = simulate("pythia-410m", "1xa100", checkpointing="none", **kw)
    full = simulate("pythia-410m", "1xa100", checkpointing="full", **kw)
    assert full.step_time_s > none.step_time_s
    assert full.memory_gib["activations"] < none.memory_gib["activations"]
    assert full.breakdown_s["recompute"] > 0 == none.breakdown_s["recompute"]


def test_compile_and_sdpa_help():
    kw = dict(precision="bf16", checkpointing="none", sharding="ddp", offload="none", micro_batch=4)
    naive = simulate("pythia-160m", "1xa100", attention="eager", compile=False, **kw)
    fast = simulate("pythia-160m", "1xa100", attention="sdpa", compile=True, **kw)
    assert fast.step_time_s < naive.step_time_s
    assert fast.memory_gib["activations"] < naive.memory_gib["activations"]


def test_tf32_faster_than_fp32_on_ampere():
    kw = dict(attention="sdpa", compile=True, checkpointing="none", sharding="ddp", offload="none", micro_batch=8)
    fp32 = simulate("vit-l-16", "1xa100", precision="fp32", **kw)
    tf32 = simulate("vit-l-16", "1xa100", precision="tf32", **kw)
    assert tf32.step_time_s < fp32.step_time_s


def test_pinned_micro_batch_need_not_divide():
    plan = simulate("pythia-160m", "8xa100", micro_batch=24)  # 128 per GPU -> 6 micro-batches, last 8
    assert plan.strategy["micro_batch"] == 24 and plan.strategy["grad_accum"] == math.ceil(128 / 24)


def test_multi_node_slower_network_costs_time():
    kw = dict(precision="bf16", attention="sdpa", compile=True, checkpointing="none", sharding="fsdp-full",
              offload="none", micro_batch=8)
    fast = simulate("pythia-2.8b", "2x8xa100", **kw)
    slow = simulate("pythia-2.8b", "2x8xa100", inter_node=10, **kw)
    assert slow.breakdown_s["exposed_comm"] > fast.breakdown_s["exposed_comm"]
    assert slow.step_time_s > fast.step_time_s


def test_offload_needs_host_ram():
    kw = dict(sharding="zero3", offload="optimizer", micro_batch=1, checkpointing="full")
    small = simulate("llama-2-7b", "1xa100", host_memory=16, **kw)
    big = simulate("llama-2-7b", "1xa100", host_memory=512, **kw)
    assert not small.feasible and any("host RAM" in r for r in small.reasons)
    assert big.feasible


def test_default_profile_fits_match_current_physics():
    """The fitted default profiles store the in-sample error of their runs under the physics they
    were fitted with; after changing the physics re-run `python -m calibration.from_runs rebuild-defaults`
    (fit, cross-validation and intervals follow)."""
    from simulator.hardware import catalog as hardware
    from simulator.validation import published

    res = published.validate()
    for gpu in ("h100-sxm", "a100-80gb-sxm"):
        fit = hardware.default_profile(gpu).fit
        assert fit is not None and fit.n_runs >= 10 and fit.mape_loo is not None
        assert 0.6 <= fit.coverage80_heldout <= 0.95  # the 80% interval means roughly what it says
        sel = res[res["run"].isin(fit.runs)]
        assert len(sel) == fit.n_runs
        assert float(sel["error_pct"].abs().mean()) == pytest.approx(fit.mape_in_sample, abs=0.05)


def test_interval_brackets_estimate():
    plan = simulate("pythia-1b", "4xa100")
    lo, hi = plan.interval_days
    assert lo <= plan.days <= hi
    assert "residuals" in plan.interval_source and "published" in plan.interval_source


def test_explicit_overhead_scales_days_not_step_time():
    base = simulate("pythia-160m", "4xa100")
    more = simulate("pythia-160m", "4xa100", overhead=0.25)
    assert more.step_time_s == pytest.approx(base.step_time_s)
    assert more.days == pytest.approx(1.25 * base.days)
    assert more.days_at_peak == pytest.approx(base.days_at_peak)
    assert more.cost["gpu_hours"] > base.cost["gpu_hours"]


def test_huge_batches_stay_cheap_to_search():
    """Candidate micro-batches are bounded by memory, not by the per-GPU batch (1.25e8 here)."""
    import time

    t0 = time.perf_counter()
    plan = simulate("pythia-1b", "8x3090", global_batch=10**9, steps=1)
    assert plan.feasible and time.perf_counter() - t0 < 30
    assert plan.strategy["micro_batch"] * plan.strategy["grad_accum"] >= 10**9 // 8


def test_fp16_loss_scaling_unscales_every_gradient():
    """fp16 training's dynamic loss scaling (GradScaler.unscale_) reads and writes each gradient once
    more per step; bf16 has no loss scale. Same model, GPU and knobs: the fp16 step's optimizer phase
    moves 2 x 4 more bytes per parameter (fp32 gradients under autocast)."""
    from simulator.answer.api import simulate
    from simulator.physics import optimizer_time

    plain = optimizer_time.bytes_per_param("adamw", 4.0, 0.0)
    assert float(optimizer_time.bytes_per_param("adamw", 4.0, 0.0, True)) == pytest.approx(float(plain) + 8.0)
    kw = dict(seq_len=1024, global_batch=8, micro_batch=8, steps=1, attention="sdpa", compile=False,
              checkpointing="none", sharding="ddp", offload="none")
    bf16 = simulate("pythia-160m", "1xa100", precision="bf16", **kw).breakdown_s["optimizer"]
    fp16 = simulate("pythia-160m", "1xa100", precision="fp16", **kw).breakdown_s["optimizer"]
    assert fp16 > bf16 * 1.1


def test_every_catalog_gpu_carries_the_measured_eager_host_time():
    """Eager PyTorch's host time per kernel is the host's and PyTorch's, not the GPU's: the one
    measurement (the H200 node's calibrate --quick: 9.7 us a launch, 30.3 / 19.6 us of training-pass
    work a kernel, 33.3 / 17.2 under autocast) is what every catalog GPU's profile holds, so a small
    eager model is not faster on an older card's placeholder (the sweep found H200 plans 3.6x an
    H100's); each cites where it comes from."""
    from simulator.hardware.catalog import default_profile, list_gpus

    ref = default_profile("h200")
    for spec in list_gpus():
        prof = default_profile(spec.id)
        for k in ("launch_overhead_us", "train_fwd_kernel_us", "train_bwd_kernel_us", "train_fwd_kernel_us_amp",
                  "train_bwd_kernel_us_amp"):
            assert getattr(prof, k) == pytest.approx(getattr(ref, k), abs=1e-3), (spec.id, k)
        assert "H200" in prof.launch_source, spec.id


def test_megatron_fused_kernels_pay_eager_host_time():
    """Megatron-LM's "compiled" is its hand-fused kernels called from eager modules (stack
    fused_dispatch eager): each kernel pays the eager launch and training-pass host time, where
    torch.compile's generated code pays the compiled launch. A host-bound step (a tiny GPT at one
    sample of 128 tokens on an A100) is slower under megatron-lm's fused kernels than under
    torchtitan's compiled step with the same graph, and no faster than its own kernel count at the
    eager host time per kernel."""
    import numpy as np

    from simulator.answer.runs import megatron_gpt
    from simulator.hardware.catalog import default_profile, get_gpu
    from simulator.hardware.device import device_from_spec
    from simulator.model.graphs import graph
    from simulator.physics import compute
    from simulator.strategy.stacks import get_stack

    assert get_stack("megatron-lm").fused_dispatch == "eager" and get_stack("torchtitan").fused_dispatch == "inductor"
    m = megatron_gpt("tiny", 4, 256, 4, 1024, 128)
    dev = device_from_spec(get_gpu("a100-80gb-sxm"), default_profile("a100-80gb-sxm"))
    mb = np.array([1.0])
    meg = compute.micro_batch_time(m, 128, mb, "bf16", "sdpa", True, "none", dev, stack="megatron-lm")
    g = graph(m, 128, mb, "bf16", "sdpa", True, "megatron-lm")
    kernels = sum(op.kernels_fwd * (b.repeat * op.count) for b in g.blocks for op in b.ops) + \
        sum(op.kernels_fwd * op.count for op in g.outside)
    p = dev.profile
    assert float(meg.fwd[0]) >= kernels * 1e-6 * (p.launch_overhead_us + p.train_fwd_kernel_us_amp) * (1 - 1e-9)
    titan = compute.micro_batch_time(m, 128, mb, "bf16", "sdpa", True, "none", dev, stack="torchtitan")
    assert float(titan.fwd[0]) < float(meg.fwd[0])


def test_megatron_reduces_gradients_after_backward_unless_asked_to_overlap():
    """Megatron-LM's DistributedDataParallelConfig.overlap_grad_reduce defaults to False: its
    data-parallel all-reduce runs after the last backward, whole. --overlap-grad-reduce hides it as
    every other stack's DDP hooks do; FSDP's reduce-scatters run in backward either way."""
    from simulator.core.errors import UsageError

    kw = dict(stack="megatron-lm", precision="bf16", seq_len=2048, global_batch=64, steps=1, micro_batch=4,
              checkpointing="none", attention="sdpa", compile=True, offload="none", tp=1, pp=1)
    after = simulate("pythia-1b", "2x8xa100-80gb-sxm", sharding="ddp", **kw)
    during = simulate("pythia-1b", "2x8xa100-80gb-sxm", sharding="ddp", overlap_grad_reduce=True, **kw)
    assert after.breakdown_s["exposed_comm"] > 1.3 * during.breakdown_s["exposed_comm"] > 0
    assert after.step_time_s > during.step_time_s
    assert after.breakdown_s["compute"] == pytest.approx(during.breakdown_s["compute"])
    hf = dict(kw, stack="hf-trainer")
    assert simulate("pythia-1b", "2x8xa100-80gb-sxm", sharding="ddp", **hf).step_time_s == pytest.approx(
        simulate("pythia-1b", "2x8xa100-80gb-sxm", sharding="ddp", overlap_grad_reduce=True, **hf).step_time_s)
    with pytest.raises(UsageError, match="overlap_grad_reduce"):
        simulate("pythia-1b", "2x8xa100-80gb-sxm", overlap_grad_reduce="yes", **kw)
