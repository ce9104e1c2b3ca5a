"""Mixtures of experts (simulator/model/families/moe.py): exact parameter counts from config.json and
presets, the MoE layer's operations, expert parallelism."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from simulator.answer.api import simulate
from simulator.core.errors import UsageError
from simulator.frontends.cli import main
from simulator.hardware.catalog import default_profile, get_gpu
from simulator.hardware.device import device_from_spec
from simulator.model import graphs
from simulator.model.families.moe import LOAD_IMBALANCE, LOOP_KERNELS
from simulator.model.hf_config import model_from_hf_config
from simulator.model.presets import get_model
from simulator.physics import compute, memory, parallel
from simulator.physics.communication import Fabric
from simulator.physics.parallel import ShardView
from simulator.strategy.layout import Parallelism

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"

#: sum(p.numel() for p in model.parameters()) of each *ForCausalLM (the Hub's published totals:
#: Mixtral 46.7 B, OLMoE 6.9 B, Qwen3 30.5 B, Qwen1.5-MoE 14.3 B), and the parameters one token
#: uses. Qwen1.5-MoE counted by hand: 24 x (attention 4 x 2048^2 + Q/K/V biases 3 x 2048, router
#: 2048 x 60, 60 experts 3 x 2048 x 1408, shared expert 3 x 2048 x 5632 and its gate 2048, two norms)
#: + untied 151936 x 2048 embedding and head + final norm.
EXACT = {
    "Mixtral-8x7B-v0.1": (46_702_792_704, 12_879_925_248),
    "OLMoE-1B-7B-0924": (6_919_161_856, 1_282_017_280),
    "Qwen3-30B-A3B-Base": (30_532_122_624, 3_353_032_704),
    "Qwen1.5-MoE-A2.7B": (14_315_784_192, 2_689_173_504),
    # by hand: 94 x (attention 4096 x (64 + 2 x 4) x 128 + 64 x 128 x 4096, QK-norms 2 x 128, router
    # 4096 x 128, 128 experts 3 x 4096 x 1536, two norms) + untied 151936 x 4096 embedding and head
    # + final norm (the model card: 235B total, 22B activated)
    "Qwen3-235B-A22B": (235_093_634_560, 22_190_763_520),
    # DeepSeek: transformers 5.25 DeepseekV2/V3ForCausalLM on the meta device (model cards: V2-Lite
    # 15.7 B total, 2.4 B active without the 0.21 B embedding; V3 671 B without its 14 B
    # multi-token-prediction module, which transformers does not build)
    "DeepSeek-V2-Lite": (15_706_484_224, 2_661_150_208),
    "DeepSeek-V3": (671_026_404_352, 37_552_282_624),
    # gpt-oss: transformers 5.25 GptOssForCausalLM on the meta device, the published config.json
    # without its MXFP4 quantization_config (model card, arXiv:2508.10925: 20.91 B total and
    # 3.61 B active, 116.83 B and 5.13 B, the active counts without the 0.58 B embedding)
    "gpt-oss-20b": (20_914_757_184, 4_187_440_704),
    "gpt-oss-120b": (116_829_156_672, 5_711_982_912),
}
PRESETS = {"mixtral-8x7b": "Mixtral-8x7B-v0.1", "olmoe-1b-7b": "OLMoE-1B-7B-0924", "qwen3-30b-a3b": "Qwen3-30B-A3B-Base",
           "deepseek-v2-lite": "DeepSeek-V2-Lite", "gpt-oss-20b": "gpt-oss-20b"}
#: Presets too large for 8 GPUs (validation rows run them on dozens or hundreds).
LARGE_PRESETS = {"qwen3-235b-a22b": "Qwen3-235B-A22B", "gpt-oss-120b": "gpt-oss-120b"}


@pytest.mark.parametrize("fixture", sorted(EXACT))
def test_exact_total_and_active_from_config(fixture: str) -> None:
    m = model_from_hf_config(FIXTURES / f"{fixture}.json")
    assert (m.n_params(), m.n_active_params()) == EXACT[fixture]


@pytest.mark.parametrize("preset", sorted(PRESETS | LARGE_PRESETS))
def test_presets_count_exactly(preset: str) -> None:
    m = get_model(preset)
    assert (m.n_params(), m.n_active_params()) == EXACT[(PRESETS | LARGE_PRESETS)[preset]]
    assert m.hf_id and "config.json" in m.source


def test_active_parameters_by_hand() -> None:
    """Mixtral: 2 of 8 experts (3 x 4096 x 14336 each) per layer are active."""
    m = get_model("mixtral-8x7b")
    assert m.n_params() - m.n_active_params() == 32 * 6 * 3 * 4096 * 14336


def test_graph_parameters_add_up_and_flops_follow_active_parameters() -> None:
    for name in PRESETS:
        m = get_model(name)
        g = graphs.graph(m, 4096, np.array([1.0]), "bf16", "sdpa", True, "megatron-lm")
        layer = sum(op.params for op in g.blocks[0].ops)
        assert layer == m.param_breakdown()["layer_per_layer"]
        # 3 x forward FLOPs per token: 6 N_active (less the embedding lookup) + attention
        six_n = 6.0 * (m.n_active_params() - m.vocab_size * m.hidden)
        assert six_n < graphs.model_flops_per_token(m, 4096) < 1.3 * six_n
        assert graphs.palm_flops_per_token(m, 4096) < 6.0 * m.n_params() / 2


def test_dense_mlp_layers_refused_in_one_line() -> None:
    cfg = json.loads((FIXTURES / "Qwen3-30B-A3B-Base.json").read_text())
    cfg["mlp_only_layers"] = [0]
    with pytest.raises(UsageError, match="dense MLP layers") as exc:
        model_from_hf_config(cfg)
    assert "\n" not in str(exc.value)


def test_top_k_above_experts_refused() -> None:
    cfg = json.loads((FIXTURES / "OLMoE-1B-7B-0924.json").read_text())
    cfg["num_experts_per_tok"] = 65
    with pytest.raises(UsageError, match="top_k"):
        model_from_hf_config(cfg)


# ---------------------------------------------------------------------- operations and expert parallelism


def _ops(model, mb=2.0, seq=1024, stack="megatron-lm", compiled=True):
    g = graphs.graph(model, seq, np.array([mb]), "bf16", "sdpa", compiled, stack)
    return {op.name: op for op in g.blocks[0].ops}


def test_expert_gemms_run_tokens_per_local_expert() -> None:
    """m = tokens x top_k / experts per GPU, the busiest rank LOAD_IMBALANCE x that under EP; the
    FLOPs of all local experts are tokens x top_k x the expert's GEMM (uniform routing)."""
    m = get_model("olmoe-1b-7b")
    T = 2 * 1024
    up = _ops(m)["expert_up"]
    assert float(up.m[0]) == T * 8 / 64 and up.batch == 64 and (up.n, up.k) == (2 * 1024, 2048)
    assert float(up.gemm_flops_fwd()[0]) == 2.0 * T * 8 * 2 * 1024 * 2048
    v = ShardView(m, Parallelism(8, ep=8))
    up8 = _ops(v)["expert_up"]
    assert float(up8.m[0]) == pytest.approx(T * 8 / 8 * LOAD_IMBALANCE) and up8.batch == 8


def test_hugging_face_loop_launches_kernels_per_expert() -> None:
    """The eager loop: LOOP_KERNELS per expert (gate and up projections two GEMMs), at the expert's
    own m, its ops at a graph break; grouped: one kernel per GEMM for all experts, no break."""
    m = get_model("olmoe-1b-7b")
    for compiled in (False, True):
        grouped, loop = _ops(m, compiled=compiled), _ops(m, stack="hf-trainer", compiled=compiled)
        assert grouped["expert_up"].kernels_fwd == 1 and loop["expert_up"].kernels_fwd == 2 * 64
        assert loop["expert_down"].kernels_fwd == 64 and loop["expert_act"].kernels_fwd == 2 * 64
        assert loop["dispatch"].kernels_fwd == 2 + 4 * 64 and loop["combine"].kernels_fwd == 2 + 2 * 64
        assert float(loop["expert_up"].m[0]) == float(grouped["expert_up"].m[0]) == 2 * 1024 * 8 / 64
        looped = {name for name, op in loop.items() if op.graph_break}
        assert looped == {"dispatch", "expert_up", "expert_act", "expert_down", "combine"}
        assert not any(op.graph_break for op in grouped.values()) and "expert_act" not in grouped
    assert sum(LOOP_KERNELS.values()) == 11


def test_hugging_face_loop_is_slower_the_more_experts() -> None:
    """Same active work per token (top-8 of E experts of OLMoE's width): the eager loop's step over
    the grouped GEMMs' grows with E (host time per expert, small GEMMs), eager or compiled; Mixtral's
    eight large experts keep the device busier than the host (within 10%)."""
    dev = device_from_spec(get_gpu("h100-sxm"), default_profile("h100-sxm"))
    mb = np.array([2.0])

    def ratio(model, compiled: bool) -> float:
        t = {s: compute.micro_batch_time(model, 4096, mb, "bf16", "sdpa", compiled, "none", dev, stack=s).total[0]
             for s in ("hf-trainer", "megatron-lm")}
        return float(t["hf-trainer"] / t["megatron-lm"])

    base = get_model("olmoe-1b-7b")
    for compiled in (False, True):
        r = [ratio(base.model_copy(update={"n_experts": n}), compiled) for n in (8, 32, 64, 128)]
        assert 1.0 < r[0] < r[1] < r[2] < r[3] and r[2] > 2.0, r
    assert 1.0 < ratio(get_model("mixtral-8x7b"), True) < 1.1


def _first(x) -> float:
    """The first element of an array of per-op, per-micro-batch seconds."""
    return float(np.ravel(x)[0])


def test_grouped_gemm_calibration_times_the_experts_as_one_gemm() -> None:
    """With the profile's grouped_gemm_m_half h, the grouped experts' GEMMs take one GEMM of all
    their rows times 1 + h/m (m: rows per expert) in each pass; without it each expert is its own
    GEMM of m rows (the catalog profiles, unchanged). More h, or fewer rows per expert, is slower;
    the eager loop's GEMMs and the dense ones are not grouped; the bound is enforced."""
    base = default_profile("h100-sxm")
    dev0 = device_from_spec(get_gpu("h100-sxm"), base)
    ops = _ops(ShardView(get_model("olmoe-1b-7b"), Parallelism(8, ep=8)))
    up = ops["expert_up"]
    assert up.grouped and not ops["qkv"].grouped
    assert not _ops(get_model("olmoe-1b-7b"), stack="hf-trainer")["expert_up"].grouped
    whole = dataclasses.replace(up, m=up.m * up.batch, batch=1.0, grouped=False)
    t_whole = compute.gemm_pass_times([whole], dev0, "bf16")
    times = {}
    for h in (0.0, 64.0, 512.0):
        dev = device_from_spec(get_gpu("h100-sxm"), base.model_copy(update={"grouped_gemm_m_half": {"bf16": h}}))
        times[h] = compute.gemm_pass_times([up], dev, "bf16")
        for got, ref in zip(times[h], t_whole, strict=True):
            assert _first(got) == pytest.approx(_first(ref) * (1 + h / float(up.m[0])))
        assert _first(compute.gemm_pass_times([ops["qkv"]], dev, "bf16")[0]) == \
            pytest.approx(_first(compute.gemm_pass_times([ops["qkv"]], dev0, "bf16")[0]))
    assert _first(times[0.0][0]) < _first(times[64.0][0]) < _first(times[512.0][0])
    thin = dataclasses.replace(up, m=up.m / 8, batch=up.batch * 8)  # the same rows over 8x the experts
    dev = device_from_spec(get_gpu("h100-sxm"), base.model_copy(update={"grouped_gemm_m_half": {"bf16": 64.0}}))
    assert _first(compute.gemm_pass_times([thin], dev, "bf16")[0]) > _first(times[64.0][0])
    with pytest.raises(ValueError, match="grouped_gemm_m_half"):
        type(base).model_validate({**base.model_dump(), "grouped_gemm_m_half": {"bf16": 1e5}})


def test_grouped_gemm_moves_every_experts_weight() -> None:
    """A grouped GEMM timed as one GEMM of all its rows still reads each expert's weight (and writes
    each weight gradient) once: with few rows per expert (Qwen3-30B-A3B's 128 experts on one GPU, 32
    rows each) no pass takes less than the experts' operand and output traffic at the profile's
    GEMM bandwidth, however small the profile's ``grouped_gemm_m_half``."""
    base = default_profile("h100-sxm")
    dev = device_from_spec(get_gpu("h100-sxm"), base.model_copy(update={"grouped_gemm_m_half": {"bf16": 0.0}}))
    up = _ops(get_model("qwen3-30b-a3b"))["expert_up"]
    thin = dataclasses.replace(up, m=np.asarray(32.0), batch=128.0)
    floor = 128 * 2 * (32 * thin.k + thin.k * thin.n + 32 * thin.n) / (dev.mem_bw * base.bw_eff("gemm"))
    for t in compute.gemm_pass_times([thin], dev, "bf16"):
        assert _first(t) >= floor * (1 - 1e-9)
    wide = dataclasses.replace(up, m=np.asarray(4096.0), batch=128.0)  # compute-bound: unchanged
    whole = dataclasses.replace(wide, m=np.asarray(4096.0 * 128), batch=1.0, grouped=False)
    assert _first(compute.gemm_pass_times([wide], dev, "bf16")[0]) == \
        pytest.approx(_first(compute.gemm_pass_times([whole], dev, "bf16")[0]))


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "olmoe-1b-7b", "mixtral-8x7b"])
@pytest.mark.parametrize("stack", ["megatron-lm", "torchtitan"])
def test_moe_plan_names_its_best_expert_parallel_layout(model, stack) -> None:
    """A mixture of experts on 8 x H100 under a stack with expert parallelism: the plan is expert-parallel,
    or its layout note names the best expert-parallel plan and how much longer it takes (the search
    evaluates the most promising expert-parallel layout even when another kind wins)."""
    plan = simulate(model, "8xh100", stack=stack, tokens="1B")
    note = next(n for n in plan.notes if n.startswith("considered"))
    if "EP " in plan.strategy_line():
        return
    import re

    found = re.search(r"the best expert-parallel plan \((.*?EP \d+.*?)\) takes (\d+\.\d+)× as long", note) \
        or re.search(r"the best tensor/pipeline/context/expert plan \((.*?EP \d+.*?)\) takes (\d+\.\d+)× as long", note)
    assert found and float(found.group(2)) >= 1.0, note


def test_hugging_face_loop_note() -> None:
    """hf-trainer + MoE says the eager loop is slow and names the grouped stacks; megatron-lm does not."""
    hf = simulate("olmoe-1b-7b", "8xh100", tokens="1B")
    mg = simulate("olmoe-1b-7b", "8xh100", stack="megatron-lm", tokens="1B")
    note = [n for n in hf.notes if "eager expert loop" in n]
    assert len(note) == 1 and "slow" in note[0] and "megatron-lm and torchtitan" in note[0]
    assert not any("eager expert loop" in n for n in mg.notes)
    assert hf.step_time_s > mg.step_time_s


def test_dispatched_copies_cost_activation_memory_and_time() -> None:
    """More experts per token: more saved activations (top_k copies) and more time."""
    base = get_model("olmoe-1b-7b")
    more = base.model_copy(update={"top_k": 16})
    one = np.array([1.0])
    a1 = memory.activations(base, 2048, one, "bf16", "sdpa", "none", True, "megatron-lm")
    a2 = memory.activations(more, 2048, one, "bf16", "sdpa", "none", True, "megatron-lm")
    assert a2[0] > a1[0]
    p1 = simulate(base, "8xh100", stack="megatron-lm", tokens="1B")
    p2 = simulate(more, "8xh100", stack="megatron-lm", tokens="1B")
    assert p2.step_time_s > p1.step_time_s


def test_shard_view_divides_the_experts() -> None:
    m = get_model("mixtral-8x7b")
    v = ShardView(m, Parallelism(8, ep=8))
    experts = m.n_expert_params()
    assert v.n_expert_params() == experts // 8
    assert v.n_params() == m.n_params() - experts + experts // 8
    assert parallel.view(m, Parallelism(8)) is m and parallel.view(m, Parallelism(8, ep=2)) is not m


def test_expert_states_shard_over_the_expert_data_parallel_ranks() -> None:
    """ZeRO-1 over 8 ranks with EP 8: each expert's optimizer states live on its one EP rank
    (8 / 8 = 1 expert data-parallel rank), the rest of the model's over all 8; never fewer bytes."""
    m = get_model("mixtral-8x7b")
    v = ShardView(m, Parallelism(8, ep=8))
    X, P = float(v.n_expert_params()), float(v.n_params())
    st = memory.layout_states(v, 1.0, "bf16", "zero1", "none", "adamw", 8)
    assert st["optimizer"] == pytest.approx(12 * (P - X) / 8 + 12 * X)
    plain = memory.model_states(P, 1.0, "bf16", "zero1", "none", "adamw", 8)
    assert st["optimizer"] > plain["optimizer"] and st["weights"] == plain["weights"]
    assert memory.layout_states(m, 1.0, "bf16", "zero1", "none", "adamw", 8) == \
        memory.model_states(float(m.n_params()), 1.0, "bf16", "zero1", "none", "adamw", 8)


def test_all_to_all_by_hand() -> None:
    """Per MoE layer and micro-batch: a dispatch and a combine per pass, each tokens x top_k x
    hidden x 2 bytes x (ep-1)/ep at the node's bus bandwidth plus its latency; beyond the node,
    slower."""
    fab = Fabric(1, 8, 450e9, 10e-6, 0.0, 0.0)
    par = Parallelism(8, ep=8)
    t = float(parallel.ep_comm_time(4096.0, 2048, 8, 2, par, fab, 2.0))
    one = fab.intra_alpha + 4096 * 8 * 2048 * 2 * 7 / 8 / fab.intra_busbw
    assert t == pytest.approx(2 * 2 * one)
    fab2 = Fabric(2, 8, 450e9, 10e-6, 50e9, 20e-6)
    across = float(parallel.ep_comm_time(4096.0, 2048, 8, 2, Parallelism(16, ep=16), fab2, 2.0))
    assert across > t
    assert float(parallel.ep_comm_time(4096.0, 2048, 8, 2, Parallelism(8), fab, 2.0)) == 0.0


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_feasible_expert_parallel_plan_on_8xh100(preset: str, capsys) -> None:
    assert main(["--gpus", "8xh100", "--model", preset, "--stack", "megatron-lm", "--ep", "8",
                 "--tokens", "1B", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    m = get_model(preset)
    assert out["feasible"] and out["strategy"]["ep"] == 8
    assert out["model"]["params"] == m.n_params() and out["model"]["active_params"] == m.n_active_params()
    assert out["breakdown_s"]["ep_comm"] > 0 and out["mfu"] < out["hfu"] < 1


def test_cli_line_shows_the_expert_layout(capsys) -> None:
    assert main(["--gpus", "8xh100", "--model", "olmoe-1b-7b", "--stack", "megatron-lm", "--ep", "8",
                 "--tokens", "1B"]) == 0
    out = capsys.readouterr().out
    assert "EP 8 · DP 8" in out and "1.28 B active" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "olmoe-1b-7b", "--ep", "3"], "valid choices: 1, 2, 4, 8"),
    (["--model", "olmoe-1b-7b", "--ep", "16", "--stack", "megatron-lm"], "valid choices here: 1, 2, 4, 8"),
    (["--model", "olmoe-1b-7b", "--ep", "4", "--tp", "4", "--stack", "megatron-lm"], "valid choices here: 1, 2"),
    (["--model", "olmoe-1b-7b", "--ep", "8"], "Hugging Face Trainer stack has no expert parallelism"),
    (["--model", "pythia-1b", "--ep", "2"], "not a mixture of experts"),
    (["--model", "olmoe-1b-7b", "--ep", "0"], "--ep"),
])
def test_bad_expert_parallelism_is_one_line_exit_2(args, needle, capsys) -> None:
    assert main(["--gpus", "8xh100", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def _published_moe_runs() -> list[dict]:
    import csv
    from importlib import resources

    text = resources.files("simulator").joinpath("data/moe_runs.csv").read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


#: Published rows the simulator still calls infeasible under their recorded layout, or predicts
#: beyond their tolerance, and why (a known gap, not an accepted answer: the test fails once the
#: row passes, so the entry goes with the fix).
_GPT_OSS = ("every gpt-oss row reads 23-27% fast, under Megatron-Core (Transformer Engine's cuDNN attention with "
            "sinks) and NeMo Automodel (FlexAttention) alike, so the gap follows the model, not the stack; not "
            "identified (its clamped SwiGLU with offset and expert biases, attention sinks and 128-token windows at "
            "head size 64, and the 201088-token head are the candidates; simulator/data/moe_runs.md)")
KNOWN_GAPS: dict[str, str] = {
    "gpt-oss-120b@8x8xh100:tp1pp4ep8gb512": _GPT_OSS,
    "gpt-oss-20b@8xh100:tp1pp1ep8gb256": _GPT_OSS,
    "gpt-oss-120b@8x8xh100:tp1pp1ep64gb512": _GPT_OSS,
    "gpt-oss-120b@8x8xh100:tp1pp4ep8gb1280": (
        "predicted 10.93 s, measured 13.67 s (+25.1%; +36.3% while the compiled loss was counted fused at 8 B a "
        "logit, now the stack's eager upcast, 48, where Megatron-Core's native fused cross-entropy moves ~40): the "
        "stage of 9 layers holds 2880-wide experts at 1024 rows each and the 201088-token head; its weight-gradient GEMMs "
        "accumulate into fp32 main grads (gradient_accumulation_fusion: 4.4 B elements read and written each "
        "micro-batch, an intensity of m/4 = 256 FLOP/B in the expert GEMMs, at the H100's ridge), not modelled "
        "(the main grads' memory and fp32 reduce are); "
        "the rest is not identified (simulator/data/moe_runs.md)"),
}


def _row_id(row: dict) -> str:
    return (f"{row['model']}@{row['gpus']}:tp{row['tp']}pp{row['pp']}ep{row['ep']}gb{row['global_batch']}"
            + ("+overlap" if row["a2a_overlap"] else ""))


@pytest.mark.parametrize("row", [
    pytest.param(r, id=_row_id(r), marks=[pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[_row_id(r)])]
                 if _row_id(r) in KNOWN_GAPS else []) for r in _published_moe_runs()])
def test_published_moe_runs(row: dict) -> None:
    """Each published bf16 or FP8 MoE run (simulator/data/moe_runs.csv) under its recorded layout is
    feasible, never refused, and its tokens/s predicted within the row's ``tolerance`` (the issue's
    20%, wider where moe_runs.md names what is not modelled; the errors: see the report printed with
    -s). :data:`KNOWN_GAPS` are expected to fail, strictly."""
    pins: dict = {k: int(row[k]) for k in ("tp", "pp", "vp", "ep", "etp", "micro_batch", "global_batch", "seq_len")
                  if row[k]}
    if row["checkpointing"]:
        pins["checkpointing"] = row["checkpointing"]
    if row["compile"]:
        pins["compile"] = row["compile"] == "1"
    if row["capacity_factor"]:
        pins["capacity_factor"] = float(row["capacity_factor"])
    if row["dispatcher"]:
        pins["moe_dispatcher"] = row["dispatcher"]
    if row["a2a_overlap"]:
        pins["moe_a2a_overlap"] = True
    if row["grad_overlap"]:
        pins["overlap_grad_reduce"] = True
    if row["routing"]:
        pins["moe_routing"] = row["routing"]
    plan = simulate(row["model"], row["gpus"], stack=row["stack"], precision=row["precision"], sharding=row["sharding"],
                    tokens="10B", **pins)
    measured = float(row["measured_step_s"])
    error = measured / plan.step_time_s - 1.0  # predicted tokens/s over measured, less one
    print(f"{row['model']} on {row['gpus']} ({plan.strategy_line()}): predicted {plan.step_time_s:.2f} s, "
          f"measured {measured:.2f} s, tokens/s error {error:+.1%}")
    assert plan.feasible and plan.strategy["ep"] == int(row["ep"]) and plan.strategy["tp"] == int(row["tp"])
    assert abs(error) < float(row["tolerance"])



def test_automodel_keeps_bf16_states_so_its_256_gpu_deepseek_v3_run_fits() -> None:
    """NeMo Automodel casts its custom MoE models to bf16 and its benchmark steps torch.optim.Adam
    over them: 2 + 2 + 4 bytes a parameter (no fp32 master), so its published DeepSeek-V3 run on
    256 H100 (PP 4, VP 8, EP 64, FSDP 64) fits; mixed states (2 + 2 + 12) had put it at 81.9 GiB."""
    from simulator.physics.memory import state_bytes_per_param
    from simulator.strategy.stacks import get_stack

    assert state_bytes_per_param("bf16", "fsdp-grad-op", "adamw", get_stack("nemo-automodel")) == (2, 2, 4)
    assert state_bytes_per_param("bf16", "fsdp-grad-op", "adamw", get_stack("torchtitan")) == (2, 2, 12)
    plan = simulate("deepseek-v3", "32x8xh100", stack="nemo-automodel", precision="bf16", sharding="fsdp-grad-op",
                    tokens="10B", tp=1, pp=4, vp=8, ep=64, micro_batch=1, global_batch=512, seq_len=4096,
                    checkpointing="full", capacity_factor=1.0, moe_dispatcher="deepep")
    assert plan.feasible and plan.memory_gib["total"] < plan.memory_gib["capacity"]

def test_capacity_factor_runs_every_expert_at_its_buffer() -> None:
    """Capacity factor c: the experts' GEMM rows and the dispatched copies' activations are c x
    the mean share (dropless: LOAD_IMBALANCE x under EP, the mean without); the all-to-all carries
    c x the tokens. So under EP 8: c = 1 is faster and smaller than dropless, c = 1.25 slower and
    larger; without EP dropless equals c = 1."""
    m = get_model("olmoe-1b-7b")
    v = ShardView(m, Parallelism(8, ep=8))
    ups = {c: float(_ops(parallel.ShardView(m.model_copy(update={"capacity_factor": c}), Parallelism(8, ep=8)))
                     ["expert_up"].m[0]) for c in (1.0, 1.25)}
    mean = 2 * 1024 * 8 / 8
    assert ups == {1.0: mean, 1.25: 1.25 * mean} and float(_ops(v)["expert_up"].m[0]) == pytest.approx(1.1 * mean)
    kw = dict(tokens="1B", stack="megatron-lm", ep=8, micro_batch=4, checkpointing="none", sharding="zero1")
    plans = {c: simulate("olmoe-1b-7b", "8xh100", capacity_factor=c, **kw) for c in (1.0, None, 1.25)}
    steps = [plans[c].step_time_s for c in (1.0, None, 1.25)]
    acts = [plans[c].memory_gib["activations"] for c in (1.0, None, 1.25)]
    assert steps == sorted(steps) and steps[0] < steps[2] and acts == sorted(acts) and acts[0] < acts[2]
    assert plans[1.25].breakdown_s["ep_comm"] == pytest.approx(1.25 * plans[1.0].breakdown_s["ep_comm"], rel=0.05)
    one = dict(tokens="1B", stack="megatron-lm", ep=1, micro_batch=4, checkpointing="none", sharding="zero1")
    assert simulate("olmoe-1b-7b", "8xh100", **one).step_time_s == \
        pytest.approx(simulate("olmoe-1b-7b", "8xh100", capacity_factor=1.0, **one).step_time_s)
    assert any("capacity factor 1.25" in n for n in plans[1.25].notes)


@pytest.mark.parametrize("args,needle", [
    (["--model", "olmoe-1b-7b", "--capacity-factor", "9", "--stack", "torchtitan"], "at most n_experts / top_k = 8"),
    (["--model", "pythia-1b", "--capacity-factor", "1"], "not a mixture of experts"),
    (["--model", "olmoe-1b-7b", "--capacity-factor", "0"], "--capacity-factor"),
    (["--model", "olmoe-1b-7b", "--capacity-factor", "1"], "eager expert loop"),
])
def test_bad_capacity_factor_is_one_line_exit_2(args, needle, capsys) -> None:
    assert main(["--gpus", "8xh100", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_deepep_sends_a_token_once_per_gpu_and_node() -> None:
    """DeepEP: per token, the other GPUs (and nodes) holding any of its top-k experts, each once.
    By hand: top-8 of 128 experts over 8 GPUs hits 8 (1 - C(112, 8) / C(128, 8)) GPUs; with one
    expert per GPU (Mixtral's top-2 of 8 at EP 8) or top-1 it sends what NCCL's all-to-all sends;
    across 4 nodes only the RDMA share shrinks to the nodes hit, and it is never slower."""
    hit = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    assert parallel.groups_hit(128, 8, 8) == pytest.approx(hit) and 5.3 < hit < 5.4
    fab = Fabric(1, 8, 450e9, 10e-6, 0.0, 0.0)
    par = Parallelism(8, ep=8)
    nccl = parallel.ep_comm_time(4096.0, 2048, 8, 2, par, fab, 2.0, 128, "alltoall")
    deep = parallel.ep_comm_time(4096.0, 2048, 8, 2, par, fab, 2.0, 128, "deepep")
    assert float(deep) == pytest.approx(2 * 2 * (10e-6 + 4096 * 2048 * 2 * hit * 7 / 8 / 450e9))
    assert float(deep) < float(nccl)
    for experts, k in ((8, 2), (64, 1)):
        same = [float(parallel.ep_comm_time(4096.0, 4096, k, 2, par, fab, 2.0, experts, d)) for d in ("alltoall", "deepep")]
        assert same[0] == pytest.approx(same[1])
    fab4 = Fabric(4, 8, 450e9, 10e-6, 400e9, 20e-6)
    p32 = Parallelism(32, ep=32)
    across = [float(parallel.ep_comm_time(2048.0, 4096, 8, 2, p32, fab4, 2.0, 128, d)) for d in ("alltoall", "deepep")]
    assert across[1] < across[0] / 1.5
    nodes_hit = 4 * (1 - math.comb(96, 8) / math.comb(128, 8)) * 3 / 4
    assert across[1] == pytest.approx(2 * 2 * (30e-6 + 2048 * 4096 * 2 * nodes_hit * 8 / 400e9))


def test_overlapped_all_to_all_hides_behind_the_other_micro_batch() -> None:
    """Overlapped (Megatron-Core --overlap-moe-expert-parallel-comm): what the compute cannot hide,
    plus A2A_OVERLAP_SM_SHARE of what it hides; a step with it is faster, never below the step
    without any all-to-all, and the option is refused where the stack has no expert parallelism."""
    share = parallel.A2A_OVERLAP_SM_SHARE
    assert float(parallel.ep_overlap_exposed(1.0, 3.0)) == pytest.approx(share)
    assert float(parallel.ep_overlap_exposed(3.0, 1.0)) == pytest.approx(2.0 + share)
    kw = dict(tokens="1B", stack="megatron-lm", ep=8, micro_batch=4, checkpointing="none", sharding="zero1")
    plain, over = (simulate("olmoe-1b-7b", "8xh100", moe_a2a_overlap=o, **kw) for o in (None, True))
    assert over.step_time_s < plain.step_time_s
    assert over.breakdown_s["ep_comm"] == pytest.approx(share * plain.breakdown_s["ep_comm"])
    assert over.step_time_s > plain.step_time_s - plain.breakdown_s["ep_comm"]
    with pytest.raises(UsageError, match="no expert parallelism"):
        simulate("olmoe-1b-7b", "8xh100", moe_a2a_overlap=True)
    assert any("expert all-to-all: NCCL" in n and "overlapped with another micro-batch" in n for n in over.notes)
    assert not any("expert all-to-all:" in n for n in plain.notes)


def test_bad_dispatcher_is_one_line_exit_2(capsys) -> None:
    assert main(["--gpus", "8xh100", "--model", "olmoe-1b-7b", "--moe-dispatcher", "deepep"]) == 2
    err = capsys.readouterr().err
    assert "has no expert parallelism" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="valid choices: alltoall, deepep"):
        simulate("olmoe-1b-7b", "8xh100", stack="megatron-lm", moe_dispatcher="nccl")


def test_folded_experts_by_hand() -> None:
    """Expert TP 1 under TP 4 (Megatron-Core's MoE parallel folding): whole experts, E/ep of them,
    on the rank's sequence shard (a quarter of the tokens: the same expert FLOPs as the TP-split
    experts on all of them, a quarter of the dispatched copies' hidden-wide activations); the
    sparse layers pay only the attention's half of the TP collectives; the expert data-parallel
    group spans tp x dp / ep ranks; EP 8 of consecutive ranks stays in the node."""
    m = get_model("qwen3-235b-a22b")
    split, folded = Parallelism(8, tp=4, sp=True, ep=8), Parallelism(8, tp=4, sp=True, ep=8, etp=1)
    vs, vf = parallel.view(m, split), parallel.view(m, folded)
    assert (vs.ffn_hidden, vf.ffn_hidden) == (1536 // 4, 1536) and vf.expert_token_shards == 4
    assert vf.n_expert_params() == 4 * vs.n_expert_params() == vf.n_layers * 16 * 3 * 4096 * 1536
    up_s, up_f = _ops(vs, mb=1.0, seq=4096)["expert_up"], _ops(vf, mb=1.0, seq=4096)["expert_up"]
    assert float(up_f.m[0]) == float(up_s.m[0]) / 4 and up_f.n == 4 * up_s.n
    assert float(up_f.gemm_flops_fwd()[0]) == pytest.approx(float(up_s.gemm_flops_fwd()[0]))
    assert float(up_f.saved[0]) == pytest.approx(float(up_s.saved[0]) / 4)
    assert parallel.tp_comm_layers(vf, folded) == vf.n_layers / 2 and parallel.tp_comm_layers(vs, split) == vs.n_layers
    assert memory.expert_dp(vf, 8) == 4 and memory.expert_dp(vs, 8) == 1
    fab = Fabric(4, 8, 450e9, 10e-6, 50e9, 20e-6)
    assert parallel.ep_link(fab, folded)[2] == 0.0 and parallel.ep_link(fab, split)[2] > 0.5
    assert "EP 8 (expert TP 1)" in folded.describe()


def test_folding_lets_ep_exceed_dp_and_fits_the_published_layout() -> None:
    """Qwen3-235B-A22B on 256 H100 at TP 2, PP 8, EP 32 (data-parallel degree 16) is refused
    without folding and evaluated with it; at TP 4, EP 8 without recomputation it fits folded
    (the hidden-wide copies a quarter) and not split."""
    kw = dict(tokens="10B", micro_batch=1, global_batch=2048, seq_len=4096, stack="megatron-lm", sharding="zero1")
    with pytest.raises(UsageError, match="--etp 1"):
        simulate("qwen3-235b-a22b", "32x8xh100", tp=2, pp=8, vp=4, ep=32, **kw)
    assert simulate("qwen3-235b-a22b", "32x8xh100", tp=2, pp=8, vp=4, ep=32, etp=1, **kw).feasible
    lay = dict(tp=4, pp=8, vp=4, ep=8, checkpointing="none")
    folded = simulate("qwen3-235b-a22b", "32x8xh100", etp=1, **lay, **kw)
    split = simulate("qwen3-235b-a22b", "32x8xh100", **lay, **kw)
    assert folded.feasible and not split.feasible
    assert folded.memory_gib["activations"] < split.memory_gib["activations"] / 1.5
    assert folded.strategy["etp"] == 1 and "etp" not in split.strategy


def test_pinned_interleaving_up_to_a_layer_per_virtual_stage() -> None:
    """94 layers over PP 32 (stages of 3 and 2 layers): a pinned VP 3 (Megatron-LM's uneven
    layout, one layer per virtual stage of the busiest stage) is evaluated, VP 4 refused naming 3."""
    kw = dict(tokens="10B", micro_batch=1, global_batch=2048, seq_len=4096, stack="megatron-lm", tp=2, pp=32, ep=8, etp=1)
    assert simulate("qwen3-235b-a22b", "32x8xh100", vp=3, **kw).strategy["vp"] == 3
    with pytest.raises(UsageError, match=r"at most 3 virtual stages .* valid here: 1\.\.3"):
        simulate("qwen3-235b-a22b", "32x8xh100", vp=4, **kw)


@pytest.mark.parametrize("args,needle", [
    (["--model", "olmoe-1b-7b", "--tp", "4", "--etp", "2", "--stack", "megatron-lm"], "valid choices: 1, 4"),
    (["--model", "pythia-1b", "--etp", "1"], "not a mixture of experts"),
    (["--model", "olmoe-1b-7b", "--tp", "2", "--ep", "8", "--stack", "megatron-lm"], "--etp 1"),
    (["--model", "olmoe-1b-7b", "--tp", "2", "--etp", "1", "--no-sequence-parallel", "--stack", "megatron-lm"],
     "sequence parallelism"),
])
def test_bad_expert_tensor_parallelism_is_one_line_exit_2(args, needle, capsys) -> None:
    assert main(["--gpus", "8xh100", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_warm_searches_equal_cold_ones() -> None:
    """The per-process caches (simulator.core.memo) key every input: each search, run after the others
    filled them, gives the numbers it gives after they are emptied (expert-parallel degrees and a
    pinned micro-batch differ only in the knobs)."""
    from simulator.answer.api import run_search
    from simulator.core import memo
    from simulator.engine.estimate import _COLUMNS

    cases = [dict(ep=1), dict(ep=2), dict(ep=4, micro_batch=2), dict(ep=4), dict(tp=2, ep=4, etp=1), dict(tp=2, ep=4)]
    warm = [run_search("olmoe-1b-7b", "8xh100", stack="megatron-lm", **k).table for k in cases]
    for k, w in zip(cases, warm, strict=True):
        memo.clear()
        cold = run_search("olmoe-1b-7b", "8xh100", stack="megatron-lm", **k).table
        assert len(cold) == len(w)
        for c in _COLUMNS:
            assert np.array_equal(getattr(cold, c), getattr(w, c), equal_nan=True), (k, c)


# ---------------------------------------------------------------------- DeepSeek: latent attention, dense layers
#: A study-sized DeepSeek-V3 (query LoRA, group-limited routing, 2 dense layers, one MTP layer):
#: transformers 5.25 DeepseekV3ForCausalLM counts 3,390,336 parameters on the meta device.
SMALL_V3 = {"model_type": "deepseek_v3", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
            "moe_intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "n_shared_experts": 1, "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
            "first_k_dense_replace": 2, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16, "v_head_dim": 24, "num_nextn_predict_layers": 1}


def test_small_deepseek_v3_config_counts_exactly() -> None:
    """Attention by hand: q_a 256x96 + norm 96 + q_b 96x(4x48) + kv_a 256x(64+16) + norm 64 +
    kv_b 64x4x(32+24) + o 4x24x256; 2 dense layers of 512, 2 sparse of 16 experts of 64 (4 active)."""
    m = model_from_hf_config(SMALL_V3)
    assert m.attention_params_per_layer() == 256 * 96 + 96 + 96 * 192 + 256 * 80 + 64 + 64 * 224 + 96 * 256
    assert m.n_params() == 3_390_336
    assert m.n_params() - m.n_active_params() == 2 * 12 * 3 * 256 * 64
    assert m.n_expert_params() == 2 * 16 * 3 * 256 * 64


def test_deepseek_graph_owns_every_parameter_and_latent_gemms() -> None:
    m = get_model("deepseek-v2-lite")
    g = graphs.graph(m, 4096, np.array([1.0]), "bf16", "sdpa", True, "megatron-lm")
    moe, dense = g.blocks
    assert (moe.repeat, dense.name, dense.repeat) == (26, "dense_layer", 1)
    b = m.param_breakdown()
    owned = sum(blk.repeat * op.params for blk in g.blocks for op in blk.ops)
    assert owned + b["embedding"] + b["head"] + b["final_norm"] == m.n_params()
    ops = {op.name: op for op in moe.ops}
    assert (ops["q_proj"].n, ops["q_proj"].k) == (16 * 192, 2048)
    assert (ops["kv_a_proj"].n, ops["kv_b_proj"].k, ops["kv_b_proj"].n) == (512 + 64, 512, 16 * 256)
    assert (ops["attn_out"].k, ops["attn_out"].n) == (16 * 128, 2048)
    assert "qkv" not in ops and "mlp_up" not in {op.name for op in moe.ops}
    # scores at width 192, values at 128: 2 s^2 a (192 + 128) per sample, half of it causal
    assert float(ops["attention"].flops_fwd[0]) == pytest.approx(0.5 * 2 * 4096**2 * 16 * (192 + 128))
    d_ops = {op.name for op in dense.ops}
    assert {"mlp_up", "mlp_down", "q_proj", "kv_b_proj"} <= d_ops and "expert_up" not in d_ops


def test_deepseek_shard_views() -> None:
    """TP 2 halves the heads of q_proj, kv_b and o_proj (kv_a and the latent norm replicated) and
    each MLP's width; EP 8 divides the 26 sparse layers' experts; a pipeline stage that fits among
    the sparse layers holds no dense one."""
    m = get_model("deepseek-v2-lite")
    v = ShardView(m, Parallelism(8, tp=2))
    h = 2048
    attn = h * 8 * 192 + h * 576 + 512 + 512 * 8 * 256 + 8 * 128 * h
    moe = 64 * 3 * h * 704 + h * 64 + 3 * h * 1408
    layer = attn + moe + 2 * h
    assert v.n_params() == 26 * layer + (attn + 3 * h * 5472 + 2 * h) + 102400 * h + h
    e = ShardView(m, Parallelism(8, ep=8))
    assert e.n_expert_params() == m.n_expert_params() // 8 and e.first_dense_layers == 1
    assert ShardView(m, Parallelism(8, pp=2)).first_dense_layers == 0
    assert e.with_layers(1).first_dense_layers == 1 and e.with_layers(0).first_dense_layers == 0


def test_deepseek_cli_feasible_on_8xh100(capsys) -> None:
    """The default search (Hugging Face Trainer) finds a plan; the output names total and active."""
    assert main(["--gpus", "8xh100", "--model", "deepseek-v2-lite", "--tokens", "1B"]) == 0
    out = capsys.readouterr().out
    assert "15.71 B parameters (2.66 B active)" in out and "2.66 B of its 15.71 B parameters are active" in out


@pytest.mark.parametrize("field,value,needle", [
    ("attention_bias", True, "attention_bias"),
    ("moe_layer_freq", 2, "moe_layer_freq"),
    ("first_k_dense_replace", 4, "first_dense_layers"),
    ("qk_rope_head_dim", None, "qk_rope_head_dim"),
])
def test_bad_deepseek_configs_are_one_line(field, value, needle, tmp_path, capsys) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**SMALL_V3, field: value}))
    assert main(["--gpus", "8xh100", "--model", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_small_deepseek_invariants() -> None:
    """Never above peak; more layers never faster; sharding never costs memory."""
    m = model_from_hf_config(SMALL_V3)
    kw = dict(global_batch=64, steps=10, micro_batch=2, seq_len=512, precision="bf16", stack="megatron-lm")
    plan = simulate(m, "8xh100", **kw)
    assert plan.feasible and plan.mfu <= plan.hfu <= 1.0
    deeper = simulate(m.model_copy(update={"n_layers": 8}), "8xh100", **kw)
    assert deeper.step_time_s >= plan.step_time_s
    totals = [simulate(m, "8xh100", sharding=s, **kw).memory_gib["total"] for s in ("ddp", "zero1")]
    assert totals[0] >= totals[1]


# ---------------------------------------------------------------------- gpt-oss


def test_gpt_oss_parameters_by_hand() -> None:
    """gpt-oss-20b: Q/K/V/O with biases (64 query and 8 key-value heads of 64) and a sink per head;
    32 experts with gate/up biases (2 x 2880) and a down bias (2880); a biased router; two norms;
    untied 201088 x 2880 embedding and head; the final norm."""
    m = get_model("gpt-oss-20b")
    h, f, q, kv = 2880, 2880, 64 * 64, 8 * 64
    attn = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + 64
    expert = 3 * h * f + 2 * f + h
    assert m.attention_params_per_layer() == attn and m.expert_params() == expert
    assert m.router_params_per_layer() == (h + 1) * 32
    assert m.n_params() == 24 * (attn + (h + 1) * 32 + 32 * expert + 2 * h) + 2 * 201088 * h + h
    assert m.n_params() - m.n_active_params() == 24 * 28 * expert


def test_gpt_oss_config_reads_windows_biases_and_training_length() -> None:
    """Every other layer (the even ones, layer_types) windowed at 128 tokens; 64-wide heads on a
    2880-wide model; trained at YaRN's original 4096 tokens; MXFP4 quantization_config ignored."""
    m = model_from_hf_config(FIXTURES / "gpt-oss-120b.json")
    assert (m.sliding_window, m.n_window_layers, m.head_dim, m.default_seq_len) == (128, 18, 64, 4096)
    assert m.linear_bias and m.router_bias and m.attention_sinks and m.family_display == "gpt-oss"
    cfg = json.loads((FIXTURES / "gpt-oss-20b.json").read_text())
    for key in ("layer_types", "sliding_window", "attention_bias"):  # the config class's defaults
        del cfg[key]
    full = model_from_hf_config(FIXTURES / "gpt-oss-20b.json")
    assert model_from_hf_config(cfg).model_copy(update={"source": full.source}) == full
    with pytest.raises(UsageError, match="attention_bias") as exc:
        model_from_hf_config({**cfg, "attention_bias": False})
    assert "\n" not in str(exc.value)


def test_gpt_oss_windowed_layers_attend_to_128_keys() -> None:
    """Fused attention FLOPs: 12 full causal layers (s^2 / 2 scores) and 12 windowed ones
    (w s - w^2 / 2 scores per head), 4 q_dim FLOPs a score, forward."""
    m = get_model("gpt-oss-20b")
    s, w = 4096, 128
    att = _ops(m, mb=1.0, seq=s)["attention"]
    per_layer = 4.0 * m.q_dim * (12 * s * s / 2 + 12 * (w * s - w * w / 2)) / 24
    assert float(att.flops_fwd[0]) == pytest.approx(per_layer)
    assert float(att.flops_fwd[0]) < 0.6 * 4.0 * m.q_dim * s * s / 2  # half the layers nearly free


def test_gpt_oss_graph_owns_every_parameter_and_shards_biased_experts() -> None:
    """The layer's operations own its parameters (the experts their biases); EP 8 holds 4 of the
    32 biased experts."""
    m = get_model("gpt-oss-20b")
    ops = _ops(m, mb=1.0, seq=4096)
    assert ops["expert_up"].params == 32 * (2880 * 5760 + 5760) and ops["expert_down"].params == 32 * (2880 * 2880 + 2880)
    v = ShardView(m, Parallelism(8, ep=8))
    assert v.n_expert_params() == m.n_expert_params() // 8 == 24 * 4 * m.expert_params()


def test_gpt_oss_120b_needs_more_than_eight_h100() -> None:
    """116.8 B parameters x 16 B of mixed-precision Adam states are 217.6 GiB a GPU even sharded
    over 8: infeasible with that reason; four nodes fit with expert parallelism."""
    plan = simulate("gpt-oss-120b", "8xh100", stack="megatron-lm", tokens="1B")
    assert not plan.feasible and any("217.6 GiB per GPU even fully sharded" in r for r in plan.reasons)
    plan = simulate("gpt-oss-120b", "4x8xh100", stack="megatron-lm", tokens="1B")
    assert plan.feasible and plan.strategy["ep"] > 1


def test_contiguous_routing_reaches_the_fewest_gpus_and_nodes() -> None:
    """NeMo Automodel's fake balanced gate gives token i the experts (i k ... i k + k - 1) mod E:
    by hand, DeepSeek-V3's 8 of 256 on EP 64 (4 a GPU) lie on 2 GPUs and 1 of 8 nodes; runs that
    wrap (E 12, k 8, groups of 4) on 2 groups; uniform routing, C(E,k)-counted, reaches more."""
    assert parallel.groups_hit(256, 8, 64, "contiguous") == 2.0
    assert parallel.groups_hit(256, 8, 8, "contiguous") == 1.0 and parallel.groups_hit(128, 8, 8, "contiguous") == 1.0
    assert parallel.groups_hit(12, 8, 3, "contiguous") == 2.0
    assert parallel.groups_hit(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    kw = dict(stack="nemo-automodel", precision="bf16", sharding="fsdp-grad-op", tokens="10B", tp=1, pp=4, vp=8, ep=64,
              micro_batch=1, global_batch=512, seq_len=4096, checkpointing="full", capacity_factor=1.0,
              moe_dispatcher="deepep")
    uniform, contiguous = (simulate("deepseek-v3", "32x8xh100", moe_routing=r, **kw) for r in ("uniform", "contiguous"))
    assert contiguous.breakdown_s["ep_comm"] < uniform.breakdown_s["ep_comm"] / 3
    assert contiguous.breakdown_s["compute"] == uniform.breakdown_s["compute"]
    assert any("contiguous routing" in n for n in contiguous.notes)


@pytest.mark.parametrize("args,needle", [
    (["--model", "olmoe-1b-7b", "--moe-routing", "random"], "--moe-routing"),
    (["--model", "pythia-1b", "--moe-routing", "contiguous"], "not a mixture of experts"),
])
def test_bad_routing_is_one_line_exit_2(args, needle, capsys) -> None:
    assert main(["--gpus", "8xh100", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
