"""``autoremat tune``: its settings read (a study file's, then the command line's over them,
``TuneSettings``), the problem built, the search run and its answer printed (the parser
and the usage errors are ``autoremat.cli``'s)."""

from __future__ import annotations

import argparse
import os
import sys

from autoremat._cli.breakdown_text import bound_line, nothing_fits_message
from autoremat._cli.distributed import deciding, join, written_line
from autoremat._cli.exits import EXIT_INTERRUPTED, EXIT_NOTHING_FITS, EXIT_OK
from autoremat._cli.printing import Progress, result_table
from autoremat._cli.problems import make_problem
from autoremat._cli.settings import (
    BUILTIN_PROBLEM,
    STORAGE_ENV,
    TUNE_SETTINGS,
    ProblemSettings,
    TuneSettings,
    flag,
    given,
    read_study_file,
    with_flag,
)
from autoremat._errors import BudgetError
from autoremat._measure.allocator import limit_bytes
from autoremat._measure.problem import Problem
from autoremat._models import floor_fixes
from autoremat._search.last_study import remember_study
from autoremat._search.storage import DEFAULT_STORAGE
from autoremat._search.tune import tune
from autoremat._units import format_bytes, has_unit, parse_bytes


def tune_settings(args: argparse.Namespace) -> TuneSettings:
    """The tune subparser's ``args`` over its study file's settings; the storage from
    ``STORAGE_ENV`` where neither gives one."""
    values = read_study_file(args.study_file) if args.study_file is not None else {}
    values.update(given(args, TUNE_SETTINGS))
    if values.get("storage") is None and os.environ.get(STORAGE_ENV):
        values["storage"] = os.environ[STORAGE_ENV]
    return TuneSettings.of(values)


def problem_of(settings: ProblemSettings) -> Problem:
    """The problem the settings name, built (``make_problem``; a hook for ``studies/``)."""
    return make_problem(settings)


def run_tune(args: argparse.Namespace) -> int:
    """Tune (``args``: the tune subparser's). Returns the exit code; library errors
    propagate (the command words them)."""
    settings = tune_settings(args)
    budget, budget_note = (0, "") if settings.budget is None else (
        parse_bytes(settings.budget), "")
    if settings.budget is not None and not has_unit(settings.budget):
        print(f"autoremat: warning: --budget {settings.budget} has no unit: read as "
              f"{budget} bytes; write {settings.budget}GB or {settings.budget}GiB (or "
              f"{settings.budget}B for bytes)", file=sys.stderr)
    # The first line within a second: building the problem starts jax and the device
    # and makes the arguments (tens of seconds on a fresh accelerator machine).
    print(f"building the problem ({settings.problem.problem or BUILTIN_PROBLEM}) ...",
          flush=True)
    if settings.budget is None:
        budget, budget_note = _default_budget()
    joined = join(settings.coordinator)  # before jax starts: the job's devices
    if joined:
        print(joined, flush=True)
    return _run(problem_of(settings.problem), budget, budget_note, settings, args.no_progress)


def _default_budget() -> tuple[int, str]:
    limit = limit_bytes()
    if limit is not None:
        return limit, " (device memory; set --budget)"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), " (host RAM; set --budget)"


def _run(problem: Problem, budget: int, budget_note: str, settings: TuneSettings,
         no_progress: bool) -> int:
    notes = "".join(f"\n  note: {n}" for n in problem.notes)  # e.g. a remat inside the step
    print(f"problem: {problem.name}{notes}\nbudget: {format_bytes(budget)} ({budget} bytes) per "
          f"device{budget_note}", flush=True)
    storage = settings.storage or DEFAULT_STORAGE
    remembered: list[str] = []

    def remember(study_name: str) -> None:
        """The last-study pointer: written once the study is open (its first trial)."""
        if study_name not in remembered:
            remember_study(storage, study_name)
            remembered.append(study_name)

    progress = Progress(settings.trials, budget, no_progress, remember)
    try:
        result = tune(
            problem, budget, n_trials=settings.trials, total_trials=settings.total_trials,
            time_limit=settings.time_limit, explore_front=settings.explore_front,
            storage=storage, study_name=settings.study_name, seed=settings.seed,
            out=settings.out, time_budget=settings.time_budget, heartbeat=settings.heartbeat,
            on_trial=progress.on_trial, on_confirm=progress.note,
            on_bound=lambda b: progress.say(bound_line(b, settings.trials is None,
                                                       progress.done)),
        )
    except BudgetError as e:  # under the step's arguments: refused before compiling
        print(f"autoremat: {with_flag(str(e))}", file=sys.stderr)
        return EXIT_NOTHING_FITS
    finally:
        progress.close()
    if deciding():  # process 0's study: the other processes of a job have none
        remember(result.study_name)
    print(result_table(result))
    if result.best is None:
        fixes = floor_fixes(settings.problem.problem)
        print(f"autoremat: {nothing_fits_message(result, flag, fixes)}", file=sys.stderr)
        return EXIT_INTERRUPTED if result.interrupted else EXIT_NOTHING_FITS
    print(written_line(settings.out))
    if result.interrupted:
        print("autoremat: interrupted; finished trials are kept (run again to resume)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK
