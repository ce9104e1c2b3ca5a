"""Argument parsing the ``simulate`` command and its subcommands share."""

from __future__ import annotations

import argparse
import re
import sys

from ..core.errors import UsageParser

_NEGATIVE = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


class ArgParser(UsageParser):
    """:class:`simulator.core.errors.UsageParser` that also reads a negative value after a flag
    (``--overhead -10%``, ``--tokens -inf``, which argparse alone takes for an unknown option), so
    that the flag's own check can name the bad value."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        out: list[str] = []
        for tok in argv:
            act = self._option_string_actions.get(out[-1]) if out else None
            if act is not None and act.nargs != 0 and _NEGATIVE.match(tok) and "=" not in out[-1]:
                out[-1] = f"{out[-1]}={tok}"
            else:
                out.append(tok)
        return super().parse_args(out, namespace)


def _positive_int(flag):
    def conv(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive integer, got {text!r}")
        return v
    return conv


def _positive_float(flag):
    def conv(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}") from None
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number, got {text!r}")
        return v
    return conv


def fraction_arg(flag):
    def conv(text):
        t = str(text).strip()
        try:
            v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a fraction such as 0.1 or 10%, got {text!r}") from None
        if not 0 <= v <= 10:
            raise argparse.ArgumentTypeError(f"{flag} must be between 0 and 10 (1000%), got {text!r}")
        return v
    return conv


def add_recipe_args(p: argparse.ArgumentParser) -> None:
    """The recipe flags every subcommand shares."""
    g = p.add_argument_group("recipe")
    g.add_argument("--tokens", help="total training tokens (e.g. 300B, 2.5e11)")
    g.add_argument("--steps", help="optimizer steps")
    g.add_argument("--global-batch", help="sequences per optimizer step")
    g.add_argument("--seq-len", help="tokens per sequence, a plain number (2048, not 2K)")
    g.add_argument("--optimizer", help="adamw | adam | lion | sgd")


def recipe_knobs(a: argparse.Namespace) -> dict:
    """Recipe keyword arguments for the API from parsed flags (unset ones left out)."""
    out = {k: getattr(a, k) for k in ("tokens", "steps", "global_batch", "seq_len", "optimizer")
           if getattr(a, k, None) is not None}
    if "optimizer" in out:
        out["optimizer"] = out["optimizer"].strip().lower()
    return out
