"""Validation files: merge result rows into a CSV, store residuals in a profile, and read the
measured steps of an earlier CSV back."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from simulator.core.errors import UsageError

from .measuring import Measured
from .report import CSV_FIELDS, as_number


def merge_csv(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Merge ``rows`` into the CSV at ``path`` by ``id`` (new rows replace same-id rows, others
    are kept) and write it atomically."""
    from simulator.core.atomic import write_text_atomic

    p = Path(path)
    old: list[dict[str, Any]] = []
    cols = list(CSV_FIELDS)
    if p.exists():
        try:
            with p.open(newline="") as fh:
                reader = csv.DictReader(fh)
                old = list(reader)
                cols += [c for c in (reader.fieldnames or []) if c not in cols]
        except (OSError, csv.Error) as exc:
            raise UsageError(f"cannot read existing CSV {str(p)!r} to merge into: {exc}") from None
        if old and "id" not in old[0]:
            raise UsageError(f"{str(p)!r} has no 'id' column; refusing to overwrite it")
    new_ids = {r["id"] for r in rows}
    merged = [r for r in old if r.get("id") not in new_ids] + rows
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    wr.writeheader()
    for r in merged:
        wr.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    return write_text_atomic(p, buf.getvalue())


def update_profile(path: str | os.PathLike, summary: dict[str, Any], source: str) -> None:
    """Write the residuals into the profile's ``validation`` field (atomically, validated)."""
    from simulator.hardware.profile import ValidationSummary, load_profile, save_profile

    prof = load_profile(path)
    if not summary["n"]:
        raise UsageError("--update-profile: no configuration has both a prediction and a measurement")
    val = ValidationSummary(source=source, n=summary["n"], mape=summary["mape_pct"],
                            log_ratio_residuals=[float(x) for x in summary["log_ratio_residuals"]])
    save_profile(prof.model_copy(update={"validation": val}), path)


def read_measured(path: str | os.PathLike) -> dict[str, tuple[Measured, dict[str, Any]]]:
    """Measured steps of a ``--csv`` file by config id (single-process rows): the times, the peak
    memory (where measured) and the
    row's own metadata (steps, warm-up, device, date, torch version, load average, other processes'
    CPU use, the host's speed against the calibration)."""
    p = Path(path)
    try:
        with p.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise UsageError(f"--measured: cannot read {str(p)!r}: {exc}") from None
    if rows and "measured_step_s" not in rows[0]:
        raise UsageError(f"--measured: {str(p)!r} is not a validate CSV (no 'measured_step_s' column)")
    out = {}
    for r in rows:
        if r.get("world", "1") not in ("1", "") or r.get("status") != "ok":
            continue
        m = Measured("ok", "", as_number(r.get("measured_step_s")), as_number(r.get("measured_fwd_s")),
                     as_number(r.get("measured_bwd_s")), as_number(r.get("measured_rec_s")), as_number(r.get("measured_opt_s")),
                     as_number(r.get("compile_s")), as_number(r.get("measured_min_s")), as_number(r.get("spread")),
                     mem_gib=as_number(r.get("measured_mem_gib")), reserved_gib=as_number(r.get("measured_reserved_gib")))
        meta = {k: r.get(k) for k in ("steps", "warmup", "rounds", "device", "suite", "date", "torch",
                                      "loadavg_1min", "other_cores", "host_speed")}
        out[r["id"]] = (m, meta)
    return out
