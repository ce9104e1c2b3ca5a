"""MLP activations: each ModelSpec names one (or takes its family's), Hugging Face configs set it,
the validation model runs it, an eager step times it in its own bandwidth class where the profile
calibrates one (the elementwise class's where not), and calibration fits those classes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from calibration.build import build_profile
from calibration.torch_model import ACTIVATION_FNS, MLP, new_gelu
from simulator.core.vocab import ACTIVATIONS
from simulator.hardware.profile import ACTIVATION_CLASSES, activation_class
from simulator.model.hf_config import model_from_hf_config
from simulator.model.presets import get_model
from tests.test_calibration_generalizes import _cpu_profile, _step

#: a tanh-GELU decoder whose Hugging Face model runs F.gelu(approximate='tanh') as one kernel (GPT-NeoX with
#: hidden_act 'gelu_fast'), where GPT-2's gelu_new is eager ops of its own (test_gpt2_gelu_new_is_its_eager_ops)
TANH = get_model("pythia-14m").model_copy(update={"activation": "gelu_tanh"})


@pytest.mark.parametrize(("model", "act"), [("gpt2", "gelu_tanh"), ("pythia-160m", "gelu"),
                                            ("tinyllama-1.1b", "silu")])
def test_family_default_activation(model, act):
    assert get_model(model).mlp_activation == act


def test_explicit_activation_wins_over_the_family_default():
    m = get_model("gpt2").model_copy(update={"activation": "gelu"})
    assert m.mlp_activation == "gelu"


@pytest.mark.parametrize(("cfg", "act"), [
    ({"model_type": "gpt2", "activation_function": "gelu_new"}, "gelu_tanh"),
    ({"model_type": "gpt2", "activation_function": "relu"}, "relu"),
    ({"model_type": "gpt_neox", "hidden_act": "gelu"}, "gelu"),
    ({"model_type": "gpt_neox", "hidden_act": "gelu_fast"}, "gelu_tanh"),
])
def test_hf_config_sets_the_activation(cfg, act):
    base = {"gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 100, "n_positions": 64},
            "gpt_neox": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                         "intermediate_size": 256, "vocab_size": 100, "max_position_embeddings": 64}}
    spec = model_from_hf_config({**base[cfg["model_type"]], **cfg}, name="t")
    assert spec.activation == act and spec.mlp_activation == act


def test_hf_config_unknown_activation_keeps_the_family_default():
    spec = model_from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 100,
                                 "n_positions": 64, "activation_function": "quick_gelu"}, name="t")
    assert spec.activation is None and spec.mlp_activation == "gelu_tanh"


def test_validation_mlp_runs_the_specs_activation():
    small = {"hidden": 8, "ffn_hidden": 16, "n_heads": 2}
    mlp = MLP(TANH.model_copy(update=small))
    x = torch.randn(3, 8)
    want = mlp.down(F.gelu(mlp.up(x), approximate="tanh"))
    assert torch.allclose(mlp(x), want)
    assert set(ACTIVATION_FNS) == set(ACTIVATIONS)
    # GPT-2's MLP runs transformers' NewGELUActivation op for op (the same function, other kernels)
    gpt2 = MLP(get_model("gpt2").model_copy(update=small))
    assert gpt2.act is new_gelu and torch.allclose(new_gelu(x), F.gelu(x, approximate="tanh"), atol=1e-6)


def test_gpt2_gelu_new_is_its_eager_ops():
    """transformers' NewGELUActivation under the hf-trainer stack: 10 eager kernels and 6e + 64 bytes an
    element forward under autocast (8 and 72 in fp32), 15 and 13e + 92 backward (11 and 112), in the
    elementwise class; stacks that do not run Hugging Face's modules keep the one tanh-GELU kernel."""
    import numpy as np

    from simulator.model import graphs

    spec = get_model("gpt2")
    width = 128 * 2.0 * spec.ffn_hidden
    for prec, fwd, bwd, kf, kb in (("bf16", 76, 118, 10, 15), ("fp32", 72, 112, 8, 11)):
        ops = {op.name: op for op, _ in graphs.graph(spec, 128, np.array([2.0]), prec, "sdpa", False).all_ops()}
        act = ops["activation"]
        assert np.allclose(act.bytes_fwd, fwd * width) and np.allclose(act.bytes_bwd, bwd * width)
        assert (act.kernels_fwd, act.kernels_bwd, act.bandwidth) == (kf, kb, "elementwise")
    mega = {op.name: op for op, _ in graphs.graph(spec, 128, np.array([2.0]), "bf16", "sdpa", False,
                                                  stack="megatron-lm").all_ops()}
    assert mega["activation"].kernels_fwd == 1 and mega["activation"].bandwidth == "activation.gelu_tanh.bf16"


def test_uncalibrated_activation_times_like_any_elementwise_op():
    """Splitting the activation out of the elementwise op moves no time when the profile has no
    activation class: the same bytes at the same efficiency."""
    plain = _cpu_profile(bw_eff_ops={"elementwise": 0.4})
    same = _cpu_profile(bw_eff_ops={"elementwise": 0.4, "activation.gelu.fp32": 0.4})
    a, b = _step(plain, TANH, seq_len=128).breakdown_s, _step(same, TANH, seq_len=128).breakdown_s
    assert a["forward"] == pytest.approx(b["forward"]) and a["backward"] == pytest.approx(b["backward"])
    assert plain.bw_eff(activation_class("gelu_tanh", "bf16")) == plain.bw_eff("elementwise")


def test_a_slow_activation_class_slows_only_its_family_and_precision():
    base = _cpu_profile(bw_eff_ops={"elementwise": 0.4})
    slow = _cpu_profile(bw_eff_ops={"elementwise": 0.4, "activation.gelu_tanh.fp32": 0.05})
    g0, g1 = _step(base, TANH).breakdown_s, _step(slow, TANH).breakdown_s
    assert g1["forward"] > g0["forward"] and g1["backward"] > g0["backward"]
    # NeoX's exact GELU, a bf16 step and a compiled step do not use the fp32 tanh class
    assert _step(slow, "pythia-14m").step_time_s == pytest.approx(_step(base, "pythia-14m").step_time_s)
    assert _step(slow, TANH, precision="bf16").step_time_s == pytest.approx(
        _step(base, TANH, precision="bf16").step_time_s)
    # more activation work never takes less time
    assert _step(slow, TANH, micro_batch=8, global_batch=8).step_time_s > g1["forward"] + g1["backward"]


def test_activation_backward_is_one_kernel_of_three_tensors():
    """The eager activation's backward (autograd's gelu_backward) reads the output gradient and
    the input and writes the input gradient: 1.5x the forward's bytes in one kernel per layer."""
    import numpy as np

    from simulator.model import graphs

    spec = TANH
    ops = {op.name: op for op, _ in graphs.graph(spec, 128, np.array([2.0]), "fp32", "sdpa", False).all_ops()}
    act = ops["activation"]
    assert np.allclose(act.bytes_bwd, 1.5 * np.asarray(act.bytes_fwd))
    assert act.kernels_bwd == act.kernels_fwd
    assert act.bandwidth == "activation.gelu_tanh.fp32" and act.bandwidth_bwd == "activation.gelu_tanh.fp32.bwd"


def test_a_slow_backward_class_slows_only_the_backward():
    fwd_only = _cpu_profile(bw_eff_ops={"elementwise": 0.4, "activation.gelu_tanh.fp32": 0.1})
    both = _cpu_profile(bw_eff_ops={"elementwise": 0.4, "activation.gelu_tanh.fp32": 0.1,
                                    "activation.gelu_tanh.fp32.bwd": 0.02})
    a, b = _step(fwd_only, TANH).breakdown_s, _step(both, TANH).breakdown_s
    assert b["forward"] == pytest.approx(a["forward"]) and b["backward"] > a["backward"]
    # absent, the backward class takes its forward class's efficiency, then the elementwise class's
    assert fwd_only.bw_eff(activation_class("gelu_tanh", "fp32", backward=True)) == 0.1
    assert fwd_only.bw_eff(activation_class("silu", "bf16", backward=True)) == 0.4


def test_activation_backward_bench_times_autograds_kernel():
    """The bench's function is the one autograd runs for each benched activation."""
    from calibration.benches.bandwidth import ACTIVATION_BWD_FNS, BENCH_ACTIVATIONS

    assert set(ACTIVATION_BWD_FNS) == set(BENCH_ACTIVATIONS)
    for act in BENCH_ACTIVATIONS:
        x = torch.randn(4, 8, requires_grad=True)
        g = torch.randn(4, 8)
        (want,) = torch.autograd.grad(ACTIVATION_FNS[act](x), x, g)
        assert torch.allclose(ACTIVATION_BWD_FNS[act](g, x.detach()), want, atol=1e-6)


def test_profile_validates_activation_classes():
    assert "activation.gelu_tanh.bf16" in ACTIVATION_CLASSES and "activation.silu.fp32.bwd" in ACTIVATION_CLASSES
    with pytest.raises(ValueError, match="unknown key"):
        _cpu_profile(bw_eff_ops={"activation.swiglu.fp32": 0.3})


def test_calibration_fits_each_activation_class_from_its_benches():
    """The committed Intel measurements plus synthetic tanh-GELU benches at a fifth of the copy
    bandwidth: the fit recovers that fifth within the fresh-page and launch terms, and fits no
    class without benches."""
    import json
    from pathlib import Path

    from calibration.device import detect

    meas = Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-intel-xeon.measurements.json"
    results = {k: v for k, v in json.loads(meas.read_text())["results"].items() if not k.startswith("activation/")}
    dev = detect("cpu")
    base = build_profile(dev, results, "test").profile
    rate = 0.2 * base.device.mem_bw_gbs * 1e9
    for n in (1 << 20, 1 << 22):
        nbytes = 2.0 * 4 * n
        results[f"activation/gelu_tanh/fp32/{n}"] = {"status": "ok", "group": "bandwidth", "time_s": nbytes / rate,
                                                     "bytes": nbytes, "kernels": 1, "elements": n}
        results[f"activation_bwd/gelu_tanh/fp32/{n}"] = {"status": "ok", "group": "bandwidth", "bytes": 1.5 * nbytes,
                                                         "time_s": 1.5 * nbytes / (0.5 * rate), "kernels": 1,
                                                         "elements": n}
    prof = build_profile(dev, results, "test").profile
    assert prof.bw_eff_ops["activation.gelu_tanh.fp32"] == pytest.approx(0.2, rel=0.15)
    assert prof.bw_eff_ops["activation.gelu_tanh.fp32.bwd"] == pytest.approx(0.1, rel=0.15)
    assert "activation.gelu.fp32" not in prof.bw_eff_ops and "activation.gelu.fp32" not in base.bw_eff_ops
    assert "activation.gelu.fp32.bwd" not in prof.bw_eff_ops
