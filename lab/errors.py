"""Errors the lab reports to the user as one line, without a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LabError(Exception):
    """A user-facing error: the CLI prints `ERROR: <message>` and exits with `exit_code`."""

    exit_code = 1


class UsageError(LabError):
    """Bad input from the user (an unknown name, a bad option): exit code 2."""

    exit_code = 2


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UsageError:
    """An error for an unknown `kind` name that lists the known names and the closest match."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return UsageError(f"Unknown {kind} `{name}`.{hint} Known {kind}s: {', '.join(known)}.")
