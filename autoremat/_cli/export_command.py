"""``autoremat export``: what TRIAL names, the format's text or the schedule file, exit 4 when
the format cannot write the trial (the parser and the usage errors are ``autoremat.cli``'s)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from autoremat._atomic import atomic_write_text
from autoremat._cli.export_text import cannot_line, export_text
from autoremat._cli.settings import UsageError
from autoremat._errors import AutorematError
from autoremat._schedules import read_schedule, save_schedule
from autoremat._search.export_forms import FrameworkExport, framework_export, schedule_export

if TYPE_CHECKING:
    import optuna

#: The format cannot write the trial (the message names the nearest measured one it can).
EXIT_NO_FORM: Final = 4


def run_export(args: argparse.Namespace,
               open_study: Callable[[argparse.Namespace], optuna.Study]) -> int:
    """Export TRIAL (``args``: the export subparser's) in ``--format``; ``open_study``: the
    study ``--storage`` / ``--study-name`` name (default: the last tuned here). Returns the
    exit code; library errors propagate (the command words them)."""
    if args.format == "yaml" and args.out is None:
        raise UsageError("--out: the YAML export writes a file; give --out FILE, or "
                         "--format maxtext or flax to print")
    study, found = _source(args, open_study)
    if not found.expressible:
        line = cannot_line(found, searched=study is not None)
        if not args.nearest or found.nearest is None:
            print(f"autoremat: {line}", file=sys.stderr)
            return EXIT_NO_FORM
        print(f"autoremat: {line}; exporting trial {found.nearest.figures.number}",
              file=sys.stderr)
        found = found.nearest
    what = f"trial {found.figures.number}, " if found.figures.number is not None else ""
    if args.format == "yaml":
        save_schedule(found.schedule, args.out)
    else:
        text = export_text(found, study.study_name if study is not None else "")
        if args.out is None:
            print(text, end="")
            return 0
        atomic_write_text(args.out, text)
    print(f"wrote {args.out}: {what}{found.figures.schedule}")
    return 0


def _source(args: argparse.Namespace, open_study: Callable[[argparse.Namespace], optuna.Study]
            ) -> tuple[optuna.Study | None, FrameworkExport]:
    """The study and export of TRIAL: a trial number (default: the pick) of the study, or a
    schedule file (its nearest looked for in the study its meta names, or --study-name)."""
    if args.trial is None or args.trial.isdigit():
        opened = open_study(args)
        return opened, framework_export(opened, None if args.trial is None
                                        else int(args.trial), args.format)
    if not Path(args.trial).is_file():
        raise UsageError(f"TRIAL: expected a trial number or a schedule file, got "
                         f"{args.trial!r} (no such file)")
    schedule = read_schedule(args.trial)
    meta = schedule.meta
    if args.study_name is None and isinstance(meta.get("study_name"), str):
        args.study_name = meta["study_name"]
        args.storage = args.storage or meta.get("storage") or None
    study: optuna.Study | None = None
    if args.study_name is not None:  # never the last study tuned here: it may be another's
        try:
            study = open_study(args)
        except (AutorematError, UsageError):
            study = None  # a file from elsewhere: exported without a study to look in
    return study, schedule_export(schedule, args.format, study)
