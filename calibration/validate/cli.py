"""The ``validate`` command: parse its arguments, check them and the profile before anything
runs, then measure the suite's configurations (or re-predict the measured steps of earlier CSV
files, ``--measured``), compare, print, and write the CSV and profile. Under ``--nproc N`` it
relaunches itself under torchrun.

Exit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.answer.uncertainty import LEVEL
from simulator.core.atomic import check_writable
from simulator.core.errors import UsageError, UsageParser, run_cli

from .. import host_alloc, host_load
from ..host_alloc import ALLOCATORS
from .devices import check_device
from .files import merge_csv, read_measured, update_profile
from .measuring import (
    MAX_ROUND_STEPS,
    Dist,
    Measured,
    init_dist,
    measure,
    merge_measured,
    round_steps,
)
from .predicting import check_fits_memory, predict
from .report import draw_coverage, format_table, make_row, summarize
from .suite import (
    DEFAULT_SUITE,
    GPU_DEFAULT_SUITE,
    MIN_ROUND_S,
    Config,
    Suite,
    check_min_round_s,
    load_suite,
)

#: the most warm-up or timed steps per config and round ``--warmup``/``--steps`` (or a suite) may
#: ask for: a median needs a handful, and 1,000 steps of the largest suite's 1 s configs already
#: take 17 minutes each (an assumption bounding a typo such as ``--steps 1000000000``)
MAX_STEPS = 1000


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="validate", description=(
        "Run real training steps in torch and compare the measured step time with the "
        "simulator's prediction from a calibration profile."))
    p.add_argument("--profile", required=True, type=Path, help="calibration profile JSON (from `calibrate`)")
    p.add_argument("--suite", type=Path, default=None,
                   help=f"suite YAML/JSON (default: {DEFAULT_SUITE.relative_to(DEFAULT_SUITE.parents[2])} on a CPU, "
                        f"{GPU_DEFAULT_SUITE.relative_to(GPU_DEFAULT_SUITE.parents[2])} on CUDA)")
    p.add_argument("--only", help="comma-separated config ids (or substrings) to run")
    p.add_argument("--steps", type=int, help="timed steps per config (default: the suite's)")
    p.add_argument("--warmup", type=int, help="warm-up steps per config after its first, which creates the "
                   "optimizer's state (default: the suite's)")
    p.add_argument("--rounds", type=int, help="passes over the suite, each config built again and its timed steps "
                   f"split over them (default: the suite's, else {host_load.CPU_ROUNDS} on a CPU, whose shared host "
                   "changes speed for minutes at a time, and 1 on a GPU)")
    p.add_argument("--min-round-s", type=float, default=None,
                   help=f"time each config's steps for at least this many seconds per round, up to "
                        f"{MAX_ROUND_STEPS} steps (default: the suite's, else {MIN_ROUND_S}; 0: exactly --steps)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--nproc", type=int, default=None,
                   help="relaunch under `torchrun --nproc-per-node N` (DDP; predicted as Nxlocal)")
    p.add_argument("--allocator", choices=ALLOCATORS, default=None,
                   help="CPU: how the C allocator treats freed memory (calibration/host_alloc.py; default: "
                        "the setting the profile was measured with)")
    p.add_argument("--json", action="store_true", help="print rows and summary as JSON")
    p.add_argument("--csv", type=Path, help="merge rows into this CSV by config id (atomic write)")
    p.add_argument("--update-profile", action="store_true",
                   help=f"store the residuals in the profile's 'validation' field ({100 * LEVEL:.0f}%% intervals)")
    p.add_argument("--no-compile", action="store_true", help="skip configs that use torch.compile")
    p.add_argument("--measured", type=Path, nargs="+", default=None, metavar="CSV",
                   help="re-predict the measured steps of earlier `--csv` files of this suite with --profile "
                        "instead of running them (to compare two calibrations on the same measurements); "
                        "several files are several draws of the host, pooled (with --update-profile, the "
                        "interval's residuals) and checked against each other (leave-one-draw-out coverage)")
    return p


def _relaunch(argv: list[str], nproc: int) -> int:
    """Run this command again under torchrun with ``nproc`` processes."""
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "calibration.validate", *rest]
    return subprocess.call(cmd)


@dataclass
class _Selection:
    """What a run measures: the suite's configurations left by ``--only``/``--no-compile``, and the
    warm-up steps, timed steps and least seconds per round of each."""

    configs: list[Config]
    warmup: int
    steps: int
    min_round_s: float


def run(a: argparse.Namespace, argv: list[str], relaunch: bool = False) -> int:
    """Validation itself (after argument parsing); returns the exit status."""
    from simulator.hardware.profile import load_profile

    if a.nproc is not None and a.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {a.nproc}")
    profile = load_profile(a.profile)
    # fail before the suite runs (or torchrun starts), not after
    if a.update_profile:
        check_writable(a.profile, "--update-profile: profile")
    if a.csv:
        check_writable(a.csv, "--csv")
    cuda = str(a.device or "").startswith("cuda") or (not a.device and _cuda_available())
    if relaunch and not cuda and a.measured is None:  # before torchrun, whose workers inherit the setting
        host_alloc.relaunch_for(a.allocator or host_alloc.recorded(profile.provenance))
    if a.nproc and a.nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        if a.measured is None:  # another device's profile: one line here, not one per torchrun worker
            from ..device import detect

            ctx = detect(a.device)
            check_device(profile, ctx.name, ctx.memory_gib if ctx.kind == "cuda" else None)
        return _relaunch(argv, a.nproc)
    suite = load_suite(a.suite or (GPU_DEFAULT_SUITE if cuda else DEFAULT_SUITE))
    sel = _select(a, suite)
    if a.measured is not None:
        return _run_measured(a, sel.configs, suite, profile)
    try:
        import torch  # noqa: F401 - only whether it is installed
    except ImportError:
        print("validate: error: torch is required: pip install 'pretrain-simulator[calibration]'",
              file=sys.stderr)
        return 1
    dist = init_dist(a.device)
    try:
        return _run_measuring(a, sel, suite, profile, dist)
    finally:
        if dist.initialized:
            import torch.distributed as tdist

            tdist.destroy_process_group()


def _select(a: argparse.Namespace, suite: Suite) -> _Selection:
    """The configurations and step counts to run, from ``suite`` and the command line (usage
    errors for values out of range)."""
    configs = suite.configs
    if a.only:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        configs = [c for c in configs if any(k == c.id or k in c.id for k in keys)]
        if not configs:
            raise UsageError(f"--only {a.only!r} matches no config of suite {suite.name!r}")
    if a.no_compile:
        configs = [c for c in configs if not c.compile]
    warmup = suite.warmup if a.warmup is None else a.warmup
    steps = suite.steps if a.steps is None else a.steps
    for flag, n in (("--warmup", warmup), ("--steps", steps)):
        if not 1 <= n <= MAX_STEPS:
            raise UsageError(f"{flag} must be from 1 to {MAX_STEPS} steps per config and round, got {n:,}")
    host_load.check_rounds(a.rounds)
    min_round_s = suite.min_round_s if a.min_round_s is None else a.min_round_s
    check_min_round_s(min_round_s)
    return _Selection(configs, warmup, steps, min_round_s)


def _run_measured(a: argparse.Namespace, configs: list[Config], suite: Suite, profile) -> int:
    """``--measured``: re-predict the measured steps of earlier CSV files (each a draw of the host)
    with ``profile`` and report them; returns the exit status."""
    if a.nproc and a.nproc > 1:
        raise UsageError("--measured re-predicts single-process rows; drop --nproc")
    twice = sorted({str(p) for p in a.measured if sum(q.resolve() == p.resolve() for q in a.measured) > 1})
    if twice:
        raise UsageError(f"--measured names {twice[0]!r} more than once: each file is one draw of the host; "
                         "pass each once")
    if a.csv and len(a.measured) > 1:
        raise UsageError(f"--csv takes the rows of one --measured file, got {len(a.measured)} (the draws "
                         "share config ids); drop --csv or pass one file")
    draws = [_remeasured(path, configs, profile) for path in a.measured]
    rows = [r for d in draws for r in d]
    return _report(a, rows, suite.name, rows[0]["device"], profile.name, 1, rows[0]["date"],
                   draws=draws if len(draws) > 1 else None)


def _remeasured(path: Path, configs: list[Config], profile) -> list[dict[str, Any]]:
    """Rows of ``configs`` from the measurements in the ``--csv`` file ``path``, predicted with ``profile``."""
    known = read_measured(path)
    todo = [c for c in configs if c.id in known]
    if not todo:
        raise UsageError(f"--measured {str(path)!r} has no measured row of this suite's configs")
    for name in dict.fromkeys(known[c.id][1]["device"] for c in todo):
        warning = check_device(profile, name, where=f"--measured {str(path)!r}")
        if warning:
            print(f"validate: warning: {warning}", file=sys.stderr)
    rows = []
    for cfg in todo:
        m, meta = known[cfg.id]
        rows.append(make_row(cfg, m, predict(cfg, profile), 1, {**meta, "profile": profile.name}))
    return rows


def _run_measuring(a: argparse.Namespace, sel: _Selection, suite: Suite, profile, dist: Dist) -> int:
    """Measure ``sel``'s configurations on this rank's device, predict and report them (the main
    rank only); returns the exit status."""
    import torch

    from ..device import detect

    ctx = detect(str(dist.device) if dist.device.type == "cuda" else "cpu")
    dev_name = ctx.name
    warning = check_device(profile, dev_name, ctx.memory_gib if ctx.kind == "cuda" else None)
    if warning and dist.is_main:
        print(f"validate: warning: {warning}", file=sys.stderr)
    check_fits_memory(sel.configs, ctx.memory_gib, "this GPU" if ctx.kind == "cuda" else "this host's RAM")
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rounds = a.rounds or suite.rounds or host_load.default_rounds(dist.device.type)
    meta = {"warmup": sel.warmup, "rounds": rounds, "device": dev_name, "profile": profile.name,
            "suite": suite.name, "date": date, "torch": torch.__version__}
    if dist.device.type == "cpu":
        meta["host_allocator"] = _prime_host_allocator(profile, dist)
    got, seen = _measure_rounds(a, sel, profile, dist, rounds)
    rows = []
    for cfg in sel.configs:
        m, s = merge_measured(got[cfg.id]), seen[cfg.id]
        pred = predict(cfg, profile, dist.world)
        rows.append(make_row(cfg, m, pred, dist.world, {
            **meta, "steps": len(m.samples) or sel.steps, "rounds": m.rounds, "loadavg_1min": max(s["load"], default=None),
            "other_cores": max(s["other"], default=None),
            "host_speed": round(min(s["speed"]), 2) if s["speed"] else None}))
    _warn_host(rows, dist)
    if not dist.is_main:
        return 0
    return _report(a, rows, suite.name, dev_name, profile.name, dist.world, date)


def _prime_host_allocator(profile, dist: Dist) -> str:
    """On a CPU: warn where the C allocator differs from the one ``profile`` was calibrated with,
    put it in the state calibration's fresh-page fit assumed, and return its name."""
    from ..benches.stepops import prime_host_allocator

    active = host_alloc.active()
    if dist.is_main and active != host_alloc.recorded(profile.provenance):
        print(f"validate: warning: measuring with the {active!r} host allocator, profile "
              f"{profile.name!r} was calibrated with {host_alloc.recorded(profile.provenance)!r}: "
              "page-fault costs differ (calibration/host_alloc.py)", file=sys.stderr)
    prime_host_allocator()  # the allocator state calibration's fresh-page fit assumed
    return active


def _measure_rounds(a: argparse.Namespace, sel: _Selection, profile, dist: Dist, rounds: int,
                    ) -> tuple[dict[str, list[Measured]], dict[str, dict[str, list[float]]]]:
    """Measure every configuration once per round (one that failed or was skipped is not run
    again); returns each config's measurements per round and what the host did meanwhile: the
    1-minute load average (``load``), other processes' cores (``other``) and the host's speed
    against the calibration (``speed``, the main rank on a CPU only)."""
    configs = sel.configs
    got: dict[str, list[Measured]] = {cfg.id: [] for cfg in configs}
    seen: dict[str, dict[str, list[float]]] = {cfg.id: {"load": [], "other": [], "speed": []} for cfg in configs}
    for r, n_steps in enumerate(round_steps(sel.steps, rounds)):
        for i, cfg in enumerate(configs):
            if got[cfg.id] and got[cfg.id][-1].status != "ok":
                continue  # failed or skipped in an earlier round
            if dist.is_main and not a.json:
                where = f"round {r + 1}/{rounds} " if rounds > 1 else ""
                print(f"[{where}{i + 1}/{len(configs)}] {cfg.id} ...", file=sys.stderr, flush=True)
            if hasattr(os, "getloadavg"):
                seen[cfg.id]["load"].append(round(os.getloadavg()[0], 2))
            cpu = dist.device.type == "cpu" and dist.is_main  # one probe: ranks probing at once would slow each other
            speed0 = host_load.host_speed(profile) if cpu else None
            before = host_load.sample()
            got[cfg.id].append(measure(cfg, dist, sel.warmup, n_steps, min_s=sel.min_round_s))
            other = host_load.other_cores(before, host_load.sample())
            speed1 = host_load.host_speed(profile) if cpu else None
            if other is not None:
                seen[cfg.id]["other"].append(other)
            if speed0 is not None and speed1 is not None:
                seen[cfg.id]["speed"].append(min(speed0, speed1))
    return got, seen


def _warn_host(rows: list[dict[str, Any]], dist: Dist) -> None:
    """Warn (main rank) where other processes kept the CPU busy or the host ran slower than
    calibrated while configurations were measured."""
    busy = [r["other_cores"] for r in rows if host_load.is_busy(r["other_cores"])]
    if dist.is_main and busy and dist.device.type == "cpu":
        print(f"validate: warning: machine was busy (other processes used up to {max(busy):.2f} of "
              f"{os.cpu_count()} cores) during {len(busy)} configs; CPU step times are inflated "
              "and noisy (see the spread column)", file=sys.stderr)
    slow = [r["host_speed"] for r in rows if r["host_speed"] is not None and r["host_speed"] < host_load.SLOW_SHARE]
    if dist.is_main and slow:
        print(f"validate: warning: the host ran at down to {min(slow):.2f} of its calibrated speed (a probe GEMM and copy "
              f"before and after each config) during {len(slow)} configs; other guests share this machine, "
              "so those step times are slower than the profile describes (see the host_speed column)",
              file=sys.stderr)


def _report(a: argparse.Namespace, rows: list[dict[str, Any]], suite: str, dev_name: str, profile: str,
            world: int, date: str, draws: list[list[dict[str, Any]]] | None = None) -> int:
    """Print the rows and summary (table or JSON), merge them into ``--csv`` and store the
    residuals with ``--update-profile``; with ``draws`` (several measurements of the suite, pooled
    in ``rows``) also each draw's MAPE and its leave-one-draw-out interval coverage
    (:func:`draw_coverage`); returns the exit status."""
    summary = summarize(rows)
    if draws:
        each = [summarize(d) for d in draws]
        summary["draws"] = [{"n": e["n"], "mape_pct": e["mape_pct"], "coverage": c}
                            for e, c in zip(each, draw_coverage(draws), strict=True)]
    if a.json:
        print(json.dumps({"suite": suite, "device": dev_name, "profile": profile, "world": world, "date": date,
                          "rows": rows, **summary}, indent=2))
    else:
        print(format_table(rows, summary))
        if draws:
            print(f"pooled over {len(draws)} draws; each draw's MAPE and the share of its rows inside the "
                  f"{100 * LEVEL:.0f}% interval from the other draws' residuals: " + ", ".join(
                      ("—" if d["mape_pct"] is None else f"{d['mape_pct']:.1f}%") + " / "
                      + ("—" if d["coverage"] is None else f"{100 * d['coverage']:.0f}%")
                      for d in summary["draws"]))
    if a.csv:
        merge_csv(a.csv, rows)
        if not a.json:
            print(f"merged {len(rows)} rows into {a.csv}")
    if a.update_profile:
        source = (f"validate {suite} on {dev_name} {str(date)[:10]}"
                  + (f", {len(draws)} draws pooled ({', '.join(sorted({str(d[0]['date'])[:16] for d in draws}))})"
                     if draws else ""))
        update_profile(a.profile, summary, source)
        if not a.json:
            print(f"wrote validation ({summary['n']} residuals, MAPE {summary['mape_pct']:.1f}%) into {a.profile}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``validate`` console script; returns the exit status."""
    from_cli = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli("validate", lambda: run(build_parser().parse_args(argv), argv, relaunch=from_cli))
