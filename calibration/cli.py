"""``calibrate``: measure this device with torch microbenchmarks and write a profile.

Exit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted (everything
measured so far is kept; rerun with ``--resume``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fnmatch
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from simulator.core.atomic import check_writable
from simulator.core.errors import UsageError, UsageParser, run_cli

from . import host_alloc, host_load
from .host_alloc import ALLOCATORS

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: seconds over which calibrate samples other processes' CPU use before it starts
QUIET_CHECK_S = 0.5
MODES = {  # budget per point (s), per-call cap (s), min timed calls, torch.compile
    "tiny": (0.01, 0.25, 2, False),
    "quick": (0.08, 0.35, 3, True),
    "thorough": (0.5, 10.0, 3, True),
}


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(prog="calibrate", description=(
        "Measure GEMMs, attention, bandwidth-bound ops, launch overhead, optimizer steps, "
        "host copies and collectives with torch, and fit a simulator profile."))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="small grid with repeats (about 3 min on a quiet 2-core CPU)")
    mode.add_argument("--thorough", action="store_true", help="full grid (default)")
    mode.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # tests only
    p.add_argument("--out", type=Path, help="profile JSON to write "
                   "(default: calibration/profiles/<device-slug>.json); raw measurements go "
                   "next to it as <name>.measurements.json")
    p.add_argument("--resume", action="store_true",
                   help="continue an earlier run: skip benchmarks already in the measurements file")
    p.add_argument("--force", action="store_true",
                   help="start over even if --out exists (old files copied to timestamped backups; "
                        "the old profile stays in place until the new one is complete)")
    p.add_argument("--refit", action="store_true",
                   help="measure nothing: refit the profile from the existing measurements file")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--nproc", type=int, help="processes for collective benchmarks via torchrun "
                   "(default: number of CUDA devices; on CPU none unless --collectives)")
    p.add_argument("--collectives", action="store_true",
                   help="run collectives on CPU too (gloo, --nproc default 2)")
    p.add_argument("--budget", type=float, help="timing budget per benchmark point, seconds")
    p.add_argument("--rounds", type=int, help="times each GEMM, attention, dispatch, optimizer, loss, "
                   "embedding and cast point is timed, in rounds a whole pass apart; the median round is "
                   f"kept (default: {host_load.CPU_ROUNDS} on a CPU, whose shared host changes speed for seconds "
                   "at a time; 1 on a GPU)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile benchmarks")
    p.add_argument("--for-model", metavar="MODEL", help="also measure this model's shapes (preset "
                   "name, e.g. pythia-1b): its layer and LM-head GEMMs, head size and sequence, "
                   "vocabulary and parameter tensors")
    p.add_argument("--allocator", choices=ALLOCATORS, default=ALLOCATORS[0],
                   help="CPU: 'keep' has glibc keep freed memory, as tuned CPU training does, so steps "
                        "re-fault nothing; 'default' leaves glibc as shipped and fits its page-fault "
                        "cost (calibration/host_alloc.py; default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--only", help=argparse.SUPPRESS)  # comma-separated groups or key globs
    runs = p.add_argument_group("fit to end-to-end runs instead of measuring (docs/calibrate_from_runs.md)")
    runs.add_argument("--from-runs", metavar="FILE",
                      help="CSV of past training runs (model, gpus, strategy, measured tokens/s): fit a few "
                           "named, bounded profile parameters to them; measures nothing")
    runs.add_argument("--base-profile", metavar="GPU|FILE",
                      help="with --from-runs: starting profile, a catalog GPU (its microbenchmark profile) or "
                           "a profile JSON (default: the GPU of the first run)")
    runs.add_argument("--params", help="with --from-runs: comma-separated parameters to fit (default: "
                                       "tensor_sustained, attention_scale, collective_busbw_eff, "
                                       "collective_overlap, collective_hop_latency_us)")
    runs.add_argument("--no-cv", action="store_true",
                      help="with --from-runs: skip leave-one-run-out / leave-one-source-out refits")
    return p


def _from_runs(a: argparse.Namespace) -> int:
    from . import from_runs

    if a.out is not None and a.out.suffix != ".json":
        raise UsageError(f"--out must end in .json, got {str(a.out)!r}")
    base = a.base_profile
    if base is None:
        from simulator.answer import runs

        table = runs.simulable(runs.load_runs(a.from_runs))
        if table.empty:
            raise UsageError(f"{a.from_runs!r}: no run can be simulated; see docs/calibrate_from_runs.md")
        base = str(table["gpu"].iloc[0])
    if a.out is not None:
        check_writable(a.out, "--out")
    with writing(a.out) if a.out is not None else contextlib.nullcontext():
        return from_runs.main(a.from_runs, base, a.out, a.params, not a.no_cv, print)


def lock_path(out: Path) -> Path:
    """``profiles/x.json`` -> ``profiles/x.json.lock``: held while a calibrate writes ``out``."""
    return out.with_name(out.name + ".lock")


@contextlib.contextmanager
def writing(out: Path):
    """Hold an exclusive lock on ``out`` (:func:`lock_path`, ``fcntl.flock``) for the block, so two
    calibrate runs never write one profile and its measurements at once (the later save would
    drop the other's measurements); a second run is a UsageError. The lock file is removed on
    exit; a lock taken on a file another run has just removed is taken again on the new one."""
    import fcntl

    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create folder {str(path.parent)!r}: {exc.strerror}") from None
    while True:
        fh = open(path, "a")  # held open, and locked, for the block
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise UsageError(f"another calibrate is writing {str(out)!r} (lock {path.name}); wait for it to "
                             "finish or choose another --out") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()
    try:
        yield
    finally:
        try:
            path.unlink()
        finally:
            fh.close()


def _mode(a: argparse.Namespace) -> str:
    return "tiny" if a.tiny else "quick" if a.quick else "thorough"


def _selected(key: str, group: str, only: list[str] | None) -> bool:
    return not only or any(group == pat or fnmatch.fnmatch(key, pat) for pat in only)


def _backup(path: Path, stamp: str) -> Path | None:
    """Copy ``path`` to a timestamped backup; the original stays in place (a profile is replaced
    atomically only once the new one is complete, so a killed run never leaves none)."""
    if not path.exists():
        return None
    import shutil

    from simulator.core.atomic import write_atomic

    dst = path.with_name(f"{path.stem}.{stamp}.bak{path.suffix}")
    write_atomic(dst, lambda tmp: shutil.copy2(path, tmp))
    return dst


def _prepare_outputs(out: Path, meas: Path, a: argparse.Namespace, err) -> bool:
    """Apply the overwrite policy; return True if an existing store should be resumed."""
    if a.resume and a.force:
        raise UsageError("--resume and --force exclude each other")
    if a.refit:
        if a.force:
            raise UsageError("--refit and --force exclude each other")
        if not meas.exists():
            raise UsageError(f"--refit: no measurements file {str(meas)!r}")
        return True
    exists = out.exists() or meas.exists()
    if not exists:
        return False
    if a.resume:
        if not meas.exists():
            raise UsageError(f"--resume: no measurements file {str(meas)!r} next to {str(out)!r}")
        return True
    if a.force:
        stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S")
        for p in (out, meas):
            dst = _backup(p, stamp)
            if dst:
                err(f"kept previous {p.name} as {dst.name}")
        return False
    raise UsageError(f"{str(out)!r} or its measurements already exist; pass --resume to continue "
                     "that calibration or --force to start over (old files are kept as backups)")


def _collectives(a, dev, ctx, store, only, err) -> None:
    import torch

    from . import collectives as coll

    nproc = a.nproc
    if nproc is None:
        nproc = torch.cuda.device_count() if dev.kind == "cuda" else (2 if a.collectives else 0)
    if nproc < 2:
        if a.collectives or a.nproc is not None:
            err("collectives skipped: need --nproc >= 2")
        return
    if dev.kind == "cuda" and nproc > torch.cuda.device_count():
        raise UsageError(f"--nproc {nproc} exceeds the {torch.cuda.device_count()} CUDA devices")
    key = f"collectives/{'nccl' if dev.kind == 'cuda' else 'gloo'}/n{nproc}"
    if not _selected(key, "collectives", only) or (a.resume and store.done(key)):
        return
    sizes = coll.QUICK_SIZES if ctx.settings.mode != "thorough" else coll.THOROUGH_SIZES
    if ctx.settings.mode == "tiny":
        sizes = [1 << 10, 1 << 16]
    err(f"collectives: torchrun --nproc-per-node {nproc} ({len(sizes)} sizes x 3 ops)")
    t0 = time.perf_counter()
    try:
        rec = coll.launch(nproc, sizes, budget_s=max(0.02, ctx.settings.budget_s))
    except RuntimeError as exc:
        rec = {"status": "error", "reason": str(exc)}
        err(f"warning: {exc}")
    store.add(key, {"group": "collectives", "params": {"nproc": nproc, "sizes": sizes}, **rec,
                    "wall_s": time.perf_counter() - t0})


def run(a: argparse.Namespace, argv: list[str], relaunch: bool = False) -> int:
    """The calibration itself (after argument parsing); ``relaunch``: started from the command
    line, so it may start itself again with the host allocator asked for (:mod:`.host_alloc`)."""
    if a.from_runs is not None:
        return _from_runs(a)
    for flag, val in (("--base-profile", a.base_profile), ("--params", a.params)):
        if val is not None:
            raise UsageError(f"{flag} needs --from-runs FILE")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("calibrate: error: torch is required: pip install 'pretrain-simulator[calibration]'",
              file=sys.stderr)
        return 1
    from rich.console import Console

    from .benches import plan
    from .benches.base import RunContext, Settings
    from .build import build_profile
    from .device import detect, from_description, same_device
    from .runner import run_benches
    from .store import MeasurementStore, measurements_path, now, round_spread

    if a.nproc is not None and a.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {a.nproc}")
    if a.budget is not None and not (0 < a.budget <= 60):
        raise UsageError(f"--budget must be in (0, 60] seconds, got {a.budget}")
    host_load.check_rounds(a.rounds)
    errc = Console(stderr=True, highlight=False)

    def err(msg: str) -> None:
        errc.print(msg, markup=False, soft_wrap=True)

    t_start = time.perf_counter()
    dev = detect(a.device)
    if relaunch and dev.kind == "cpu" and not a.refit:
        host_alloc.relaunch_for(a.allocator)  # returns only where nothing needs to change
    mode = _mode(a)
    budget, cap, min_runs, compile_ = MODES[mode]
    if dev.kind == "cpu" and mode == "thorough":
        cap = 2.0  # a CPU would spend hours on GPU-sized shapes
    model = None
    if a.for_model:
        from simulator.model.presets import get_model

        model = get_model(a.for_model)  # UsageError naming the valid presets
    rounds = a.rounds or (host_load.default_rounds(dev.kind) if mode != "tiny" else 1)
    settings = Settings(mode, a.budget or budget, cap if not a.budget else max(cap, 4 * a.budget),
                        compile_ and not a.no_compile, min_runs, model, rounds)
    out = a.out or PROFILE_DIR / f"{dev.slug}.json"
    if out.suffix != ".json":
        raise UsageError(f"--out must end in .json, got {str(out)!r}")
    only = [s.strip() for s in a.only.split(",") if s.strip()] if a.only else None
    ctx = RunContext(dev, settings)
    planned = [] if a.refit else plan(ctx)
    benches = [b for b in planned if _selected(b.key, b.group, only)]
    if only and not a.refit:  # before any file is written
        groups = sorted({b.group for b in planned} | {"collectives"})
        unmatched = [p for p in only if p not in groups and not any(_selected(b.key, b.group, [p]) for b in benches)]
        if unmatched:
            raise UsageError(f"--only {','.join(unmatched)!r} matches no benchmark; groups: {', '.join(groups)} "
                             "(or key globs such as 'gemm/fp32/*')")
    meas = measurements_path(out)
    check_writable(out, "--out")
    check_writable(meas, "--out: measurements")
    with writing(out):
        command = "calibrate " + " ".join(shlex.quote(x) for x in argv)
        run_info = {"started": now(), "command": command, "mode": "refit" if a.refit else mode}
        resume = _prepare_outputs(out, meas, a, err)
        if hasattr(os, "getloadavg"):
            run_info["loadavg_1min"] = round(os.getloadavg()[0], 2)
        if not a.refit and dev.kind == "cpu":
            run_info["host_allocator"] = host_alloc.active()
            if run_info["host_allocator"] != a.allocator:
                err(f"warning: --allocator {a.allocator}: measuring with the {run_info['host_allocator']!r} host "
                    "allocator (not glibc, or calibrate was not started from the command line)")
            # what other processes use now (the load average lags a minute)
            before = host_load.sample()
            time.sleep(QUIET_CHECK_S)
            other = host_load.other_cores(before, host_load.sample())
            if host_load.is_busy(other):
                err(f"warning: machine is busy (other processes use {other:.2f} of {os.cpu_count()} cores); "
                    "CPU timings will be inflated")
        if resume:
            store = MeasurementStore.load(meas)
            if a.refit and not same_device(store.data.get("device", {}), dev):
                # another device's measurements: the profile is that device's, fitted here without probing it
                dev = from_description(store.data.get("device", {}))
                err(f"refitting measurements taken on {dev.name} (host {dev.host}), not on this device")
            store.resume(dev.describe() if not a.refit else store.data["device"], run_info)
        else:
            store = MeasurementStore.create(meas, dev.describe(), run_info)
        if a.refit:
            err(f"refitting {out} from {meas.name} ({len(store.results)} measurements)")
        else:
            err(f"calibrating {dev.name} [{mode}]: {len(benches)} benchmarks -> {out}")
        console = None if (a.no_progress or not benches) else errc
        cpu0 = host_load.sample()
        probe0 = host_load.probe_pair() if dev.kind == "cpu" and benches else None
        summary = run_benches(benches, ctx, store, console, resume=a.resume)
        if not a.refit:
            _collectives(a, dev, ctx, store, only, err)
            other = host_load.other_cores(cpu0, host_load.sample())
            store.data["runs"][-1]["other_cores"] = other
            if probe0 is not None:
                probe1 = host_load.probe_pair()
                moved = host_load.drift(probe0, probe1)
                store.data["runs"][-1]["host_probe_s"] = {"start": list(probe0), "end": list(probe1)}
                if moved > host_load.DRIFT_FACTOR:
                    err(f"warning: the host changed speed while calibrating (probe GEMM {probe0[0] * 1e3:.2f} -> "
                        f"{probe1[0] * 1e3:.2f} ms, copy {probe0[1] * 1e3:.1f} -> {probe1[1] * 1e3:.1f} ms): "
                        "the profile mixes both; calibrate again and compare")
            if dev.kind == "cpu" and host_load.is_busy(other):
                err(f"warning: other processes used {other:.2f} of {os.cpu_count()} cores while calibrating; "
                    "CPU timings are inflated (calibrate again on a quiet machine)")
        runs = [r for r in store.data["runs"] if r.get("mode") != "refit"]
        notes = [f"measured in {len(runs)} run(s): " + "; ".join(
            f"{r.get('mode')} {r.get('started', '')[:16]}"
            + (f" (load average {r['loadavg_1min']} on {os.cpu_count()} cores"
               + (f", other processes {r['other_cores']} cores" if r.get("other_cores") is not None else "") + ")"
               if "loadavg_1min" in r and dev.kind == "cpu" else "") for r in runs)]
        measured_by = "; ".join(dict.fromkeys(r.get("command", "") for r in runs)) or command
        if a.refit:
            measured_by += f" (refitted by {command})"
        allocs = {r.get("host_allocator", "default") for r in runs} if dev.kind == "cpu" else set()
        allocator = None if not allocs else allocs.pop() if len(allocs) == 1 else "mixed"
        if allocator == "mixed":
            err("warning: the measurements were taken with different --allocator settings; calibrate again "
                "with --force")
        built = build_profile(dev, store.results, measured_by, extra_sources=notes, host_allocator=allocator)
        from .build import fit_spread

        spread = fit_spread(dev, store.results, measured_by, built.profile)
        built.profile = built.profile.model_copy(update={"spread": spread})
        probes = store.data["runs"][-1].get("host_probe_s") if not a.refit else None
        level = host_load.calibrated_level(built.profile, [probes["start"][0], probes["end"][0]]) if probes else None
        if level is not None:
            store.data["runs"][-1]["host_level"] = round(level, 3)
            if max(level, 1.0 / level) > host_load.DRIFT_FACTOR:
                built.warnings.append(
                    f"the fitted profile predicts the probe GEMM at {level:.2f}x the time it took at this calibration's "
                    f"start and end ({probes['start'][0] * 1e3:.1f} and {probes['end'][0] * 1e3:.1f} ms): its benchmarks "
                    f"caught the host {'faster' if level < 1 else 'slower'} than the probes read, and its predictions "
                    "are off by that much while the host runs as the probes read (validate's host_speed reads about "
                    f"{level:.2f}); calibrate again and compare")
        from simulator.hardware.profile import save_profile

        built.profile = built.profile.model_copy(update={"fit_warnings": list(built.warnings)})
        save_profile(built.profile, out)
        wall = time.perf_counter() - t_start
        store.data["runs"][-1].update(finished=now(), wall_s=round(wall, 1))
        spread_line = round_spread(store.results)
        if spread_line:
            store.data["runs"][-1]["round_spread"] = spread_line
        store.set_fits({**built.fits, "warnings": built.warnings})
        _report(built, summary, out, meas, wall, spread_line)
        return 0


def _report(built, summary, out: Path, meas: Path, wall: float, spread_line: str | None) -> None:
    p = built.profile
    print(f"wrote {out} ({meas.name}) in {wall:.0f} s: {summary.measured} measured, "
          + (f"{summary.repeated} repeated rounds, " if summary.repeated else "")
          + f"{summary.resumed} resumed, {summary.unsupported} unsupported, "
          f"{summary.too_slow} skipped as too slow, {len(summary.errors)} errors")
    if spread_line:
        print(f"  {spread_line}")
    peaks = ", ".join(f"{k} {v:.4g}" for k, v in p.device.peak_tflops.items())
    print(f"  peaks TFLOPS: {peaks}; memory bandwidth {p.device.mem_bw_gbs:.1f} GB/s")
    for prec, g in p.gemm.items():
        print(f"  gemm {prec}: e_max {g.e_max:.3f}, x_half {g.x_half:.1f}")
    at = p.attention
    print(f"  attention: flash fwd {at.flash_fwd:.3f} bwd {at.flash_bwd:.3f}, mem_efficient fwd "
          f"{at.mem_efficient_fwd:.3f} bwd {at.mem_efficient_bwd:.3f}")
    print(f"  memory_bw_eff {p.memory_bw_eff:.3f}; launch {p.launch_overhead_us:.2f} us, "
          f"compiled {p.compiled_launch_overhead_us:.2f} us"
          + (f"; eager training passes +{p.train_fwd_kernel_us:.1f} us (forward) +{p.train_bwd_kernel_us or 0:.1f} us "
             "(backward) per kernel" if p.train_fwd_kernel_us is not None else "")
          + (f" (under autocast +{p.train_fwd_kernel_us_amp:.1f} / +{p.train_bwd_kernel_us_amp or 0:.1f} us)"
             if p.train_fwd_kernel_us_amp is not None else ""))
    opt = ", ".join(f"{k} {v:.3f}" for k, v in p.optimizer_bw_eff.items())
    print(f"  optimizer_bw_eff: {opt}; host->device {p.host_to_device_gbs:.1f} GB/s; "
          f"CPU Adam {p.cpu_adam_gparams_per_s:.3f} Gparams/s")
    for what, sec in (("input-gradient", p.gemm_bwd), ("weight-gradient", p.gemm_wgrad)):
        if sec:
            print(f"  gemm {what} layout: " + ", ".join(
                f"{k} e_max {g.e_max:.3f} x_half {g.x_half:.1f}"
                + (f" operand_half {g.operand_half_mib:.3g} MiB floor {g.operand_floor:.3f}" if g.operand_half_mib else "")
                for k, g in sec.items()))
    if p.bw_eff_ops:
        print("  bandwidth per op class: " + ", ".join(f"{k} {v:.3f}" for k, v in p.bw_eff_ops.items()))
    if p.provenance.host_allocator:
        print(f"  host allocator: {p.provenance.host_allocator} (calibration/host_alloc.py)")
    if p.fresh_memory:
        print(f"  fresh host pages: {p.fresh_memory.gbs:.2f} GB/s; heap keeps "
              f"{p.fresh_memory.keep_bytes / 2**20:.1f} MiB per step")
    if p.optimizer_tensor_us is not None:
        print(f"  optimizer: {p.optimizer_tensor_us:.1f} us per parameter tensor (foreach)")
    if p.spread:
        worst = sorted(p.spread.items(), key=lambda kv: -kv[1])[:4]
        print("  spread (relative IQR over resampled timings), largest: "
              + ", ".join(f"{k} {v:.1%}" for k, v in worst))
    for link, c in p.collectives.items():
        print(f"  collectives[{link}]: alpha {c.alpha_us:.1f} us, busbw {c.busbw_gbs:.2f} GB/s")
    for w in built.warnings:
        print(f"  warning: {w}")
    for e in summary.errors[:5]:
        print(f"  error: {e}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``calibrate`` console script; returns the exit status."""
    from_cli = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    prev_term = _on_sigterm()
    try:
        return run_cli("calibrate", lambda: run(build_parser().parse_args(argv), argv, relaunch=from_cli),
                       interrupted="interrupted; measurements so far are saved — rerun with --resume")
    finally:
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)


def _on_sigterm():
    """Treat SIGTERM like Ctrl-C (clean message, measurements kept); returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
