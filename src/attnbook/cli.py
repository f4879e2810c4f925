"""How every command fails: one line ``error: <problem>; <fix>`` on standard error and exit
status 2, never a traceback for a mistake of the user's (a bad option, a missing or damaged file).
:class:`Parser` does it for argparse's own errors, :func:`fail` for the rest, and a
:class:`UsageError` carries such a message to the command that prints it.

This module sits on the lowest floor (the standard library only); the options that name a
preset, a device or a recipe field are :mod:`attnbook.training.options`.
"""
from __future__ import annotations

import argparse
import sys


class UsageError(ValueError):
    """A bad option value; the message names the option and the fix."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line ``error: ...; see PROG --help`` (exit status 2)."""

    def error(self, message):
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def fail(message) -> int:
    """Print ``error: <message>`` as one line on standard error; returns the exit status, 2."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    return 2
