"""Errors the front ends turn into one-line messages and exit codes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UsageError(ValueError):
    """Bad user input (unknown name, malformed value). CLI exit status 2."""


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
