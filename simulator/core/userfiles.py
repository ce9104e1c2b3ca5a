"""Reading files the user names (profiles, prices, model configs): regular files of a bounded
size only, with one-line UsageErrors — never a hang on ``/dev/zero`` or a traceback on a name
the file system rejects."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .errors import UsageError

#: Largest input file read (bytes). An assumption: profiles, price files and model configs are
#: a few kB to a few hundred kB; anything far larger is not one of them.
MAX_INPUT_BYTES = 16 * 1024 * 1024


def _short(p: str, n: int = 80) -> str:
    return p if len(p) <= n else p[: n // 2] + "…" + p[-n // 2:]


def check_regular_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path if it is an existing regular file, else a UsageError naming ``what``."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise UsageError(f"cannot read {what} {_short(str(p))!r}: no such file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {_short(str(p))!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise UsageError(f"{what} {_short(str(p))!r} is {kind}; expected a file")
    if st.st_size > MAX_INPUT_BYTES:
        raise UsageError(f"{what} {_short(str(p))!r} is {st.st_size / 2**20:.0f} MiB; the limit is "
                         f"{MAX_INPUT_BYTES // 2**20} MiB")
    return p


def read_text(path: str | os.PathLike, what: str) -> str:
    """UTF-8 text of a regular file of at most :data:`MAX_INPUT_BYTES`."""
    p = check_regular_file(path, what)
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {_short(str(p))!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {_short(str(p))!r} is not UTF-8 text") from None


def parse_json(text: str, what: str) -> object:
    """``text`` parsed as JSON; a UsageError naming ``what`` if it is not JSON or nests too deeply
    for the parser (``[[[[...`` a hundred thousand levels down)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except RecursionError:
        raise UsageError(f"{what} nests its arrays or objects too deeply to be read") from None
