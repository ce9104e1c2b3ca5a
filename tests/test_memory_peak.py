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
    """One micro-batch (fresh): max(0, grads + outside - activations - logits); else all."""
    g, a, out, lg = np.array([10.0]), np.array([6.0]), np.array([1.0]), np.array([2.0])
    assert memory.gradients_at_peak(g, a, out, lg, np.array([True]))[0] == 10 + 1 - 6 - 2
    assert memory.gradients_at_peak(g, np.array([20.0]), out, lg, np.array([True]))[0] == 0
    assert memory.gradients_at_peak(g, a, out, lg, np.array([False]))[0] == 10


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
    stack's caching-allocator reserve and is what must fit."""
    m = simulate("pythia-1b", "1xh200", seq_len=2048, global_batch=16, micro_batch=8, **KW).memory_gib
    frag = get_stack("hf-trainer").fragmentation
    assert m["total"] - m["allocated"] == pytest.approx(frag * m["activations"])
    assert m["allocated"] < m["total"] <= m["capacity"]
