"""Run benchmarks in order with a progress bar, saving each record as soon as it exists.

Benches of :data:`ROUND_GROUPS` are timed ``Settings.rounds`` times, in rounds: every bench once,
then those groups again in the same order, and so on, so that a bench's rounds lie a whole pass
apart and a slow spell of a shared host hits one of them (:func:`calibration.store.merge_rounds`).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .benches.base import Bench, RunContext, TooSlow
from .store import MeasurementStore, now

#: groups whose points set most of a step's predicted time (GEMM shapes, attention, the host time
#: of eager passes, the optimizer, the loss, embedding and casts): timed in every round. The
#: bandwidth benches each time dozens of calls over hundreds of MB already, and compile, launch
#: and host-copy benches are not worth their wall time twice.
ROUND_GROUPS = ("gemm", "gemm_align", "attention", "dispatch", "optimizer", "loss", "embedding", "cast")


@dataclass
class RunSummary:
    """Counts of what happened to each bench in this run."""

    measured: int = 0
    repeated: int = 0  # later rounds of benches already measured
    resumed: int = 0  # already in the measurements file
    unsupported: int = 0
    too_slow: int = 0
    errors: list[str] = field(default_factory=list)


def _free(device: torch.device, full: bool) -> None:
    """Free what a bench left: its young reference cycles, and all of them when ``full`` (a full
    collection walks every object torch keeps, ~0.1 s on a 2-core CPU: once per group, not per
    bench)."""
    gc.collect() if full else gc.collect(1)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def rounds_for(bench: Bench, rounds: int) -> int:
    """Timed rounds of ``bench`` in a run of ``rounds`` rounds."""
    return rounds if bench.group in ROUND_GROUPS else 1


def schedule(benches: list[Bench], store: MeasurementStore, rounds: int,
             resume: bool) -> list[tuple[Bench, int]]:
    """(bench, round) pairs in execution order: round by round, each bench's rounds that
    ``store`` does not hold yet (all of them unless ``resume``; a final record that is not 'ok'
    needs none)."""
    have = {b.key: store.held(b.key) if resume else 0 for b in benches}
    return [(b, r) for r in range(rounds) for b in benches
            if have[b.key] is not None and have[b.key] <= r < rounds_for(b, rounds)]


def run_benches(benches: list[Bench], ctx: RunContext, store: MeasurementStore,
                console: Console | None, resume: bool) -> RunSummary:
    """Execute ``benches`` in ``ctx.settings.rounds`` rounds (:func:`schedule`); skip the rounds
    already in ``store`` when ``resume``."""
    summary = RunSummary()
    ctx.results = store.results
    progress = Progress(TextColumn("[bold]{task.description:<44}"), BarColumn(),
                        TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        disable=console is None, transient=False)
    todo = schedule(benches, store, ctx.settings.rounds, resume)
    summary.resumed = len(benches) - len({b.key for b, r in todo if r == 0})
    # progress in wall seconds; the remaining estimate is rescaled per group by how long
    # that group's benches actually took so far (est_s are rough a-priori guesses)
    spent: dict[str, float] = {}
    guessed: dict[str, float] = {}
    done_s = 0.0

    tried = set(store.results)  # keys whose first round has run (here or before a resume)

    def skipped(bench: Bench, rnd: int) -> bool:
        """A later round of a bench whose first was unsupported, too slow or failed."""
        return (bool(rnd) and bench.key in tried
                and store.results.get(bench.key, {}).get("status") != "ok")

    def remaining(i: int) -> float:
        total_ratio = (sum(spent.values()) / sum(guessed.values())) if guessed else 1.0
        return sum(b.est_s * (spent[b.group] / guessed[b.group] if guessed.get(b.group)
                              else total_ratio) for b, r in todo[i:] if not skipped(b, r))

    with progress:
        task = progress.add_task("calibrating", total=remaining(0) or 1.0)
        for i, (bench, rnd) in enumerate(todo):
            if skipped(bench, rnd):
                continue
            progress.update(task, description=(bench.key if not rnd else f"{bench.key} #{rnd + 1}")[:44])
            tried.add(bench.key)
            t0 = time.perf_counter()
            failed = False
            try:
                rec = bench.run(ctx)
            except TooSlow:
                summary.too_slow += 1
                rec = None
            except Exception as exc:  # noqa: BLE001 - OOM, kernel errors: record, go on
                msg = str(exc).strip().splitlines()[0][:300] if str(exc) else type(exc).__name__
                rec = {"status": "error", "reason": f"{type(exc).__name__}: {msg}"}
                summary.errors.append(f"{bench.key}: {msg}")
                failed = True  # its traceback's frames may hold large tensors in cycles
            finally:
                _free(ctx.device, full=failed or i + 1 == len(todo) or todo[i + 1][0].group != bench.group)
            wall = time.perf_counter() - t0
            if rec is not None:
                rec = {"group": bench.group, "params": bench.params, **rec, "measured_at": now(),
                       "wall_s": round(wall, 3)}
                store.add_round(bench.key, rec)
                if rec["status"] == "ok" and rnd:
                    summary.repeated += 1
                elif rec["status"] == "ok":
                    summary.measured += 1
                elif rec["status"] == "unsupported":
                    summary.unsupported += 1
            spent[bench.group] = spent.get(bench.group, 0.0) + wall
            guessed[bench.group] = guessed.get(bench.group, 0.0) + bench.est_s
            done_s += wall
            progress.update(task, completed=done_s, total=done_s + remaining(i + 1))
    return summary
