"""The evaluation's named steps, its typed table, the optimizer step's time and Strategy's layout."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from simulator.answer.api import run_search
from simulator.engine.estimate import Table
from simulator.model.presets import get_model
from simulator.physics import optimizer_time, parallel
from simulator.physics.communication import Fabric
from simulator.strategy.knobs import Strategy
from simulator.strategy.layout import Parallelism

KNOBS = dict(precision="bf16", attention="sdpa", compile=True, checkpointing="none", sharding="zero1",
             offload="none", micro_batch=4, grad_accum=8)


@pytest.fixture(scope="module")
def table() -> Table:
    return run_search("pythia-160m", "8x3090", steps=10).table


def test_every_column_is_one_array_per_strategy(table):
    cols = [f.name for f in dataclasses.fields(Table)][4:]
    assert {"step_time", "mem_total", "feasible", "rank_key", "dp", "tp", "pp", "vp", "sp", "bubble"} <= set(cols)
    for c in cols:
        x = getattr(table, c)
        assert isinstance(x, np.ndarray) and x.shape == (len(table),), c
    assert not np.isnan(table.step_time).any()


def test_table_parts_add_up(table):
    t = table
    assert np.allclose(t.step_time, t.compute + t.exposed_comm + t.optimizer + t.offload_time
                       + t.bubble + t.tp_comm + t.pp_comm)
    parts = t.mem_weights + t.mem_gradients + t.mem_optimizer + t.mem_activations + t.mem_logits + t.mem_other
    assert np.allclose(t.mem_total, parts)
    assert np.array_equal(t.feasible, t.valid & t.fits & t.host_ok)
    assert np.array_equal(np.isfinite(t.rank_key), t.feasible)
    assert (t.dp * t.tp * t.pp == 8).all()


def test_concat_and_with_columns_keep_rows(table):
    both = Table.concat([table, table], table.problem, table.packs, table.shardings, table.offloads)
    assert len(both) == 2 * len(table) and both.strategy(len(table)) == table.strategy(0)
    slower = table.with_columns(step_time=table.step_time * 2)
    assert np.array_equal(slower.step_time, 2 * table.step_time) and slower.mem_total is table.mem_total


def test_strategy_keeps_its_layout_and_flat_json(table):
    i = int(np.nonzero(table.feasible)[0][0])
    st = table.strategy(i)
    assert st.parallelism == table.parallelism(i) and st.dp == int(table.dp[i])
    d = json.loads(st.model_dump_json())
    assert "parallelism" not in d and {k: d[k] for k in ("dp", "tp", "pp", "vp", "sequence_parallel")} == {
        "dp": st.dp, "tp": st.tp, "pp": st.pp, "vp": st.vp, "sequence_parallel": st.sequence_parallel}
    assert Strategy(**d) == st


def test_strategy_layout_flat_or_nested():
    flat = Strategy(**KNOBS, dp=2, tp=2, pp=2, sequence_parallel=True)
    nested = Strategy(**KNOBS, parallelism=Parallelism(2, 2, 2, 1, True))
    assert flat == nested and flat.describe().startswith("TP 2 + sequence parallel · PP 2")
    plain = Strategy(**KNOBS)
    assert plain.parallelism is None and plain.dp is None and (plain.tp, plain.pp, plain.vp) == (1, 1, 1)
    assert plain.model_dump()["dp"] is None
    with pytest.raises(ValueError, match="data-parallel degree"):
        Strategy(**KNOBS, tp=2)
    with pytest.raises(ValueError, match="not both"):
        Strategy(**KNOBS, dp=2, parallelism=Parallelism(2))


def test_optimizer_bytes_per_param_by_hand():
    # AdamW, bf16 under ZeRO (half gradients, fp32 master): master 4 + grad 2 + moments 8 x 2 + write 4
    # + half copy 2 + clipping 3 x 2 = 34 bytes; SGD in fp32 (DDP): 4 + 4 + 4 x 2 + 4 + 0 + 12 = 32
    assert float(optimizer_time.bytes_per_param("adamw", 2, 2.0)) == 34
    assert float(optimizer_time.bytes_per_param("sgd", 4, 0.0)) == 32


def test_optimizer_time_grows_with_work():
    kw = dict(mem_bw=1e12, bw_eff=0.8, fresh_s=0.0, loop_s=None, n_layers=24, launch_overhead_us=5.0)
    small = optimizer_time.gpu_step_time(1e8, 1.0, 34.0, **kw)
    assert optimizer_time.gpu_step_time(2e8, 1.0, 34.0, **kw) > small > 1e8 * 34 / 1e12
    off = optimizer_time.offload_step_time(np.array([1e8, 2e8]), 2.0, 2.0, 1e9, 25e9)
    assert off[1] > off[0] > 0.1
    stream = optimizer_time.offload_stream_time(1e9, 2.0, 2.0, 8, 25e9)
    hidden = optimizer_time.offload_time(0.0, stream, 10.0, 10.0, 4, 24)  # compute hides all but one layer
    exposed = optimizer_time.offload_time(0.0, stream, 0.0, 0.0, 4, 24)
    assert hidden == pytest.approx(4 * stream / 24) and exposed == pytest.approx(4 * stream)


def test_fabric_bus_bandwidth_is_the_links_times_the_sustained_fraction():
    f = Fabric(2, 8, 100e9, 1e-5, 50e9, 1e-5, busbw_eff=0.8)
    assert f.intra_busbw == pytest.approx(80e9) and f.inter_busbw == pytest.approx(40e9)


def test_shard_view_widths_are_the_gpus_share_of_the_heads():
    spec = get_model("llama-2-70b")  # 64 query heads, 8 KV heads
    v = parallel.view(spec, Parallelism(1, 8, 1))
    assert v.q_dim == spec.q_dim // 8 and v.kv_dim == spec.head_dim  # one KV head per GPU
    v16 = parallel.ShardView(spec, Parallelism(1, 16, 1))
    assert v16.kv_dim == spec.head_dim  # KV heads replicated when tp exceeds them


def test_a_layout_splits_the_batch_and_states_over_its_data_parallel_ranks():
    # 3 nodes x 8: dp 12 x pp 2 puts a data-parallel group on 1.5 nodes (its links round up to 2
    # nodes of 8); the batch and the ZeRO-1 shards are still split 12 ways, not 16
    res = run_search("llama-2-13b", "3x8xa100", tp=1, pp=2, vp=1, sharding="zero1", global_batch=128)
    t, i = res.table, int(res.order[0])
    assert int(t.dp[i]) == 12 and int(t.micro_batch[i] * t.grad_accum[i]) >= math.ceil(128 / 12)
    view = parallel.view(get_model("llama-2-13b"), Parallelism(12, 1, 2))
    assert t.mem_optimizer[i] == pytest.approx(view.n_params() * 12 / 12)  # bf16 AdamW: 12 B/param over 12 ranks
