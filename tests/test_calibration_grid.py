"""The GEMM and attention grids: a GPU's quick grid reaches the shapes training runs (so e_max is
measured, not extrapolated); a CPU's grid is what it was (committed CPU profiles were fitted on it)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from calibration.benches import attention as A  # noqa: E402
from calibration.benches import gemm as G  # noqa: E402
from simulator.model.presets import get_model  # noqa: E402


def test_cpu_quick_grid_is_unchanged():
    """The 28 quick shapes the committed CPU profiles were measured on (before the GPU layer shapes)."""
    assert G.shapes("quick") == G.shapes("quick", kind="cpu")
    assert len(G.shapes("quick")) == 28 and max(m * n * k for m, n, k in G.shapes("quick")) == 2048**3
    assert G.model_shapes(get_model("pythia-1b"), 4e9) == G.model_shapes(get_model("pythia-1b"), 4e9, 512)


def test_gpu_quick_grid_reaches_layer_shapes():
    cuda = G.shapes("quick", kind="cuda")
    assert set(G.shapes("quick")) < set(cuda)
    assert (8192, 8192, 8192) in cuda
    for h in (768, 4096):  # qkv, MLP up and down at 16k tokens
        assert {(16384, 3 * h, h), (16384, 4 * h, h), (16384, h, 4 * h)} <= set(cuda)
    assert any(n >= 50000 for _, n, _ in cuda)  # an LM head


def test_gpu_for_model_measures_the_models_shapes_at_training_tokens():
    m = get_model("pythia-1b")
    cuda = set(G.shapes("quick", m, 4e12, "cuda"))
    assert (16384, 4 * m.hidden, m.hidden) in cuda
    assert all(t <= 512 for t, _, _ in G.model_shapes(m, 4e9))  # the CPU's stay small


def test_gpu_quick_attention_reaches_head_128_and_sequence_8192():
    assert (2, 16, 8192, 128) in A.CUDA_QUICK and (2, 16, 8192, 64) in A.CUDA_QUICK
    assert A.POINTS["quick"][-1][2] <= 2048  # the CPU's quick points unchanged
