"""``autoremat pareto``: a study's measured front, as a table, JSON or a plot, at the study's
budget or at another (``--budget``); the parser and the usage errors are ``autoremat.cli``'s."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoremat._cli.front_text import front_json, front_table
from autoremat._cli.plot import plot_study
from autoremat._cli.printing import name_cost_lines
from autoremat._cli.settings import UsageError
from autoremat._measure.mesh import device_note
from autoremat._search.attrs import NAME_COSTS, PROBE
from autoremat._search.pareto import pareto_front
from autoremat._search.probes.probe import lines as probe_lines
from autoremat._search.study import StudyInfo
from autoremat._units import format_bytes, parse_bytes

if TYPE_CHECKING:
    import optuna

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def run_pareto(args: argparse.Namespace,
               open_study: Callable[[argparse.Namespace], optuna.Study]) -> int:
    """Print the front of the study ``open_study`` opens (``args``: the pareto subparser's);
    returns the exit code. Library errors propagate (the command words them)."""
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot: expected a .png, .svg or .pdf file, got {args.plot!r}")
    asked = None if args.budget is None else parse_bytes(args.budget)
    study = open_study(args)
    info = StudyInfo.of(study)
    budget = info.budget_bytes if asked is None else asked
    points = pareto_front(study, asked)
    if args.plot:
        plot_study(study, args.plot, asked)
    if args.json:
        print(front_json(points, budget))
        return 0
    print(f"study: {study.study_name!r} ({len(study.trials)} trials)")
    if asked is not None and asked != info.budget_bytes:
        more = (f"; over {format_bytes(info.budget_bytes)} nothing was timed (tune "
                f"--budget {args.budget} measures there)" if asked > info.budget_bytes else "")
        print(f"read at --budget {format_bytes(asked)}, not the study's "
              f"{format_bytes(info.budget_bytes)}{more}")
    for line in probe_lines(study.user_attrs.get(PROBE) or {}):
        print(line)  # choices its probe checked (offload): offered or left out
    for line in name_cost_lines(study.user_attrs.get(NAME_COSTS) or []):
        print(line)  # a layer stack's tags: what keeping each costs
    print(front_table(points, budget, device_note(info.devices, info.mesh), info.seq_len))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0
