"""Atomic file writes: write a temp file in the target folder, fsync, rename over the target.

The result has the mode an ordinary ``open(path, "w")`` would give: an existing file keeps its
mode, a new one gets 0o666 less the user's umask (``mkstemp`` alone would make it 0o600)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import UsageError


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _target_mode(p: Path) -> int:
    try:
        return p.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def write_atomic(path: str | os.PathLike, writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` to produce the file, then move it over ``path`` atomically."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create folder {str(p.parent)!r}: {exc.strerror}") from None
    if p.is_dir():
        raise UsageError(f"{str(p)!r} is a folder, not a file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp" + p.suffix, dir=p.parent)
    except OSError as exc:
        raise UsageError(f"cannot write {str(p)!r}: {exc.strerror}") from None
    os.close(fd)
    try:
        writer(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, _target_mode(p))
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return p


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
    return write_atomic(path, w)
