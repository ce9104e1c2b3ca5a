"""Errors the front ends turn into one-line messages and exit codes."""

from __future__ import annotations

import argparse
import codecs
import difflib
import sys
from collections.abc import Callable, Iterable


class UsageError(ValueError):
    """Bad user input (unknown name, malformed value). CLI exit status 2."""


class PhysicsError(RuntimeError):
    """A computed plan breaks physics (above the hardware's peak, a negative time or byte count,
    faster than the 100%-of-peak floor): a bug in the simulator, never a number to show. The CLI
    reports it on one line with exit status 3 (:data:`EXIT_INTERNAL`)."""


class UsageParser(argparse.ArgumentParser):
    r"""argparse whose errors are one-line :class:`UsageError`\ s (exit 2 through :func:`run_cli`)
    instead of usage text and ``SystemExit``."""

    def error(self, message: str):
        raise UsageError(message)


def did_you_mean(value: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' (did you mean X?)' for the closest choices, or '' if none are close."""
    close = difflib.get_close_matches(str(value).lower(), [c.lower() for c in choices], n=n, cutoff=0.5)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def unknown(kind: str, value: str, choices: Iterable[str]) -> UsageError:
    """Build the standard 'unknown X' error naming the bad value and the valid choices."""
    choices = sorted(set(choices))
    shown = ", ".join(choices[:40]) + (", ..." if len(choices) > 40 else "")
    return UsageError(f"unknown {kind} {value!r}{did_you_mean(value, choices)}; valid choices: {shown}")


#: ASCII stand-ins for the non-ASCII characters reports print, where the terminal cannot show
#: them (``PYTHONIOENCODING=ascii``, a Latin-1 locale); any other character becomes "?".
ASCII_STAND_INS = {"·": "|", "×": "x", "–": "-", "—": "-", "…": "...", "≥": ">=", "≤": "<=", "≈": "~",
                   "±": "+/-", "µ": "u", "→": "->", "²": "^2", "•": "*", "✓": "v", "✗": "x"}


def _ascii_stand_in(exc: UnicodeError) -> tuple[str, int]:
    """Codec error handler: the characters ``exc`` could not encode, as ASCII stand-ins."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    bad = exc.object[exc.start:exc.end]
    return "".join(ASCII_STAND_INS.get(c, "?") for c in bad), exc.end


codecs.register_error("simulator-ascii", _ascii_stand_in)


def degrade_output() -> None:
    """Make stdout and stderr that cannot encode the reports' characters print ASCII stand-ins
    (:data:`ASCII_STAND_INS`) instead of failing with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            "".join(ASCII_STAND_INS).encode(getattr(stream, "encoding", None) or "ascii")
        except (UnicodeEncodeError, LookupError):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="simulator-ascii")


#: Exit status of an unexpected internal error (1 is "nothing fits", 2 a usage error).
EXIT_INTERNAL = 3


def run_cli(prog: str, body: Callable[[], int], interrupted: str = "interrupted") -> int:
    """Run a console script's body with the project's error contract: a UsageError prints one
    line and exits 2; Ctrl-C prints ``interrupted`` and exits 130; any other exception prints
    one line naming it and exits 3 (``SIMULATOR_DEBUG=1`` re-raises it with its traceback). A
    terminal that cannot show the reports' characters gets ASCII stand-ins (:func:`degrade_output`). An
    OSError about a named file (a name too long, a folder not writable) is the user's path: exit 2.
    A closed pipe on stdout (``| head``) ends quietly with exit 0."""
    import os

    degrade_output()
    try:
        return int(body() or 0)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``simulate ... | head``): nothing to report
        # Python flushes stdout again at exit; point it at devnull so that flush cannot fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        if os.environ.get("SIMULATOR_DEBUG"):
            raise
        if isinstance(exc, OSError) and exc.filename is not None:  # a path the system refuses
            name = str(exc.filename)
            name = name if len(name) <= 80 else name[:40] + "…" + name[-40:]
            print(f"{prog}: error: {name!r}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{prog}: internal error: {type(exc).__name__}: {msg} (SIMULATOR_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
        return EXIT_INTERNAL
