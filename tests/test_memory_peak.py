"""The memory peak of a step: gradients written during backward when a step has one micro-batch
(they coexist with the activations only where accumulation keeps them), and the allocated peak
beside what the caching allocator reserves (feasibility checks the larger)."""

import numpy as np
import pytest

from simulator.answer.api import simulate
from simulator.physics import memory
from simulator.strategy.stacks import get_stack

GIB = 1024**3
KW = dict(steps=1, optimizer="adamw", precision="bf16", attention="sdpa", compile=False,
          checkpointing="none", sharding="ddp", offload="none")


def test_gradients_at_peak_by_hand():
    """One micro-batch (fresh): max(0, grads + outside + rebuilt - activations - logits); else all."""
    g, a, out, lg, none = np.array([10.0]), np.array([6.0]), np.array([1.0]), np.array([2.0]), np.array([0.0])
    assert memory.gradients_at_peak(g, a, out, lg, none, np.array([True]))[0] == 10 + 1 - 6 - 2
    assert memory.gradients_at_peak(g, a, out, lg, np.array([1.5]), np.array([True]))[0] == 10 + 1 + 1.5 - 6 - 2
    assert memory.gradients_at_peak(g, np.array([20.0]), out, lg, none, np.array([True]))[0] == 0
    assert memory.gradients_at_peak(g, a, out, lg, none, np.array([False]))[0] == 10


def test_logits_and_the_rebuilt_block_alternate():
    """The loss's buffers are gone before backward rebuilds a checkpointed block: the peak holds
    the larger of the two, and all the logits where nothing is rebuilt."""
    lg = np.array([9.0, 9.0, 3.0])
    rebuilt = np.array([0.0, 4.0, 4.0])
    assert list(memory.logits_at_peak(lg, rebuilt)) == [9.0, 5.0, 0.0]
    assert list(rebuilt + memory.logits_at_peak(lg, rebuilt)) == [9.0, 9.0, 4.0]


def test_autocast_weight_copies_by_hand():
    """fp32 weights under autocast: 2 bytes a parameter saved for backward, except in checkpointed
    blocks, whose copies exist one block at a time while it is rebuilt; none for half weights."""
    P, PL = 1000.0, 100.0
    assert memory.autocast_weight_copies(P, np.array(True), np.array(0.0), PL) == 2 * P
    assert memory.autocast_weight_copies(P, np.array(True), np.array(8 * PL), PL) == 2 * (P - 8 * PL + PL)
    assert memory.autocast_weight_copies(P, np.array(False), np.array(8 * PL), PL) == 0


@pytest.mark.parametrize("model, seq, mb", [("pythia-410m", 2048, 8), ("qwen2.5-0.5b", 2048, 8)])
def test_full_checkpointing_peak_by_hand(model, seq, mb):
    """Hugging Face, bf16, full checkpointing, one micro-batch on one GPU: the allocated peak is
    the states, buffers and the larger of (layer inputs + outside + logits) at the loss and
    (gradients + outside + one rebuilt layer) at the end of backward, plus one layer's weight
    copies and the head's (copies outside the layers are all kept)."""
    from simulator.engine.estimate import _layer_params
    from simulator.model.presets import get_model

    kw = dict(KW, checkpointing="full")
    m = simulate(model, "1xh200", seq_len=seq, global_batch=mb, micro_batch=mb, stack="hf-trainer", **kw).memory_gib
    spec = get_model(model)
    one = np.array([float(mb)])
    held, rebuilt = memory.activation_terms(spec, seq, one, "bf16", "sdpa", "full", False, "hf-trainer")
    outside = memory.outside_activations(spec, seq, one, "bf16", "sdpa", False, "hf-trainer")
    logits = memory.logits_bytes(spec, seq, one, "bf16", False, "hf-trainer")
    P, PL = float(spec.n_params()), _layer_params(spec)
    states = (4 + 8) * P + 2 * (P - spec.n_layers * PL + PL)  # fp32 weights, AdamW moments, half copies
    peak = states + max(held[0] + max(rebuilt[0], logits[0]), 4 * P + outside[0] + rebuilt[0])
    assert m["allocated"] * GIB == pytest.approx(peak, rel=1e-9)


@pytest.mark.parametrize("model, seq, mb", [("pythia-1b", 2048, 8), ("pythia-1b", 2048, 1), ("gpt2-xl", 1024, 4),
                                           ("pythia-2.8b", 256, 1)])
def test_single_micro_batch_step_holds_gradients_only_beyond_its_activations(model, seq, mb):
    """A DDP step of one micro-batch peaks either at the start of backward (activations and loss
    buffers, no gradient yet: zero_grad(set_to_none=True)) or at its end (every gradient); with
    accumulation the gradients of the earlier micro-batches are there all along."""
    one = simulate(model, "1xh200", seq_len=seq, global_batch=mb, micro_batch=mb, **KW).memory_gib
    two = simulate(model, "1xh200", seq_len=seq, global_batch=2 * mb, micro_batch=mb, **KW).memory_gib
    full = two["gradients"]
    assert one["activations"] == two["activations"] and one["logits"] == two["logits"]
    assert one["gradients"] == pytest.approx(max(0.0, full - one["activations"] - one["logits"]), abs=0.01 * full)
    assert one["total"] <= two["total"]
    # never below either end of backward
    states = one["weights"] + one["optimizer"] + one["other"]
    assert one["total"] >= states + one["activations"] + one["logits"]
    assert one["total"] >= states + full


def test_allocated_peak_and_reserve():
    """'allocated' is the peak of live tensors (torch.cuda.max_memory_allocated); 'total' adds the
    stack's caching-allocator reserve (shares of activations and logits) and is what must fit."""
    m = simulate("pythia-1b", "1xh200", seq_len=2048, global_batch=16, micro_batch=8, **KW).memory_gib
    stack = get_stack("hf-trainer")
    assert m["total"] - m["allocated"] == pytest.approx(stack.fragmentation * m["activations"]
                                                        + stack.loss_fragmentation * m["logits"])
    assert m["allocated"] < m["total"] <= m["capacity"]
