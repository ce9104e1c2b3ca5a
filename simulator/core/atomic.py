"""Atomic file writes: write a temp file in the target folder, fsync, rename over the target.

The result has the mode an ordinary ``open(path, "w")`` would give: an existing file keeps its
mode (and, where the user may set them, its owner and group), a new one gets 0o666 less the
user's umask (``mkstemp`` alone would make it 0o600). A symlink is written through: its target
is replaced, in the target's folder, and the link stays. A file the user may not write is
refused, as ``open(path, "w")`` would refuse it (renaming over it would replace it anyway in a
folder the user may write)."""

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


def _keep_owner(tmp: str, p: Path) -> None:
    """Give ``tmp`` the owner and group of the existing ``p`` where the user may (best effort:
    only root may give a file away, a user may set any group they belong to)."""
    try:
        st, mine = p.stat(), os.stat(tmp)
    except OSError:
        return
    if (st.st_uid, st.st_gid) != (mine.st_uid, mine.st_gid):
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            try:
                os.chown(tmp, -1, st.st_gid)
            except OSError:
                pass


def target(path: str | os.PathLike) -> Path:
    """The file a write to ``path`` changes: ``path`` itself, or the file a symlink there points to."""
    p = Path(path)
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def check_writable(path: str | os.PathLike, what: str = "") -> None:
    """UsageError unless the user may write ``path`` (through a symlink, its target) atomically:
    an existing file must be writable, and so must its folder (or the nearest existing folder
    above a folder still to be created). ``what`` names the option, e.g. ``"--csv"``. Call it
    before long work whose result goes to ``path``."""
    p = target(path)
    label = f"{what} {str(path)!r}" if what else repr(str(path))
    if p.is_dir():
        raise UsageError(f"{label} is a folder, not a file")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{label} is not writable (read-only for you); refusing to replace it: make it "
                         "writable or write somewhere else")
    folder = p.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{label} is not writable (folder {str(folder)!r} is read-only for you); "
                         "write somewhere else")


def write_atomic(path: str | os.PathLike, writer: Callable[[str], None]) -> Path:
    """Call ``writer(tmp_path)`` to produce the file, then move it over ``path`` (through a
    symlink, over its target) atomically; returns ``path``."""
    p = target(path)
    check_writable(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create folder {str(p.parent)!r}: {exc.strerror}") from None
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
        _keep_owner(tmp, p)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    def w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
    return write_atomic(path, w)
