"""Published end-to-end training runs as one normalized table (loader; no physics).

Three CSV layouts are read into the same columns (:data:`COLUMNS`):

- ``validation_dev.csv``: the MosaicML llm-foundry H100 table, one row per run
  (``throughput_tok_s`` column);
- ``published_runs_more.csv``: one row per (run, metric) from several projects, with the
  source and the reading in ``notes`` (``metric``/``value_num``/``unit`` columns);
- the ``calibrate --from-runs`` format documented in docs/calibrate_from_runs.md (a
  ``tokens_per_s`` column and a ``gpus`` cluster string).

Every row gets a ModelSpec (built from its dimensions and the architecture it names), a catalog
GPU id, its exact strategy, the measured tokens/s of the whole job and ``excluded``: empty when the
row can be simulated, else the reason (no stated micro-batch, unknown GPU, no number, a
duplicate metric of a run already listed, ...); tensor and pipeline parallelism are simulated.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

import pandas as pd

from ..core.errors import UsageError
from ..core.userfiles import read_text
from ..hardware.catalog import cluster_text, parse_cluster
from ..model.presets import get_model, model_from_dict
from ..model.resolve import resolve_model
from ..model.spec import ModelSpec
from ..strategy.stacks import default_stack, for_published

DATA = Path(__file__).resolve().parents[1] / "data"
DEV_FILE = DATA / "validation_dev.csv"
MORE_FILE = DATA / "published_runs_more.csv"
KORTHIKANTI_FILE = DATA / "korthikanti2022.csv"
#: Megatron-LM GPT on Selene, DGX A100 80 GB nodes (Korthikanti et al. 2022, Table 3)
KORTHIKANTI_GPU = "a100-80gb-sxm"
KORTHIKANTI_SOURCE = "NVIDIA/Megatron-LM (Korthikanti et al. 2022, Table 5)"

COLUMNS = ("run", "source", "stack", "model", "spec", "seq_len", "gpu", "gpus", "n_gpus", "nodes",
           "gpus_per_node", "precision", "sharding", "tp", "pp", "sequence_parallel", "checkpointing", "compile",
           "attention", "micro_batch", "grad_accum", "global_batch", "measured_tok_s", "metric", "excluded", "note")

#: catalog GPU id for the spellings found in published tables (case-insensitive regex, first match)
_GPU_PATTERNS = (
    (r"h100_80gb|h100[- ]sxm|h100 80gb sxm", "h100-sxm"),
    (r"h100[- ]pcie", "h100-pcie"),
    (r"h200", "h200"),
    (r"a100_40gb|a100[- ](sxm4?-)?40gb", "a100-40gb-sxm"),
    (r"a100[- ]pcie[- ]80gb|a100[- ]80gb[- ]pcie", "a100-80gb-pcie"),
    (r"a100_80gb|a100[- ](sxm4?-)?80gb", "a100-80gb-sxm"),
)
_SHARD_DEV = {"FULL_SHARD": "fsdp-full", "SHARD_GRAD_OP": "fsdp-grad-op", "NO_SHARD": "ddp"}
_METRIC_PRIORITY = ("throughput_tokens_per_s", "step_time", "step_time_ms", "hours_per_1B_tokens")


def _int(text) -> int | None:
    """Leading integer of a cell ('8 (implied ...)' -> 8); None if empty or not a number."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    m = re.match(r"\s*~?(\d+(?:\.\d+)?)", str(text))
    return int(float(m.group(1))) if m else None


def measured_tok_s(value, where: str, column: str) -> float:
    """A measured throughput cell as tokens/s: a finite positive number, else a UsageError naming
    the row and the value (an empty cell, ``nan``, ``inf`` or ``-5`` is no measurement)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        shown = "nothing (an empty cell or nan)" if value is None or (isinstance(value, float) and math.isnan(value)) else repr(value)
        raise UsageError(f"{where}: {column} must be the measured tokens/s of the whole job, a positive "
                         f"finite number; got {shown}")
    return v


def gpu_id(text) -> str | None:
    """Catalog GPU id of a published GPU description; None if the GPU (or its memory) is not stated."""
    s = str(text).strip().lower()
    for pat, gid in _GPU_PATTERNS:
        if re.search(pat, s):
            return gid
    return None


def _sharding(text) -> str | None:
    s = str(text)
    if s in _SHARD_DEV:
        return _SHARD_DEV[s]
    low = s.lower()
    if "apex-distributed" in low:  # apex DistributedFusedAdam: reduce-scatter grads, shard states
        return "zero2"
    if "zero-0" in low:
        return "ddp"
    for stage in ("3", "2", "1"):
        if f"zero-{stage}" in low or f"zero{stage}" in low:
            return f"zero{stage}"
    if "adamw-zero" in low or "zeroredundancy" in low:
        return "zero1"
    if low.startswith("ddp") or "data parallel" in low:
        return "ddp"
    if low in ("", "nan"):
        return "ddp"
    return None


def _precision(text) -> str:
    low = str(text).lower()
    for p in ("fp8", "bf16", "fp16", "fp32"):  # fp8 first: FP8 runs keep bf16 master weights
        if p in low:
            return p
    return "bf16"  # not stated: A100/H100 training runs in bf16 (labelled in the row's note)


def _global_batch(text, seq_len: int) -> int | None:
    """Sequences per optimizer step from '256 seqs x 2048', '524288 tokens (512 x 1024)'."""
    s = str(text)
    m = re.search(r"(\d+)\s*seqs", s)
    if m:
        return int(m.group(1))
    m = re.match(r"\s*(\d+)\s*tokens", s)
    if m:
        return int(m.group(1)) // seq_len
    return None


def _arch(name: str, row, seq_len: int) -> ModelSpec | None:
    """A ModelSpec from a row's dimensions and the architecture its model name implies."""
    L, d, h = _int(row.get("n_layers")), _int(row.get("d_model")), _int(row.get("n_heads"))
    if None in (L, d, h):
        return None
    ffn = _int(row.get("ffn")) or 4 * d
    vocab_txt = str(row.get("vocab", ""))
    padded = re.search(r"padded to (?:mult\. of \d+ = )?(\d+)", vocab_txt)
    vocab = int(padded.group(1)) if padded else (_int(vocab_txt) or 50257)
    low = name.lower()
    if "llama" in low:
        base = dict(family="llama", gated_mlp=True, tied_embeddings="(tied)" in vocab_txt,
                    pos_embedding="rotary", norm="rmsnorm", linear_bias=False, norm_bias=False)
    else:  # GPT-2 / GPT-3 style (flash-attention, llm.c, nanoGPT): learned positions, biases, tied
        base = dict(family="gpt2", tied_embeddings=True, pos_embedding="learned", norm="layernorm",
                    linear_bias=True, norm_bias=True)
    return model_from_dict(dict(base, name=name, kind="decoder", head="lm", n_layers=L, hidden=d, n_heads=h,
                                ffn_hidden=ffn, vocab_size=vocab, max_positions=seq_len,
                                default_seq_len=seq_len, source=str(row.get("source", ""))))


def _row(**kw) -> dict:
    out = dict.fromkeys(COLUMNS)
    out.update(excluded="", note="", tp=1, pp=1, sequence_parallel=False)
    out.update(kw)
    return out


def _finish(r: dict) -> dict:
    """Derived fields: cluster string, accumulation; exclusion for what cannot be simulated."""
    reasons = [r["excluded"]] if r["excluded"] else []
    if r["gpu"] is None:
        reasons.append("GPU type (or its memory size) not stated")
    if r["spec"] is None:
        reasons.append("model dimensions not stated")
    if r["micro_batch"] is None:
        reasons.append("no stated micro-batch")
    if r["measured_tok_s"] is None or not (r["measured_tok_s"] > 0):
        reasons.append("no measured throughput in the row")
    if r["n_gpus"] is None or r["global_batch"] is None or r["sharding"] is None:
        reasons.append("GPU count, global batch or sharding not stated")
    r["excluded"] = "; ".join(dict.fromkeys(reasons))
    n, nodes = r["n_gpus"], r["nodes"] or 1
    if n:
        r["nodes"] = nodes
        r["gpus_per_node"] = r["gpus_per_node"] or n // nodes
        if r["gpu"]:
            r["gpus"] = cluster_text(nodes, r["gpus_per_node"] if nodes > 1 else n, r["gpu"])
    if n and r["micro_batch"] and r["global_batch"]:
        dp = n // ((r["tp"] or 1) * (r["pp"] or 1))
        r["grad_accum"] = math.ceil(r["global_batch"] / max(1, dp) / r["micro_batch"])
    return r


def _from_dev(df: pd.DataFrame, origin: str) -> list[dict]:
    out = []
    for i, row in df.iterrows():
        try:
            out.append(_dev_row(i, row, origin))
        except (TypeError, ValueError) as exc:  # an empty or non-numeric required cell
            if isinstance(exc, UsageError):
                raise
            raise UsageError(f"{origin} line {i + 2}: a required cell is empty or not a number "
                             f"({exc})") from None
    return out


def _dev_row(i: int, row: pd.Series, origin: str) -> dict:
    """One row of the llm-foundry layout (``validation_dev.csv``)."""
    seq = int(row["seq_len"])
    try:
        spec = get_model(f"mpt-{row['model']}").with_max_positions(seq)
    except UsageError:
        spec = _arch(f"mpt-{row['model']}", row, seq) if "d_model" in row else None
    ckpt = str(row["act_ckpt"]).strip().lower() in ("true", "1", "yes")
    return _finish(_row(
        run=f"{origin}:{i + 2}", source=str(row.get("source", origin)), stack="llm-foundry",
        model=f"mpt-{row['model']}", spec=spec, seq_len=seq, gpu=gpu_id(row["gpu"]),
        n_gpus=int(row["n_gpus"]), nodes=int(row["n_nodes"]), gpus_per_node=int(row["gpus_per_node"]),
        precision=_precision(row["precision"]), sharding=_sharding(row["sharding"]),
        checkpointing="full" if ckpt else "none", compile=False, attention="sdpa",
        micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]),
        measured_tok_s=measured_tok_s(row["throughput_tok_s"], f"{origin} line {i + 2}", "throughput_tok_s"),
        metric="throughput_tok_s"))


def _stack(source: str) -> str:
    low = source.lower()
    for key, name in (("llm-foundry", "llm-foundry"), ("llm.c", "llm.c"), ("nanogpt", "nanogpt"),
                      ("flash-attention", "flash-attention"), ("flashattention", "flash-attention"),
                      ("megatron", "megatron-lm"), ("nanotron", "nanotron")):
        if key in low:
            return name
    return "unknown"


def _tok_s(row, seq: int, global_batch: int | None, spec: ModelSpec | None, n_gpus: int | None,
           where: str) -> float | None:
    """Measured tokens/s of the whole job from the row's metric (None where the row states no
    number or it cannot be converted; a UsageError naming ``where`` for an infinite one)."""
    metric, unit = str(row.get("metric")), str(row.get("unit", "")).lower()
    try:
        v = float(row.get("value_num"))
    except (TypeError, ValueError):
        return None
    if math.isnan(v) or v <= 0:
        return None
    if not math.isfinite(v):
        raise UsageError(f"{where}: value_num must be a finite number, got {row.get('value_num')!r}")
    if metric == "throughput_tokens_per_s":
        return float(v)
    if metric == "hours_per_1B_tokens":
        return 1e9 / (float(v) * 3600.0)
    if metric in ("step_time", "step_time_ms", "iter_time_ms") and global_batch:
        seconds = float(v) / 1000.0 if unit.startswith("ms") else float(v)
        return global_batch * seq / seconds
    if metric == "model_tflops_per_gpu" and spec is not None and n_gpus:
        # FlashAttention's convention: 6 N + 12 L h s FLOPs per token (attention not halved)
        per_token = 6.0 * spec.n_params() + 12.0 * spec.n_layers * spec.hidden * seq
        return float(v) * 1e12 * n_gpus / per_token
    return None


def _from_more(df: pd.DataFrame, origin: str) -> list[dict]:
    out = []
    for i, row in df.iterrows():
        row = row.to_dict()
        seq = _int(row.get("seq_len")) or 2048
        name = re.sub(r"\s+", " ", str(row["model"])).strip()
        spec = _arch(name, row, seq)
        n = _int(row.get("n_gpus"))
        gb = _global_batch(row.get("global_batch"), seq)
        ck_txt = str(row.get("act_ckpt", "")).lower()
        excluded, note = "", ""
        if "mlp_checkpoint_lvl=2" in ck_txt or "+ 2" in ck_txt:
            excluded = "mlp_checkpoint_lvl=2 (recomputes the MLP's first GEMM) is not modelled"
        elif "mlp_checkpoint_lvl=1" in ck_txt:
            note = "mlp_checkpoint_lvl=1 recomputes only the fused GELU in backward: simulated as no checkpointing"
        ckpt = "full" if ck_txt in ("true", "full") else "none"
        comp_txt = str(row.get("compile", "")).lower()
        compiled = "c/cuda" in comp_txt or comp_txt in ("yes", "true")
        if "c/cuda" in comp_txt:
            note = (note + "; " if note else "") + "hand-fused C/CUDA kernels: simulated as compiled"
        if str(row.get("precision", "nan")) == "nan":
            note = (note + "; " if note else "") + "precision not stated: bf16 assumed"
        att_txt = str(row.get("attention", "")).lower()
        attention = "eager" if "without flashattention" in att_txt else "sdpa"
        mb = _int(row.get("micro_batch"))
        tp, pp = _int(row.get("tp")) or 1, _int(row.get("pp")) or 1
        out.append(_finish(_row(
            run=f"{origin}:{i + 2}", source=str(row["source"]), stack=_stack(str(row["source"])), model=name,
            spec=spec, seq_len=seq, gpu=gpu_id(row.get("gpu")), n_gpus=n, nodes=_int(row.get("n_nodes")),
            precision=_precision(row.get("precision")), sharding=_sharding(row.get("sharding")), tp=tp, pp=pp,
            checkpointing=ckpt, compile=compiled, attention=attention, micro_batch=mb, global_batch=gb,
            measured_tok_s=_tok_s(row, seq, gb, spec, n, f"{origin} line {i + 2}"), metric=str(row.get("metric")), excluded=excluded,
            note=note)))
    _mark_duplicates(out)
    return out


def _mark_duplicates(rows: list[dict]) -> None:
    """Several metrics of one run (tokens/s and hours per 1B tokens): keep one, by metric priority."""
    key = lambda r: (r["source"], r["model"], r["seq_len"], r["gpu"], r["n_gpus"], r["micro_batch"],  # noqa: E731
                     r["sharding"], r["checkpointing"], r["attention"])
    seen: dict = {}
    rank = {m: i for i, m in enumerate(_METRIC_PRIORITY)}
    for r in sorted((r for r in rows if not r["excluded"]), key=lambda r: rank.get(r["metric"], 99)):
        k = key(r)
        if k in seen:
            r["excluded"] = f"duplicate: same run as {seen[k]} ({r['metric']})"
        else:
            seen[k] = r["run"]


def _from_user(df: pd.DataFrame, origin: str) -> list[dict]:
    """The ``calibrate --from-runs`` format (docs/calibrate_from_runs.md)."""
    out = []
    for i, row in df.iterrows():
        row = {k: v for k, v in row.to_dict().items() if not (isinstance(v, float) and math.isnan(v))}
        where = f"{origin} line {i + 2}"
        seq = _int(row.get("seq_len"))
        if seq is None:
            raise UsageError(f"{where}: seq_len missing or not a number")
        tok_s = measured_tok_s(row.get("tokens_per_s"), where, "tokens_per_s")
        try:
            if row.get("n_layers") is not None:
                spec = _arch(str(row.get("model", "custom")), row, seq)
            else:
                spec = resolve_model(str(row.get("model", "")))
                if spec.pos_embedding == "learned" and spec.max_positions < seq:
                    spec = spec.with_max_positions(seq)
            cl = parse_cluster(str(row.get("gpus", "")))
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        ck = str(row.get("checkpointing", "none")).lower()
        comp = str(row.get("compile", "false")).lower() in ("true", "1", "yes")
        out.append(_finish(_row(
            run=f"{origin}:{i + 2}", source=str(row.get("source", origin)), stack=str(row.get("stack", "pytorch")),
            model=spec.name, spec=spec, seq_len=seq, gpu=cl.gpu.id, n_gpus=cl.n_gpus, nodes=cl.nodes,
            gpus_per_node=cl.gpus_per_node, precision=_precision(row.get("precision", "bf16")),
            sharding=_sharding(row.get("sharding", "ddp")) if row.get("sharding") not in
            ("ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op") else row["sharding"],
            tp=_int(row.get("tp")) or 1, pp=_int(row.get("pp")) or 1, checkpointing=ck, compile=comp,
            sequence_parallel=str(row.get("sequence_parallel", "false")).lower() in ("true", "1", "yes"),
            attention=str(row.get("attention", "sdpa")), micro_batch=_int(row.get("micro_batch")),
            global_batch=_int(row.get("global_batch")), measured_tok_s=tok_s,
            metric="tokens_per_s")))
    return out


def _check_field_counts(text: str, name: str) -> None:
    """Every non-blank row has as many fields as the header, else a UsageError naming the line (a
    short row would read as empty cells, a long one would shift the columns)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise UsageError(f"{name!r} is empty; expected a header line of column names")
    for row in reader:
        if any(cell.strip() for cell in row) and len(row) != len(header):
            raise UsageError(f"{name} line {reader.line_num}: {len(row)} fields, but the header has "
                             f"{len(header)}; leave an unknown value empty between commas")


def load_runs(path: str | Path) -> pd.DataFrame:
    """Read any of the three layouts into the normalized table; UsageError names the file and problem."""
    p = Path(path)
    text = read_text(p, "runs CSV")
    _check_field_counts(text, p.name)
    try:
        df = pd.read_csv(io.StringIO(text))
    except Exception as exc:  # pandas raises several parser errors
        raise UsageError(f"cannot parse {str(p)!r} as CSV: {exc}") from None
    cols = set(df.columns)
    if "throughput_tok_s" in cols:
        need, reader = ("model", "seq_len", "gpu", "n_gpus", "n_nodes", "gpus_per_node", "precision",
                        "sharding", "act_ckpt", "micro_batch", "global_batch"), _from_dev
    elif {"metric", "value_num"} <= cols:
        need, reader = ("source", "model", "seq_len", "gpu", "n_gpus"), _from_more
    elif "tokens_per_s" in cols:
        need, reader = ("model", "gpus", "seq_len", "global_batch", "micro_batch", "tokens_per_s"), _from_user
    else:
        raise UsageError(f"{str(p)!r} lacks column 'tokens_per_s' (the format of docs/calibrate_from_runs.md; "
                         "or 'throughput_tok_s' as in data/validation_dev.csv)")
    missing = [c for c in need if c not in cols]
    if missing:
        raise UsageError(f"{str(p)!r} lacks column(s) {', '.join(missing)}; required: {', '.join(need)}")
    return pd.DataFrame(reader(df, p.name), columns=list(COLUMNS))


def megatron_gpt(name: str, layers: int, hidden: int, heads: int, vocab: int, seq_len: int) -> ModelSpec:
    """A Megatron-LM GPT (learned positions, LayerNorm, GELU MLP of 4h, biases, tied embeddings)."""
    return ModelSpec(name=name, family="gpt2", kind="decoder", n_layers=layers, hidden=hidden, n_heads=heads,
                     ffn_hidden=4 * hidden, vocab_size=vocab, max_positions=seq_len, tied_embeddings=True,
                     pos_embedding="learned", norm="layernorm", linear_bias=True, norm_bias=True, head="lm",
                     default_seq_len=seq_len)


def korthikanti_runs() -> pd.DataFrame:
    """Korthikanti et al. 2022, Table 5 (GPT 22B-1T, TP 8, PP 1-64 on DGX A100) as normalized runs:
    Megatron-LM with its fused kernels (compiled), unfused attention, bf16, DDP gradients, one
    sample per micro-batch; full recomputation, or sequence parallelism + selective recomputation."""
    out = []
    for i, r in pd.read_csv(KORTHIKANTI_FILE).iterrows():
        seq, n, gb = int(r["seq_len"]), int(r["n_gpus"]), int(r["global_batch"])
        present = str(r["schedule"]).startswith("sequence parallel")
        out.append(_finish(_row(
            run=f"{KORTHIKANTI_FILE.name}:{i + 2}", source=KORTHIKANTI_SOURCE, stack="megatron-lm",
            model=str(r["model"]), seq_len=seq, gpu=KORTHIKANTI_GPU, n_gpus=n, nodes=max(1, n // 8),
            gpus_per_node=min(n, 8), spec=megatron_gpt(str(r["model"]), int(r["n_layers"]), int(r["hidden"]),
                                                      int(r["n_heads"]), int(r["vocab"]), seq),
            precision="bf16", sharding="ddp", tp=int(r["tp"]), pp=int(r["pp"]), sequence_parallel=present,
            checkpointing="selective" if present else "full", compile=True, attention="eager", micro_batch=1,
            global_batch=gb, measured_tok_s=gb * seq / float(r["iteration_s"]), metric="iteration_s",
            note=str(r["schedule"]))))
    return pd.DataFrame(out, columns=list(COLUMNS))


def default_runs() -> pd.DataFrame:
    """The bundled dev runs: validation_dev.csv, published_runs_more.csv and Korthikanti et al.
    2022 Table 5 (:func:`korthikanti_runs`), all rows."""
    return pd.concat([load_runs(DEV_FILE), load_runs(MORE_FILE), korthikanti_runs()], ignore_index=True)


def stack_preset(name) -> str:
    """The stack preset (simulator.strategy.stacks) for a run's stack name; the default (hf-trainer, plain
    PyTorch with autocast) where no preset claims it."""
    try:
        return for_published(str(name)).name
    except UsageError:
        return default_stack().name


def run_knobs(run) -> dict:
    """The :func:`simulator.answer.api.simulate` keyword arguments (recipe, stack and every strategy knob
    pinned) that reproduce one normalized run exactly: one optimizer step of AdamW, its tensor and
    pipeline layout pinned, 1F1B without interleaving (runs record no virtual stages), no offload.
    The one definition shared by ``validate-published`` and ``calibrate --from-runs``."""
    return {"global_batch": int(run["global_batch"]), "seq_len": int(run["seq_len"]), "steps": 1,
            "optimizer": "adamw", "stack": stack_preset(run["stack"]), "precision": run["precision"],
            "sharding": run["sharding"], "attention": run["attention"], "compile": bool(run["compile"]),
            "checkpointing": run["checkpointing"], "offload": "none", "micro_batch": int(run["micro_batch"]),
            "tp": int(run["tp"] or 1), "pp": int(run["pp"] or 1), "vp": 1,
            "sequence_parallel": bool(run["sequence_parallel"])}


def simulable(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows with no exclusion reason."""
    return runs[runs["excluded"] == ""].reset_index(drop=True)


#: The command that refits the default profiles from these runs (cited in every fitted profile).
REBUILD_COMMAND = "python -m calibration.from_runs rebuild-defaults"


def source_key(source: str) -> str:
    """The publishing project of a run ('mosaicml/llm-foundry', 'karpathy/llm.c', ...): the unit
    of leave-one-source-out cross-validation and of per-source errors."""
    return str(source).split()[0] if str(source).strip() else "unknown"
