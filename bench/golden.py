"""Golden numbers of the simulator: pins the current output so that refactors and speedups can
prove they change none.

For each case of :data:`CASES` (a ``simulate`` command line) it records the full ``--json``
output of ``simulate ... --json --top 10`` (less ``search_ms``, the only wall-clock figure) and
a fingerprint of the whole search table (every evaluated strategy's step time and its parts,
memory by component, feasibility): per column the sum, a sum under fixed pseudo-random weights,
the extremes and the non-finite count (compared with rtol 1e-12), and a digest of every value
rounded to 20 bits of mantissa (a change of ~1e-6 in any one strategy). Rows are taken in a
canonical order (their layout and knob indices), so reordering the evaluation changes nothing.

    python bench/golden.py            # compare with tests/data/golden_search.json; exit 1 if any differs
    python bench/golden.py --write    # regenerate it

A deliberate physics change regenerates the file with ``--write`` in its own commit, whose
message says which numbers moved and why. tests/test_golden_search.py runs the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden_search.json"
CPU_PROFILE = "calibration/profiles/cpu-amd-epyc.json"
RTOL = 1e-12

#: ``simulate`` command lines (without --json/--top), varied over families, clusters, pins and stacks.
CASES: dict[str, list[str]] = {
    "pythia-1b-8x3090": ["--model", "pythia-1b", "--gpus", "8x3090"],
    "llama-2-70b-8x8xh100": ["--model", "llama-2-70b", "--gpus", "8x8xh100"],
    "llama-2-70b-tp8-pp4": ["--model", "llama-2-70b", "--gpus", "8x8xh100", "--tp", "8", "--pp", "4"],
    "llama-2-70b-1x3090-infeasible": ["--model", "llama-2-70b", "--gpus", "1x3090"],
    "mamba-2.8b-8xa100": ["--model", "mamba-2.8b", "--gpus", "8xa100"],
    "convnext-4x3090": ["--model", "convnext-xlarge-22k", "--gpus", "4x3090"],
    "vit-l-16-8xh100": ["--model", "vit-l-16", "--gpus", "8xh100"],
    "bert-base-2x3090": ["--model", "bert-base", "--gpus", "2x3090"],
    "gemma-3-1b-8xh100": ["--model", "gemma-3-1b", "--gpus", "8xh100"],
    "mistral-7b-32k": ["--model", "mistral-7b", "--gpus", "8xh100", "--seq-len", "32768"],
    "llama-3-8b-2x8xh100-32k": ["--model", "llama-3-8b", "--gpus", "2x8xh100", "--seq-len", "32768"],
    "pythia-1b-pinned": ["--model", "pythia-1b", "--gpus", "8x3090", "--precision", "bf16", "--sharding", "zero2",
                         "--micro-batch", "4", "--checkpointing", "selective", "--attention", "eager"],
    "pythia-2.8b-offload": ["--model", "pythia-2.8b", "--gpus", "1x3090", "--offload", "optimizer"],
    "llama-2-7b-offload-all": ["--model", "llama-2-7b", "--gpus", "2x3090", "--offload", "all", "--sharding", "zero3"],
    "gpt2-hf-trainer": ["--model", "gpt2", "--gpus", "4x3090", "--stack", "hf-trainer"],
    "llama-3-8b-torchtitan": ["--model", "llama-3-8b", "--gpus", "8xh100", "--stack", "torchtitan"],
    "llama-2-13b-megatron": ["--model", "llama-2-13b", "--gpus", "2x8xa100", "--stack", "megatron-lm"],
    "mpt-7b-llm-foundry": ["--model", "mpt-7b", "--gpus", "8xa100", "--stack", "llm-foundry", "--tokens", "1e9"],
    "qwen2.5-0.5b-fp16-eager": ["--model", "qwen2.5-0.5b", "--gpus", "1x3090", "--precision", "fp16",
                                "--attention", "eager", "--compile"],
    "pythia-14m-1xlocal-cpu": ["--model", "pythia-14m", "--gpus", "1xlocal", "--profile", CPU_PROFILE,
                               "--steps", "100"],
    "olmoe-1b-7b-8xh100": ["--model", "olmoe-1b-7b", "--gpus", "8xh100"],
    "mixtral-8x7b-ep8": ["--model", "mixtral-8x7b", "--gpus", "4x8xh100", "--ep", "8", "--stack", "megatron-lm"],
}

#: Subcommands whose whole output is pinned too (validation figures, a catalog sweep, a budget): the
#: command line, and the file its rows are read from (``None``: its ``--json`` on stdout).
REPORTS: dict[str, tuple[list[str], str | None]] = {
    "validate-published": (["validate-published", "--json"], None),
    "validate-parallel": (["validate-parallel", "--csv", "{out}/rows.csv"], "rows.csv"),
    "compare-pythia-1b": (["compare", "--model", "pythia-1b", "--gpu", "3090,a100-80gb-sxm,h100-sxm", "--json"], None),
    "budget-pythia-1b": (["budget", "--model", "pythia-1b", "--budget", "60000", "--deadline", "60d",
                          "--gpu", "3090,h100-sxm", "--out", "{out}"], "budget-pythia-1b.csv"),
}


def _resolved(argv: list[str]) -> list[str]:
    """``argv`` with the repository's relative paths made absolute (any working directory)."""
    return [str(ROOT / x) if x == CPU_PROFILE else x for x in argv]


def plan_json(argv: list[str]) -> dict:
    """The ``simulate --json --top 10`` object of ``argv``, less the search's wall-clock time."""
    from simulator.frontends.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*_resolved(argv), "--json", "--top", "10"])
    d = json.loads(out.getvalue())
    for p in (d, *d.get("top", [])):
        p.pop("search_ms", None)
    return d


def report_output(name: str) -> object:
    """The output of :data:`REPORTS` ``name``: its JSON, or its CSV file as a list of rows (cells
    that read as numbers become floats)."""
    from simulator.frontends.cli import main

    argv, file = REPORTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main([x.format(out=tmp) for x in argv])
        if file is None:
            return json.loads(out.getvalue())
        with open(Path(tmp) / file, newline="", encoding="utf-8") as f:
            return [[_number(c) for c in row] for row in csv.reader(f)]


def _number(cell: str) -> object:
    try:
        return float(cell)
    except ValueError:
        return cell


def _canonical_order(tab) -> np.ndarray:
    """Row indices sorted by layout and knob indices (unique per strategy)."""
    keys = [tab.micro_batch, tab.offload, tab.sharding, tab.pack, tab.sp, tab.cp, tab.vp, tab.pp, tab.tp, tab.dp]
    return np.lexsort([np.asarray(k, dtype=float) for k in keys])


def _column_print(x: np.ndarray, w: np.ndarray) -> dict:
    """Sum, weighted sum, extremes and non-finite count of the finite values of ``x``, and a
    digest of every value rounded to 20 bits of mantissa."""
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0.0)
    mant, expo = np.frexp(xf)
    rounded = np.round(mant * 2.0**20).astype(np.int64) * 4096 + expo.astype(np.int64)
    return {"sum": float(xf.sum()), "wsum": float((w * xf).sum()),
            "min": float(xf[fin].min()) if fin.any() else 0.0, "max": float(xf[fin].max()) if fin.any() else 0.0,
            "nonfinite": int((~fin).sum()),
            "digest": hashlib.sha256(rounded.tobytes() + np.packbits(fin).tobytes()).hexdigest()[:16]}


def table_print(argv: list[str]) -> dict:
    """Fingerprint of every strategy the search of ``argv`` evaluates (see the module docstring)."""
    from simulator.answer import api
    from simulator.engine.estimate import _COLUMNS
    from simulator.frontends.cli import _knobs, build_parser

    a = build_parser().parse_args(_resolved(argv))
    res = api.run_search(a.model, a.gpus, **_knobs(a))
    tab = res.table
    idx = _canonical_order(tab)
    w = np.random.default_rng(36).uniform(0.5, 1.5, idx.size)
    cols = {k: _column_print(np.asarray(getattr(tab, k), dtype=float)[idx], w) for k in _COLUMNS}
    return {"rows": int(idx.size), "feasible": int(res.order.size), "order": res.order[:50].tolist(),
            "columns": cols}


def record() -> dict:
    """Every case's plan JSON and table fingerprint, and every report's output."""
    out: dict = {name: {"argv": argv, "plan": plan_json(argv), "table": table_print(argv)}
                 for name, argv in CASES.items()}
    out["reports"] = {name: {"argv": REPORTS[name][0], "output": report_output(name)} for name in REPORTS}
    return out


def differences(old, new, path: str = "") -> list[str]:
    """Where ``new`` differs from ``old``: floats beyond rtol :data:`RTOL`, anything else exactly."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = [f"{path}.{k}: missing" for k in old if k not in new] + [f"{path}.{k}: new" for k in new if k not in old]
        for k in old:
            if k in new:
                out += differences(old[k], new[k], f"{path}.{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: length {len(old)} -> {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        same = math.isclose(old, new, rel_tol=RTOL, abs_tol=0.0) or (old == new)
        return [] if same else [f"{path}: {old!r} -> {new!r}"]
    return [] if old == new and type(old) is type(new) else [f"{path}: {old!r} -> {new!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"regenerate {GOLDEN.relative_to(ROOT)}")
    a = ap.parse_args()
    from simulator.core.atomic import write_atomic

    new = record()
    if a.write:
        text = json.dumps(new, indent=1, sort_keys=True) + "\n"
        write_atomic(GOLDEN, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        print(f"wrote {len(CASES)} cases and {len(REPORTS)} reports to {GOLDEN.relative_to(ROOT)}")
        return 0
    diffs = differences(json.loads(GOLDEN.read_text(encoding="utf-8")), new)
    if not diffs:
        print(f"all {len(CASES)} cases and {len(REPORTS)} reports unchanged")
        return 0
    print("\n".join(diffs[:50]))
    print(summary(diffs))
    return 1


def summary(diffs: list[str]) -> str:
    """One line per case or report that differs: how many values, and which parts (plan, table, ...)."""
    parts: dict[str, dict[str, int]] = {}
    names = sorted([*CASES, *REPORTS, "reports"], key=len, reverse=True)  # case names hold dots (pythia-2.8b)
    for d in diffs:
        path = d.lstrip(".")
        name = next((n for n in names if path.startswith(n + ".") or path.startswith(n + ":")), path.split(".")[0])
        part = path[len(name) + 1:].split(".")[0].split("[")[0].split(":")[0]
        parts.setdefault(name, {}).setdefault(part, 0)
        parts[name][part] += 1
    lines = [f"{len(diffs)} differences in {len(parts)} of {len(CASES)} cases and {len(REPORTS)} reports:"]
    lines += [f"  {name}: " + ", ".join(f"{part} {n}" for part, n in sorted(p.items())) for name, p in sorted(parts.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
