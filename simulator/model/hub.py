"""Hugging Face Hub ids: find a model's ``config.json`` (never its weights).

``org/name`` or ``org/name@revision`` resolves (see :func:`simulator.model.resolve.resolve_model`) to a
preset with that ``hf_id`` first; else to the ``config.json`` in the local Hugging Face cache,
so it works offline; else, when online and ``huggingface_hub`` is installed (the optional
``hub`` extra), to ``huggingface_hub.hf_hub_download(repo_id, "config.json", revision=...)``,
which downloads that one file into the same cache.

The cache is the folder ``huggingface_hub`` writes: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
else ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``; inside it
``models--{org}--{name}/refs/{revision}`` holds a commit hash and
``models--{org}--{name}/snapshots/{commit}/config.json`` the file (a revision may also be a
commit hash itself). ``HF_HUB_OFFLINE=1`` forbids the download.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ..core.errors import UsageError

#: ``org/name`` with an optional ``@revision`` (branch, tag or commit; may contain ``/``).
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")
_TRUE = {"1", "true", "yes", "on"}


def parse_hub_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` when ``text`` looks like ``org/name[@revision]``."""
    m = _HUB_ID.match(text.strip())
    if m is None or m.group("repo").lower().endswith(".json"):
        return None
    return m.group("repo"), m.group("rev")


def cache_dir() -> Path:
    """The Hugging Face hub cache folder, resolved from the environment as huggingface_hub does."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids network access."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _repo_folder(cache: Path, repo_id: str) -> Path | None:
    """The cache folder of ``repo_id`` (Hub ids are case-insensitive; the folder keeps the case
    it was downloaded with)."""
    name = "models--" + repo_id.replace("/", "--")
    exact = cache / name
    if exact.is_dir():
        return exact
    if not cache.is_dir():
        return None
    wanted = name.lower()
    return next((p for p in cache.iterdir() if p.name.lower() == wanted and p.is_dir()), None)


def cached_config(repo_id: str, revision: str | None = None) -> Path | None:
    """Path of ``config.json`` for ``repo_id`` at ``revision`` (default ``main``) in the local
    cache, or None."""
    folder = _repo_folder(cache_dir(), repo_id)
    if folder is None:
        return None
    rev = revision or "main"
    ref = folder / "refs" / rev
    try:
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else rev
    except OSError:
        return None
    path = folder / "snapshots" / commit / "config.json"
    return path if path.is_file() else None


def _how_to_get(repo_id: str, revision: str | None) -> str:
    rev = f" --revision {revision}" if revision else ""
    return (f"get it with `hf download {repo_id} config.json{rev}` (`huggingface-cli download` "
            "in older huggingface_hub) or pass the path of its config.json")


def hub_reachable() -> bool:
    """Whether the Hub's host (``$HF_ENDPOINT``, default huggingface.co) resolves: a machine
    without network fails here at once instead of in huggingface_hub's retries (~30 s)."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.getaddrinfo(url.hostname or "huggingface.co", url.port or 443)
    except (OSError, UnicodeError):
        return False
    return True


def _missing(revision: str | None) -> str:
    """What is missing, for a one-line error: a pinned revision's config.json (the id may be a preset's,
    at another revision), else the model itself."""
    return f"no config.json of revision {revision!r}" if revision else "not a preset and no config.json"


def _download(repo_id: str, revision: str | None) -> Path:
    """Download ``config.json`` only, through huggingface_hub; one-line UsageError on failure
    (huggingface_hub's own retry warnings are silenced: the error is the one line)."""
    label = repo_id + (f"@{revision}" if revision else "")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise UsageError(
            f"model {label!r}: {_missing(revision)} in the local Hugging Face cache "
            f"({cache_dir()}); install the hub extra (pip install 'pretrain-simulator[hub]') to "
            f"download it, or {_how_to_get(repo_id, revision)}"
        ) from None
    if not hub_reachable():
        raise UsageError(
            f"model {label!r}: {_missing(revision)} in the local Hugging Face cache "
            f"({cache_dir()}) and the Hugging Face Hub is unreachable; {_how_to_get(repo_id, revision)}"
        )
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision))
    except Exception as exc:  # huggingface_hub and network errors: one line, never a traceback
        kinds = {c.__name__ for c in type(exc).__mro__}
        if kinds & {"LocalEntryNotFoundError", "OfflineModeIsEnabled"}:
            why = f"cannot reach the Hugging Face Hub ({type(exc).__name__})"
        elif "GatedRepoError" in kinds:
            why = "the repository is gated: accept its licence on huggingface.co and run `hf auth login`"
        elif "RepositoryNotFoundError" in kinds:
            why = "no such repository on the Hugging Face Hub (or it is private)"
        elif "RevisionNotFoundError" in kinds:
            why = f"no revision {revision!r} in that repository"
        elif "EntryNotFoundError" in kinds:
            why = "the repository has no config.json"
        else:
            why = f"cannot reach the Hugging Face Hub ({type(exc).__name__})"
        raise UsageError(f"model {label!r}: {why}; {_how_to_get(repo_id, revision)}") from None
    finally:
        hub_log.setLevel(level)


def find_config(repo_id: str, revision: str | None = None) -> tuple[Path, str]:
    """``(path of config.json, where it came from)`` for a Hub id: the local cache, else a
    download of the config alone. Offline without a cached copy: a one-line UsageError saying
    how to get it."""
    path = cached_config(repo_id, revision)
    if path is not None:
        return path, "local Hugging Face cache"
    if offline():
        label = repo_id + (f"@{revision}" if revision else "")
        raise UsageError(
            f"model {label!r}: {_missing(revision)} in the local Hugging Face cache "
            f"({cache_dir()}) while offline (HF_HUB_OFFLINE); {_how_to_get(repo_id, revision)}"
        )
    return _download(repo_id, revision), "downloaded from the Hugging Face Hub"
