"""Issue 10, second round: backward GEMM layouts with an operand-size dependence, the host time of
eager training passes per kernel, the tied-embedding gradient sum, the cross-entropy bench and the
validation models' initialization."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration import fit as F
from simulator.hardware.profile import GemmEfficiency
from simulator.model.presets import get_model
from simulator.physics import kernels
from tests.test_calibration_generalizes import _cpu_profile, _step


def test_operand_factor_is_one_without_a_fit_and_falls_to_the_floor():
    s = np.array([1e3, 1e6, 1e8, 1e10])
    assert np.all(kernels.operand_factor(s, None) == 1.0)
    f = kernels.operand_factor(s, 1e6, 0.25)
    assert np.all(np.diff(f) < 0) and f[0] == pytest.approx(1.0, abs=1e-3) and f[-1] == pytest.approx(0.25, abs=1e-3)
    assert kernels.operand_factor(1e6, 1e6, 0.25) == pytest.approx(0.25 + 0.75 / 2)


def test_gemm_time_default_is_unchanged_by_the_operand_terms():
    args = (512, 1024, 256, 1e12, 0.8, 50.0, 4, 1e11, 0.8, 0.0)
    assert kernels.gemm_time(*args) == kernels.gemm_time(*args, None, 0.0, 123.0)


def test_fit_gemm_recovers_an_operand_dependence():
    rng = np.random.default_rng(0)
    m = rng.choice([8, 64, 256, 1024], 24).astype(float)
    n = rng.choice([256, 1024, 4096], 24).astype(float)
    k = rng.choice([64, 1024, 8192, 65536], 24).astype(float)
    peak, e = 1e11, 2
    true = kernels.gemm_time(m, n, k, peak, 0.05, 0.0, e, 1e13, 1.0, 0.0, 2**20, 0.3)
    fit = F.fit_gemm(m, n, k, true, peak, e, 1e13, 1.0, 0.0, operand_bytes=k * n * e)
    assert fit.params["operand_half_bytes"] == pytest.approx(2**20, rel=0.05)
    assert fit.params["operand_floor"] == pytest.approx(0.3, abs=0.02) and fit.rms_log < 0.01
    flat = kernels.gemm_time(m, n, k, peak, 0.5, 20.0, e, 1e13, 1.0, 0.0)
    assert "operand_half_bytes" not in F.fit_gemm(m, n, k, flat, peak, e, 1e13, 1.0, 0.0,
                                                  operand_bytes=k * n * e).params


def test_weight_gradient_layout_moves_only_the_backward():
    base = _cpu_profile()
    g = base.gemm["fp32"]
    slow = _cpu_profile(gemm_wgrad={"fp32": GemmEfficiency(e_max=g.e_max / 4, x_half=g.x_half, source="t")})
    t0 = _step(base, "gpt2", seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    t1 = _step(slow, "gpt2", seq_len=64, micro_batch=1, global_batch=1).breakdown_s
    assert t1["forward"] == pytest.approx(t0["forward"]) and t1["backward"] > 1.2 * t0["backward"]
    assert base.gemm_wgrad_for("fp32") == base.gemm_bwd_for("fp32") == g


def test_unblocked_input_gradient_slows_large_vocabularies_most():
    base = _cpu_profile()
    g = base.gemm["bf16"]
    cliff = _cpu_profile(gemm_bwd={"bf16": GemmEfficiency(e_max=g.e_max, x_half=g.x_half, operand_half_mib=1.0,
                                                          operand_floor=0.2, source="t")})
    small = get_model("gpt2").model_copy(update={"vocab_size": 2048})

    def ratio(model):
        kw = dict(seq_len=64, micro_batch=1, global_batch=1, precision="bf16")
        return _step(cliff, model, **kw).breakdown_s["backward"] / _step(base, model, **kw).breakdown_s["backward"]

    assert ratio("gpt2") > ratio(small) > 1.0


def test_training_pass_kernel_overhead_adds_per_kernel_and_not_when_compiled():
    base = _cpu_profile()
    over = _cpu_profile(train_fwd_kernel_us=20.0, train_bwd_kernel_us=10.0)
    kw = dict(seq_len=32, micro_batch=1, global_batch=1)
    t0, t1 = _step(base, **kw).breakdown_s, _step(over, **kw).breakdown_s
    assert t1["forward"] > t0["forward"] and t1["backward"] > t0["backward"]
    assert t1["optimizer"] == t0["optimizer"]
    c0, c1 = _step(base, compile=True, **kw).breakdown_s, _step(over, compile=True, **kw).breakdown_s
    assert c1["forward"] == pytest.approx(c0["forward"])


def test_dispatch_fit_recovers_the_per_kernel_overhead():
    from calibration.benches.dispatch import TOKENS, tiny_spec
    from calibration.build import dispatch_overhead
    from simulator.hardware.device import device_from_profile
    from simulator.physics.compute import micro_batch_time

    base = _cpu_profile()
    true = _cpu_profile(train_fwd_kernel_us=21.0, train_bwd_kernel_us=9.0)
    results = {}
    for fam, att in (("gpt2", "sdpa"), ("llama", "sdpa")):
        for n in (1, 3):
            t = micro_batch_time(tiny_spec(fam, n), TOKENS, np.array([1.0]), "fp32", att, False, "none",
                                 device_from_profile(true))
            results[f"dispatch/{fam}-{att}/L{n}"] = {"status": "ok", "layers": n, "fwd_s": float(t.fwd[0]),
                                                     "bwd_s": float(t.bwd[0])}
    over = dispatch_overhead(results, base)
    assert over["fwd_us"] == pytest.approx(21.0, rel=1e-6) and over["bwd_us"] == pytest.approx(9.0, rel=1e-6)
    assert dispatch_overhead({}, base) is None


def test_tied_head_adds_two_fresh_weight_gradients_on_a_cpu():
    from simulator.hardware.profile import FreshMemory
    from simulator.model import workload
    from simulator.physics import fresh_memory

    prof = _cpu_profile(fresh_memory=FreshMemory(gbs=1.0, keep_bytes=2**30, source="t"))
    untied = get_model("gpt2").model_copy(update={"tied_embeddings": False})
    mb = np.array([1.0])
    _, b_t, _ = fresh_memory.micro_batch_fresh(get_model("gpt2"), 64, mb, "fp32", "sdpa", "none", prof)
    _, b_u, _ = fresh_memory.micro_batch_fresh(untied, 64, mb, "fp32", "sdpa", "none", prof)
    vh = 4.0 * untied.vocab_size * untied.hidden  # above the mmap threshold: always fresh
    assert float(b_t[0] - b_u[0]) == pytest.approx(2 * vh / 1e9, rel=1e-6)
    assert not workload.tied_head(get_model("vit-b-16"))


def test_tied_head_sums_its_two_gradients_in_the_backward():
    """A tied head's backward moves 12 more bytes per embedding element (autograd reads the head's
    and the embedding's fp32 gradients and writes their sum) in one more kernel; the forward is
    the same."""
    from simulator.model import workload

    tied = get_model("gpt2")
    untied = tied.model_copy(update={"tied_embeddings": False})
    mb = np.array([2.0])
    (f_t, b_t), (f_u, b_u) = (workload.embedding_bytes(m, mb, 128, 4) for m in (tied, untied))
    assert float(f_t.nbytes[0]) == float(f_u.nbytes[0])
    assert float(b_t.nbytes[0] - b_u.nbytes[0]) == pytest.approx(12.0 * tied.vocab_size * tied.hidden)
    assert b_t.kernels == b_u.kernels + 1


def test_eager_rotary_counts_every_op_of_rotate_half():
    """Eager rotary moves 10 elements per rotated dim (neg, cat, two muls, add) in 5 kernels per
    tensor, and a partial rotation also rewrites the whole head (cat of rotated and passed-through
    dims); compiled, one kernel reads and writes the rotated dims. More rotated dims never move
    fewer bytes."""
    from simulator.model import workload

    assert workload.rotary_elements(1.0, False) == (10.0, 5)
    assert workload.rotary_elements(0.25, False) == (4.5, 6)
    assert workload.rotary_elements(0.25, True) == (0.5, 0)  # fused into LN1's kernel
    fracs = [0.125, 0.25, 0.5, 0.75, 0.99]
    assert all(workload.rotary_elements(a, False)[0] < workload.rotary_elements(b, False)[0]
               for a, b in zip(fracs[:-1], fracs[1:], strict=True))
    llama, pythia = get_model("tinyllama-1.1b"), get_model("pythia-160m")
    mb = np.array([1.0])
    no_rope = llama.model_copy(update={"pos_embedding": "alibi"})
    (f_r, _), (f_n, _) = (workload.layer_elementwise(m, mb, 256, 4, False) for m in (llama, no_rope))
    per_tok = 256 * 4 * llama.n_layers
    assert float(f_r.nbytes[0] - f_n.nbytes[0]) == pytest.approx(10.0 * (llama.q_dim + llama.kv_dim) * per_tok)
    assert f_r.kernels - f_n.kernels == 10 * llama.n_layers
    assert pythia.rotary_pct == 0.25
    plain = pythia.model_copy(update={"pos_embedding": "alibi"})
    (f_p, _), (f_a, _) = (workload.layer_elementwise(m, mb, 256, 4, False) for m in (pythia, plain))
    per_tok = 256 * 4 * pythia.n_layers
    assert float(f_p.nbytes[0] - f_a.nbytes[0]) == pytest.approx(4.5 * (pythia.q_dim + pythia.kv_dim) * per_tok)
    assert f_p.kernels - f_a.kernels == 12 * pythia.n_layers
    (c_p, _), (c_a, _) = (workload.layer_elementwise(m, mb, 256, 4, True) for m in (pythia, plain))
    assert c_p.kernels == c_a.kernels


def test_plan_measures_the_loss_dispatch_and_backward_layout_shapes():
    from calibration.benches import plan
    from calibration.benches.base import RunContext, Settings
    from calibration.device import detect

    keys = {b.key for b in plan(RunContext(detect("cpu"), Settings("quick", 0.05, 0.3, False, 2)))}
    assert {"loss/t512v50304", "dispatch/llama-sdpa/L3", "gemm/fp32/8x256x65536"} <= keys


def test_loss_class_is_fitted_to_the_cross_entropy_bench():
    from calibration.build import build_profile
    from calibration.device import detect

    dev = detect("cpu")
    results = {f"loss/t{t}v{v}": {"status": "ok", "group": "loss", "tokens": t, "vocab": v, "logits": float(t * v),
                                  "time_s": t * v * 36 / (dev_bw := 20e9 * 0.3)}
               for t, v in ((256, 2048), (512, 8192))}
    results["bandwidth/copy/fp32/4194304"] = {"status": "ok", "group": "bandwidth", "bytes": 2 * 4 * 4194304.0,
                                              "time_s": 2 * 4 * 4194304.0 / 20e9, "kernels": 1}
    prof = build_profile(dev, results, "test").profile
    assert prof.bw_eff_ops["loss"] == pytest.approx(0.3, rel=0.05)
    assert math.isfinite(dev_bw)


def test_validation_models_are_initialized_like_hugging_face():
    torch = pytest.importorskip("torch")
    from calibration.torch_model import INIT_STD, build_model

    spec = get_model("gpt2").model_copy(update={"n_layers": 1, "hidden": 64, "n_heads": 2, "ffn_hidden": 128,
                                                "vocab_size": 512})
    torch.manual_seed(0)
    m = build_model(spec, "sdpa")
    assert m.embed.weight.std().item() == pytest.approx(INIT_STD, rel=0.1)
    assert all(b.abs().max().item() == 0 for n, b in m.named_parameters() if n.endswith("qkv.bias"))
    x, y = torch.randint(0, 512, (2, 1, 64))
    loss = m(x, y).item()
    assert abs(loss - math.log(512)) < 0.5  # near-uniform logits at initialization, as real runs start


def test_cpu_gemm_bench_reads_its_second_operand_from_memory(tmp_path):
    """Cold operands span twice the last-level cache (sysfs): views of one arena, a cache line
    apart at least, cycled; an operand larger than half the span is read as it is."""
    import torch

    from calibration.benches import cold

    for i, (level, size) in enumerate([(1, "48K"), (2, "2048K"), (3, "300M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    llc = cold.last_level_cache_bytes(str(tmp_path))
    assert llc == 300 << 20 and cold.last_level_cache_bytes(str(tmp_path / "none")) is None
    span = cold.COLD_LLC_FACTOR * llc
    w = torch.arange(6.0).reshape(2, 3)
    got = [next(cold.cold_inputs(w, 0)) for _ in range(2)]
    assert got[0] is w and got[1] is w
    it = cold.cold_inputs(w, 3 * cold.ALIGN)
    got = [next(it) for _ in range(4)]
    assert all(g.shape == w.shape and g.dtype == w.dtype for g in got)
    assert got[1].data_ptr() - got[0].data_ptr() == cold.ALIGN and got[3].data_ptr() == got[0].data_ptr()
    assert span == 600 << 20 and next(cold.cold_inputs(torch.empty(4, 1 << 20), 1 << 20)).numel() == 4 << 20


def test_resampling_keeps_every_record_under_its_key():
    """The spread's bootstrap replaces each record's time (GEMMs: per layout, by the statistic the
    record was taken with) and keeps the measurements keyed as they were."""
    from calibration.build import _resample

    gemm = {"status": "ok", "time_s": 2.0, "stat": "median", "layouts_s": {"a": 1.0, "b": 3.0},
            "layouts_times": {"a": [1.0, 1.0, 1.0], "b": [3.0, 3.0, 3.0]}}
    old = {"status": "ok", "time_s": 1.0, "layouts_min_s": {"a": 1.0}, "layouts_times": {"a": [1.0, 2.0]}}
    other = {"status": "ok", "time_s": 4.0, "stat": "median", "timing": {"times": [4.0, 4.0, 4.0]}}
    out = _resample({"gemm/fp32/1x2x3": gemm, "gemm/fp32/4x5x6": old, "loss/t1v2": other,
                     "x": {"status": "unsupported"}}, np.random.default_rng(0))
    assert set(out) == {"gemm/fp32/1x2x3", "gemm/fp32/4x5x6", "loss/t1v2", "x"}
    assert out["gemm/fp32/1x2x3"]["layouts_s"] == {"a": 1.0, "b": 3.0} and out["gemm/fp32/1x2x3"]["time_s"] == 2.0
    assert out["gemm/fp32/4x5x6"]["layouts_min_s"]["a"] in (1.0, 2.0) and out["loss/t1v2"]["time_s"] == 4.0


def test_misaligned_gemm_bench_outvotes_a_host_stall():
    """The aligned and misaligned shapes are timed in alternating rounds and the round with the
    median ratio is kept: one round in which the host stalled the misaligned GEMM 10x does not
    become a 3x ``gemm_misaligned`` factor."""
    from types import SimpleNamespace

    import torch

    from calibration.benches import gemm_align
    from calibration.timing import Timing

    seq = iter([1.0, 1.1, 1.0, 10.0, 1.0, 1.05])  # (aligned, misaligned) per round; round 2 stalled
    ctx = SimpleNamespace(settings=SimpleNamespace(budget_s=0.6), device=torch.device("cpu"),
                          time=lambda fn, budget_s=None: Timing.of_calls([next(seq) * 1e-3]))
    rec = gemm_align._bench("fp32", 8, 64, 8)(ctx)
    assert rec["time_s"] / rec["aligned_s"] == pytest.approx(1.1)
    assert sorted(rec["round_ratios"]) == pytest.approx([1.05, 1.1, 10.0])


def test_misaligned_gemm_bench_pairs_avoid_power_of_two_widths():
    """Every aligned width of the misalignment bench is a whole number of 64-element rows but not a
    power of two, as padded vocabularies are: a power-of-two row stride is slow on its own (cache
    sets) and hid the misalignment penalty (x1.01 fitted where the LM head ran x1.15-1.19)."""
    from calibration.benches.gemm_align import SHAPES

    for mode, shapes in SHAPES.items():
        for m, n, k in shapes:
            assert n % 64 == 0 and n & (n - 1) != 0, (mode, m, n, k)


def test_optimizer_big_mix_spans_twice_the_cache():
    """The 'big' AdamW mix keeps its 24 MiB tensors and repeats them until the optimizer state
    (16 bytes per parameter) spans the cold span; without a cache size it stays at two."""
    from calibration.benches.stepops import OPT_MIX, big_mix
    from simulator.physics.memory import state_bytes_per_param

    state = sum(state_bytes_per_param("fp32", "ddp", "adamw"))
    base = OPT_MIX["quick"]["big"]
    assert big_mix(base, 0) == base and len(base) == 2 and state == 16
    grown = big_mix(base, 960 << 20)
    per = state * base[0][0] * base[0][1]
    assert set(grown) == {base[0]} and len(grown) == 10 and (len(grown) - 1) * per < (960 << 20) <= len(grown) * per


def test_rotary_and_permute_benches_feed_the_broadcast_class():
    """calibrate times Hugging Face's rotary multiply (half Q times an fp32 [1, 1, s, d] table, promoted to
    fp32: e + 4 bytes an element) and the copy of a transposed view (2e), the kernels hf-trainer's eager
    rotary and transposes are priced at, and the build fits them with the mask add into the ``broadcast``
    class: a bench that ran twice as slow as the mask add pulls the class down."""
    from types import SimpleNamespace

    import torch

    from calibration.benches import stepops
    from calibration.timing import Timing

    def timed(fn, **_):
        fn()
        return Timing.of_calls([1e-3])

    ctx = SimpleNamespace(device=torch.device("cpu"), dev=SimpleNamespace(kind="cuda"), time=timed)
    rot = stepops._rotary_mul(1, 2, 8, 4, "bf16")(ctx)
    perm = stepops._permute_copy(1, 2, 8, 4, "bf16")(ctx)
    assert rot["bytes"] == 64 * 6 and rot["out_bytes"] == 64 * 4 and perm["bytes"] == 64 * 4
    from calibration.build import Bandwidth, op_class_section

    def rec(nbytes, t):
        return {"status": "ok", "bytes": nbytes, "out_bytes": nbytes / 2, "time_s": t}

    bw = Bandwidth(gbs=100.0, gbs_source="t", copy_eff=None)
    alone = op_class_section({"mask_add/a": rec(1e8, 2e-3)}, "t", bw, 0.0, None)
    both = op_class_section({"mask_add/a": rec(1e8, 2e-3), "rotary_mul/a": rec(1e8, 4e-3),
                             "permute_copy/a": rec(1e8, 4e-3)}, "t", bw, 0.0, None)
    assert both.fits["bw_eff_ops/broadcast"]["n"] == 3
    assert both.fields["bw_eff_ops"]["broadcast"] < alone.fields["bw_eff_ops"]["broadcast"]
