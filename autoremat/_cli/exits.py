"""The command's exit codes, in one table, and how it reports an error.

``EXIT_CODES`` is the one table: ``autoremat --help``'s epilog prints it and
``docs/tuning.md`` shows it (``tests/test_cli.py`` checks the two agree). An error is one
line on stderr; where it came from the user's own code (their ``problem()`` raising),
the line names the file and line it was raised at, and ``--debug`` prints that
traceback above it. A lockstep tune that lost a process (``LockstepLost``) is one line,
exit ``EXIT_LOST``. An exception that is not autoremat's own (a bug, here or in a library)
prints its traceback, then one line: exit ``EXIT_CRASH``, never mistaken for a stale
schedule (1).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import textwrap
import traceback
from pathlib import Path
from typing import Final, NoReturn

from autoremat._cli.export_command import EXIT_NO_FORM
from autoremat._cli.settings import UsageError
from autoremat._cli.show_command import EXIT_STALE
from autoremat._errors import AutorematError, one_line
from autoremat._search.lockstep import LockstepLost

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
EXIT_NOTHING_FITS: Final = 3
#: An unexpected exception: the traceback is printed (sysexits' EX_SOFTWARE).
EXIT_CRASH: Final = 70
#: A tune on many processes ended because another process was lost (sysexits'
#: EX_TEMPFAIL: run the same command again to resume the study).
EXIT_LOST: Final = 75
EXIT_INTERRUPTED: Final = 130

#: ``(code, meaning)``: every exit code of ``autoremat``.
EXIT_CODES: Final = (
    (EXIT_OK, "success"),
    (EXIT_STALE, "show: the schedule is stale here (other shapes or devices) or, with "
                 "--problem, compiles to another total than the tuned one"),
    (EXIT_USAGE, "usage error: bad input, one line on stderr naming the option"),
    (EXIT_NOTHING_FITS, "tune: nothing fits the budget (the message gives the smallest "
                        "total measured, or the arguments' size when the budget is under it)"),
    (EXIT_NO_FORM, "export: the format cannot write the trial (the message names the "
                   "nearest measured trial it can; --nearest exports that one)"),
    (EXIT_CRASH, "crash: an unexpected error (a bug), its traceback on stderr"),
    (EXIT_LOST, "tune on many processes (lockstep): another process was lost; run the same "
                "command on every process to resume the study"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C); tune keeps the finished trials"),
)


def exit_table() -> str:
    """``EXIT_CODES`` as the epilog's lines."""
    return "exit codes:\n" + "\n".join(
        textwrap.fill(meaning, 79, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, meaning in EXIT_CODES)


_OURS: Final = str(Path(__file__).resolve().parents[1])
_LIBRARIES: Final = tuple(str(Path(p).resolve()) for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]})


def user_cause(error: BaseException) -> BaseException | None:
    """The exception from outside autoremat that ``error`` was raised from (its
    ``__cause__`` chain), if any: what the user's code raised."""
    seen: set[int] = set()
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, (AutorematError, UsageError)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def user_frame(error: BaseException) -> str | None:
    """``file:line in function``: the innermost frame of ``error``'s traceback in code that
    is neither autoremat's nor an installed library's nor Python's (the user's); ``None``
    when there is none."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<")
              and not str(Path(f.filename).resolve()).startswith((_OURS, *_LIBRARIES))]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def report_error(error: UsageError, debug: bool) -> None:
    """One line on stderr; where the error came from the user's code, the line names where
    it was raised and ``debug`` prints its traceback above the line."""
    line = " ".join(str(error).split())
    cause = user_cause(error)
    if cause is not None:
        if debug:
            traceback.print_exception(cause, file=sys.stderr)
        where = user_frame(cause)
        if where is not None:
            line += f" (raised at {where}{'' if debug else '; --debug prints its traceback'})"
    print(f"autoremat: error: {line}", file=sys.stderr)


def end_lost(error: LockstepLost) -> NoReturn:
    """One line (which process was lost, how to resume), then exit ``EXIT_LOST`` at once:
    the job's runtime would otherwise wait at exit for the lost process
    (``jax.distributed``'s shutdown barrier)."""
    print(f"autoremat: {error} (exit {EXIT_LOST})", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_LOST)


def report_crash(error: BaseException) -> None:
    """The traceback, then one line saying what it is (``EXIT_CRASH``)."""
    traceback.print_exception(error, file=sys.stderr)
    print(f"autoremat: crashed: {one_line(error)}; an unexpected error, not a bad input "
          f"(the traceback above says where; exit {EXIT_CRASH})", file=sys.stderr)
