"""What a compiled Hugging Face layer saves (simulator/model/hf_compiled.py), by hand on the tiny
blocks of tests/test_hf_eager.py. The rules themselves are held to Inductor's partitioner on real
models in tests/test_hf_memory.py::test_compiled_saved_set."""

from __future__ import annotations

from simulator.model import hf_compiled
from tests.test_hf_eager import GPT2, LLAMA, S


def test_llama_block_by_hand():
    """Llama (h 64, q 64, kv 32, SwiGLU f 160, 4 heads), bf16 under autocast (e = 2), SDPA:

    * the fp32 stream both RMSNorms read and their rstd: 2 x (4h + 4) = 520
    * each norm's half output: 2 x 2h = 256
    * rotated Q, K and V at the query heads' width (repeat_kv): 3 x 2q = 384
    * SDPA's output and log-sum-exp: 2q + 4 x 4 = 144; o_proj's input: 2q = 128
    * gate and up outputs and their product: 3 x 2f = 960
    Total 2392."""
    assert hf_compiled.layer_saved_bytes_per_token(LLAMA, S, "bf16", "sdpa") == (2392, 0)


def test_gpt2_block_by_hand():
    """GPT-2 (h 64, 4 heads, gelu_new f 256, dropout 0.1), bf16, SDPA:

    * the fp32 stream and each LayerNorm's rstd (its mean is recomputed): 2 x (4h + 4) = 520; their half
      outputs 2 x 2h = 256
    * c_attn's output whole (Q is a view of it): 2 x 3h = 384, the KV cache's K and V copies 2 x 2h = 256
    * SDPA's output and log-sum-exp: 2h + 16 = 144; c_proj's input: 2h = 128
    * gelu_new: c_fc's output and gelu's output, 2 x 2f = 1024 (its fp32 tanh is recomputed)
    * two residual dropout masks: 2h = 128
    Total 2840."""
    assert hf_compiled.layer_saved_bytes_per_token(GPT2, S, "bf16", "sdpa") == (2840, 0)


def test_an_encoder_returns_no_cache_to_take_gradients_for():
    """Only decoders return a KV cache (2 e kv of zero-filled gradients a token and layer, compiled):
    a ViT-style encoder's compiled layer holds none."""
    encoder = LLAMA.model_copy(update={"kind": "encoder"})
    assert hf_compiled.cache_tangent_bytes_per_token(LLAMA, "bf16") == 2 * 2 * 32
    assert hf_compiled.cache_tangent_bytes_per_token(LLAMA, "fp32") == 2 * 4 * 32
    assert hf_compiled.cache_tangent_bytes_per_token(encoder, "bf16") == 0


def test_eager_attention_keeps_the_probabilities():
    """Eager attention under compile: Q, K, V as the matmuls read them (3 x 2q, as with SDPA's rotated
    ones, in place of SDPA's output and log-sum-exp) and the s x s probabilities as the eager count
    has them (fp32 softmax + its half copy: 6 bytes a score, 4 heads x S)."""
    sdpa, _ = hf_compiled.layer_saved_bytes_per_token(LLAMA, S, "bf16", "sdpa")
    eager, core = hf_compiled.layer_saved_bytes_per_token(LLAMA, S, "bf16", "eager")
    assert core == 4 * S * 6
    assert eager == sdpa - (2 * 64 + 16) + core


def test_the_causal_mask_is_saved_by_compiled_sdpa_only():
    """A compiled decoder's SDPA reads the 4-D mask (e bytes a score, traced); eager attention adds it
    to the scores and saves none of it."""
    sdpa = hf_compiled.outside_saved_bytes_per_token(LLAMA, S, "bf16", "sdpa")
    eager = hf_compiled.outside_saved_bytes_per_token(LLAMA, S, "bf16", "eager")
    assert sdpa - eager == 2 * S


def test_the_returned_outputs_gradients_are_held_only_where_the_model_returns_them():
    """A compiled hf-trainer step holds the zero-filled gradients of the KV cache (2 e kv a token and
    layer) and of the logits (e a logit) beside what it saves; the same modules in a loop whose model
    returns only the loss (calibration/torch_model.py, validate's) hold neither."""
    import numpy as np

    from simulator.physics import memory
    from simulator.strategy.stacks import get_stack

    hf = get_stack("hf-trainer")
    loss_only = hf.model_copy(update={"returns_outputs": False})
    mb = np.array([2.0])
    held, _ = memory.activation_terms(LLAMA, S, mb, "bf16", "sdpa", "none", True, hf)
    held_0, _ = memory.activation_terms(LLAMA, S, mb, "bf16", "sdpa", "none", True, loss_only)
    assert float((held - held_0)[0]) == LLAMA.n_layers * 2 * S * hf_compiled.cache_tangent_bytes_per_token(LLAMA, "bf16")
    logits = memory.logits_bytes(LLAMA, S, mb, "bf16", True, hf) - memory.logits_bytes(LLAMA, S, mb, "bf16", True, loss_only)
    assert float(logits[0]) == 2 * S * LLAMA.vocab_size * 2
    eager, _ = memory.activation_terms(LLAMA, S, mb, "bf16", "sdpa", "none", False, hf)
    eager_0, _ = memory.activation_terms(LLAMA, S, mb, "bf16", "sdpa", "none", False, loss_only)
    assert float(eager[0]) == float(eager_0[0])
