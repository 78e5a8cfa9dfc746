"""The ``autoremat`` command: ``tune``, ``pareto``, ``export``, ``show``.

Parsing and printing only; every action is a library call (``autoremat._tune``,
``autoremat._pareto``). Heavy modules (jax, optuna, matplotlib) are imported
inside the commands, so ``autoremat --help`` is instant.

Exit codes: 0 success; 1 ``show --problem`` found the schedule stale;
2 usage error (one line on stderr); 3 ``tune`` found nothing that fits
(the message gives the smallest total measured and its schedule);
130 interrupted (finished trials are kept).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

EXIT_OK: Final = 0
EXIT_STALE: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOTHING_FITS: Final = 3
EXIT_INTERRUPTED: Final = 130
STORAGE_ENV: Final = "AUTOREMAT_STORAGE"

#: Keys a study file (``autoremat tune studies/NAME.yaml``) may hold; each is
#: the ``tune`` option of the same name (dashes as underscores).
STUDY_FILE_KEYS: Final = (
    "budget", "problem", "seq_len", "batch", "hidden", "seq2seq", "trials", "total_trials",
    "timeout", "storage", "study_name", "out", "seed", "time_budget", "heartbeat",
)
_TUNE_DEFAULTS: Final[dict[str, Any]] = {
    "trials": 30, "out": "schedule.yaml", "seed": 0, "time_budget": 5.0, "seq2seq": True,
    "heartbeat": 60,
}
_MAX_SIZE: Final = 2**31 - 1  # lax.scan lengths and array dimensions are int32
BUILTIN_PROBLEM: Final = "seed_lstm"


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="autoremat",
        description="Find and run the fastest remat schedule of a JAX scan that fits a "
        "memory budget.",
        epilog="Exit codes: 0 ok, 1 stale schedule (show --problem), 2 usage error, "
        "3 nothing fits, 130 interrupted.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser(
        "tune", help="measure schedules and pick the fastest that fits the budget",
        description="Search remat schedules of a training step under a memory budget. "
        "Every figure is measured: total memory = argument + output + temp - alias of the "
        "compiled step (XLA memory_analysis); step time = median wall time of repeated runs. "
        "Settings may come from a study file (YAML with keys "
        + ", ".join(STUDY_FILE_KEYS) + "); options given on the command line win.",
    )
    t.add_argument("study_file", nargs="?", metavar="STUDY.yaml",
                   help="a study file holding the same settings as the options")
    t.add_argument("--budget", help="memory budget: 4GB (10^9), 4GiB (2^30), 512MB, 1.5G, or "
                   "bytes; default: the device's memory (host RAM on CPU)")
    t.add_argument("--problem", help="package.module:name or path/file.py:name (a Problem or "
                   f"a zero-argument callable returning one); default: {BUILTIN_PROBLEM}, the "
                   "seed LSTM (hidden 128, batch 10, T=10,000, seq2seq, Adam)")
    t.add_argument("--seq-len", type=int, help="built-in problem: sequence length (10000)")
    t.add_argument("--batch", type=int, help="built-in problem: batch size (10)")
    t.add_argument("--hidden", type=int, help="built-in problem: LSTM width (128)")
    t.add_argument("--last-only", dest="seq2seq", action="store_const", const=False,
                   default=None, help="built-in problem: loss on the last hidden state only")
    t.add_argument("--trials", type=int, help="schedules to measure (30; with --total-trials, "
                   "that total); duplicates are skipped and do not count")
    t.add_argument("--total-trials", type=int, metavar="N", help="stop when the study holds N "
                   "measured schedules, counting every worker's; a worker then waits for trials "
                   "still running elsewhere, so all of them end on the same final answer")
    t.add_argument("--timeout", type=float, help="stop starting trials after SECONDS")
    t.add_argument("--storage", help=f"Optuna storage URL (env {STORAGE_ENV}; default "
                   "sqlite:///runs/autoremat.db); any RDB URL, e.g. postgresql://..., lets "
                   "several workers share one study")
    t.add_argument("--study-name", help="resume or create this study (default: from the "
                   "problem, device and budget, so the same command resumes)")
    t.add_argument("--out", help="where to write the chosen schedule (schedule.yaml)")
    t.add_argument("--seed", type=int, help="sampler seed (0)")
    t.add_argument("--time-budget", type=float, help="seconds of timed runs per schedule (5)")
    t.add_argument("--heartbeat", type=int, metavar="SECONDS", help="a running trial records a "
                   "heartbeat every SECONDS (60); one silent for 3x that (its worker was killed "
                   "or lost) is marked failed and re-queued for another worker, at most twice")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    pa = sub.add_parser("pareto", help="the measured memory/time front of a study",
                        description="List the non-dominated trials within the study's budget, "
                        "sorted by memory; * marks the chosen (fastest that fits).")
    _study_options(pa)
    pa.add_argument("--plot", metavar="FILE", help="draw every trial to FILE (.png or .svg)")
    pa.add_argument("--json", action="store_true", help="print the front as JSON")

    e = sub.add_parser("export", help="write one trial's schedule as YAML",
                       description="Write trial TRIAL's schedule (same format and meta as "
                       "tune) atomically to --out.")
    e.add_argument("trial", type=int, metavar="TRIAL", help="the trial number (see pareto)")
    e.add_argument("--out", required=True, help="the YAML file to write")
    _study_options(e)

    s = sub.add_parser("show", help="summarize a schedule file",
                       description="Print a schedule file's levels, policies, what it was "
                       "tuned for and its measured figures; with --problem, whether it still "
                       "matches (exit 1 if not).")
    s.add_argument("path", metavar="PATH", help="a schedule YAML file")
    s.add_argument("--problem", help=f"compare with this problem ({BUILTIN_PROBLEM} or "
                   "module:name / file.py:name)")
    s.add_argument("--seq-len", type=int, help="built-in problem: sequence length")
    s.add_argument("--batch", type=int, help="built-in problem: batch size")
    s.add_argument("--hidden", type=int, help="built-in problem: LSTM width")
    s.add_argument("--last-only", dest="seq2seq", action="store_const", const=False,
                   default=True, help="built-in problem: loss on the last hidden state only")
    return p


def _study_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help=f"Optuna storage URL (env {STORAGE_ENV}; default: the "
                   "last tune run from this folder)")
    p.add_argument("--study-name", help="the study (default: the last tune run from here)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code (the console script exits with it)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return {"tune": _tune, "pareto": _pareto, "export": _export, "show": _show}[
            args.command](args)
    except UsageError as e:
        print(f"autoremat: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("autoremat: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _usage_errors() -> tuple[type[BaseException], ...]:
    from autoremat._budget import BudgetError
    from autoremat._problem import ProblemError
    from autoremat._schedule import ScheduleError
    from autoremat._tune import TuneError

    return (BudgetError, ProblemError, ScheduleError, TuneError)


def _read_study_file(path: str) -> dict[str, Any]:
    from autoremat._schedule import ScheduleError, read_yaml_file

    try:
        data = read_yaml_file(path, what="study file")
    except ScheduleError as e:
        raise UsageError(str(e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of settings ({', '.join(STUDY_FILE_KEYS)})")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    bad = [k for k in data if k not in STUDY_FILE_KEYS]
    if bad:
        raise UsageError(f"{path}: unknown setting {bad[0][:60]!r}; valid: "
                         f"{', '.join(STUDY_FILE_KEYS)}")
    return data


def _check_settings(settings: dict[str, Any]) -> None:
    """Every ``tune`` setting has the right type and range (study files can hold anything)."""

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def bad(key: str, expected: str) -> UsageError:
        value = repr(settings[key])
        value = value if len(value) <= 60 else value[:57] + "..."
        return UsageError(f"--{key.replace('_', '-')}: expected {expected}, got {value}")

    for key, low in (("trials", 0), ("total_trials", 1), ("heartbeat", 1), ("seed", 0)):
        v = settings.get(key)
        high = 2**32 - 1 if key == "seed" else _MAX_SIZE
        if v is not None and (not is_int(v) or not low <= v <= high):
            raise bad(key, f"an integer from {low} to {high}")
    for key in ("seq_len", "batch", "hidden"):
        v = settings.get(key)
        if v is not None and (not is_int(v) or not 1 <= v <= _MAX_SIZE):
            raise bad(key, f"a positive integer up to {_MAX_SIZE}")
    for key in ("timeout", "time_budget"):
        v = settings.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                              or not math.isfinite(v) or v <= 0):
            raise bad(key, "seconds > 0")
    for key in ("problem", "storage", "study_name", "out"):
        v = settings.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip() or "\0" in v):
            raise bad(key, "a non-empty string")
    name = settings.get("study_name")
    if isinstance(name, str) and len(name) > 512:  # Optuna's column is VARCHAR(512)
        raise bad("study_name", "at most 512 characters")
    if not isinstance(settings.get("seq2seq"), bool):
        raise bad("seq2seq", "true or false")
    out = settings.get("out")
    if isinstance(out, str) and Path(out).is_dir():
        raise UsageError(f"--out: {out!r} is a directory; give a file name such as schedule.yaml")


def make_problem(ref: str | None, seq_len: int | None, batch: int | None,
                 hidden: int | None, seq2seq: bool) -> Any:
    """The built-in seed LSTM (resized), or the problem ``ref`` names."""
    from autoremat._problem import resolve_problem, seed_lstm

    if ref is None or ref == BUILTIN_PROBLEM:
        for name, value in (("--seq-len", seq_len), ("--batch", batch), ("--hidden", hidden)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 1 <= value <= _MAX_SIZE):
                raise UsageError(f"{name}: expected a positive integer up to {_MAX_SIZE}, "
                                 f"got {value!r}")
        return seed_lstm(seq_len=seq_len or 10_000, batch=batch or 10, hidden=hidden or 128,
                         seq2seq=seq2seq)
    given = [n for n, v in (("--seq-len", seq_len), ("--batch", batch), ("--hidden", hidden))
             if v is not None]
    if given:
        raise UsageError(f"{given[0]}: only resizes the built-in problem; your --problem "
                         "sets its own sizes")
    return resolve_problem(ref)


def _tune(args: argparse.Namespace) -> int:
    settings: dict[str, Any] = {}
    if args.study_file is not None:
        settings.update(_read_study_file(args.study_file))
    for key in STUDY_FILE_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    if settings.get("total_trials") is not None and settings.get("trials") is None:
        settings["trials"] = settings["total_trials"]
    for key, value in _TUNE_DEFAULTS.items():
        if settings.get(key) is None:
            settings[key] = value
    settings.setdefault("storage", os.environ.get(STORAGE_ENV) or None)
    _check_settings(settings)

    from autoremat._budget import BudgetError, parse_bytes

    budget_note = ""
    try:
        if settings.get("budget") is not None:
            budget = parse_bytes(settings["budget"])
        else:
            budget, budget_note = _default_budget()
    except BudgetError as e:
        raise UsageError(str(e)) from None

    try:
        problem = make_problem(settings.get("problem"), settings.get("seq_len"),
                               settings.get("batch"), settings.get("hidden"),
                               bool(settings["seq2seq"]))
        return _run_tune(problem, budget, budget_note, settings, args.no_progress)
    except _usage_errors() as e:
        raise UsageError(str(e)) from None


def _default_budget() -> tuple[int, str]:
    from autoremat._measure import device_memory_bytes

    limit = device_memory_bytes()
    if limit is not None:
        return limit, " (device memory; set --budget)"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), " (host RAM; set --budget)"


def _run_tune(problem: Any, budget: int, budget_note: str, settings: dict[str, Any],
              no_progress: bool) -> int:
    from tqdm import tqdm

    from autoremat._budget import format_bytes
    from autoremat._tune import nothing_fits_message, tune

    print(f"problem: {problem.name}\nbudget: {format_bytes(budget)} ({budget} bytes)"
          f"{budget_note}", flush=True)
    bar = tqdm(total=settings["trials"], desc="tune", unit="schedule", disable=no_progress,
               file=sys.stderr, dynamic_ncols=True)

    def on_trial(study: Any, trial: Any) -> None:
        a = trial.user_attrs
        if a.get("measured") and a.get("status") == "error":
            tqdm.write(f"autoremat: trial {trial.number} failed ({a.get('describe', '')}): "
                       f"{a.get('reason')}; going on", file=sys.stderr)
        if a.get("measured"):
            bar.update(1)
            bar.set_postfix_str(f"#{trial.number} {a.get('describe', '')} "
                                f"{format_bytes(a.get('total_bytes'))} "
                                f"{'fits' if a.get('feasible') else a.get('status')}")

    try:
        result = tune(
            problem, budget, n_trials=settings["trials"],
            total_trials=settings.get("total_trials"), timeout=settings.get("timeout"),
            storage=settings.get("storage"), study_name=settings.get("study_name"),
            seed=settings["seed"], out=settings["out"], time_budget=settings["time_budget"],
            heartbeat=settings["heartbeat"], on_trial=on_trial,
        )
    finally:
        bar.close()
    print(_result_table(result))
    if result.best is None:
        print(f"autoremat: {nothing_fits_message(result)}", file=sys.stderr)
        return EXIT_INTERRUPTED if result.interrupted else EXIT_NOTHING_FITS
    print(f"wrote {settings['out']}")
    if result.interrupted:
        print("autoremat: interrupted; finished trials are kept (run again to resume)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _result_table(result: Any) -> str:
    from autoremat._budget import format_bytes
    from autoremat._pareto import _seconds
    from autoremat._tune import redact

    lines = [f"study: {result.study_name!r} in {redact(result.storage)} "
             f"({result.n_trials} trials, {result.measured} measured now)",
             f"  {'':<18} {'total':>10} {'temp':>10} {'step':>10} {'vs plain':>9}  schedule"]
    plain = result.plain_attrs
    plain_step = plain.get("step_seconds") if plain else None

    def row(label: str, a: dict[str, Any] | None) -> str:
        if a is None:
            return f"  {label:<18} (not measured)"
        step = a.get("step_seconds")
        ratio = f"{step / plain_step:.2f}x" if step and plain_step else "-"
        note = "" if a.get("feasible") else f"  [{a.get('reason')}]"
        return (f"  {label:<18} {format_bytes(a.get('total_bytes')):>10} "
                f"{format_bytes(a.get('temp_bytes')):>10} {_seconds(step):>10} {ratio:>9}  "
                f"{a.get('describe', '')}{note}")

    best = result.best_attrs
    lines.append(row(f"best (trial {best['number']})" if best else "best", best))
    lines.append(row(f"plain (trial {plain['number']})" if plain else "plain scan", plain))
    return "\n".join(lines)


def _open_study(args: argparse.Namespace) -> Any:
    from autoremat._tune import load_study

    return load_study(args.storage or os.environ.get(STORAGE_ENV) or None, args.study_name)


def _pareto(args: argparse.Namespace) -> int:
    try:
        from autoremat._pareto import front_json, front_table, pareto_front, plot_study

        study = _open_study(args)
        points = pareto_front(study)
        budget = study.user_attrs["budget_bytes"]
        if args.plot:
            if Path(args.plot).suffix.lower() not in (".png", ".svg", ".pdf"):
                raise UsageError(f"--plot: expected a .png, .svg or .pdf file, got {args.plot!r}")
            plot_study(study, args.plot)
        if args.json:
            print(front_json(points, budget))
        else:
            print(f"study: {study.study_name!r} ({len(study.trials)} trials)")
            print(front_table(points, budget))
            if args.plot:
                print(f"wrote {args.plot}")
    except _usage_errors() as e:
        raise UsageError(str(e)) from None
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    try:
        from autoremat._pareto import export_trial
        from autoremat._schedule import save_schedule

        study = _open_study(args)
        schedule = export_trial(study, args.trial)
        save_schedule(schedule, args.out)
    except _usage_errors() as e:
        raise UsageError(str(e)) from None
    print(f"wrote {args.out}: trial {args.trial}, {schedule.describe()}")
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    try:
        from autoremat._pareto import describe_schedule
        from autoremat._schedule import load_schedule

        schedule = load_schedule(args.path)
        print(describe_schedule(schedule))
        if args.problem is None:
            return EXIT_OK
        from autoremat._check import schedule_mismatches

        problem = make_problem(args.problem, args.seq_len, args.batch, args.hidden,
                               args.seq2seq)
        mismatches = schedule_mismatches(schedule, problem)
    except _usage_errors() as e:
        raise UsageError(str(e)) from None
    if mismatches:
        print(f"stale for {problem.name}: " + "; ".join(mismatches))
        return EXIT_STALE
    print(f"matches {problem.name} on this device")
    return EXIT_OK


def _entry() -> NoReturn:  # pragma: no cover - the console script
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
