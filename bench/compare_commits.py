"""Benchmark an old commit and the current tree side by side: the same warm strategy searches, in
one invocation, on one machine, under the same load.

    python bench/compare_commits.py [--old ac16722] [--search pythia-1b:8x3090 ...] [--repeat 30] [--rounds 3]

The old commit is exported with ``git archive`` into a temporary folder (the repository and its
worktrees are left as they are; ``--old-tree PATH`` uses a checkout that exists). Each tree runs
in its own Python process with ``PYTHONPATH`` set to it, importing its own ``simulator``. The two
alternate for ``--rounds`` rounds of ``--repeat`` warm searches each, so that both see the same
load; printed per search and tree: strategies evaluated, the minimum CPU time of one search (the
steadier figure on a shared machine: it does not count waiting for a core) and the median wall
time, in milliseconds, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The issue's reference: the code of two rounds before the layout search (issue 36).
OLD_COMMIT = "ac16722"
SEARCHES = ("pythia-1b:8x3090", "llama-2-70b:8x8xh100")

#: Run in each tree's process: warm once, then time ``repeat`` searches; one JSON line out.
_RUNNER = """
import json, sys, time
try:
    from simulator.answer.api import run_search
except ImportError:  # a commit before the package's layers (issue 36)
    from simulator.api import run_search
model, gpus, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
res = run_search(model, gpus)
cpu, wall = [], []
for _ in range(repeat):
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_search(model, gpus)
    wall.append((time.perf_counter() - t0) * 1e3)
    cpu.append((time.process_time() - c0) * 1e3)
print(json.dumps({"n": len(res.table), "cpu": cpu, "wall": wall}))
"""


def export_commit(commit: str, dest: Path) -> Path:
    """The files of ``commit`` (``git archive``) extracted under ``dest``; the repository is not
    changed."""
    tar = dest / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(tar), commit], check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest / "tree", filter="data")
    return dest / "tree"


def time_searches(tree: Path, model: str, gpus: str, repeat: int) -> dict | str:
    """One process importing ``tree``'s simulator: strategies, and per search CPU and wall ms; or
    the last line of its error when that tree cannot run the search."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _RUNNER, model, gpus, str(repeat)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def compare(old: Path, new: Path, searches: list[str], repeat: int, rounds: int) -> list[str]:
    """Lines of the side-by-side table: per search, the old and new tree's figures and their ratio."""
    lines = []
    for search in searches:
        model, gpus = search.split(":")
        got: dict[str, dict] = {"old": {"cpu": [], "wall": []}, "new": {"cpu": [], "wall": []}}
        for _ in range(rounds):
            for name, tree in (("old", old), ("new", new)):
                if "error" in got[name]:
                    continue
                r = time_searches(tree, model, gpus, repeat)
                if isinstance(r, str):
                    got[name]["error"] = r
                    continue
                got[name]["n"] = r["n"]
                got[name]["cpu"] += r["cpu"]
                got[name]["wall"] += r["wall"]
        for name in ("old", "new"):
            g = got[name]
            lines.append(f"{model} on {gpus} [{name}]: " + (f"cannot run: {g['error']}" if "error" in g else
                         f"{g['n']:,} strategies, min {min(g['cpu']):.2f} ms CPU, "
                         f"median {statistics.median(g['wall']):.2f} ms wall"))
        if got["old"]["cpu"] and got["new"]["cpu"]:
            ratio = min(got["new"]["cpu"]) / min(got["old"]["cpu"])
            lines.append(f"{model} on {gpus}: new / old min CPU = {ratio:.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default=OLD_COMMIT, help=f"commit to compare with (default {OLD_COMMIT})")
    ap.add_argument("--old-tree", type=Path, help="an existing checkout of the old commit (skips the export)")
    ap.add_argument("--search", action="append", help="MODEL:GPUS, repeatable (default: "
                    + ", ".join(SEARCHES) + ")")
    ap.add_argument("--repeat", type=int, default=30, help="warm searches per round and tree")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating old and new")
    a = ap.parse_args()
    searches = a.search or list(SEARCHES)
    print(f"load average before: {_load()}")
    with tempfile.TemporaryDirectory(prefix="simulator-bench-") as tmp:
        old = a.old_tree or export_commit(a.old, Path(tmp))
        label = a.old if a.old_tree is None else str(a.old_tree)
        print(f"old: {label}; new: {ROOT} (working tree)")
        for line in compare(old, ROOT, searches, a.repeat, a.rounds):
            print(line)
    print(f"load average after: {_load()}")


if __name__ == "__main__":
    main()
