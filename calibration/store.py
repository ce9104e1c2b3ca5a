"""Raw measurements file next to the profile: written atomically after every benchmark.

Layout (JSON): ``{"format", "version", "device", "runs": [...], "results": {key: record},
"fits": {...}}``. A killed run loses nothing already measured; ``--resume`` reloads it
and skips keys whose records are final ('ok' or 'unsupported'; 'error' is retried) and hold
every timed round the run asks for.

A bench timed in several rounds (:func:`merge_rounds`) keeps each round's record under
``rounds``; its own fields are those of the median round, so every reader of a record sees one
consistent measurement.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

from simulator.core.errors import UsageError
from simulator.core.userfiles import parse_json
from simulator.hardware.profile import write_json_atomic

FORMAT = "pretrain-simulator calibration measurements"
VERSION = 1
FINAL = ("ok", "unsupported")


def measurements_path(out: Path) -> Path:
    """``profiles/x.json`` -> ``profiles/x.measurements.json``."""
    return out.with_name(out.stem + ".measurements.json")


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class MeasurementStore:
    """The measurements of one calibration (possibly over several resumed runs)."""

    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    @classmethod
    def create(cls, path: Path, device: dict, run: dict) -> MeasurementStore:
        """A new, empty store (written immediately)."""
        store = cls(path, {"format": FORMAT, "version": VERSION, "device": device,
                           "runs": [run], "results": {}, "fits": {}})
        store.save()
        return store

    @classmethod
    def load(cls, path: Path) -> MeasurementStore:
        """Read an existing measurements file; UsageError if unreadable or foreign."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read measurements {str(path)!r}: {exc.strerror or exc}") from None
        data = parse_json(text, f"measurements {str(path)!r}")
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
                data.get("results"), dict):
            raise UsageError(f"{str(path)!r} is not a calibration measurements file")
        if data.get("version") != VERSION:
            raise UsageError(f"measurements {str(path)!r} has version {data.get('version')!r}; "
                             f"this calibrate reads version {VERSION}")
        for key, rec in data["results"].items():
            check_record(rec, f"measurements {str(path)!r}, {key!r}")
        data.setdefault("runs", [])
        data.setdefault("fits", {})
        return cls(path, data)

    def resume(self, device: dict, run: dict) -> None:
        """Continue this store on ``device``; refuse if it was measured on another device."""
        old = self.data.get("device", {})
        for key in ("kind", "name"):
            if old.get(key) != device.get(key):
                raise UsageError(f"cannot resume {str(self.path)!r}: it was measured on "
                                 f"{old.get('name')!r}, this device is {device.get('name')!r}")
        self.data["runs"].append(run)
        self.save()

    @property
    def results(self) -> dict[str, dict]:
        return self.data["results"]

    def held(self, key: str) -> int | None:
        """Timed rounds of ``key`` already stored: 0 without a final record (an 'error' is
        retried), None for a final record that is not 'ok' (nothing to time again)."""
        rec = self.results.get(key)
        if rec is None or rec.get("status") not in FINAL:
            return 0
        return rounds_of(rec) if rec["status"] == "ok" else None

    def done(self, key: str, rounds: int = 1) -> bool:
        """True if ``key`` needs no more of ``rounds`` timed rounds (skipped on resume)."""
        held = self.held(key)
        return held is None or held >= rounds

    def add_round(self, key: str, record: dict) -> None:
        """Store one more timed round of ``key`` (:func:`merge_rounds` with what is stored) and
        write the file atomically. A round that is not 'ok' replaces nothing already measured."""
        old = self.results.get(key)
        if old is not None and old.get("status") == "ok":
            if record.get("status") == "ok":
                record = merge_rounds([*old.get("rounds", [old]), record])
            else:
                record = old
        self.add(key, record)

    def add(self, key: str, record: dict) -> None:
        """Store one benchmark's record and write the file atomically."""
        self.results[key] = record
        self.save()

    def set_fits(self, fits: dict) -> None:
        self.data["fits"] = fits
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)


def check_record(rec: object, where: str) -> None:
    """A stored record: a mapping, and where it is 'ok', it and each of its rounds hold a
    positive, finite ``time_s`` (seconds); else a UsageError naming ``where`` and the value (a
    hand-edited or damaged file, never a measurement)."""
    if not isinstance(rec, dict):
        raise UsageError(f"{where}: expected a record (a JSON object), got {type(rec).__name__}")
    rounds = rec.get("rounds") or []
    for r in [rec, *(rounds if isinstance(rounds, list) else [rounds])]:
        if not isinstance(r, dict):
            raise UsageError(f"{where}: a round is not a record (a JSON object)")
        t = r.get("time_s")
        if r.get("status") == "ok" and not (isinstance(t, int | float) and not isinstance(t, bool)
                                            and math.isfinite(t) and t > 0):
            raise UsageError(f"{where}: time_s must be a positive, finite number of seconds, got {t!r}; "
                             "delete that record and --resume measures it again")


def rounds_of(rec: dict) -> int:
    """Timed rounds behind an 'ok' record (1 for a record measured once)."""
    return len(rec.get("rounds") or [rec])


def merge_rounds(rounds: list[dict]) -> dict:
    """One record from the 'ok' records of the same bench timed in separate rounds: the round
    whose ``time_s`` is the (lower) median, with every round kept under ``rounds``. A shared
    host's speed moves by 20-50% for a second or more at a time: rounds minutes apart are
    independent draws of it, and their median drops the one a slow spell hit, which the
    median of calls within one round (a tenth of a second) cannot."""
    flat = [{k: v for k, v in r.items() if k != "rounds"} for r in rounds]
    if len(flat) == 1:
        return flat[0]
    order = sorted(range(len(flat)), key=lambda i: flat[i]["time_s"])
    med = dict(flat[order[(len(flat) - 1) // 2]])
    med["rounds"] = flat
    return med


def round_spread(results: dict[str, dict]) -> str | None:
    """One line on how far the rounds of each bench timed more than once lay apart (slowest
    round's ``time_s`` over the fastest), or None where no bench has rounds."""
    times = {key: [r["time_s"] for r in rec["rounds"]] for key, rec in results.items()
             if rec.get("status") == "ok" and rec.get("rounds")}
    ratios = sorted((max(ts) / min(ts), key) for key, ts in times.items() if min(ts) > 0)
    if not ratios:
        return None
    counts = sorted({len(times[k]) for _, k in ratios})
    mid = ratios[(len(ratios) - 1) // 2][0]
    over = sum(r > 1.2 for r, _ in ratios)
    return (f"rounds: {len(ratios)} benchmarks timed {'/'.join(map(str, counts))} times; slowest over fastest "
            f"round: median x{mid:.2f}, {over} beyond x1.2, largest x{ratios[-1][0]:.2f} ({ratios[-1][1]}); "
            "each keeps its median round")
