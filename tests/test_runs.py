"""The published-runs loader: normalized rows, metric conversion, exclusion reasons; the shared
attention-efficiency contract."""

import numpy as np
import pandas as pd
import pytest

from simulator.answer import runs
from simulator.core.errors import UsageError
from simulator.physics import kernels


def test_dev_rows_reproduce_llm_foundry_parameter_counts():
    dev = runs.load_runs(runs.DEV_FILE)
    raw = pd.read_csv(runs.DEV_FILE)
    assert len(dev) == len(raw) == 52 and (dev["excluded"] == "").all()
    assert [s.n_params() for s in dev["spec"]] == list(raw["num_params"])
    assert set(dev["gpu"]) == {"h100-sxm"}
    assert (dev["measured_tok_s"] == raw["throughput_tok_s"]).all()


def test_more_rows_are_normalized_and_excluded_with_reasons():
    more = runs.load_runs(runs.MORE_FILE)
    ok = runs.simulable(more)
    assert len(ok) >= 10 and ok["micro_batch"].notna().all() and (ok["measured_tok_s"] > 0).all()
    assert {"a100-80gb-sxm", "a100-40gb-sxm", "h100-sxm"} <= set(ok["gpu"])
    reasons = " | ".join(more["excluded"])
    for why in ("no stated micro-batch", "GPU type", "duplicate"):
        assert why in reasons
    assert "tensor/pipeline" not in reasons  # simulator.physics.parallel models them
    # hours per 1B tokens converts to the same run's tokens/s within the rounding of the table
    fa = more[more["model"] == "GPT3-125M"]
    tok = fa.set_index("metric")["measured_tok_s"]
    assert tok["hours_per_1B_tokens"] == pytest.approx(tok["throughput_tokens_per_s"], rel=0.02)
    # llm.c step time: 524288 tokens in 0.3 s
    llmc = ok[ok["model"] == "GPT-2 124M (d12)"].iloc[0]
    assert llmc["measured_tok_s"] == pytest.approx(524288 / 0.3)
    assert llmc["grad_accum"] == 1 and llmc["sharding"] == "zero1"


def test_user_format_and_bad_files(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("model,gpus,seq_len,global_batch,micro_batch,precision,sharding,checkpointing,compile,"
                 "attention,tokens_per_s,source\n"
                 "pythia-1b,8xa100,2048,256,8,bf16,fsdp-full,none,false,sdpa,150000,my logs\n")
    r = runs.load_runs(f).iloc[0]
    assert r["gpu"].startswith("a100") and r["excluded"] == ""
    assert r["grad_accum"] == 4
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="lacks column"):
        runs.load_runs(bad)
    with pytest.raises(UsageError, match="no such file"):
        runs.load_runs(tmp_path / "missing.csv")


def test_attention_efficiency_contract():
    assert kernels.attention_efficiency(0.5, 64, 2048) == pytest.approx(0.5)  # defaults: constant
    e = kernels.attention_efficiency(0.7, np.array([64, 128]), 2048, d_half=32.0, s_half=512.0)
    assert e[0] < e[1] < 0.7
    assert kernels.attention_efficiency(0.7, 128, 512, 32.0, 512.0) < kernels.attention_efficiency(
        0.7, 128, 8192, 32.0, 512.0)
