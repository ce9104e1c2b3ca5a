"""Collective benchmarks under ``torchrun``: all_reduce, all_gather, reduce_scatter.

Run as ``torchrun --standalone --nproc-per-node N -m calibration.collectives --out F``
(gloo on CPU, NCCL on CUDA). Every rank times the same sweep; the per-size time is the
slowest rank's median, and rank 0 writes the JSON result atomically. ``calibrate``
launches this through :func:`launch` when ``--nproc`` > 1.

Sizes follow the nccl-tests convention: ``bytes`` is the full buffer (all_reduce input,
all_gather output, reduce_scatter input). Bus bytes, what the alpha-beta fit uses:
all_reduce 2(n-1)/n x bytes, all_gather and reduce_scatter (n-1)/n x bytes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter")
QUICK_SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]
THOROUGH_SIZES = [1 << s for s in range(10, 29, 2)]


def bus_bytes(op: str, nbytes: float, world: int) -> float:
    """Bytes each rank moves over the bus for ``op`` on an ``nbytes`` buffer (ring)."""
    if world <= 1:
        return 0.0
    factor = 2.0 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
    return factor * nbytes


def _run_op(op: str, nbytes: int, world: int, device):
    """Allocate buffers and return a closure doing one ``op`` of ``nbytes`` (fp32)."""
    import torch
    import torch.distributed as dist

    n = max(world, nbytes // 4 // world * world)
    if op == "all_reduce":
        buf = torch.ones(n, device=device)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":  # torch >= 2.13 renames *_into_tensor / *_tensor to *_single
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        out = torch.empty(n, device=device)
        inp = torch.ones(n // world, device=device)
        return lambda: gather(out, inp)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    inp = torch.ones(n, device=device)
    out = torch.empty(n // world, device=device)
    return lambda: scatter(out, inp)


def worker(out: Path, sizes: list[int], ops: list[str], budget_s: float, repeats: int) -> int:
    """Body of each torchrun rank."""
    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize if use_cuda else (lambda: None)
    points, unsupported = [], {}
    try:
        for op in ops:
            for nbytes in sizes:
                try:
                    fn = _run_op(op, nbytes, world, device)
                    for _ in range(3):  # warm-up: connections, buffers
                        fn()
                except (RuntimeError, NotImplementedError) as exc:
                    unsupported[op] = str(exc).strip().splitlines()[0][:200] if str(exc) else type(exc).__name__
                    break
                sync()
                # iterations: rank 0 decides from a warm call, everyone uses the same count
                t0 = time.perf_counter()
                fn()
                sync()
                one = time.perf_counter() - t0
                iters = torch.tensor([max(1, min(1000, int(budget_s / repeats / max(one, 1e-6))))],
                                     dtype=torch.int64, device=device)
                dist.broadcast(iters, 0)
                k = int(iters.item())
                samples = []
                for _ in range(repeats):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(k):
                        fn()
                    sync()
                    samples.append((time.perf_counter() - t0) / k)
                samples.sort()
                med = torch.tensor([samples[len(samples) // 2]], dtype=torch.float64, device=device)
                dist.all_reduce(med, op=dist.ReduceOp.MAX)
                points.append({"op": op, "bytes": int(max(world, nbytes // 4 // world * world) * 4),
                               "time_s": float(med.item()), "iters": k, "repeats": repeats})
    finally:
        dist.barrier()
        if rank == 0:
            from simulator.hardware.profile import write_json_atomic

            write_json_atomic(out, {"status": "ok", "backend": backend, "world_size": world,
                                    "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
                                    "ops_ok": sorted({p["op"] for p in points}),
                                    "unsupported": unsupported, "points": points})
        dist.destroy_process_group()
    return 0


def launch(nproc: int, sizes: list[int], budget_s: float, timeout_s: float = 600.0,
           ops: list[str] | None = None, repeats: int = 3) -> dict:
    """Run :func:`worker` under ``torchrun`` with ``nproc`` processes; return rank 0's record.

    Raises RuntimeError (one line) if torchrun fails or times out.
    """
    with tempfile.TemporaryDirectory(prefix="calib-coll-") as tmp:
        out = Path(tmp) / "collectives.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "calibration.collectives", "--out", str(out),
               "--sizes", ",".join(str(s) for s in sizes), "--ops", ",".join(ops or OPS),
               "--budget", str(budget_s), "--repeats", str(repeats)]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"torchrun collectives timed out after {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            msg = next((ln for ln in reversed(tail) if "Error" in ln), tail[-1] if tail else "")
            raise RuntimeError(f"torchrun collectives failed (exit {proc.returncode}): {msg[:300]}")
        import json

        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.collectives",
                                description="collective microbenchmarks; run under torchrun")
    p.add_argument("--out", required=True, type=Path, help="JSON file rank 0 writes")
    p.add_argument("--sizes", default=",".join(str(s) for s in QUICK_SIZES),
                   help="comma-separated buffer sizes in bytes")
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
    p.add_argument("--budget", type=float, default=0.1, help="seconds per (op, size), all repeats")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per point (median)")
    a = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("error: run under torchrun, e.g. torchrun --standalone --nproc-per-node 2 "
              "-m calibration.collectives --out coll.json", file=sys.stderr)
        return 2
    try:
        sizes = [int(s) for s in a.sizes.split(",") if s]
    except ValueError:
        print(f"error: --sizes must be integers (bytes), got {a.sizes!r}", file=sys.stderr)
        return 2
    ops = [o for o in a.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        print(f"error: unknown op {bad[0]!r}; valid: {', '.join(OPS)}", file=sys.stderr)
        return 2
    return worker(a.out, sizes, ops, a.budget, max(1, a.repeats))


if __name__ == "__main__":
    sys.exit(main())
