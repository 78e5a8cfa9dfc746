"""The ``autoremat`` command: ``tune``, ``pareto``, ``export``, ``show``.

Parsing and printing only; every action is a library call (``autoremat._search.tune``,
``autoremat._search.study``, ``autoremat._search.pareto``). The options and study-file keys
come from one table (``autoremat._cli.settings``), which also turns a library
error naming an argument (``storage: ...``) into one naming its flag
(``--storage: ...``). ``tune`` records the study it ran in
``runs/last_study.json`` (``autoremat._search.last_study``), the default study of
``pareto`` and ``export``; studies go to ``runs/autoremat.db`` in the current folder
unless ``--storage`` says otherwise.
Heavy modules (jax, optuna, matplotlib, tqdm) are imported only inside the
library functions that use them (no module this one imports loads them), so
``autoremat --help`` is instant; the commands' handlers are ``_cli.tune_command`` (its
settings read into a ``TuneSettings``, its printing ``autoremat._cli.printing``),
``_cli.pareto_command``, ``_cli.export_command`` and ``_cli.show_command``. A mistyped
option, command, format or built-in problem gets the closest valid one ("did you mean").

Exit codes: one table, ``autoremat._cli.exits.EXIT_CODES`` (0 success, 1 stale, 2 usage
error, 3 nothing fits, 4 no such form, 70 crash, 75 lockstep process lost, 130
interrupted), printed by
``autoremat --help``. An error is one line; ``--debug`` adds the traceback of an error
raised in the user's own code (their ``problem()``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, NoReturn

from autoremat import __version__
from autoremat._cli.exits import EXIT_CRASH as EXIT_CRASH
from autoremat._cli.exits import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    end_lost,
    exit_table,
    report_crash,
    report_error,
)
from autoremat._cli.exits import EXIT_NO_FORM as EXIT_NO_FORM  # 4: no such form
from autoremat._cli.exits import EXIT_NOTHING_FITS as EXIT_NOTHING_FITS  # 3
from autoremat._cli.exits import EXIT_OK as EXIT_OK
from autoremat._cli.exits import EXIT_STALE as EXIT_STALE  # 1: does not hold here
from autoremat._cli.export_command import run_export
from autoremat._cli.maxtext_command import run_maxtext
from autoremat._cli.pareto_command import run_pareto
from autoremat._cli.problems import make_problem
from autoremat._cli.settings import (
    DEFAULT_STORAGE_HELP,
    PROBLEM_SETTINGS,
    STORAGE_ENV,
    STUDY_FILE_KEYS,
    TUNE_SETTINGS,
    UsageError,
    add_grouped,
    add_settings,
    with_flag,
)
from autoremat._cli.show_command import run_show
from autoremat._cli.tune_command import run_tune
from autoremat._errors import AutorematError, ScheduleError, did_you_mean
from autoremat._models import MODELS
from autoremat._search.export_forms import FORMATS
from autoremat._search.last_study import LAST_STUDY_FILE as LAST_STUDY_FILE
from autoremat._search.last_study import last_study_ref
from autoremat._search.lockstep import LockstepLost
from autoremat._search.study import load_study

if TYPE_CHECKING:
    import optuna

_DEBUG_HELP: Final = ("on an error raised in your own code (your problem()), print its "
                      "traceback above the one-line message")


#: An option's value that starts with a minus (``--budget -1GB``): argparse reads it as an
#: option, so it is joined to its option (``--budget=-1GB``) and the value's check words it.
_NEGATIVE: Final = re.compile(r"-[0-9.]")
#: The options that take a value (a negative one is joined to them, ``_joined``).
_VALUED: Final = frozenset({*(s.flag for s in TUNE_SETTINGS if s.const is None), "--budget",
                            "--out", "--storage", "--study-name", "--problem", "--format"})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        choice = re.fullmatch(r"argument (.*): invalid choice: '(.*)' \(choose from (.*)\)",
                              message)
        if choice is not None:  # a mistyped command or --format
            message += did_you_mean(choice[2], re.findall(r"'([^']*)'", choice[3]))
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _joined(argv: Sequence[str]) -> list[str]:
    """``argv`` with each option's negative value joined to it (``_NEGATIVE``)."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] in _VALUED and _NEGATIVE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def _unrecognized(parser: argparse.ArgumentParser, command: str | None,
                  extra: Sequence[str]) -> UsageError:
    """The error for arguments no option takes: the first, with the closest option of its
    command (or of the top level)."""
    # argparse keeps the options of a parser by their strings (no public reader)
    options = list(parser._option_string_actions)
    if command is not None:
        for action in parser._subparsers._group_actions if parser._subparsers else ():
            sub = getattr(action, "choices", {}).get(command)
            if isinstance(sub, argparse.ArgumentParser):
                options += list(sub._option_string_actions)
    where = f"autoremat {command}" if command else "autoremat"
    first = extra[0].split("=", 1)[0]
    hint = did_you_mean(first, options) if first.startswith("-") else ""
    return UsageError(f"unrecognized arguments: {' '.join(extra)}{hint} (see '{where} "
                      "--help')")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="autoremat",
        description="Find and run the fastest remat schedule of a JAX scan that fits a "
        "memory budget.",
        epilog=exit_table(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"autoremat {__version__}")
    p.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    # --debug after the command too; SUPPRESS: not given there keeps the one before it
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help=_DEBUG_HELP)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser(
        "tune", help="measure schedules and pick the fastest that fits the budget",
        description="Search remat schedules of a training step under a memory budget. "
        "Every figure is measured: total memory = argument + output + temp - alias of the "
        "compiled step (XLA memory_analysis); step time = median wall time of repeated runs. "
        "Settings may come from a study file (YAML with keys "
        + ", ".join(STUDY_FILE_KEYS) + "); options given on the command line win.",
        parents=[common],
    )
    t.add_argument("study_file", nargs="?", metavar="STUDY.yaml",
                   help="a study file holding the same settings as the options")
    groups = add_grouped(t)
    groups["output"].add_argument("--no-progress", action="store_true", help="no progress bar")

    pa = sub.add_parser("pareto", help="the measured memory/time front of a study",
                        description="List the non-dominated trials within the study's budget, "
                        "sorted by memory; * marks the chosen (fastest that fits).",
                        parents=[common])
    _study_options(pa)
    pa.add_argument("--budget", help="read the front at this budget, not the study's (4GB, "
                    "512MiB, ...): the fastest measured schedule within it; over the study's "
                    "budget nothing was timed")
    pa.add_argument("--plot", metavar="FILE", help="draw every trial to FILE (.png, .svg or "
                    ".pdf)")
    pa.add_argument("--json", action="store_true", help="print the front as JSON")

    e = sub.add_parser("export", help="write a trial's schedule: YAML, MaxText's "
                       "remat_policy or Flax's remat",
                       description="Write trial TRIAL's schedule: as YAML (same format and "
                       "meta as tune), as MaxText's remat_policy: custom keys, or as Flax's "
                       "nn.remat / nnx.remat policy, for a pick with one policy on every "
                       "layer. A trial the format cannot write (nested levels, groups, "
                       "binomial) exits 4 naming the nearest measured trial it can; "
                       "--nearest exports that one. Printed, or written atomically to --out.",
                       parents=[common])
    e.add_argument("trial", nargs="?", metavar="TRIAL", help="a trial number (see pareto) or "
                   "a schedule file (default: the study's pick)")
    e.add_argument("--format", choices=FORMATS, default="yaml",
                   help="yaml (default; needs --out), maxtext or flax")
    e.add_argument("--out", help="the file to write (for maxtext and flax: default, print)")
    e.add_argument("--nearest", action="store_true", help="where the format cannot write "
                   "the trial, export the nearest measured trial it can")
    _study_options(e)

    mt = sub.add_parser("maxtext", help="tune a MaxText model by its own remat knobs",
                        description="Build the MaxText model of OVERRIDE... (MaxText's "
                        "key=value, over its configs/base.yml or --config) and measure "
                        "MaxText's own train step under each of its remat knob settings -- "
                        "remat_policy: full, its presets over the tensors the model tags, "
                        "custom keys (device / offload / remat per tensor), then the pick "
                        "with scan_layers flipped; print the fastest within --budget as "
                        "MaxText config lines. Needs MaxText (Python >= 3.12: pip install "
                        "'autoremat[maxtext]'); every setting is one compile of MaxText's "
                        "step.", parents=[common])
    mt.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                    help="MaxText config overrides, key=value (e.g. base_num_decoder_layers=4)")
    mt.add_argument("--budget", required=True, help="memory budget per device (4GB, ...)")
    mt.add_argument("--config", help="a MaxText config file (default: MaxText's base.yml)")
    mt.add_argument("--limit", type=int, help="measure at most this many knob settings "
                    "(before the scan_layers one)")
    mt.add_argument("--out", help="write the pick's config lines to this YAML file")
    mt.add_argument("--json", action="store_true", help="also print every measurement as "
                    "JSON")

    s = sub.add_parser("show", help="summarize a schedule file",
                       description="Print a schedule file's levels, policies, what it was "
                       "tuned for and its measured figures (per device); exit 1 if it was "
                       "tuned on another number of devices or, with --problem, if it no longer "
                       "matches. With --problem it also compiles the problem's step under the "
                       "schedule (nothing is run) and prints its total memory beside the tuned "
                       "one: exit 1 where they differ by more than 2%.", parents=[common])
    s.add_argument("path", metavar="PATH", help="a schedule YAML file")
    s.add_argument("--problem", help=f"compare with this problem ({', '.join(MODELS)} or "
                   "module:name / file.py:name)")
    add_settings(s, PROBLEM_SETTINGS)
    return p


def _study_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help=f"Optuna storage URL (env {STORAGE_ENV}; default: the "
                   f"last tune run from this folder, else {DEFAULT_STORAGE_HELP})")
    p.add_argument("--study-name", help="the study (default: the last tune run from here)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (the console script exits with it)."""
    parser = _parser()
    debug = False
    try:
        args, extra = parser.parse_known_args(_joined(sys.argv[1:] if argv is None else argv))
        debug = bool(args.debug)
        if extra:
            raise _unrecognized(parser, args.command, extra)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return {"tune": _tune, "pareto": _pareto, "export": _export, "show": _show,
                "maxtext": _maxtext}[args.command](args)
    except UsageError as e:
        report_error(e, debug)
        return EXIT_USAGE
    except LockstepLost as e:  # a tune on many processes: exit EXIT_LOST at once
        end_lost(e)
    except KeyboardInterrupt:
        print("autoremat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # not a bad input: a bug, here or in a library (EXIT_CODES)
        report_crash(e)
        return EXIT_CRASH


def _usage_error(e: AutorematError) -> UsageError:
    """A library error as a usage error; a message naming an argument names its flag."""
    return UsageError(str(e) if isinstance(e, ScheduleError) else with_flag(str(e)))


def _tune(args: argparse.Namespace) -> int:
    try:
        return run_tune(args)
    except AutorematError as e:
        raise _usage_error(e) from e


def _open_study(args: argparse.Namespace) -> optuna.Study:
    """``--storage``/``--study-name``, each defaulting to the last study tuned here."""
    storage = args.storage or os.environ.get(STORAGE_ENV) or None
    name = args.study_name
    if name is None or storage is None:
        last = last_study_ref()
        if last is None and name is None:
            raise UsageError(f"--study-name: none given and no {LAST_STUDY_FILE} from an "
                             "earlier 'autoremat tune' in this folder")
        if last is not None:
            storage, name = storage or last[0], name or last[1]
    assert name is not None
    return load_study(name, storage)


def _pareto(args: argparse.Namespace) -> int:
    try:
        return run_pareto(args, _open_study)
    except AutorematError as e:
        raise _usage_error(e) from e


def _export(args: argparse.Namespace) -> int:
    try:
        return run_export(args, _open_study)
    except AutorematError as e:
        raise _usage_error(e) from e


def _maxtext(args: argparse.Namespace) -> int:
    try:
        return run_maxtext(args)
    except AutorematError as e:
        raise _usage_error(e) from None


def _show(args: argparse.Namespace) -> int:
    try:
        return run_show(args, make_problem)
    except AutorematError as e:
        raise _usage_error(e) from e


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
