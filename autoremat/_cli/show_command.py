"""``autoremat show``: a schedule file's summary; with a problem, whether it is stale for it
and what its step compiles to here beside the tuned total (the parser and the usage errors
are ``autoremat.cli``'s)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Final

from autoremat._cli.settings import (
    PROBLEM_SETTINGS,
    ProblemSettings,
    check_settings,
    given,
    with_defaults,
)
from autoremat._cli.show_text import describe_schedule
from autoremat._measure.parity import check_parity
from autoremat._measure.problem import Problem
from autoremat._measure.stale import mesh_mismatches, schedule_mismatches
from autoremat._schedules import read_schedule
from autoremat._schedules.base import Schedule
from autoremat._units import format_bytes

#: The schedule does not hold here: stale, or compiling to another total than the tuned one.
EXIT_STALE: Final = 1


def run_show(args: argparse.Namespace, problem_of: Callable[[ProblemSettings], Problem]) -> int:
    """Show PATH (``args``: the show subparser's); ``problem_of``: the command's problem from
    its settings. Returns the exit code; library errors propagate (the command words them)."""
    schedule = read_schedule(args.path)
    print(describe_schedule(schedule))
    if args.problem is None:
        other_mesh = mesh_mismatches(schedule)
        if other_mesh:
            print("stale here: " + "; ".join(other_mesh))
            return EXIT_STALE
        return 0
    settings = with_defaults(given(args, PROBLEM_SETTINGS), PROBLEM_SETTINGS)
    check_settings(settings)
    problem = problem_of(ProblemSettings.of({**settings, "problem": args.problem}))
    mismatches = schedule_mismatches(schedule, problem)
    if mismatches:
        print(f"stale for {problem.name}: " + "; ".join(mismatches))
        return EXIT_STALE
    print(f"matches {problem.name} on this device")
    return _parity(schedule, problem)


def _parity(schedule: Schedule, problem: Problem) -> int:
    """Print the step compiled here under ``schedule`` beside its tuned total; exit 1 where
    they differ by more than ``parity.SAME``."""
    parity = check_parity(schedule, problem)
    if parity.compiled_bytes is None:
        print(f"compiled here: failed ({parity.reason})")
        return EXIT_STALE
    line = f"compiled here: total {format_bytes(parity.compiled_bytes)}"
    if parity.ratio is not None:
        line += (f", tuned {format_bytes(parity.tuned_bytes)} "
                 f"({parity.ratio:.3f}x: {'the same program' if parity.same else 'differs'})")
    print(line)
    return 0 if parity.same else EXIT_STALE
