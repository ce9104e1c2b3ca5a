"""Raw measurements file next to the profile: written atomically after every benchmark.

Layout (JSON): ``{"format", "version", "device", "runs": [...], "results": {key: record},
"fits": {...}}``. A killed run loses nothing already measured; ``--resume`` reloads it
and skips keys whose records are final ('ok' or 'unsupported'; 'error' is retried).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from simulator.errors import UsageError
from simulator.profile import write_json_atomic

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
            data = json.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"cannot read measurements {str(path)!r}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise UsageError(f"measurements {str(path)!r} is not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
                data.get("results"), dict):
            raise UsageError(f"{str(path)!r} is not a calibration measurements file")
        if data.get("version") != VERSION:
            raise UsageError(f"measurements {str(path)!r} has version {data.get('version')!r}; "
                             f"this calibrate reads version {VERSION}")
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

    def done(self, key: str) -> bool:
        """True if ``key`` has a final record (skipped on resume)."""
        rec = self.results.get(key)
        return rec is not None and rec.get("status") in FINAL

    def add(self, key: str, record: dict) -> None:
        """Store one benchmark's record and write the file atomically."""
        self.results[key] = record
        self.save()

    def set_fits(self, fits: dict) -> None:
        self.data["fits"] = fits
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)
