"""The explorer's words: package messages in the app's terms (sidebar controls instead of
command-line flags, hardware in words), sources without file paths, the likely range, the
micro-batch and the recipe spelled out, and money and days formatted for the page."""

from __future__ import annotations

import math
import re

from simulator.answer import costs
from simulator.answer.plan import format_days
from simulator.core.errors import UsageError
from simulator.hardware import catalog as hardware

#: Where each command-line flag lives in this app: package messages name flags; the app names
#: its own controls instead.
APP_CONTROLS = {
    "--host-memory": "“Host RAM per node” (Hardware)",
    "--price-per-gpu": "“$ per GPU” (Prices)",
    "--rent-per-gpu-hour": "“$ per GPU-hour” (Prices)",
    "--kwh-price": "“Electricity” (Prices)",
    "--pue": "“PUE” (Prices)",
    "--lifetime-years": "“Lifetime” (Prices)",
    "--tokens": "“Tokens” (Training length)",
    "--steps": "“Optimizer steps” (Training length)",
    "--global-batch": "“Global batch” (Training length)",
    "--seq-len": "“Sequence length” (Training length)",
    "--optimizer": "“Optimizer” (Training length)",
    "--micro-batch": "“Micro-batch” (Strategy)",
    "--precision": "“Precision” (Strategy)",
    "--attention": "“Attention” (Strategy)",
    "--checkpointing": "“Activation checkpointing” (Strategy)",
    "--sharding": "“Sharding” (Strategy)",
    "--offload": "“CPU offload” (Strategy)",
    "--compile": "“torch.compile” (Strategy)",
    "--intra-node": "“Intra-node link” (Hardware)",
    "--inter-node": "“Inter-node Gbit/s” (Hardware)",
    "--profile": "the efficiency profile",
    "--gpus": "the hardware",
    "--model": "the model",
}
_FLAG = re.compile(r"(?:(?:pass|set|use) )?(--[a-z][a-z-]*)(?: [A-Z][A-Z_]+\b)?")  # a flag and its FILE-like value
_COMMAND = re.compile(r"`([a-z][\w-]*)[^`]*`")  # `calibrate`, `validate --profile FILE ...`


def app_words(text: str) -> str:
    """A package message in the app's terms: flags become the sidebar controls that set them."""
    def sub(m: re.Match) -> str:
        flag = m.group(1)
        name = APP_CONTROLS.get(flag)
        if name is None:
            return m.group(0)
        return ("set " if m.group(0) != flag else "") + name
    text = _COMMAND.sub(lambda m: f"the {m.group(1)} command", _FLAG.sub(sub, str(text)))
    return _CLUSTER.sub(_cluster_words, text)


_CLUSTER = re.compile(r"'?\b(\d+)x(?:(\d+)x)?([a-z][a-z0-9-]*)\b'?")


def cluster_words(nodes: int, per_node: int, gpu: str) -> str:
    """'8 × RTX 3090 24 GB' on one node, '2 nodes × 8 × RTX 4090 24 GB' on several (as the
    package's hardware description starts)."""
    return f"{per_node} × {gpu}" if nodes == 1 else f"{nodes} nodes × {per_node} × {gpu}"


def _cluster_words(m: re.Match) -> str:
    """'2x8xh100-sxm' -> '2 nodes × 8 × H100 80 GB SXM'; '8xlocal' -> '8 × calibrated device'
    (left as is if not a catalog GPU)."""
    nodes, per = (int(m.group(1)), int(m.group(2))) if m.group(2) else (1, int(m.group(1)))
    if m.group(3) == "local":
        return cluster_words(nodes, per, "calibrated device")
    try:
        name = hardware.get_gpu(m.group(3)).short_name
    except UsageError:
        return m.group(0)
    return cluster_words(nodes, per, name)


_PATHY = re.compile(r"\s*(?:[^\s()]*/[^\s()]*|@?\b[0-9a-f]{7,40}\b|\b[\w.-]+\.(?:csv|py|yaml|json|md)\b|\bcommit\b)")


_REPO = re.compile(r"\b[\w-]+/([\w-]+(?:\.(?!(?:csv|py|yaml|yml|json|md)\b)\w+)?)\b(?![./\w])")  # owner/repo, not a file


def plain_source(text: str | None) -> str:
    """A source in a reader's words: file paths, file names and commit hashes dropped."""
    t = _REPO.sub(r"\1", str(text or ""))  # 'mosaicml/llm-foundry' -> 'llm-foundry'
    t = _PATHY.sub("", t)
    t = re.sub(r"\(\s*(?:[;,]|via|from)?\s*\)", "", t)
    t = re.sub(r"\(\s*[;,]\s*", "(", t)
    t = re.sub(r"\s*[;,]\s*\)", ")", t)
    t = re.sub(r"\s+([;,)])", r"\1", re.sub(r"\s{2,}", " ", t))
    return t.strip(" ;,:")


_IV = re.compile(r"from (\d+) validation residuals \(real runs (\d+% (?:slower|faster)) than predicted on "
                 r"average\): (.*)$")


def interval_words(plan) -> str:
    """Where the 80% range comes from, in plain words."""
    m = _IV.search(plan.interval_source or "")
    if not m:
        return ("This efficiency profile has no validation against real training runs, so there is no "
                "range: treat the estimate as optimistic.")
    n, bias, src = m.groups()
    src = re.sub(r",\s*\d+ runs.*$", "", plain_source(src.split(": ", 1)[-1]).split(";")[0])
    return (f"Where the range comes from: on {n} real training runs ({src}) the runs were on average "
            f"{bias} than this simulator estimated; 8 in 10 fell within the range shown.")


def microbatch_words(plan) -> str:
    """'12 micro-batches of 11 samples per GPU and step (the last one 7): 128 per GPU'."""
    st_, hw = plan.strategy, plan.hardware
    mb, ga = int(st_["micro_batch"]), int(st_["grad_accum"])
    per_gpu = -(-int(plan.recipe["global_batch"]) // int(hw["n_gpus"]))
    last = per_gpu - (ga - 1) * mb
    tail = f" (the last one {last})" if last != mb else ""
    return (f"{ga} micro-batch{'es' if ga > 1 else ''} of {mb} sample{'s' if mb > 1 else ''} per GPU and "
            f"step{tail}: {per_gpu} per GPU")


def strategy_words(plan) -> str:
    """The strategy line with the micro-batch spelled out."""
    line = plan.strategy_line()
    return re.sub(r"micro-batch \d+ × \d+ accumulation", microbatch_words(plan), line)


def recipe_words(plan) -> str:
    """The training length and where it comes from, e.g. '1.38 T tokens (...), 20 tokens per
    parameter. Recipe: generic default (not a published recipe): ...'."""
    r, m = plan.recipe, plan.model
    per_param = f", {r['tokens'] / m['params']:,.0f} tokens per parameter" if m.get("params") else ""
    src = re.sub(r"^\((.*?)\)", r"\1", plain_source(r.get("source"))) or "no source recorded"
    return (f"Training length: {r['description']}{per_param}. Recipe: {src}. "
            "Set “Tokens” or “Optimizer steps” under Training length to match the run you plan.")


def fmt_money(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else f"${x:,.0f}"


def _years(d: float) -> str:
    return f"{d / costs.DAYS_PER_YEAR:,.1f}"


def days_text(d: float) -> str:
    """'46.7 days'; from a year on with years beside: '584 days (1.6 years)'."""
    text = f"{format_days(d)} days"
    return text + (f" ({_years(d)} years)" if math.isfinite(d) and d >= costs.DAYS_PER_YEAR else "")


def range_text(lo: float, hi: float) -> str:
    """'36.9–65.3 days'; with years beside once the slow end passes a year."""
    text = f"{format_days(lo)}–{format_days(hi)} days"
    return text + (f" ({_years(lo)}–{_years(hi)} years)" if math.isfinite(hi) and hi >= costs.DAYS_PER_YEAR else "")
