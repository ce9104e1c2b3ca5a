"""Mixtures of experts (simulator/families/moe.py): exact parameter counts from config.json and
presets, the MoE layer's operations, expert parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator import opcost
from simulator.errors import UsageError
from simulator.hf_config import model_from_hf_config
from simulator.models import get_model

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
}
PRESETS = {"mixtral-8x7b": "Mixtral-8x7B-v0.1", "olmoe-1b-7b": "OLMoE-1B-7B-0924", "qwen3-30b-a3b": "Qwen3-30B-A3B-Base"}


@pytest.mark.parametrize("fixture", sorted(EXACT))
def test_exact_total_and_active_from_config(fixture: str) -> None:
    m = model_from_hf_config(FIXTURES / f"{fixture}.json")
    assert (m.n_params(), m.n_active_params()) == EXACT[fixture]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_count_exactly(preset: str) -> None:
    m = get_model(preset)
    assert (m.n_params(), m.n_active_params()) == EXACT[PRESETS[preset]]
    assert m.hf_id and "config.json" in m.source


def test_active_parameters_by_hand() -> None:
    """Mixtral: 2 of 8 experts (3 x 4096 x 14336 each) per layer are active."""
    m = get_model("mixtral-8x7b")
    assert m.n_params() - m.n_active_params() == 32 * 6 * 3 * 4096 * 14336


def test_graph_parameters_add_up_and_flops_follow_active_parameters() -> None:
    for name in PRESETS:
        m = get_model(name)
        g = opcost.graph(m, 4096, np.array([1.0]), "bf16", "sdpa", True, "megatron-lm")
        layer = sum(op.params for op in g.blocks[0].ops)
        assert layer == m.param_breakdown()["layer_per_layer"]
        # 3 x forward FLOPs per token: 6 N_active (less the embedding lookup) + attention
        six_n = 6.0 * (m.n_active_params() - m.vocab_size * m.hidden)
        assert six_n < opcost.model_flops_per_token(m, 4096) < 1.3 * six_n
        assert opcost.palm_flops_per_token(m, 4096) < 6.0 * m.n_params() / 2


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
