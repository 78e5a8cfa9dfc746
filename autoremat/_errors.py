"""Every error autoremat raises for bad input, in one place.

All are ``ValueError``s under ``AutorematError``, so ``except
autoremat.AutorematError`` catches any of them. Messages name the argument or
field (``budget``, ``storage``, ``levels[1].length``), the bad value and the
valid choices; they never name a command-line flag -- the CLI adds those.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AutorematError(ValueError):
    """Bad input to autoremat; the message names the field and the fix."""


class ScheduleError(AutorematError):
    """A schedule (object, mapping or file) is invalid; the message says why."""


class BudgetError(AutorematError):
    """A byte count could not be read (the message lists the accepted forms), or a budget
    is under the step's arguments alone, so nothing can fit."""


class ProblemError(AutorematError):
    """A problem reference could not be resolved, built, or is not a Problem."""


class TuneError(AutorematError):
    """The study cannot be created, resumed or read; the message says why."""


def one_line(what: str | BaseException, limit: int = 300) -> str:
    """A message on one line, at most ``limit`` characters.

    An exception is written ``Type: text``; a Python error raised inside a
    computation (JAX embeds the host traceback) keeps the text before the
    traceback and its last line.
    """
    if isinstance(what, BaseException):
        raw = str(what)
        if "Traceback (most recent call last)" in raw:
            head, _, tail = raw.partition("Traceback (most recent call last)")
            last = [line for line in tail.splitlines() if line.strip()]
            raw = f"{head.rstrip(' :')}: {last[-1].strip()}" if last else head
        text = f"{type(what).__name__}: {' '.join(raw.split()) or type(what).__name__}"
    else:
        text = " ".join(what.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RematScansWarning(UserWarning):
    """``remat_scans`` left a scan as written, or found nothing to rewrite; the message says
    which scan (length, source location) and why."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to a mistyped ``word`` (``difflib``),
    or ``""`` when none is close: the end of a message that lists the valid choices."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
