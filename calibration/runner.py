"""Run benchmarks in order with a progress bar, saving each record as soon as it exists."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .benches import Bench, RunContext, TooSlow
from .store import MeasurementStore, now


@dataclass
class RunSummary:
    """Counts of what happened to each bench in this run."""

    measured: int = 0
    resumed: int = 0  # already in the measurements file
    unsupported: int = 0
    too_slow: int = 0
    errors: list[str] = field(default_factory=list)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_benches(benches: list[Bench], ctx: RunContext, store: MeasurementStore,
                console: Console | None, resume: bool) -> RunSummary:
    """Execute ``benches``; skip those already final in ``store`` when ``resume``."""
    summary = RunSummary()
    ctx.results = store.results
    progress = Progress(TextColumn("[bold]{task.description:<44}"), BarColumn(),
                        TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                        TextColumn("ETA"), TimeRemainingColumn(), console=console,
                        disable=console is None, transient=False)
    todo = [b for b in benches if not (resume and store.done(b.key))]
    summary.resumed = len(benches) - len(todo)
    # progress in wall seconds; the remaining estimate is rescaled per group by how long
    # that group's benches actually took so far (est_s are rough a-priori guesses)
    spent: dict[str, float] = {}
    guessed: dict[str, float] = {}
    done_s = 0.0

    def remaining(i: int) -> float:
        total_ratio = (sum(spent.values()) / sum(guessed.values())) if guessed else 1.0
        return sum(b.est_s * (spent[b.group] / guessed[b.group] if guessed.get(b.group)
                              else total_ratio) for b in todo[i:])

    with progress:
        task = progress.add_task("calibrating", total=remaining(0) or 1.0)
        for i, bench in enumerate(todo):
            progress.update(task, description=bench.key[:44])
            t0 = time.perf_counter()
            try:
                rec = bench.run(ctx)
            except TooSlow:
                summary.too_slow += 1
                rec = None
            except Exception as exc:  # noqa: BLE001 - OOM, kernel errors: record, go on
                msg = str(exc).strip().splitlines()[0][:300] if str(exc) else type(exc).__name__
                rec = {"status": "error", "reason": f"{type(exc).__name__}: {msg}"}
                summary.errors.append(f"{bench.key}: {msg}")
            finally:
                _free(ctx.device)
            wall = time.perf_counter() - t0
            if rec is not None:
                rec = {"group": bench.group, "params": bench.params, **rec, "measured_at": now(),
                       "wall_s": round(wall, 3)}
                store.add(bench.key, rec)
                if rec["status"] == "ok":
                    summary.measured += 1
                elif rec["status"] == "unsupported":
                    summary.unsupported += 1
            spent[bench.group] = spent.get(bench.group, 0.0) + wall
            guessed[bench.group] = guessed.get(bench.group, 0.0) + bench.est_s
            done_s += wall
            progress.update(task, completed=done_s, total=done_s + remaining(i + 1))
    return summary
